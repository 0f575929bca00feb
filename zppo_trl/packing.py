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

Packing is exact only when every layer of the model sees those boundaries. Softmax attention does (the
block-diagonal mask), but a mask over the whole packed row costs the square of its length where the
sequences alone cost the sum of theirs. A linear-attention layer does not by itself: the Gated DeltaNet
layers of Qwen3.5 (the paper's students), Qwen3.5-MoE and Qwen3-Next carry a causal convolution and a
recurrent state that, in transformers' PyTorch path, run straight through the boundaries.
:func:`segment_packed_sequences` is the one patch point for both: each such layer runs once per packed
sequence, exactly as the sequence alone would run it (see its docstring). The boundaries reach the layer as
transformers' own packed-sequence keyword ``cu_seq_lens_q``, which the decoder layers pass through to it
(and which gradient checkpointing replays, so a recomputed layer is segmented too).

:func:`model_refusal` says why a model is not packed: only the model types and attention implementations
that ``tests/test_packing.py`` checks against each sequence run alone are packed. :func:`batch_refusal` says
why one micro-batch cannot be packed; :func:`multimodal_positions` gives a Qwen3.5 VLM's packed batch with
images its multimodal RoPE positions.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

import torch

__all__ = [
    "LINEAR_ATTENTION_LAYERS",
    "PACKED_MULTIMODAL_FIELDS",
    "ImageRows",
    "PACKED_ATTENTION",
    "PACKED_MODEL_TYPES",
    "PackedBatch",
    "batch_refusal",
    "model_refusal",
    "multimodal_positions",
    "multimodal_refusal",
    "pack",
    "segment_packed_sequences",
    "unpack_scored",
]

# Model types made only of softmax attention, whose masks transformers builds from packed position ids, each
# checked against the padded path in tests/test_packing.py (Qwen3: the text student of the tests; Llama:
# SmolLM2, the demo's student).
PACKED_MODEL_TYPES = ("llama", "qwen3")
# Hybrid model types (softmax attention interleaved with Gated DeltaNet linear attention) and the transformers
# module (``transformers.models.<module>.modeling_<module>``) and class of their linear-attention layer, which
# :func:`segment_packed_sequences` runs once per packed sequence. Each is checked in tests/test_packing.py
# against every sequence run alone (Qwen3.5 text and VLM: the paper's students) and its layer's forward
# signature in tests/test_trl_coupling.py.
LINEAR_ATTENTION_LAYERS = {
    "qwen3_5_text": ("qwen3_5", "Qwen3_5GatedDeltaNet"),
    "qwen3_5_moe_text": ("qwen3_5_moe", "Qwen3_5MoeGatedDeltaNet"),
    "qwen3_next": ("qwen3_next", "Qwen3NextGatedDeltaNet"),
}
# The attention implementations those tests run on CPU. flash_attention_2/3 take packed position ids too
# (a variable-length kernel), but nothing here can run them: they are refused until a GPU test checks them.
PACKED_ATTENTION = ("sdpa", "eager")
# VLM model types whose packed batches with images get their multimodal RoPE positions from
# :func:`multimodal_positions` (the model's own ``get_rope_index``), checked in tests/test_packing.py.
PACKED_MULTIMODAL_TYPES = ("qwen3_5", "qwen3_5_moe")
# The multimodal inputs such a batch may carry: the images' patches and grids, which packing keeps in row
# order (so in the order their placeholder tokens appear), and the token types the positions are read from.
PACKED_MULTIMODAL_FIELDS = ("pixel_values", "image_grid_thw", "num_images", "mm_token_type_ids")


def model_refusal(config) -> str | None:
    """Why a model of ``config`` (a transformers config; a VLM's text config is read) cannot be packed
    exactly here, or None when it can. A hybrid model packs once :func:`segment_packed_sequences` has
    segmented its linear-attention layers (ZPPOTrainer does it when ``padding_free`` is set)."""
    text = config.get_text_config()
    model_type = text.model_type
    if model_type not in PACKED_MODEL_TYPES and model_type not in LINEAR_ATTENTION_LAYERS:
        checked = ", ".join((*PACKED_MODEL_TYPES, *LINEAR_ATTENTION_LAYERS))
        return f"model type {model_type!r} is not one packing was checked on ({checked})"
    attention = text._attn_implementation
    if attention not in PACKED_ATTENTION:
        return (
            f"attention implementation {attention!r} is not one packing was checked on ({', '.join(PACKED_ATTENTION)})"
        )
    allowed = {"full_attention", "linear_attention"} if model_type in LINEAR_ATTENTION_LAYERS else {"full_attention"}
    other = sorted({kind for kind in getattr(text, "layer_types", None) or () if kind not in allowed})
    if other:
        return f"layers of type {other} were not checked packed (only {' and '.join(sorted(allowed))} were)"
    return None


def multimodal_refusal(config, present: list[str]) -> str | None:
    """Why a packed micro-batch carrying the multimodal inputs ``present`` (their names) cannot be packed
    for a model of ``config``, or None when it can (see :func:`multimodal_positions`)."""
    if not present:
        return None
    if config.model_type not in PACKED_MULTIMODAL_TYPES:
        return f"the batch carries multimodal inputs ({', '.join(present)})"
    other = [name for name in present if name not in PACKED_MULTIMODAL_FIELDS]
    if other:
        return f"the batch carries multimodal inputs packing was not checked with ({', '.join(other)})"
    return None


# The softmax-attention layer (``transformers.models.<module>.modeling_<module>``, class) of each packed model type,
# which :func:`segment_packed_sequences` runs once per packed sequence under sdpa: each sequence attends causally to
# itself alone (sdpa's causal kernel, no mask), so attention costs the sum of the squared sequence lengths rather
# than the square of the packed row's. Checked like the linear-attention layers.
SOFTMAX_ATTENTION_LAYERS = {
    "llama": ("llama", "LlamaAttention"),
    "qwen3": ("qwen3", "Qwen3Attention"),
    "qwen3_5_text": ("qwen3_5", "Qwen3_5Attention"),
    "qwen3_5_moe_text": ("qwen3_5_moe", "Qwen3_5MoeAttention"),
    "qwen3_next": ("qwen3_next", "Qwen3NextAttention"),
}


def _layer_class(table: dict, model_type: str) -> type | None:
    entry = table.get(model_type)
    if entry is None:
        return None
    module, name = entry
    return getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)


