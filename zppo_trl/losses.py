"""Algorithm 1, step 6's second half: the loss of one micro-batch, one named function per objective.

A loss is a small function of tensors, registered under a name with :func:`register_loss`; the trainer
computes what the loss declares it needs (per-token log-probs, or the student's and teacher's distributions) and calls
it. Adding an objective is one function here (or in a module of its own) and its registration line.

=========  =====================================================================================
``dapo``   The paper's objective ("GRPO"): the PPO clipped surrogate per token with clip-higher
           (``epsilon``/``epsilon_high``) and the dual clip ``delta`` for negative advantages,
           aggregated over tokens as DAPO does.
``gspo``   The same clipped surrogate on one ratio per response, the length-normalised geometric
           mean of its token ratios, clipped at 3e-4 / 4e-4 and averaged per response (GSPO).
``cispo``  The importance weight clipped at ``cispo_weight_bound`` (5) and stopped from the gradient,
           on ``A log pi`` (CISPO, MiniMax-M1).
``dispo``  DISPO's four-way clipped REINFORCE loss (:func:`dispo_per_token_loss`).
``sft``    Cross-entropy on the response tokens (the Correction-/Error-reflection-SFT controls).
``jsd``    GKD's generalized Jensen-Shannon divergence to the teacher (the distillation rows).
=========  =====================================================================================

KDRL and RLAD, the teacher-side hybrid rows, register in :mod:`zppo_trl.hybrid_objectives`; they read the
teacher's log-prob of every sampled token. SDPO and OPSD, the self-teacher rows, register in
:mod:`zppo_trl.terms.self_teachers` with the term they train with (``term=``); they read a copy of the student under
another prompt. :mod:`zppo_trl.objectives`
imports every module that registers one (this one imports none of them) and answers "which loss does a configuration
train with" (:func:`zppo_trl.objectives.loss_for`).

Every loss divides a sum over the micro-batch's loss tokens by ``normalizer``, the partition's token
count as the trainer carries it (a token mean per optimizer update); GSPO as its paper trains it divides
a sum over responses by ``sequences``, the partition's response count. The arithmetic of ``dapo`` is
TRL's ``GRPOTrainer`` loss for the paper's settings, operation for operation, so the paper's objective
trains bit for bit as TRL's would (tests/test_losses.py).

A loss also returns what it wants logged: ``means`` (name -> a masked sum and its count, averaged over
every rank's tokens) and ``extremes`` (name -> per-response values and ``"min"``/``"max"`` over ranks).

The policy objectives (``policy_objective``): the paper trains ZPPO with GRPO (the DAPO token-level
clipped surrogate with the dual clip) and reports three alternatives on the GRPO† pipeline, every
other setting as in its hyperparameter table (the appendix's objective comparison). With
r = pi_theta / pi_old per token, A the rollout's advantage and sg the stop-gradient:

- ``"grpo"``: ``min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)``, and ``max(., c_dual A)`` for A < 0.
- ``"gspo"`` (Zheng et al. 2025, Group Sequence Policy Optimization): the same clipped surrogate
  on one ratio per rollout, ``s = exp(mean_t log r_t)`` (the length-normalised geometric mean), with the
  GSPO paper's clip range and per-response mean (``gspo_settings``).
- ``"cispo"`` (MiniMax-M1, Chen et al. 2025): clip the importance weight, not the update:
  ``sg(min(r, cispo_weight_bound)) A log pi`` (no lower bound, as MiniMax-M1 trains it).
- ``"dispo"`` (Karaman et al. 2026): :func:`dispo_per_token_loss`.

This module is pure: torch only, no TRL, no trainer.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .needs import SCORES_TOKEN_LOGPS, Needs

__all__ = [
    "LOSSES",
    "GSPO_EPSILONS",
    "DispoBounds",
    "Loss",
    "LossInputs",
    "LossOutput",
    "CISPO_WEIGHT_BOUND",
    "DISPO_FIELDS",
    "PAPER_POLICY_OBJECTIVE",
    "dispo_outside",
    "dispo_per_token_loss",
    "log_loss",
    "masked_sum",
    "register_loss",
    "sequence_level_warning_expected",
]

# GSPO's clip range on the sequence ratio, as the GSPO paper trains it (left 3e-4, right 4e-4): a geometric
# mean of token ratios moves by about 1e-3 per update, so the ZPPO table's 0.2 / 0.28 would essentially never bind.
GSPO_EPSILONS: tuple[float, float] = (3e-4, 4e-4)


# The paper's Step-6 objective (the table's GRPO with DAPO's clip-higher, token-level loss and the dual clip): the
# policy_objective value that selects the `dapo` loss, and the one every other objective is compared with.
PAPER_POLICY_OBJECTIVE = "grpo"
# The loss the SFT controls fit their targets with (zppo_trl.augmentations.TargetSource.loss).
SFT_LOSS = "sft"
# DISPO's four clip ranges, one field each (zppo_trl.objective_settings checks them).
DISPO_FIELDS = ("dispo_epsilon_low_pos", "dispo_epsilon_high_pos", "dispo_epsilon_low_neg", "dispo_epsilon_high_neg")

# CISPO's upper bound on the importance weight. MiniMax-M1 (the CISPO paper) imposes no lower bound and tunes
# only the upper one, whose value it does not state; ScaleRL (Khatri et al. 2025), which trains CISPO at scale,
# caps the weight at eps_max = 5 (as TRL's GRPOConfig recommends for loss_type="cispo"). The ZPPO paper does not
# say which it used.
CISPO_WEIGHT_BOUND = 5.0


@dataclass(frozen=True)
class DispoBounds:
    """DISPO's four clip epsilons: an interval ``[1 - low, 1 + high]`` on the importance weight
    for correct responses (``*_pos``, A > 0) and one for incorrect responses (``*_neg``, A < 0).

    A ``low`` of 1 or more leaves that side without a lower bound (a weight is never negative).
    ``ZPPOConfig`` validates the values (``dispo_epsilon_*``: finite, >= 0).
    """

    low_pos: float
    high_pos: float
    low_neg: float
    high_neg: float


def dispo_outside(
    ratio: torch.Tensor, advantages: torch.Tensor, bounds: DispoBounds
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where DISPO's trust region excludes a token: ``(below, above)`` boolean masks.

    ``below``: the weight is under ``1 - low`` of its response's side; ``above``: over ``1 + high``.
    The side is the advantage's sign (A > 0 correct, A < 0 incorrect: with binary rewards and
    group-relative advantages the two agree on every group with a signal); A = 0 tokens carry no
    gradient and are never counted as clipped. ``advantages`` broadcasts against ``ratio``.
    """
    pos, neg = advantages > 0, advantages < 0
    below = (pos & (ratio < 1 - bounds.low_pos)) | (neg & (ratio < 1 - bounds.low_neg))
    above = (pos & (ratio > 1 + bounds.high_pos)) | (neg & (ratio > 1 + bounds.high_neg))
    return below, above


