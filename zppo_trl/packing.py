"""Padding-free micro-batches: a padded batch of prompt + completion rows packed into one row, and back.

TRL scores a micro-batch as a ``(B, L)`` grid: each row's prompt left-padded, its completion right-padded,
the completions being the last ``logits_to_keep`` columns. Every pad token goes through the model and is
thrown away. Packed, the real tokens of all rows sit end to end in a single row of ``T`` tokens, the paper's
"padding-free training" (its hyperparameter table). Three things keep the rows apart:

- each row's position ids restart at 0. With no attention mask, transformers reads a position id that does
  not follow its predecessor as the start of a new sequence and masks attention block-diagonally, one block
  per sequence (sdpa and eager build that mask; flash-attention runs its variable-length kernel);
- only completion tokens carry a label, so no position is ever scored on the first token of the next row;
- RoPE depends only on the distance between tokens, so a row whose positions start at 0 attends exactly as
  the same row did in the padded grid, where its positions started after the left padding.

:meth:`PackedBatch.unpack` scatters the fused LM head's per-position outputs (``log_probs``, ``entropy``)
back into TRL's ``(B, logits_to_keep)`` layout, with zeros at padding as the padded path leaves them.

Packing is exact only when every layer of the model sees those boundaries. :func:`model_refusal` says why a
model is not packed: only the model types and attention implementations that ``tests/test_packing.py``
checks against the padded path are packed. Qwen3.5 (the paper's students) is refused: in transformers'
PyTorch path its Gated DeltaNet layers (a causal convolution and a recurrent state) run straight through
the boundaries between packed sequences. :func:`batch_refusal` says why one micro-batch cannot be packed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PACKED_ATTENTION", "PACKED_MODEL_TYPES", "PackedBatch", "batch_refusal", "model_refusal", "pack"]

# Model types made only of softmax attention, whose masks transformers builds from packed position ids, each
# checked against the padded path in tests/test_packing.py (Qwen3: the text student of the tests; Llama:
# SmolLM2, the demo's student).
PACKED_MODEL_TYPES = ("llama", "qwen3")
# The attention implementations those tests run on CPU. flash_attention_2/3 take packed position ids too
# (a variable-length kernel), but nothing here can run them: they are refused until a GPU test checks them.
PACKED_ATTENTION = ("sdpa", "eager")

_GATED_DELTANET = (
    "its Gated DeltaNet (linear-attention) layers carry their causal convolution and recurrent state across "
    "the boundaries of packed sequences in transformers' PyTorch path; only the flash-linear-attention kernels "
    "take sequence boundaries (cu_seqlens), which transformers does not derive from position ids"
)
# Model types known to mix sequences when packed, and why (shown on qwen3_5_text in tests/test_packing.py; the
# other two run the same Gated DeltaNet code in transformers 5.23).
_MIXES_SEQUENCES = {
    "qwen3_5_text": _GATED_DELTANET,
    "qwen3_5_moe_text": _GATED_DELTANET,
    "qwen3_next": _GATED_DELTANET,
}


def model_refusal(config) -> str | None:
    """Why a model of ``config`` (a transformers config; a VLM's text config is read) cannot be packed
    exactly here, or None when it can."""
    text = config.get_text_config()
    model_type = text.model_type
    if model_type in _MIXES_SEQUENCES:
        return _MIXES_SEQUENCES[model_type]
    if model_type not in PACKED_MODEL_TYPES:
        return f"model type {model_type!r} is not one packing was checked on ({', '.join(PACKED_MODEL_TYPES)})"
    attention = text._attn_implementation
    if attention not in PACKED_ATTENTION:
        return (
            f"attention implementation {attention!r} is not one packing was checked on ({', '.join(PACKED_ATTENTION)})"
        )
    other = sorted({kind for kind in getattr(text, "layer_types", None) or () if kind != "full_attention"})
    if other:
        return f"layers of type {other} were not checked packed (only full attention was)"
    return None


def batch_refusal(attention_mask: torch.Tensor, logits_to_keep: int) -> str | None:
    """Why the micro-batch of ``attention_mask`` (``(B, L)``, completions in the last ``logits_to_keep``
    columns) cannot be packed, or None when it can.

    A row must be one contiguous run of tokens (TRL's left-padded prompt and right-padded completion are),
    since a gap would change the distances RoPE sees; a row's first token must not be a completion token,
    since packed it would be predicted from the end of the row before it; and the batch must hold a token.
    """
    real = attention_mask.bool()
    starts = real & ~torch.nn.functional.pad(real, (1, 0))[:, :-1]
    if (starts.sum(dim=1) > 1).any():
        return "a row has padding between its tokens"
    first = starts.float().argmax(dim=1)
    if ((first >= real.size(1) - logits_to_keep) & real.any(dim=1)).any():
        return "a row's completion has no prompt token before it"
    if not real.any():
        return "the micro-batch has no tokens"
    return None


@dataclass(frozen=True)
class PackedBatch:
    """One padded micro-batch packed into one row (see :func:`pack`).

    Attributes:
        input_ids: ``(1, T)``, the real tokens of every row, row after row.
        position_ids: ``(1, T)``, each row's positions from 0.
        labels: ``(1, T)``, the token at completion positions and -100 everywhere else.
        scored: ``(B, logits_to_keep)`` bool, the completion cells that hold a real token.
        sources: for each True cell of ``scored`` in row-major order, the index of the output that
            predicts it among the ``T - 1`` shifted per-position outputs of the fused LM head.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    scored: torch.Tensor
    sources: torch.Tensor

    def unpack(self, per_position: torch.Tensor) -> torch.Tensor:
        """``per_position`` (``(1, T - 1)``: output ``p`` is about packed token ``p + 1``, as the fused LM
        head returns ``log_probs`` and ``entropy``) as TRL's ``(B, logits_to_keep)`` grid, zeros at padding.
        Differentiable: gradients flow back to the packed outputs."""
        return per_position.new_zeros(self.scored.shape).masked_scatter(self.scored, per_position[0, self.sources])


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> PackedBatch:
    """Pack the ``(B, L)`` micro-batch ``input_ids``/``attention_mask`` (left-padded prompts, right-padded
    completions in the last ``logits_to_keep`` columns) into one row of its real tokens.

    Call :func:`batch_refusal` first: a row with padding between its tokens, or a completion with no
    prompt before it, would be packed wrongly.
    """
    real = attention_mask.bool()
    completion = torch.zeros_like(real)
    completion[:, real.size(1) - logits_to_keep :] = True
    scored_grid = real & completion
    # Boolean indexing walks the grid row-major: rows in order, each row's tokens left to right.
    packed_ids = input_ids[real]
    positions = (real.long().cumsum(dim=1) - 1)[real]
    scored = scored_grid[real]
    labels = packed_ids.masked_fill(~scored, -100)
    return PackedBatch(
        input_ids=packed_ids[None],
        position_ids=positions[None],
        labels=labels[None],
        scored=scored_grid[:, real.size(1) - logits_to_keep :],
        # the fused head's output p predicts token p + 1
        sources=scored.nonzero().squeeze(1) - 1,
    )
