"""The dry run's memory plan: what one student training rank holds on its GPU during an update, at the
recipe's lengths, and whether that fits an 80 GB H100.

The layout is the paper's ("FSDP sharding: full-shard, bfloat16, rank-0 init";
``recipes/accelerate_configs/fsdp.yaml``): FSDP2 keeps each rank's shard of the weights, gradients and
optimizer state in float32 (accelerate upcasts the bf16 checkpoint for mixed precision), computes in
bf16, and gathers one decoder layer at a time (plus the next, prefetched) and the root module
(embeddings, LM head, vision tower) for the whole forward. The update's micro-batch is
``per_device_train_batch_size`` rows of the longest sequence the recipe can build (plain prompt + the
longest BCQ/NCQ block + ``max_completion_length``), the worst case a padded micro-batch reaches.

The estimate, per rank, in bytes (P parameters, N ranks, T micro-batch tokens, T_c its completion tokens,
H the hidden size, V the vocabulary, L decoder layers):

- weights 4P/N, gradients 4P/N, optimizer state 4P/N with AnyPrecisionAdamW's bf16 moments (8P/N with
  float32 ones; its Kahan buffer exists only for bf16 weights, and these are float32);
- gathered weights: the root module in bf16 for the whole pass, two decoder layers in bf16 and one
  layer's unsharded bf16 gradients, and the LM head's float32 weight gradient, which TRL's fused head
  accumulates whole (4 V H);
- activations with gradient checkpointing: every layer's input, L x T x H in bf16, plus one layer
  recomputed in the backward pass with its gradients (:func:`layer_activation_elements` per token, twice);
  without checkpointing every layer keeps its recompute set;
- the LM head: fused, one tile of TRL's kernel (4,096 tokens x 32,768 vocabulary entries in bf16) and the
  gathered hidden states with their float32 gradient (T_c x H x 6 bytes); unfused, the completion
  positions' logits and the float32 copies the log-softmax and its backward make (T_c x V x 14 bytes).

Padding (:class:`PaddingPlan`): a padded micro-batch is TRL's ``(B, L)`` grid, B rows x (its longest prompt + its
longest completion) tokens; packed (``padding_free``, :mod:`zppo_trl.packing`), it is the sum of its rows' own tokens.
Both are at most the worst case above, which is what activation memory must fit either way: no length distribution
is known before a run, so the plan says what each costs in terms of the lengths, and the bounds (a packed
micro-batch holds at least 1/B of its padded grid, so packing avoids at most 1 - 1/B of it).

``benchmarks/bench_memory.py`` checks the same arithmetic against the peak memory of real updates on a
CPU (float32, one process; :func:`plan_memory` with ``layout="single"``), and measures padded against packed
tokens on the micro-batches of a real run (``--part padding``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "GPU_BYTES",
    "KNOWN_STUDENTS",
    "Architecture",
    "MemoryPlan",
    "PaddingPlan",
    "UpdateShape",
    "activation_bytes",
    "architecture",
    "known_student_config",
    "layer_activation_elements",
    "optimizer_state",
    "packed_tokens",
    "packing_refusal",
    "padded_tokens",
    "padding_plan",
    "plan_memory",
    "update_shape",
]

GiB = 1024**3
# An "80 GB" H100: 81,559 MiB, less what the CUDA context, NCCL buffers and allocator fragmentation take
# (about 4 GiB on a training rank in practice).
GPU_BYTES = 81_559 * 1024**2
GPU_RESERVED = 4 * GiB
# TRL's fused LM-head kernel (trl.kernels.chunked_logprob): tokens per tile and vocabulary entries per tile
# (tests/test_trl_coupling.py guards both).
FUSED_TILE_TOKENS = 4096
FUSED_TILE_VOCAB = 32768
# Bytes per (completion token x vocabulary entry) on the unfused path: the bf16 logits (2), their float32 copy
# that the log-softmax reads (4, freed once used), the log-softmax output kept for the backward (4), and in the
# backward the dense gradient of that output (4) and of its input (4) at once, then its bf16 cast (2).
_UNFUSED_BYTES = {"bf16": 14, "fp32": 12}

# The paper's students, for planning where their config cannot be read (no Hub access, nothing cached). From
# transcriptions of their config.json files (no verbatim copy could be fetched here): for 0.8B a test fixture
# mirroring it (wlejon/brolm) and THUDM/slime's Megatron arguments; for 4B and 9B Qwen3.5 write-ups citing the
# official configs and configs of quantized and fine-tuned copies; for 2B copies of its model card. The parameter
# counts these give (0.853B, 2.213B, 4.539B, 9.410B) are the official safetensors' totals (4.66B and 9.65B for 4B
# and 9B) less their multi-token-prediction layer, which transformers does not load. Inferred, not found: 2B's tied
# embeddings (as 0.8B and 4B) and its vision MLP and heads (as 4B, whose vision tower has the same depth and width).
_SHARED_TEXT = dict(
    vocab_size=248320, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4
)
_SHARED_VISION = dict(patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304)
KNOWN_STUDENTS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3.5-0.8B": dict(
        tie_word_embeddings=True,
        text=dict(
            hidden_size=1024,
            intermediate_size=3584,
            num_hidden_layers=24,
            num_attention_heads=8,
            num_key_value_heads=2,
            linear_num_key_heads=16,
            linear_num_value_heads=16,
        ),
        vision=dict(depth=12, hidden_size=768, intermediate_size=3072, num_heads=12, out_hidden_size=1024),
    ),  # fmt: skip
    "Qwen/Qwen3.5-2B": dict(
        tie_word_embeddings=True,
        text=dict(
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=24,
            num_attention_heads=8,
            num_key_value_heads=2,
            linear_num_key_heads=16,
            linear_num_value_heads=16,
        ),
        vision=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048),
    ),  # fmt: skip
    "Qwen/Qwen3.5-4B": dict(
        tie_word_embeddings=True,
        text=dict(
            hidden_size=2560,
            intermediate_size=9216,
            num_hidden_layers=32,
            num_attention_heads=16,
            num_key_value_heads=4,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
        ),
        vision=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2560),
    ),  # fmt: skip
    "Qwen/Qwen3.5-9B": dict(
        tie_word_embeddings=False,
        text=dict(
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=32,
            num_attention_heads=16,
            num_key_value_heads=4,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
        ),
        vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, out_hidden_size=4096),
    ),  # fmt: skip
}


def known_student_config(name: str):
    """The `transformers` config of one of :data:`KNOWN_STUDENTS` (architecture fields only), or None."""
    known = KNOWN_STUDENTS.get(name)
    if known is None:
        return None
    from transformers import Qwen3_5Config

    tied = known["tie_word_embeddings"]
    return Qwen3_5Config(
        text_config={**_SHARED_TEXT, **known["text"], "tie_word_embeddings": tied},
        vision_config={**_SHARED_VISION, **known["vision"]},
        tie_word_embeddings=tied,
    )


@dataclass(frozen=True)
class Architecture:
    """What the plan needs of the student: its parameter count, the biggest decoder layer's (what FSDP
    gathers at once), the root module's (everything outside the decoder layers), and the text dimensions."""

    parameters: int
    largest_layer: int
    root: int
    hidden_size: int
    intermediate_size: int
    attention_width: int  # query + key + value + output-gate widths of a full-attention layer
    num_layers: int
    vocab_size: int
    attention: str | None = None  # the attention implementation transformers picks for it by default