def segment_packed_sequences(model) -> int:
    """Make the layers of ``model`` that would otherwise see across packed sequences run once per sequence; returns
    how many layers were segmented (0 for a model packing does not know). Idempotent.

    The patch point, and the only one: each such layer's ``forward`` is wrapped on the instance (its class and every
    other model are untouched). The wrapper reads transformers' packed-sequence keyword ``cu_seq_lens_q`` (the
    cumulative sequence lengths ``[0, n_1, n_1 + n_2, ...]``, which the decoder layer passes to its token mixer
    with the rest of the model's keywords) and, for a batch of one packed row without a cache, calls the layer's
    own forward once per sequence on that sequence's slice and concatenates the outputs. Each sequence so goes
    through the very code it would alone, whichever kernels transformers picked:

    - the linear-attention (Gated DeltaNet) layers of the hybrid models (:data:`LINEAR_ATTENTION_LAYERS`), with
      no cache, so a fresh convolution window and recurrent state: exact where they would otherwise carry state
      across the boundary, at the price of one call per sequence instead of a variable-length kernel's one;
    - under sdpa, the softmax-attention layers (:data:`SOFTMAX_ATTENTION_LAYERS`), with their slice of the rotary
      embeddings and no mask (sdpa's causal kernel): the same numbers as the block-diagonal mask the position
      ids give, for the squared length of each sequence instead of the packed row's. Eager attention needs the
      mask for causality and keeps it.

    Any other call (no ``cu_seq_lens_q``, generation with a cache) is the layer's own forward unchanged.
    """
    text = model.config.get_text_config()
    wrappers = [(_layer_class(LINEAR_ATTENTION_LAYERS, text.model_type), _segmented_linear_attention)]
    if text._attn_implementation == "sdpa":
        wrappers.append((_layer_class(SOFTMAX_ATTENTION_LAYERS, text.model_type), _segmented_softmax_attention))
    segmented = 0
    for module in model.modules():
        for layer_class, wrapper in wrappers:
            if layer_class is not None and isinstance(module, layer_class):
                if not getattr(module, "_zppo_segmented", False):
                    module.forward = functools.partial(wrapper, module)
                    module._zppo_segmented = True
                segmented += 1
    return segmented


