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
    ``fused_lm_head`` (generation, the distillation rows' hidden states) are passed through unchanged. The
    logits are divided by ``temperature`` as TRL's fused head divides them, and the log-softmax is taken in
    float32 (or wider).
    """
    fused_forward = model.forward

    def forward(self, *args, fused_lm_head: bool = False, labels=None, **kwargs):
        if not fused_lm_head:
            return fused_forward(*args, labels=labels, **kwargs)
        kwargs["use_cache"] = False
        outputs = fused_forward(*args, **kwargs)  # the model's own forward: logits at every position
        logits = outputs.logits[:, :-1]
        logits = (logits if logits.dtype == torch.float64 else logits.float()) / temperature
        targets = labels[:, 1:].to(logits.device)
        mask = targets != -100
        logps = torch.log_softmax(logits, dim=-1)
        del logits
        log_probs = logps.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        entropy = -(logps.exp() * logps).sum(-1)
        return FusedCausalLMOutput(
            log_probs=log_probs.masked_fill(~mask, 0),
            entropy=entropy.masked_fill(~mask, 0),
            label_mask=mask,
            aux_loss=getattr(outputs, "aux_loss", None),
        )

    model.forward = types.MethodType(forward, model)