def architecture(config: Any) -> Architecture:
    """The :class:`Architecture` of a `transformers` config, counted on a model built on the meta device
    (no memory, no weights): a VLM config as the trainer loads it (image-text-to-text), else a causal LM."""
    import transformers

    auto = (
        transformers.AutoModelForImageTextToText
        if getattr(config, "vision_config", None) is not None
        else transformers.AutoModelForCausalLM
    )
    with torch.device("meta"):
        model = auto.from_config(copy.deepcopy(config))  # the build resolves the attention implementation in place
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no *DecoderLayer modules to plan with")
    sizes = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    total = sum(p.numel() for p in model.parameters())
    text = config.get_text_config()
    heads, kv_heads = text.num_attention_heads, getattr(text, "num_key_value_heads", text.num_attention_heads)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    gate = 2 if getattr(text, "attn_output_gate", False) else 1
    return Architecture(
        parameters=total,
        largest_layer=max(sizes),
        root=total - sum(sizes),
        hidden_size=text.hidden_size,
        intermediate_size=text.intermediate_size,
        attention_width=(gate * heads + 2 * kv_heads) * head_dim,
        num_layers=len(layers),
        vocab_size=model.get_output_embeddings().weight.shape[0],
        attention=model.config.get_text_config()._attn_implementation,
    )


def layer_activation_elements(arch: Architecture) -> int:
    """Activations one decoder layer keeps per token for its backward pass, in elements: the two norms'
    outputs and the residual stream (3 H), the attention projections and their output (query, key, value,
    gate; then the attention output and the output projection: 2 x attention width + H), and the gated MLP's
    gate, up, activation and product (4 x intermediate) with its down projection (H)."""
    return 5 * arch.hidden_size + 2 * arch.attention_width + 4 * arch.intermediate_size