def _segments(hidden_states, cache, kwargs) -> list[tuple[int, int]] | None:
    """The packed sequences' ``(start, end)`` a segmented layer runs one by one, or None for a call to leave alone."""
    bounds = kwargs.get("cu_seq_lens_q")
    if bounds is None or cache is not None or hidden_states.size(0) != 1:
        return None
    bounds = bounds.tolist()
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _segmented_linear_attention(module, hidden_states, cache=None, attention_mask=None, **kwargs):
    """The forward of a segmented linear-attention layer (see :func:`segment_packed_sequences`)."""
    forward, segments = type(module).forward, _segments(hidden_states, cache, kwargs)
    if segments is None:
        return forward(module, hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    inner = {key: value for key, value in kwargs.items() if key not in PACKED_SEQUENCE_KWARGS}
    outputs = [
        forward(
            module,
            hidden_states[:, start:end],
            cache=None,
            attention_mask=None if attention_mask is None else attention_mask[:, start:end],
            **inner,
        )
        for start, end in segments
    ]
    return torch.cat(outputs, dim=1)


def _segmented_softmax_attention(
    module, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs
):
    """The forward of a segmented sdpa softmax-attention layer (see :func:`segment_packed_sequences`)."""
    forward, segments = type(module).forward, _segments(hidden_states, cache, kwargs)
    if segments is None:
        return forward(
            module,
            hidden_states,
            position_embeddings=position_embeddings,
            attention_mask=attention_mask,
            cache=cache,
            **kwargs,
        )
    inner = {key: value for key, value in kwargs.items() if key not in PACKED_SEQUENCE_KWARGS}
    positions = inner.pop("position_ids", None)
    cos, sin = position_embeddings
    outputs = []
    for start, end in segments:
        out, _ = forward(
            module,
            hidden_states[:, start:end],
            position_embeddings=(cos[:, start:end], sin[:, start:end]),
            attention_mask=None,  # sdpa: causal within the sequence alone
            cache=None,
            **({} if positions is None else {"position_ids": positions[..., start:end]}),
            **inner,
        )
        outputs.append(out)
    return torch.cat(outputs, dim=1), None


# transformers' keywords for packed sequences (its FlashAttentionKwargs), which the packed forward passes.
PACKED_SEQUENCE_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


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
        cu_seq_lens: ``(S + 1,)`` int32 on the CPU, where each of the ``S`` packed sequences (the rows with a
            token) starts, and ``T``: transformers' ``cu_seq_lens_q``.
        real: ``(B, L)`` bool, the padded grid's real tokens (what was packed, row-major).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    scored: torch.Tensor
    sources: torch.Tensor
    cu_seq_lens: torch.Tensor
    real: torch.Tensor

    def model_inputs(self, model=None, input_ids=None, images: dict | None = None) -> dict:
        """The keywords of the packed forward pass: the tokens, their per-sequence positions, the labels the
        fused LM head scores, and the sequence boundaries (transformers' packed-sequence keywords), which
        segmented linear-attention layers read (:func:`segment_packed_sequences`; unsegmented, transformers'
        PyTorch path refuses them). No attention mask: the position ids separate the sequences for softmax
        attention. With ``images`` (a Qwen3.5 VLM's, for these rows: :class:`ImageRows`), also the images and
        the multimodal RoPE positions (:func:`multimodal_positions`) of ``model`` (unwrapped) on the padded
        ``input_ids``."""
        if images and images.get("image_grid_thw") is not None:
            grid = images["image_grid_thw"]
            return {
                **self.model_inputs(),
                "position_ids": multimodal_positions(model, self, input_ids, images["mm_token_type_ids"], grid),
                "pixel_values": images["pixel_values"],
                "image_grid_thw": grid,
            }
        longest = int((self.cu_seq_lens[1:] - self.cu_seq_lens[:-1]).max())
        return dict(
            # a scoring pass: no cache (with one, transformers builds no packed-sequence mask from the position ids and
            # the segmented layers run the row whole)
            use_cache=False,
            input_ids=self.input_ids,
            position_ids=self.position_ids,
            labels=self.labels,
            cu_seq_lens_q=self.cu_seq_lens,
            cu_seq_lens_k=self.cu_seq_lens,
            max_length_q=longest,
            max_length_k=longest,
        )

    def unpack(self, per_position: torch.Tensor) -> torch.Tensor:
        """``per_position`` (``(1, T - 1)``: output ``p`` is about packed token ``p + 1``, as the fused LM
        head returns ``log_probs`` and ``entropy``) as TRL's ``(B, logits_to_keep)`` grid, zeros at padding.
        Differentiable: gradients flow back to the packed outputs."""
        return unpack_scored(per_position, self.scored, self.sources)


def unpack_scored(per_position: torch.Tensor, scored: torch.Tensor, sources: torch.Tensor) -> torch.Tensor:
    """A one-row layout's per-position outputs (``(1, T - 1)``) as TRL's ``(B, logits_to_keep)`` grid: the output at
    ``sources[i]`` into the ``i``-th True cell of ``scored`` (row-major), zeros elsewhere. Differentiable."""
    return per_position.new_zeros(scored.shape).masked_scatter(scored, per_position[0, sources])


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
    lengths = real.sum(dim=1)
    lengths = lengths[lengths > 0]
    return PackedBatch(
        input_ids=packed_ids[None],
        position_ids=positions[None],
        labels=labels[None],
        scored=scored_grid[:, real.size(1) - logits_to_keep :],
        # the fused head's output p predicts token p + 1
        sources=scored.nonzero().squeeze(1) - 1,
        # on the CPU: the segmented layers read the bounds as numbers, once per layer, with no device sync
        cu_seq_lens=torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32).cpu(),
        real=real,
    )


