"""How the trainer turns the student's last hidden states into per-token log-probs: the fused LM head or the
full logits.

The paper trains with a fused LM-head kernel ("Fused LM-head kernel: on, PyTorch backend", its hyperparameter
table): the log-probs (and the entropies the trainer logs) come from the hidden states in tiles of tokens and
of the vocabulary, and the backward pass recomputes each tile, so the ``[tokens, vocab]`` logits never exist
whole. TRL 1.16's ``GRPOTrainer`` already does this on every log-prob path: it patches the model's forward
with ``trl.trainer.utils.add_fused_lm_head`` (Triton tiles on CUDA, PyTorch tiles elsewhere) and asks for
``fused_lm_head=True``. So does every loss of :mod:`zppo_trl.losses` that reads log-probs (the clipped
surrogate with the dual clip, GSPO, CISPO, DISPO and the supervised cross-entropy); the distillation rows'
JSD is chunked the same way by :func:`zppo_trl.distill.chunked_jsd`.

TRL's PyTorch tiles (every device without Triton: CPUs) score every position of the micro-batch, the
prompt's included, where its Triton kernel scores only the loss positions; each float32 temporary of a
tile is then as long as the micro-batch's rows x their whole length. :func:`score_loss_positions` keeps
the hidden states the head sees to those that predict a loss position: in a padded micro-batch the columns
from the first scored label on, as TRL's own logits path and :func:`use_full_logits` do; in a packed row
(``padding_free``) each sequence's completion, without the prompts packed between them. On the CPU demo's
micro-batch (10 rows of 241 prompt and 48 completion tokens) one padded forward and backward peaked 2.6 GB
lower (docs/benchmarks.md).

``fused_lm_head: false`` swaps in :func:`use_full_logits`, the textbook computation (all logits, then a
log-softmax): the reference the fused path is tested against, and the baseline of
``benchmarks/bench_memory.py``. Its memory grows with tokens x vocabulary: about 8 GB of float32 logits
for one 8,192-token completion at Qwen3.5's 248,320-token vocabulary, and as much again for each copy the
log-softmax and its backward make.
"""

from __future__ import annotations

import contextvars
import functools
import threading
import types
from typing import Any

import torch
from trl.trainer.utils import FusedCausalLMOutput

__all__ = ["score_loss_positions", "use_full_logits"]


def use_full_logits(model: Any, temperature: float = 1.0) -> None:
    """Make ``model(..., labels=..., fused_lm_head=True)`` compute its per-token log-probs and entropies
    from the model's complete logits instead of TRL's fused tiles (same outputs, same meaning).

    ``model`` must already carry TRL's fused head (``GRPOTrainer.__init__`` adds it); calls without
    ``fused_lm_head`` (generation, the distillation rows' hidden states) are passed through unchanged. Only
    the positions from the first scored label on get logits (TRL's completion positions), divided by
    ``temperature`` as TRL's fused head divides them; the log-softmax is taken in float32 (or wider). The
    entropies carry no gradient (the trainer only logs them).
    """
    fused_forward = model.forward

    # The model's own signature: generate() checks its keyword arguments (pixel_values, ...) against it
    @functools.wraps(type(model).forward)
    def forward(self, *args, fused_lm_head: bool = False, labels=None, **kwargs):
        if not fused_lm_head:
            return fused_forward(*args, labels=labels, **kwargs)
        kwargs["use_cache"] = False
        # the logits of the loss positions only (and the last one, dropped), as TRL computed them before it fused
        scored = (labels != -100).any(0).nonzero()
        first = int(scored[0]) if len(scored) else labels.size(1) - 1
        outputs = fused_forward(*args, logits_to_keep=labels.size(1) - first + 1, **kwargs)
        aux_loss = getattr(outputs, "aux_loss", None)
        logits = outputs.logits[:, :-1]
        del outputs  # nothing else may hold the raw logits once they are scaled
        logits = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
        logps = torch.log_softmax(logits, dim=-1)
        del logits
        targets = labels[:, -logps.size(1) :].to(logps.device)
        mask = targets != -100
        log_probs = logps.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        with torch.no_grad():  # the entropies are logged, never trained on: no second [tokens, vocab] for autograd
            entropy = -(logps.exp().mul_(logps)).sum(-1)
        # positions before the first loss position (every row's prompt) carry zeros, as the fused head's do
        pad = labels.size(1) - 1 - log_probs.size(1)
        return FusedCausalLMOutput(
            log_probs=torch.nn.functional.pad(log_probs.masked_fill(~mask, 0), (pad, 0)),
            entropy=torch.nn.functional.pad(entropy.masked_fill(~mask, 0), (pad, 0)),
            label_mask=torch.nn.functional.pad(mask, (pad, 0)),
            aux_loss=aux_loss,
        )

    model.forward = types.MethodType(forward, model)


_PER_TOKEN = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1", "label_mask")