def activation_bytes(
    arch: Architecture, tokens: int, *, layout: str = "fsdp", gradient_checkpointing: bool = True
) -> int:
    """The activations an update keeps for ``tokens`` micro-batch tokens (bf16 under ``layout="fsdp"``, float32
    under ``"single"``): with gradient checkpointing every layer's input plus one layer recomputed with its gradients,
    without it every layer's recompute set and one more. Linear in ``tokens``, padded or packed alike."""
    act = 2 if layout == "fsdp" else 4
    per_layer = layer_activation_elements(arch) * tokens * act
    if gradient_checkpointing:
        return arch.num_layers * tokens * arch.hidden_size * act + 2 * per_layer
    return (arch.num_layers + 1) * per_layer


@dataclass(frozen=True)
class UpdateShape:
    """One update micro-batch: ``rows`` sequences of ``tokens_per_row`` tokens, ``completion_per_row`` of
    them completion tokens (the positions the loss reads)."""

    rows: int
    tokens_per_row: int
    completion_per_row: int

    @property
    def tokens(self) -> int:
        return self.rows * self.tokens_per_row

    @property
    def completion_tokens(self) -> int:
        return self.rows * self.completion_per_row


def optimizer_state(args: Any) -> int:
    """Bytes of optimizer state per (float32 master) parameter for a config's ``optim``/``optim_args``:
    AnyPrecisionAdamW's as :mod:`zppo_trl.optim` allocates it, every other optimizer AdamW's two float32
    moments."""
    from .optim import ANYPRECISION_OPTIM, anyprecision_kwargs, state_bytes_per_parameter

    if str(getattr(args.optim, "value", args.optim)) != ANYPRECISION_OPTIM:
        return 8
    return state_bytes_per_parameter(anyprecision_kwargs(args.optim_args), torch.float32)


def update_shape(args: Any) -> UpdateShape:
    """The worst-case micro-batch of a :class:`~zppo_trl.ZPPOConfig`: every row as long as the student's
    server context allows (plain prompt + the longest BCQ/NCQ block + completion)."""
    lengths = args.context_lengths()
    tokens = lengths.plain_prompt + lengths.block + lengths.completion
    return UpdateShape(args.per_device_train_batch_size, tokens, lengths.completion)


def _check_lengths(prompt_lengths: Sequence[int], completion_lengths: Sequence[int]) -> None:
    """A micro-batch's lengths: one prompt and one completion length per row."""
    if len(prompt_lengths) != len(completion_lengths):
        raise ValueError(f"{len(prompt_lengths)} prompt lengths, {len(completion_lengths)} completion lengths")


def padded_tokens(prompt_lengths: Sequence[int], completion_lengths: Sequence[int]) -> int:
    """The tokens of one micro-batch run padded: TRL's ``(B, L)`` grid, each row's prompt left-padded to the longest
    prompt of the micro-batch and its completion right-padded to the longest completion (the trainer drops the
    columns that are padding in every row: ``zppo_trl.batches.select_rows``)."""
    _check_lengths(prompt_lengths, completion_lengths)
    if not prompt_lengths:
        return 0
    return len(prompt_lengths) * (max(prompt_lengths) + max(completion_lengths))


def packed_tokens(prompt_lengths: Sequence[int], completion_lengths: Sequence[int]) -> int:
    """The tokens of the same micro-batch packed (``padding_free``): its rows' own tokens end to end, one row."""
    _check_lengths(prompt_lengths, completion_lengths)
    return sum(prompt_lengths) + sum(completion_lengths)