def dispo_per_token_loss(
    per_token_logps: torch.Tensor,
    old_per_token_logps: torch.Tensor,
    advantages: torch.Tensor,
    bounds: DispoBounds,
    out_of_bounds: str = "zero",
) -> torch.Tensor:
    """DISPO's per-token loss (Karaman et al. 2026, "DISPO: Enhancing Training Efficiency and
    Stability in Reinforcement Learning for Large Language Model Mathematical Reasoning",
    arXiv 2602.00983, AISTATS 2026: the objective J_DISPO of its method section; its section and
    equation numbers were not checked: only the abstract and a summary of J_DISPO were readable).

    DISPO is REINFORCE-style, like CISPO: the importance weight is a stop-gradient coefficient on
    ``log pi``. It maximizes ``(1 / sum_i |o_i|) sum_i sum_t sg(r^d_{i,t}) A_{i,t} log pi_theta``
    (DAPO's token-level aggregation), with the decoupled weight

        r^d = r * 1[1 - low_pos <= r <= 1 + high_pos]   for correct responses (A > 0)
        r^d = r * 1[1 - low_neg <= r <= 1 + high_neg]   for incorrect responses (A < 0)

    so a token's gradient is ``r A grad log pi`` inside its side's interval and exactly zero
    outside it: the abstract's fix to CISPO, whose clipped weight still pushes every token
    outside the trust region ("permitting non-zero gradients outside the trust-region"). The
    four bounds make the four regimes (correct/incorrect x weight above/below 1) separately
    tunable.

    ``out_of_bounds`` says what a token outside its interval gets: ``"zero"`` (the default, above) or
    ``"clamp"``, the weight clamped into the interval (a CISPO-style bound, which still pushes the token).
    The DISPO paper's method section could not be read here: its abstract faults CISPO for "permitting
    non-zero gradients outside the trust-region", which reads as "zero"; secondary summaries of J_DISPO
    write ``clip(r, ...)``, which reads as "clamp". docs/comparison_rows.md gives both sources.

    Returns ``-sg(r^d) A log pi`` per token (minimize form), the shape of ``per_token_logps``
    broadcast with ``advantages`` (pass (B, 1) advantages for (B, T) log-probs). The caller
    masks padding and aggregates (DAPO: a sum over completion tokens divided by their count).
    """
    ratio = torch.exp(per_token_logps.detach() - old_per_token_logps.detach())
    below, above = dispo_outside(ratio, advantages, bounds)
    if out_of_bounds == "zero":
        weight = torch.where(below | above, torch.zeros_like(ratio), ratio)
    elif out_of_bounds == "clamp":
        pos = advantages > 0
        side = ratio.new_tensor  # the bounds in the ratio's dtype
        low = torch.where(pos, side(1 - bounds.low_pos), side(1 - bounds.low_neg)).clamp(min=0.0)
        high = torch.where(pos, side(1 + bounds.high_pos), side(1 + bounds.high_neg))
        weight = torch.minimum(torch.maximum(ratio, low), high)
    else:
        raise ValueError(f"out_of_bounds must be 'zero' or 'clamp', got {out_of_bounds!r}")
    return -weight * advantages * per_token_logps