# The cut of the fused-head call in progress in this thread: (the backbone it runs, what of its last hidden states
# the head sees: from a position on, or the positions at an index). Call-local, not module state: the model may run
# a forward on another thread meanwhile (the plain rollouts' old log-probs on a second thread,
# zppo_trl.logp_paths), and that forward must see its own hidden states whole.
_CUT: contextvars.ContextVar[tuple[torch.nn.Module, int | torch.Tensor] | None] = contextvars.ContextVar(
    "zppo_cut", default=None
)
_HOOK_FLAG = "_zppo_cuts_scored_positions"
_hook_lock = threading.Lock()


def _cut_hidden_states(module, inputs, output):
    """The backbone's forward hook: the last hidden states this thread's call cut to, if it has one here."""
    cut = _CUT.get()
    if cut is not None and cut[0] is module:
        states, kept = output.last_hidden_state, cut[1]
        output.last_hidden_state = states[:, kept:] if isinstance(kept, int) else states.index_select(1, kept)
    return output


def _hooked(backbone: torch.nn.Module) -> torch.nn.Module:
    """``backbone`` with :func:`_cut_hidden_states` registered once (a lock: two threads may be first at once)."""
    if not getattr(backbone, _HOOK_FLAG, False):
        with _hook_lock:
            if not getattr(backbone, _HOOK_FLAG, False):
                backbone.register_forward_hook(_cut_hidden_states)
                setattr(backbone, _HOOK_FLAG, True)
    return backbone


def _scored_states(labels: torch.Tensor) -> int | torch.Tensor:
    """The hidden states the head must score for ``labels`` (the state at ``i`` predicts label ``i + 1``): those
    predicting a label that some row scores. An int ``first`` where they run from ``first`` to the end (a padded
    batch: its completions are its last columns), else their positions (a packed row: each sequence's completion
    sits between prompts)."""
    predicts = (labels[:, 1:] != -100).any(0)
    positions = predicts.nonzero().squeeze(1)
    if len(positions) == 0:
        return labels.size(1) - 2  # the last state alone: an all-masked batch still gives outputs of its shape
    first = int(positions[0])
    return first if len(positions) == predicts.numel() - first else positions


def _put_back(value: torch.Tensor, kept: int | torch.Tensor, width: int) -> torch.Tensor:
    """A per-token output of the kept states (:func:`_scored_states`) in place among ``width`` positions, zeros
    elsewhere."""
    if isinstance(kept, int):
        return torch.nn.functional.pad(value, (kept, 0))
    return value.new_zeros(value.size(0), width).index_copy(1, kept.to(value.device), value)


def score_loss_positions(model: Any) -> None:
    """Make TRL's fused head (``model(..., labels=..., fused_lm_head=True)``) score only the hidden states that
    predict a loss position (:func:`_scored_states`): the same per-token outputs, of the same shape, with zeros
    at every other position.

    ``model`` must already carry TRL's fused head. TRL's head runs ``model.base_model`` and scores its last
    hidden state at position ``i`` against label ``i + 1``; a forward hook on ``base_model`` hands it the
    states that predict a loss position (from the first one on in a padded batch; a packed row's completions
    only, without the prompts between them), with the labels cut to match, and the outputs are put back in
    place. Pre-shifted ``shift_labels`` (context parallelism) pass through unchanged.
    The hook stays registered and cuts only inside such a call, in the thread making it: any other forward of
    the model, on any thread (generation meanwhile included), sees its hidden states whole.
    """
    fused_forward = model.forward

    # The model's own signature: generate() checks its keyword arguments (pixel_values, ...) against it
    @functools.wraps(type(model).forward)
    def forward(self, *args, fused_lm_head: bool = False, labels=None, **kwargs):
        if not fused_lm_head or labels is None or kwargs.get("shift_labels") is not None:
            return fused_forward(*args, fused_lm_head=fused_lm_head, labels=labels, **kwargs)
        kept = _scored_states(labels)
        if isinstance(kept, int):
            if kept <= 0:
                return fused_forward(*args, fused_lm_head=True, labels=labels, **kwargs)
            cut, cut_labels = kept, labels[:, kept:]
        else:  # TRL's head drops the last state it is handed and the first label: one more of each
            cut = torch.cat([kept, kept.new_tensor([labels.size(1) - 1])])
            cut_labels = labels[:, torch.cat([kept[:1], kept + 1])]
        token = _CUT.set((_hooked(self.base_model), cut))  # looked up per call: PEFT and FSDP replace it
        try:
            out = fused_forward(*args, fused_lm_head=True, labels=cut_labels, **kwargs)
        finally:
            _CUT.reset(token)
        for name in _PER_TOKEN:
            value = getattr(out, name, None)
            if value is not None:
                setattr(out, name, _put_back(value, kept, labels.size(1) - 1))
        return out

    model.forward = types.MethodType(forward, model)