@dataclass(frozen=True)
class PaddingPlan:
    """Padded against packed tokens of one update micro-batch of ``rows`` rows, from the config alone.

    A padded micro-batch costs :func:`padded_tokens`, ``rows x (longest prompt + longest completion)``; packed it
    costs :func:`packed_tokens`, the sum of its rows' own tokens. Both reach :attr:`worst_case` (every row with
    the longest prompt, ``plain_prompt + block``, and the longest completion, ``completion``), which is what the
    memory plan sizes the activations for either way. The padded grid reaches its completion limit as soon as one
    row does; the packed row only grows with the rows' lengths. The packed row is never under 1/``rows`` of the
    padded grid (the rows with the longest prompt and the longest completion hold both lengths between them), so
    packing avoids between 0 (rows equally long) and :attr:`most_avoided` of it. How much, between the two, depends
    on the lengths a run samples, which no config says (``benchmarks/bench_memory.py --part padding`` measures it).

    ``padding_free`` is the config's; ``refusal`` why the student runs padded anyway (:func:`packing_refusal`;
    None: it packs).
    """

    rows: int
    plain_prompt: int
    block: int
    completion: int
    padding_free: bool
    refusal: str | None = None

    @property
    def packs(self) -> bool:
        """Whether the run's micro-batches go through the model packed."""
        return self.padding_free and self.refusal is None

    @property
    def worst_case(self) -> int:
        """The most tokens a micro-batch can hold, padded or packed (the memory plan's micro-batch)."""
        return self.rows * (self.plain_prompt + self.block + self.completion)

    @property
    def most_avoided(self) -> float:
        """The largest share of a padded micro-batch that packing can avoid: 1 - 1/rows."""
        return 1 - 1 / self.rows


def padding_plan(args: Any, refusal: str | None = None) -> PaddingPlan:
    """The :class:`PaddingPlan` of a :class:`~zppo_trl.ZPPOConfig`, at the lengths of :func:`update_shape`;
    ``refusal``: why its student runs padded even with ``padding_free`` (:func:`packing_refusal`)."""
    lengths = args.context_lengths()
    return PaddingPlan(
        rows=args.per_device_train_batch_size,
        plain_prompt=lengths.plain_prompt,
        block=lengths.block,
        completion=lengths.completion,
        padding_free=bool(args.padding_free),
        refusal=refusal,
    )


def packing_refusal(config: Any, attention: str | None) -> str | None:
    """Why ``ZPPOTrainer`` with ``padding_free`` would run a student of ``config`` padded, or None when it packs
    (:func:`zppo_trl.packing.model_refusal`), loaded with the attention implementation ``attention`` (the recipe's
    ``attn_implementation``, else transformers' default: :attr:`Architecture.attention`). For a vision-language
    student, a micro-batch with images may be refused on its own (:func:`zppo_trl.packing.multimodal_refusal`)."""
    from .packing import model_refusal, multimodal_refusal

    config = copy.deepcopy(config)
    config._attn_implementation = attention  # transformers sets it on the text and vision configs too
    refusal = model_refusal(config)
    if refusal is None and getattr(config, "vision_config", None) is not None:
        images = multimodal_refusal(config, ["pixel_values", "image_grid_thw"])
        if images is not None:
            refusal = f"micro-batches with images: {images}"
    return refusal


@dataclass(frozen=True)
class MemoryPlan:
    """The estimate: ``lines`` of ``(name, bytes)`` for everything but the LM head, the LM head's bytes fused
    and unfused, and which of the two the run uses (``fused``)."""

    lines: tuple[tuple[str, int], ...]
    fused_head: int
    unfused_head: int
    fused: bool = True

    def total(self, fused: bool | None = None) -> int:
        """The sum, with the run's LM head (or the one ``fused`` names)."""
        fused = self.fused if fused is None else fused
        return sum(size for _, size in self.lines) + (self.fused_head if fused else self.unfused_head)

    def fits(self, fused: bool | None = None, capacity: int = GPU_BYTES - GPU_RESERVED) -> bool:
        return self.total(fused) <= capacity


