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

``fused_lm_head: false`` swaps in :func:`use_full_logits`, the textbook computation (all logits, then a
log-softmax): the reference the fused path is tested against, and the baseline of
``benchmarks/bench_memory.py``. Its memory grows with tokens x vocabulary: about 8 GB of float32 logits
for one 8,192-token completion at Qwen3.5's 248,320-token vocabulary, and as much again for each copy the
log-softmax and its backward make.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from trl.trainer.utils import FusedCausalLMOutput

__all__ = ["use_full_logits"]


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