@dataclass
class LossInputs:
    """One micro-batch's tensors, as the selected loss needs them.

    ``mask`` (B, T) marks the tokens that enter the loss; ``normalizer`` divides the token sum, and
    ``sequences`` the sum over responses of the losses that average per response (each the update's count,
    in the units the trainer carries them).
    Log-prob losses get ``logps`` (B, T, with gradient), ``old_logps`` (the sampling policy's; None:
    this policy's, detached), ``advantages`` (B, 1) or (B, T) and ``entropies``; the distillation loss
    gets ``distill`` (the student's completion states and LM head, and the teacher's signal). A loss
    that needs the teacher's token log-probs also gets ``teacher_logps`` (B, T), the frozen teacher's log-prob
    of each sampled token, and ``step``, the optimizer steps taken so far (for a coefficient's schedule). A
    self-teacher term (:mod:`zppo_trl.terms.self_teachers`) puts ``teacher_mask`` (B, T), 1 on the rollouts that
    have a self-teacher (a copy of the student under a privileged prompt), and its signal: ``teacher_logps`` (SDPO)
    or, in ``distill``, the student's completion states with the self-teacher's top-k (OPSD).
    """

    mask: torch.Tensor
    normalizer: torch.Tensor | float
    sequences: torch.Tensor | float | None = None
    logps: torch.Tensor | None = None
    old_logps: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    entropies: torch.Tensor | None = None
    distill: Any = None  # a zppo_trl.distill.DistillInputs (that module registers the loss that reads it)
    teacher_logps: torch.Tensor | None = None
    teacher_mask: torch.Tensor | None = None
    step: int = 0