def plan_memory(
    arch: Architecture,
    shape: UpdateShape,
    ranks: int = 1,
    *,
    layout: str = "fsdp",
    optimizer_state_bytes: int = 8,
    gradient_checkpointing: bool = True,
    fused_head: bool = True,
) -> MemoryPlan:
    """The per-rank memory of one update (see the module docstring for each term).

    ``layout``: ``"fsdp"`` (full shard over ``ranks``, bf16 compute on CUDA) or ``"single"`` (one float32
    process on a CPU, nothing sharded or gathered: what ``benchmarks/bench_memory.py`` measures).
    ``optimizer_state_bytes``: optimizer state per parameter (8 for AdamW's float32 moments, 4 for bf16 ones:
    :func:`optimizer_state`).
    """
    if layout not in ("fsdp", "single"):
        raise ValueError(f"layout must be 'fsdp' or 'single', got {layout!r}")
    fsdp = layout == "fsdp"
    act = 2 if fsdp else 4  # activation bytes: bf16 compute, or float32
    shards = ranks if fsdp else 1
    p, h, v = arch.parameters, arch.hidden_size, arch.vocab_size
    activations = activation_bytes(arch, shape.tokens, layout=layout, gradient_checkpointing=gradient_checkpointing)
    lines = [
        ("weights (float32 shard)" if fsdp else "weights (float32)", 4 * p // shards),
        ("gradients (float32 shard)" if fsdp else "gradients (float32)", 4 * p // shards),
        (f"optimizer state ({optimizer_state_bytes} bytes per parameter)", optimizer_state_bytes * p // shards),
    ]
    if fsdp:
        gathered = 2 * arch.root + 3 * 2 * arch.largest_layer + 4 * v * h
        lines.append(("gathered weights (root, 2 layers, 1 layer's grads, LM-head grad)", gathered))
    checkpointing = "with" if gradient_checkpointing else "without"
    lines.append((f"activations ({checkpointing} gradient checkpointing)", activations))
    # TRL's kernel scores only the loss positions where Triton runs (CUDA); elsewhere it scores every position and
    # works each float32 tile with about seven temporaries of its size (its torch fallback).
    head_tokens = shape.completion_tokens if fsdp else shape.tokens
    tile = min(head_tokens, FUSED_TILE_TOKENS) * min(v, FUSED_TILE_VOCAB) * (act if fsdp else 7 * 4)
    fused = tile + head_tokens * h * (act + 4)
    unfused = shape.completion_tokens * v * _UNFUSED_BYTES["bf16" if fsdp else "fp32"]
    return MemoryPlan(tuple(lines), fused, unfused, fused_head)


def format_plan(plan: MemoryPlan, shape: UpdateShape, ranks: int, out: Callable[[str], object] = print) -> None:
    """The plan as the dry run prints it: one line per term, the LM head, the total, and whether it fits an
    80 GB H100 (and whether it would with the LM head the other way)."""

    def gib(size: int) -> str:
        return f"{size / GiB:6.1f} GiB"

    capacity = GPU_BYTES - GPU_RESERVED
    out(
        f"\nmemory plan (one student rank of {ranks}, FSDP full shard, bf16; micro-batch {shape.rows} rows x "
        f"{shape.tokens_per_row:,} tokens, {shape.completion_per_row:,} of them completion):"
    )
    for name, size in plan.lines:
        out(f"  {gib(size)}  {name}")
    head = plan.fused_head if plan.fused else plan.unfused_head
    out(f"  {gib(head)}  LM head ({'fused' if plan.fused else 'unfused: the completion logits'})")
    verdict = "fits" if plan.fits() else "DOES NOT FIT"
    out(f"  {gib(plan.total())}  total: {verdict} an 80 GB H100 ({capacity / GiB:.1f} GiB usable)")
    other = not plan.fused
    verdict = "fits" if plan.fits(other) else "would not fit"
    out(f"  {gib(plan.total(other))}  with the LM head {'fused' if other else 'unfused'}: {verdict}")


def format_padding(
    padding: PaddingPlan, activation_per_token: int | None = None, out: Callable[[str], object] = print
) -> None:
    """The dry run's padding lines: padded against packed tokens per micro-batch, which of the two the run uses,
    and what the memory plan sizes for (``activation_per_token``: its activations' bytes per token, or None)."""
    rows, completion, worst = padding.rows, padding.completion, padding.worst_case
    prompt = f"{padding.plain_prompt:,} + {padding.block:,}" if padding.block else f"{padding.plain_prompt:,}"
    if not padding.padding_free:
        state = "padding_free: false, so micro-batches run padded"
    elif padding.refusal is not None:
        state = f"padding_free: true, but the student runs padded: {padding.refusal}"
    else:
        state = "padding_free: true, and the student packs"
    padded_run, packed_run = ("", " (this run)") if padding.packs else (" (this run)", "")
    out(f"\npadding ({state}), tokens through the model per micro-batch of {rows} rows:")
    out(
        f"  padded{padded_run}: {rows} x (its longest prompt + its longest completion) <= {rows} x ({prompt} + "
        f"{completion:,}) = {worst:,}; one completion at the {completion:,}-token limit pads all {rows} rows to it"
    )
    out(
        f"  packed{packed_run}: the sum of its rows' own tokens, <= {worst:,} (every row at its limit), >= 1/{rows} "
        f"of the padded grid: it avoids 0 to {padding.most_avoided:.0%} of the padded tokens"
    )
    per_token = (
        "" if activation_per_token is None else f" ({activation_per_token / 1024:,.0f} KiB of activations each)"
    )
    out(
        f"  the plan above sizes {worst:,} tokens{per_token}, the worst case padded or packed; what a run avoids "
        "depends on its lengths (`benchmarks/bench_memory.py --part padding` measures it)"
    )