class ImageRows:
    """A Qwen3.5 VLM batch's multimodal inputs (:data:`PACKED_MULTIMODAL_FIELDS`), sliced by rows as TRL slices
    them for its chunks: each row's images
    (``num_images``) are consecutive in ``image_grid_thw``, and each image's patches (the product of its grid)
    consecutive in ``pixel_values``."""

    def __init__(self, multimodal: dict):
        self.multimodal = multimodal
        grid, counts = multimodal.get("image_grid_thw"), multimodal.get("num_images")
        if grid is not None:
            patches = grid.prod(dim=-1)
            images_before = torch.tensor([0, *counts]).cumsum(0)
            self.image_start = images_before.tolist()
            self.patch_start = torch.nn.functional.pad(patches.cumsum(0), (1, 0))[images_before].tolist()

    def rows(self, start: int, end: int) -> dict:
        """The multimodal inputs of rows ``start:end``."""
        out = {}
        if "mm_token_type_ids" in self.multimodal:
            out["mm_token_type_ids"] = self.multimodal["mm_token_type_ids"][start:end]
        if self.multimodal.get("image_grid_thw") is not None:
            out["image_grid_thw"] = self.multimodal["image_grid_thw"][self.image_start[start] : self.image_start[end]]
            out["pixel_values"] = self.multimodal["pixel_values"][self.patch_start[start] : self.patch_start[end]]
            out["num_images"] = self.multimodal["num_images"][start:end]
        return out


def multimodal_positions(model, packed: PackedBatch, input_ids, mm_token_type_ids, image_grid_thw) -> torch.Tensor:
    """The position ids of a Qwen3.5 VLM's packed batch with images: ``(4, 1, T)``, the text positions
    (each sequence's from 0, which the masks read to find the sequences) over the three multimodal RoPE
    axes, which the model's own ``get_rope_index`` gives each row of the padded ``input_ids`` (from its first
    real token, as the padded pass computes them) and packing gathers at the real tokens. ``model`` is the
    unwrapped VLM (``model.model.get_rope_index``)."""
    mrope, _ = model.model.get_rope_index(
        input_ids,
        mm_token_type_ids=mm_token_type_ids,
        image_grid_thw=image_grid_thw,
        attention_mask=packed.real.long(),
    )
    return torch.cat([packed.position_ids[None], mrope[:, packed.real][:, None]], dim=0)
