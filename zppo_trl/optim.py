"""The paper's optimizer: AdamW with its moments kept in a low-precision dtype (AnyPrecisionAdamW).

The hyperparameter table lists "Optimizer: AdamW (AnyPrecisionAdamW, bf16 optimizer state)".
transformers selects that optimizer as ``optim="adamw_anyprecision"`` but imports it from
``torchdistx``, which is unmaintained and has no wheel for this Python and torch; this module is a
self-contained implementation of the same algorithm, and ``ZPPOTrainer`` builds it for that name.

The update is torch's AdamW (decoupled weight decay, bias-corrected first and second moments);
what changes is where the numbers live. The two moments are stored in dtypes of the caller's
choice (bfloat16 halves the optimizer state next to fp32) and the arithmetic of a step is done in
fp32, rounding once when a moment is written back. Parameters that are themselves low precision
(bf16 weights, as FSDP loads them in the paper's recipes) lose updates far smaller than their
rounding step, which at a learning rate of 1e-6 is almost all of them; with
``use_kahan_summation`` each such parameter gets a compensation buffer that carries what rounding
dropped into the next step (Kahan summation), so the weights follow the high-precision trajectory.
fp32 parameters (the master weights that accelerate's FSDP2 and DeepSpeed keep under bf16 mixed
precision) get no buffer: their rounding is far below an update.

Only plain tensor operations are used, so the optimizer also runs on FSDP2's DTensor shards.
Loading a state dict restores the moments in their configured dtypes (torch's loader would cast
them to the parameters' dtype).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

__all__ = [
    "ANYPRECISION_OPTIM",
    "AnyPrecisionAdamW",
    "anyprecision_kwargs",
    "optimizer_cls_and_kwargs",
    "state_bytes_per_parameter",
]

ANYPRECISION_OPTIM = "adamw_anyprecision"  # transformers' OptimizerNames value

# What transformers passes to torchdistx's class for keys that ``optim_args`` leaves out, so that the
# same YAML means the same optimizer either way: fp32 moments unless asked (the recipes ask for bf16).
_OPTIM_ARGS_DEFAULTS: dict[str, Any] = {
    "use_kahan_summation": False,
    "momentum_dtype": torch.float32,
    "variance_dtype": torch.float32,
    "compensation_buffer_dtype": torch.bfloat16,
}
_STATE_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
_DTYPE_NAMES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}
# State entry -> the param-group setting that names its dtype.
_BUFFERS = {"exp_avg": "momentum_dtype", "exp_avg_sq": "variance_dtype", "compensation": "compensation_buffer_dtype"}


def anyprecision_kwargs(optim_args: str | None) -> dict[str, Any]:
    """The optimizer keyword arguments that an ``optim_args`` string selects for ``adamw_anyprecision``.

    The string is transformers' format, comma-separated ``key=value`` entries such as
    ``"use_kahan_summation=true,momentum_dtype=bfloat16,variance_dtype=bfloat16"``. The keys are
    ``use_kahan_summation`` (a boolean: true/false, yes/no, on/off, 1/0) and ``momentum_dtype``,
    ``variance_dtype``, ``compensation_buffer_dtype`` (one of float16, bfloat16, float32, float64).
    Keys left out take transformers' defaults (Kahan summation off, fp32 moments, a bf16 compensation
    buffer). An unknown or repeated key, a malformed entry or a bad value raises a ValueError naming
    ``optim_args`` and the entry.
    """
    kwargs = dict(_OPTIM_ARGS_DEFAULTS)
    seen: set[str] = set()
    for entry in (optim_args or "").replace(" ", "").split(","):
        if not entry:
            continue
        key, sep, value = entry.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"optim_args: expected comma-separated key=value entries, got {entry!r}")
        if key not in _OPTIM_ARGS_DEFAULTS:
            raise ValueError(
                f"optim_args: unknown key {key!r} for optim={ANYPRECISION_OPTIM!r}; "
                f"known keys: {', '.join(_OPTIM_ARGS_DEFAULTS)}"
            )
        if key in seen:
            raise ValueError(f"optim_args: {key!r} is given twice")
        seen.add(key)
        if key == "use_kahan_summation":
            if value.lower() not in _TRUE | _FALSE:
                raise ValueError(f"optim_args: use_kahan_summation must be true or false, got {value!r}")
            kwargs[key] = value.lower() in _TRUE
        else:
            if value not in _DTYPE_NAMES:
                raise ValueError(f"optim_args: {key} must be one of {', '.join(_DTYPE_NAMES)}, got {value!r}")
            kwargs[key] = _DTYPE_NAMES[value]
    return kwargs


def state_bytes_per_parameter(kwargs: Mapping[str, Any], param_dtype: torch.dtype = torch.float32) -> int:
    """Bytes of optimizer state per parameter of ``param_dtype`` under these keyword arguments.

    ``kwargs`` is what :func:`anyprecision_kwargs` returns: the two moments, plus the compensation
    buffer where Kahan summation applies to that parameter dtype (bf16/fp16 only). For memory plans:
    fp32 master weights with bf16 moments hold 4 bytes, Kahan or not; torch's AdamW holds 8.
    """
    size = torch.finfo(kwargs["momentum_dtype"]).bits // 8 + torch.finfo(kwargs["variance_dtype"]).bits // 8
    if _kahan(torch.empty(0, dtype=param_dtype), kwargs):
        size += torch.finfo(kwargs["compensation_buffer_dtype"]).bits // 8
    return size


def _state_dtype(name: str, value: Any) -> torch.dtype:
    """``value`` (a torch dtype or its name) as a storage dtype, or a ValueError naming ``name``."""
    if isinstance(value, str):
        value = _DTYPE_NAMES.get(value, value)
    if value not in _STATE_DTYPES:
        raise ValueError(f"{name} must be one of {sorted(_DTYPE_NAMES)} (or the torch dtype), got {value!r}")
    return value


def _kahan(param: torch.Tensor, group: Mapping[str, Any]) -> bool:
    """Whether ``param``'s updates go through a compensation buffer: Kahan on, and a parameter below fp32."""
    return group["use_kahan_summation"] and param.dtype in (torch.bfloat16, torch.float16)


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """fp32, or the tensor's own dtype where that is wider (float64)."""
    return torch.promote_types(tensor.dtype, torch.float32)


