"""Row-level surgery on TRL's scored rollout batches: concatenate rounds, select rows.

A ZPPO rollout step scores two rounds with `GRPOTrainer._generate_and_score_completions`
(plain prompts, then BCQ/NCQ prompts) and then regroups the rows into ``num_partitions``
optimizer mini-batches. Each round comes back as TRL's padded dict: prompts left-padded,
completions right-padded, per-token tensors as wide as the completions, and images as
one flat ``pixel_values`` tensor: Qwen-VL's patches indexed by ``image_grid_thw``/``num_images``,
InternVL's tiles by ``num_tiles`` (tiles per row), or one entry per image counted by
``num_images`` (Ovis2, and InternVL with one tile per image). This module merges such dicts and
picks rows out of them, padding every field the way TRL does.

A field this module does not know raises ``ValueError`` naming it, rather than being
merged wrongly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "MARKED_ROWS",
    "ROUND_ROW",
    "SELF_TEACHER_LOGPS",
    "SELF_TEACHER_MASK",
    "SELF_TEACHER_TOPK_IDS",
    "SELF_TEACHER_TOPK_LOGPS",
    "TARGET_ROWS",
    "TOKEN_TYPE_FIELDS",
    "concat_batches",
    "num_rows",
    "rows_alone",
    "select_rows",
]

# (B, P) fields, left-padded like the prompts; value = padding (None: the tokenizer's pad id)
_PROMPT_FIELDS = {"prompt_ids": None, "prompt_mask": 0}
# (B, C) fields, right-padded like the completions
_COMPLETION_FIELDS = {
    "completion_ids": None,
    "completion_mask": 0,
    "old_per_token_logps": 0.0,
    "sampling_per_token_logps": 0.0,
    "ref_per_token_logps": 0.0,
    "tool_mask": 1,
    "importance_sampling_ratio": 1.0,  # (B, C) per token, or (B, 1) per sequence
    "self_teacher_logps": 0.0,  # SDPO's self-teacher log-prob of each sampled token
    "self_teacher_mask": 0,  # 1 on the rollouts that have a self-teacher
    "self_teacher_topk_ids": 0,  # (B, C, k) OPSD's self-teacher top-k at each position
    "self_teacher_topk_logps": 0.0,
}
SELF_TEACHER_LOGPS, SELF_TEACHER_MASK = "self_teacher_logps", "self_teacher_mask"
# Rows a term's partition signal marks (the all-wrong groups', 1.0) and a term's teacher-forced target rows (1.0,
# trained with cross-entropy, never with RL).
MARKED_ROWS, TARGET_ROWS = "zero_variance_rows", "teacher_target_rows"
# Each micro-batch row's index in the rollout step's merged batch (the plain round's rows first), which the old
# log-probs read to find a row computed before the micro-batches existed; removed before the loss.
ROUND_ROW = "zppo_round_row"
# Per-token multimodal inputs: a prompt's image/video placeholder types, as wide as prompt + completion.
TOKEN_TYPE_FIELDS = ("token_type_ids", "mm_token_type_ids")
SELF_TEACHER_TOPK_IDS, SELF_TEACHER_TOPK_LOGPS = "self_teacher_topk_ids", "self_teacher_topk_logps"
# fields only some rounds carry (the self-teacher rows', on the plain round): the others' rows take the padding value
_OPTIONAL_FIELDS = (SELF_TEACHER_LOGPS, SELF_TEACHER_MASK, SELF_TEACHER_TOPK_IDS, SELF_TEACHER_TOPK_LOGPS)
# (B, P + C) fields spanning prompt and completion
_SEQUENCE_FIELDS = {"token_type_ids": 0, "mm_token_type_ids": 0}
# one value per row
_ROW_FIELDS = ("advantages",)
# images, kept per row between concat and select: {"pixel_values": [tensor per row], ...}
_IMAGE_FIELDS = ("pixel_values", "image_grid_thw", "num_images", "num_tiles")
# recomputed by the caller per optimizer mini-batch
_DROPPED = ("num_items_in_batch", "num_sequences_in_batch")


def num_rows(batch: Mapping) -> int:
    """Number of rollouts in ``batch``."""
    return int(batch["completion_ids"].size(0))


def _check_fields(batch: Mapping) -> None:
    known = {*_PROMPT_FIELDS, *_COMPLETION_FIELDS, *_SEQUENCE_FIELDS, *_ROW_FIELDS, *_IMAGE_FIELDS, *_DROPPED}
    unknown = sorted(set(batch) - known)
    if unknown:
        raise ValueError(
            f"ZPPOTrainer cannot regroup the rollout field(s) {unknown} this model produces; "
            "supported: text models and image inputs as pixel_values with image_grid_thw (Qwen-VL), num_tiles "
            "(InternVL) or one entry per image (Ovis2)"
        )
    if "pixel_values" in batch and "num_images" not in batch:
        raise ValueError("pixel_values without num_images: the images cannot be assigned to their rows")


def _pad_width(x: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    """``x`` padded along its second dimension (positions) to ``width``; trailing dimensions (a top-k) are kept."""
    missing = width - x.size(1)
    if missing <= 0:
        return x
    return F.pad(x, (0, 0) * (x.dim() - 2) + ((missing, 0) if left else (0, missing)), value=value)


def _per_row_images(batch: Mapping) -> tuple[list, list, list[int], list] | None:
    """Split flat image tensors into one entry per row: (pixel_values, image_grid_thw or None, image
    count, tile count or None) lists."""
    if "pixel_values" not in batch:
        return None
    if isinstance(batch["pixel_values"], list):  # already per row
        n = len(batch["pixel_values"])
        return (
            batch["pixel_values"],
            batch.get("image_grid_thw", [None] * n),
            list(batch["num_images"]),
            batch.get("num_tiles", [None] * n),
        )
    counts = [int(n) for n in batch["num_images"]]
    pixel_values = batch["pixel_values"]
    if "image_grid_thw" in batch:  # Qwen-VL: each image is prod(grid) patch rows
        grids = list(torch.split(batch["image_grid_thw"], counts))
        patches = [int(g.prod(-1).sum()) if g.numel() else 0 for g in grids]
        return list(torch.split(pixel_values, patches)), grids, counts, [None] * len(counts)
    if "num_tiles" in batch:  # InternVL: each row holds its images' tiles
        tiles = [int(n) for n in batch["num_tiles"]]
        return list(torch.split(pixel_values, tiles)), [None] * len(counts), counts, tiles
    if pixel_values.size(0) != sum(counts):
        raise ValueError(
            f"pixel_values has {pixel_values.size(0)} entries for {sum(counts)} images and neither image_grid_thw "
            "nor num_tiles says how they split"
        )
    return list(torch.split(pixel_values, counts)), [None] * len(counts), counts, [None] * len(counts)


def concat_batches(batches: Sequence[Mapping], pad_token_id: int) -> dict:
    """Stack the rows of several scored batches into one, padding to common widths.

    Images stay split per row in the result (``pixel_values``, and ``image_grid_thw`` or
    ``num_tiles`` where the model has them, as lists), ready for :func:`select_rows`;
    ``num_items_in_batch`` is dropped.
    """
    batches = [b for b in batches if b is not None]
    if not batches:
        raise ValueError("nothing to concatenate")
    for batch in batches:
        _check_fields(batch)
    prompt_width = max(b["prompt_ids"].size(1) for b in batches)
    completion_width = max(b["completion_ids"].size(1) for b in batches)
    out: dict = {}
    for name, pad in _PROMPT_FIELDS.items():
        value = pad_token_id if pad is None else pad
        out[name] = torch.cat([_pad_width(b[name], prompt_width, value, left=True) for b in batches])
    for name, pad in _COMPLETION_FIELDS.items():
        present = [name in b for b in batches]
        if not any(present):
            continue
        if not all(present) and name not in _OPTIONAL_FIELDS:
            raise ValueError(f"rollout field {name!r} is present in some rounds but not others")
        value = pad_token_id if pad is None else pad
        example = next(b[name] for b in batches if name in b)  # a round without the field: rows without the signal
        parts = [
            b[name]
            if name in b
            else example.new_full((num_rows(b), b["completion_ids"].size(1), *example.shape[2:]), value)
            for b in batches
        ]
        if all(p.dim() == 2 and p.size(1) == 1 for p in parts):  # per-sequence values
            out[name] = torch.cat(parts)
        else:
            out[name] = torch.cat([_pad_width(p, completion_width, value, left=False) for p in parts])
    for name, pad in _SEQUENCE_FIELDS.items():
        if not any(name in b for b in batches):
            continue
        parts = []
        for b in batches:
            width = b["prompt_ids"].size(1)
            full = b[name] if name in b else torch.zeros_like(torch.cat([b["prompt_ids"], b["completion_ids"]], 1))
            prompt_part, completion_part = full[:, :width], full[:, width:]
            parts.append(
                torch.cat(
                    [
                        _pad_width(prompt_part, prompt_width, pad, left=True),
                        _pad_width(completion_part, completion_width, pad, left=False),
                    ],
                    dim=1,
                )
            )
        out[name] = torch.cat(parts)
    out["advantages"] = torch.cat([b["advantages"] for b in batches])
    images = [_per_row_images(b) for b in batches]
    if any(i is not None for i in images):
        pixels, grids, counts, tiles = [], [], [], []
        for batch, split in zip(batches, images):
            if split is None:  # a round without images: rows carry none
                n = num_rows(batch)
                split = [None] * n, [None] * n, [0] * n, [0 if "num_tiles" in _keys(images) else None] * n
            pixels += split[0]
            grids += split[1]
            counts += split[2]
            tiles += split[3]
        out["pixel_values"], out["num_images"] = pixels, counts
        if any(g is not None for g in grids):
            out["image_grid_thw"] = grids
        if any(t is not None for t in tiles):
            out["num_tiles"] = [t or 0 for t in tiles]
    return out


def rows_alone(batch: Mapping) -> list[dict]:
    """Every row of a TRL-layout ``batch`` (a micro-batch) as a batch of its own, trimmed to its tokens and with
    its own images: exactly what :func:`select_rows` gives for that row of the batch it was selected from, so a
    rollout scored alone gives the same numbers from either."""
    known = {*_PROMPT_FIELDS, *_COMPLETION_FIELDS, *_SEQUENCE_FIELDS, *_ROW_FIELDS, *_IMAGE_FIELDS}
    rows = {"advantages": torch.zeros(num_rows(batch)), **{k: v for k, v in batch.items() if k in known}}
    regrouped = concat_batches([rows], pad_token_id=0)
    return [select_rows(regrouped, [j]) for j in range(num_rows(batch))]


def _keys(images: list) -> set[str]:
    """Which per-row image layouts the rounds' images use ("num_tiles" when any round counts tiles)."""
    return {"num_tiles" for split in images if split is not None and any(t is not None for t in split[3])}