@dataclass
class LossOutput:
    """The loss, and what to log: ``means[name] = (sum, count)``, ``extremes[name] = (values, "min"|"max")``."""

    loss: torch.Tensor
    means: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    extremes: dict[str, tuple[torch.Tensor, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Loss:
    """A registered loss: ``fn(inputs, args)``, what the trainer computes for it (``"logps"`` or
    ``"distributions"``), what it asks of the run (:class:`zppo_trl.needs.Needs`) and, for a policy objective, the
    ``policy_objective`` value that selects it, how the paper prints it and the run-time part it trains with
    (``term``: a :class:`zppo_trl.terms.Term` class, whose needs and settings are the objective's)."""

    name: str
    fn: Callable[[LossInputs, Any], LossOutput]
    computes: str = "logps"
    objective: str | None = None
    printed: str | None = None
    dual_clip: bool = False
    needs: Needs = Needs()
    sequence_level: bool = False
    trl_settings: Mapping[str, object] = field(default_factory=dict)
    reads: tuple[str, ...] = ()
    term: type | None = None

    @property
    def reads_old_logps(self) -> bool:
        """A policy objective weighs each token by its ratio to the sampling policy (``LossInputs.old_logps``)."""
        return self.objective is not None

    @property
    def needs_teacher_logps(self) -> bool:
        """Whether it reads the teacher's log-prob of every sampled token (``LossInputs.teacher_logps``)."""
        return SCORES_TOKEN_LOGPS in self.needs.teacher_scores

    @property
    def trains_zero_advantage(self) -> bool:
        return self.needs.trains_zero_advantage


LOSSES: dict[str, Loss] = {}
NO_NEEDS = Needs()  # a loss that asks nothing of the run beyond its log-probs or distributions


def register_loss(
    name: str,
    computes: str = "logps",
    objective: str | None = None,
    printed: str | None = None,
    dual_clip: bool = False,
    needs: Needs = NO_NEEDS,
    sequence_level: bool = False,
    trl_settings: Mapping[str, object] | None = None,
    reads: tuple[str, ...] = (),
    term: type | None = None,
) -> Callable:
    """Register ``fn(inputs: LossInputs, args) -> LossOutput`` under ``name`` (``args`` is the ZPPOConfig).

    ``computes`` says what the trainer computes for it: per-token log-probs (``"logps"``) or the student's and
    teacher's distributions (``"distributions"``). With ``objective``, the loss is a policy objective:
    ``policy_objective: <objective>`` selects it, and ``printed`` (default: ``objective`` upper-cased) names the row
    in the dry run, the model card and the metrics, as the paper's tables do. ``dual_clip`` says the loss reads
    ``delta`` (the dual clip), so the configuration checks it. ``needs`` declares what it asks of the run: the
    teacher's log-prob of every sampled token (``teacher_scores={"token_logps"}``, ``LossInputs.teacher_logps``),
    which the trainer then asks the teacher for; ``trains_zero_advantage`` when the loss has a gradient on rollouts
    whose advantage is 0 (KDRL's reverse KL), so a partition without a group of mixed rewards still trains rather
    than being skipped. ``sequence_level`` says the loss takes one ratio per response (GSPO), so a part that gives
    each token its own advantage (``Needs.token_level_objective``) refuses it. ``trl_settings`` are the TRL fields the
    objective sets itself among the paper's pinned ones (GSPO's sequence-level ratio, CISPO's loss type: TRL's
    attributes then state what trains; the configuration refuses them set by hand for another objective).
    ``reads`` names the settings it reads (the unused-setting warning names a setting no part of the row reads).
    ``term`` is the run-time part a policy objective trains with (a :class:`zppo_trl.terms.Term` class: the
    self-teachers' copy of the student and the signal it leaves for the loss); its needs and reads are the
    objective's, so ``policy_objective`` selects one part, registered here only.
    """
    if term is not None and objective is None:
        raise ValueError(f"loss {name!r}: only a policy objective trains with a term")
    if computes not in ("logps", "distributions"):
        raise ValueError(f"computes must be 'logps' or 'distributions', got {computes!r}")

    def register(fn: Callable) -> Callable:
        if name in LOSSES:
            raise ValueError(f"a loss named {name!r} is already registered")
        if objective is not None and objective in _registered_objectives():
            raise ValueError(
                f"policy_objective {objective!r} is already registered "
                f"(loss {_registered_objectives()[objective].name!r})"
            )
        LOSSES[name] = Loss(
            name,
            fn,
            computes,
            objective,
            printed or (objective.upper() if objective else None),
            dual_clip,
            needs | term.needs if term is not None else needs,
            sequence_level,
            dict(trl_settings or {}),
            tuple(dict.fromkeys((*reads, *(term.reads if term is not None else ())))),
            term,
        )
        return fn

    return register


def _registered_objectives() -> dict[str, Loss]:
    """The policy objectives registered so far (every one: :func:`zppo_trl.objectives.policy_objectives`)."""
    return {loss.objective: loss for loss in LOSSES.values() if loss.objective is not None}


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum, count)`` of ``values`` over the loss tokens; per-response values (B, 1) count once for each
    response with a loss token (zero-weight padding rows do not count)."""
    if values.shape[1] == 1:
        has = _has_tokens(mask).to(values.dtype)
        return (values.squeeze(1) * has).sum(), has.sum()
    return (values * mask).sum(), mask.sum().to(values.dtype)


def _has_tokens(mask: torch.Tensor) -> torch.Tensor:
    """(B,) 1 for each response with at least one loss token."""
    return (mask.sum(-1) > 0).to(mask.dtype)


def _per_response(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` over each response's loss tokens (NaN for a response without any)."""
    if values.shape[1] == 1:
        return torch.where(_has_tokens(mask) > 0, values.squeeze(1), float("nan"))
    return (values * mask).sum(-1) / mask.sum(-1)


def _advantages(inputs: LossInputs) -> torch.Tensor:
    advantages = inputs.advantages
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def _old_logps(inputs: LossInputs) -> torch.Tensor:
    # No stored old log-probs: the sampling policy is this one (one update per rollout step).
    return inputs.logps.detach() if inputs.old_logps is None else inputs.old_logps


def _epsilons(args: Any) -> tuple[float, float]:
    return args.epsilon, args.epsilon_high if args.epsilon_high is not None else args.epsilon


def _clipped_surrogate(
    inputs: LossInputs,
    args: Any,
    log_weights: torch.Tensor,
    epsilons: tuple[float, float],
    per_response: bool = False,
) -> LossOutput:
    """``-min(w A, clip(w, 1 - eps_low, 1 + eps_high) A)`` with ``w`` clamped at ``delta`` (the dual clip:
    for A < 0 it bounds the loss at ``-delta A``). Summed over the loss tokens / ``normalizer`` (a token
    mean), or with ``per_response`` (one weight per response, ``log_weights`` (B, 1)) summed over the
    responses / ``sequences`` (each response counts once, whatever its length)."""
    mask, advantages = inputs.mask, _advantages(inputs)
    eps_low, eps_high = epsilons
    weight = torch.exp(log_weights)
    clipped = torch.clamp(weight, 1 - eps_low, 1 + eps_high)
    if args.delta is not None:
        weight = torch.clamp(weight, max=args.delta)
    per_token_loss = -torch.min(weight * advantages, clipped * advantages)
    if per_response:
        if inputs.sequences is None:
            raise ValueError("a per-response loss needs LossInputs.sequences, the update's response count")
        loss = (per_token_loss.squeeze(1) * _has_tokens(mask)).sum() / inputs.sequences
    else:
        loss = (per_token_loss * mask).sum() / inputs.normalizer
    low = ((weight < 1 - eps_low) & (advantages < 0)).float()
    high = ((weight > 1 + eps_high) & (advantages > 0)).float()
    region = ((low > 0) | (high > 0)).float()
    return LossOutput(
        loss,
        means={
            "entropy": masked_sum(inputs.entropies, mask),
            "clip_ratio/low_mean": masked_sum(low, mask),
            "clip_ratio/high_mean": masked_sum(high, mask),
            "clip_ratio/region_mean": masked_sum(region, mask),
        },
        extremes={
            "clip_ratio/low_min": (_per_response(low, mask), "min"),
            "clip_ratio/high_max": (_per_response(high, mask), "max"),
        },
    )


@register_loss("dapo", objective=PAPER_POLICY_OBJECTIVE, printed="GRPO", dual_clip=True)
def dapo_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """The paper's objective: the clipped surrogate on each token's ratio ``pi / pi_old``."""
    return _clipped_surrogate(inputs, args, inputs.logps - _old_logps(inputs), _epsilons(args))


@register_loss(
    "gspo",
    objective="gspo",
    printed="GSPO",
    dual_clip=True,
    sequence_level=True,
    trl_settings={"importance_sampling_level": "sequence"},
    reads=("gspo_settings",),
)
def gspo_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """GSPO: the clipped surrogate on one ratio per response, ``exp(mean over its tokens of log r)``.

    With ``gspo_settings="gspo_paper"`` (the default) as the GSPO paper trains it: that ratio clipped to
    ``[1 - 3e-4, 1 + 4e-4]`` (:data:`GSPO_EPSILONS`) and the loss averaged per response. With
    ``"zppo_table"``: the ZPPO hyperparameter table's ``epsilon``/``epsilon_high`` and DAPO's token mean
    (each response's term weighted by its length). Both keep the dual clip (``delta``).
    """
    log_ratio = inputs.logps - _old_logps(inputs)
    log_weights = (log_ratio * inputs.mask).sum(-1) / inputs.mask.sum(-1).clamp(min=1.0)
    if args.gspo_settings == "gspo_paper":
        return _clipped_surrogate(inputs, args, log_weights.unsqueeze(-1), GSPO_EPSILONS, per_response=True)
    return _clipped_surrogate(inputs, args, log_weights.unsqueeze(-1), _epsilons(args))


@register_loss(
    "cispo", objective="cispo", printed="CISPO", trl_settings={"loss_type": "cispo"}, reads=("cispo_weight_bound",)
)
def cispo_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """CISPO: ``-sg(min(r, cispo_weight_bound)) A log pi`` per token (no lower bound, as MiniMax-M1 trains it)."""
    mask, advantages = inputs.mask, _advantages(inputs)
    bound = args.cispo_weight_bound
    weight = torch.exp(inputs.logps - _old_logps(inputs))
    per_token_loss = -torch.clamp(weight, max=bound).detach() * advantages * inputs.logps
    loss = (per_token_loss * mask).sum() / inputs.normalizer
    clipped = ((weight > bound) & (advantages > 0)).float()
    return LossOutput(
        loss, means={"entropy": masked_sum(inputs.entropies, mask), "cispo_clip_ratio": masked_sum(clipped, mask)}
    )


@register_loss("dispo", objective="dispo", printed="DISPO", reads=(*DISPO_FIELDS, "dispo_out_of_bounds"))
def dispo_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """DISPO: zero gradient outside each side's interval; logs the share of tokens each regime stopped
    (``clip_ratio/{pos,neg}_{low,high}_mean``: A > 0 or A < 0, weight below or above its interval)."""
    mask, advantages, old = inputs.mask, _advantages(inputs), _old_logps(inputs)
    bounds = args.dispo_bounds
    per_token_loss = dispo_per_token_loss(inputs.logps, old, advantages, bounds, args.dispo_out_of_bounds)
    loss = (per_token_loss * mask).sum() / inputs.normalizer
    below, above = dispo_outside(torch.exp(inputs.logps.detach() - old.detach()), advantages, bounds)
    pos, neg = (advantages > 0).expand_as(below), (advantages < 0).expand_as(below)
    regimes = {
        "entropy": inputs.entropies,
        "clip_ratio/pos_low_mean": below & pos,
        "clip_ratio/pos_high_mean": above & pos,
        "clip_ratio/neg_low_mean": below & neg,
        "clip_ratio/neg_high_mean": above & neg,
        "clip_ratio/region_mean": below | above,
    }
    return LossOutput(loss, means={name: masked_sum(value.detach().double(), mask) for name, value in regimes.items()})


@register_loss(SFT_LOSS)
def sft_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """Cross-entropy on the target's response tokens (prompt and tag tokens are prompt, never counted)."""
    nll = -(inputs.logps * inputs.mask).sum()
    return LossOutput(nll / inputs.normalizer, means={"sft/nll": (nll.detach(), inputs.mask.sum().to(nll.dtype))})


def log_loss(out: LossOutput, accelerator: Any, metrics: Any) -> None:
    """What a loss reports, over every rank, appended to ``metrics`` (TRL's, of the mode): token means, and
    per-response minima or maxima."""
    for name, (total, count) in out.means.items():
        totals = accelerator.reduce(torch.stack([total, count]), reduction="sum")
        metrics[name].append((totals[0] / totals[1].clamp(min=1.0)).item())
    for name, (values, how) in out.extremes.items():
        gathered = accelerator.gather(values)
        kept = gathered[~torch.isnan(gathered)]  # NaN marks a rank's or response's "nothing to report"
        extreme = (kept.min() if how == "min" else kept.max()) if kept.numel() else torch.tensor(float("nan"))
        metrics[name].append(extreme.item())


@contextlib.contextmanager
def sequence_level_warning_expected(objective: Loss, trl_module: str) -> Iterator[None]:
    """Drop TRL's construction-time warning that a sequence-level ratio under ``loss_type="dapo"`` weights each
    rollout by its length (it points to ``loss_type="grpo"``), where ``objective`` is sequence-level: TRL's loss does
    not train it, its registered loss does (GSPO's averages per response as the GSPO paper does, or, with
    ``gspo_settings="zppo_table"``, keeps DAPO's token mean on purpose). Any other warning, and every other
    objective's, passes. ``trl_module``: the module whose logger warns (TRL's GRPO trainer)."""
    trl_logger = logging.getLogger(trl_module)

    def expected(record: logging.LogRecord) -> bool:
        # accelerate's logger prefixes the rank ("[RANK 0] "), hence `in`
        return not (
            objective.sequence_level and "When using `importance_sampling_level='sequence'`" in record.getMessage()
        )

    trl_logger.addFilter(expected)
    try:
        yield
    finally:
        trl_logger.removeFilter(expected)