def _widened(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` itself when it already has ``dtype`` (updated in place), else a widened copy."""
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def _write_back(target: torch.Tensor, value: torch.Tensor) -> None:
    """Store ``value`` into ``target`` (rounding to its dtype) unless it is ``target`` itself."""
    if value is not target:
        target.copy_(value)


class AnyPrecisionAdamW(torch.optim.Optimizer):
    """AdamW whose first and second moments, and optional Kahan compensation buffer, have chosen dtypes.

    One step of a parameter ``w`` with gradient ``g`` at step ``t`` (counted per parameter) is torch's
    AdamW: ``m = beta1 m + (1 - beta1) g``, ``v = beta2 v + (1 - beta2) g^2``, and
    ``w = w - lr wd w - lr (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)``, the weight decay
    decoupled from the gradient. It is computed in fp32 (fp64 for fp64 tensors) from widened copies
    of the stored values; the moments are then rounded once into ``momentum_dtype`` and
    ``variance_dtype``. With fp32 moments and fp32 parameters it is torch's AdamW to float rounding.

    With ``use_kahan_summation``, for a bf16 or fp16 parameter the whole change of ``w`` (weight
    decay included, which on bf16 weights would otherwise round away entirely) is added to a
    per-parameter compensation buffer (``compensation_buffer_dtype``); the parameter takes as much
    of the buffer as its dtype can represent and the buffer keeps the remainder for the next step.
    This is what makes training low-precision parameters follow the fp32 trajectory. Parameters of
    fp32 or wider are updated directly and get no buffer (torchdistx's class gives every parameter
    one; on fp32 weights it would only hold their sub-ulp rounding).

    Args:
        params: parameters or parameter-group dicts, as for any torch optimizer.
        lr: learning rate.
        betas: the moments' decay rates ``(beta1, beta2)``.
        eps: added to the bias-corrected root of the second moment.
        weight_decay: decoupled weight decay coefficient (torch's AdamW default, 0.01).
        use_kahan_summation: keep a compensation buffer per bf16/fp16 parameter for the rounding of its updates.
        momentum_dtype, variance_dtype, compensation_buffer_dtype: storage dtypes (a torch dtype or its
            name: float16, bfloat16, float32 or float64); bfloat16 by default.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        use_kahan_summation: bool = False,
        momentum_dtype: torch.dtype | str = torch.bfloat16,
        variance_dtype: torch.dtype | str = torch.bfloat16,
        compensation_buffer_dtype: torch.dtype | str = torch.bfloat16,
    ):
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            use_kahan_summation=bool(use_kahan_summation),
            momentum_dtype=_state_dtype("momentum_dtype", momentum_dtype),
            variance_dtype=_state_dtype("variance_dtype", variance_dtype),
            compensation_buffer_dtype=_state_dtype("compensation_buffer_dtype", compensation_buffer_dtype),
        )
        _check_group(defaults)
        super().__init__(params, defaults)
        self.register_load_state_dict_post_hook(_restore_state_dtypes)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``add_param_group``, then the group's settings checked and its dtype names resolved."""
        super().add_param_group(param_group)
        _check_group(self.param_groups[-1])

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One update of every parameter that has a gradient; returns the closure's loss, if one is given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("AnyPrecisionAdamW does not support sparse gradients")
                self._update(param, group)
        return loss

    def _state_for(self, param: torch.Tensor, group: Mapping[str, Any]) -> dict[str, Any]:
        """The parameter's state, creating what is missing (a state loaded without a buffer gets a zero one)."""
        state = self.state[param]
        if "step" not in state:
            state["step"] = torch.tensor(0.0)  # a CPU scalar, as torch's AdamW keeps it
        for name, dtype_key in _BUFFERS.items():
            if name == "compensation" and not _kahan(param, group):
                continue
            if name not in state:
                state[name] = torch.zeros_like(param, dtype=group[dtype_key], memory_format=torch.preserve_format)
        return state

    def _update(self, param: torch.Tensor, group: Mapping[str, Any]) -> None:
        state = self._state_for(param, group)
        state["step"] += 1
        step = int(state["step"].item())
        beta1, beta2 = group["betas"]
        lr = float(group["lr"])
        decay = lr * float(group["weight_decay"])
        compute = _compute_dtype(param)

        grad = _widened(param.grad, compute)
        exp_avg = _widened(state["exp_avg"], compute)
        exp_avg_sq = _widened(state["exp_avg_sq"], compute)
        exp_avg.lerp_(grad, 1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        _write_back(state["exp_avg"], exp_avg)
        _write_back(state["exp_avg_sq"], exp_avg_sq)

        step_size = lr / (1.0 - beta1**step)
        denom = (exp_avg_sq.sqrt() / math.sqrt(1.0 - beta2**step)).add_(group["eps"])
        weight = _widened(param, compute)
        if not _kahan(param, group):
            if decay:
                weight.mul_(1.0 - decay)
            weight.addcdiv_(exp_avg, denom, value=-step_size)
            _write_back(param, weight)
            return
        # Kahan: the pending change is the new update plus what earlier roundings dropped; the
        # parameter takes what its dtype can hold and the buffer keeps the rest.
        pending = torch.div(exp_avg, denom).mul_(-step_size)
        if decay:
            pending.add_(weight, alpha=-decay)
        pending.add_(state["compensation"].to(compute))
        moved = (weight + pending).to(param.dtype)
        applied = moved.to(compute).sub_(weight)
        state["compensation"].copy_(pending.sub_(applied))
        param.copy_(moved)


def _check_group(group: dict[str, Any]) -> None:
    """A ValueError naming the first setting of a parameter group that AdamW cannot use; dtype names resolved."""
    beta1, beta2 = group["betas"]
    for name, value, ok in (
        ("lr", group["lr"], float(group["lr"]) >= 0.0),
        ("eps", group["eps"], group["eps"] >= 0.0),
        ("weight_decay", group["weight_decay"], group["weight_decay"] >= 0.0),
        ("betas[0]", beta1, 0.0 <= beta1 < 1.0),
        ("betas[1]", beta2, 0.0 <= beta2 < 1.0),
    ):
        if not ok:
            raise ValueError(f"AnyPrecisionAdamW: invalid {name}: {value!r}")
    for key in ("momentum_dtype", "variance_dtype", "compensation_buffer_dtype"):
        group[key] = _state_dtype(key, group[key])


def _restore_state_dtypes(optimizer: AnyPrecisionAdamW) -> None:
    """After ``load_state_dict``: each buffer back in its group's dtype (torch casts them to the parameter's).

    Groups loaded from another optimizer's state dict (torch's AdamW, say) get this optimizer's
    defaults for the settings they lack. A bf16 buffer widened by the loader narrows back exactly.
    """
    for group in optimizer.param_groups:
        for key, value in optimizer.defaults.items():
            group.setdefault(key, value)
        for param in group["params"]:
            state = optimizer.state.get(param)
            if not state:
                continue
            for name, dtype_key in _BUFFERS.items():
                if name in state and state[name].dtype != group[dtype_key]:
                    state[name] = state[name].to(group[dtype_key])


def optimizer_cls_and_kwargs(args: Any, model: Any, default: Callable) -> tuple[type, dict]:
    """transformers' choice of optimizer (``default(args, model)``), except that ``optim="adamw_anyprecision"``
    builds :class:`AnyPrecisionAdamW`.

    The paper trains with AnyPrecisionAdamW (bf16 optimizer state); transformers would import it from torchdistx,
    which cannot be installed here, so :class:`AnyPrecisionAdamW` takes its place with transformers' keyword
    arguments (lr, betas, eps from ``args``; ``optim_args`` parsed by :func:`anyprecision_kwargs`).
    ``create_optimizer`` still builds the parameter groups and their weight decay; every other ``optim`` is
    transformers' own.
    """
    if args.optim == ANYPRECISION_OPTIM:
        kwargs = {
            "lr": args.learning_rate,
            "betas": (args.adam_beta1, args.adam_beta2),
            "eps": args.adam_epsilon,
            **anyprecision_kwargs(args.optim_args),
        }
        return AnyPrecisionAdamW, kwargs
    return default(args, model)