def _trim(out: dict) -> None:
    """Drop the prompt columns that are padding in every row and the completion columns past
    the longest completion, in place.

    Rounds are padded to a common width when merged, so a mini-batch of short plain prompts
    would otherwise carry the BCQ/NCQ prompts' padding through every forward and backward.
    Dropping left padding shifts every position of a row by the same amount, which rotary
    (relative) position encodings do not see; masked columns never reach the loss.
    """
    prompt_width = out["prompt_ids"].size(1)
    real = out["prompt_mask"].bool().any(0)
    start = int(real.nonzero()[0]) if real.any() else prompt_width
    real = out["completion_mask"].bool().any(0)
    end = int(real.nonzero()[-1]) + 1 if real.any() else 0
    completion_width = out["completion_ids"].size(1)
    if start == 0 and end == completion_width:
        return
    for name in _PROMPT_FIELDS:
        out[name] = out[name][:, start:]
    for name in _COMPLETION_FIELDS:
        if (
            name in out
            and out[name].size(1) == completion_width
            and not (completion_width == 1 and name == "importance_sampling_ratio")
        ):
            out[name] = out[name][:, :end]
    for name in _SEQUENCE_FIELDS:
        if name in out:
            out[name] = torch.cat(
                [out[name][:, start:prompt_width], out[name][:, prompt_width : prompt_width + end]], dim=1
            )


def select_rows(batch: Mapping, rows: Sequence[int], trim: bool = True) -> dict:
    """The rows ``rows`` (repeats allowed) of a :func:`concat_batches` result, as a TRL batch.

    Images are flattened back into TRL's layout; a selection without any image carries
    no image fields. With ``trim``, padding columns no selected row uses are dropped
    (see :func:`_trim`).
    """
    index = torch.as_tensor(list(rows), dtype=torch.long)
    out: dict = {}
    for name, value in batch.items():
        if name in _IMAGE_FIELDS:
            continue
        out[name] = value.index_select(0, index.to(value.device))
    if trim:
        _trim(out)
    if "pixel_values" in batch:
        counts = [batch["num_images"][i] for i in rows]
        if sum(counts):
            with_images = [i for i in rows if batch["num_images"][i]]  # text-only rows hold None here
            out["pixel_values"] = torch.cat([batch["pixel_values"][i] for i in with_images])
            if "image_grid_thw" in batch:
                out["image_grid_thw"] = torch.cat([batch["image_grid_thw"][i] for i in with_images])
            if "num_tiles" in batch:
                out["num_tiles"] = [batch["num_tiles"][i] for i in rows]
            out["num_images"] = counts
    return out
