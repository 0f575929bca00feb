"""The teacher server's scores of the rows a step trains, for every row that declares them (``Needs.teacher_scores``):
its top-k log-probs at every completion position (the distillation rows, RSTG) or its log-prob of each sampled token
(KDRL, RLAD), asked in one concurrent batch per step and put on the micro-batches as fields the loss reads.

A sequence whose request failed leaves the loss (its completion mask zeroed, counted); a step where every request
failed is an error. Token ids cannot carry a question's images: image rows are refused (load the teacher next to the
student with ``distill_teacher`` instead).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .needs import SCORES_TOKEN_LOGPS, SCORES_TOP_K
from .partitioning import is_skipped

__all__ = [
    "TEACHER_LOGPS_FIELD",
    "TEACHER_TOPK_IDS",
    "TEACHER_TOPK_LOGPS",
    "attach_teacher_scores",
    "teacher_forced_rows",
]

# The micro-batch fields: the teacher's top-k ids and log-probs at each completion position, (B, C, k), and its
# log-prob of each sampled completion token, (B, C).
TEACHER_TOPK_IDS, TEACHER_TOPK_LOGPS = "teacher_topk_ids", "teacher_topk_logps"
TEACHER_LOGPS_FIELD = "teacher_logps"
# The step metric counting each kind's failed sequences.
_FAILED = {SCORES_TOP_K: "distill_teacher_failed", SCORES_TOKEN_LOGPS: "teacher_logps_failed"}


def attach_teacher_scores(
    teacher: Any, micro_batches: list[dict], kinds: Sequence[str], top_k: int, metrics: dict, only: str | None = None
) -> None:
    """Ask ``teacher``'s server for each of ``kinds`` (:data:`~zppo_trl.needs.SCORES_TOP_K`,
    :data:`~zppo_trl.needs.SCORES_TOKEN_LOGPS`) on every sequence this rank trains in the step and put them on the
    micro-batches; with ``only``, only the rows that field marks are sent, and only their micro-batches get the
    fields."""
    for kind in sorted(kinds):
        if kind == SCORES_TOP_K:
            _attach_top_k(teacher, micro_batches, top_k, metrics, only)
        else:
            _attach_token_logps(teacher, micro_batches, metrics, only)


def _attach_top_k(teacher: Any, micro_batches: list[dict], k: int, metrics: dict, only: str | None) -> None:
    rows = teacher_forced_rows(micro_batches, only)
    results = (
        teacher.sequence_logprobs_async([seq for _, _, seq, _ in rows], [n for *_, n in rows], k).result()
        if rows
        else []
    )
    for micro in _holding(rows):
        shape = (*micro["completion_ids"].shape, k)
        micro[TEACHER_TOPK_IDS] = torch.zeros(shape, dtype=torch.long, device=micro["completion_ids"].device)
        micro[TEACHER_TOPK_LOGPS] = torch.zeros(shape, device=micro["completion_ids"].device)

    def place(micro: dict, r: int, result) -> None:
        ids, logps = result
        micro[TEACHER_TOPK_IDS][r, : len(ids)] = torch.tensor(ids)
        micro[TEACHER_TOPK_LOGPS][r, : len(ids)] = torch.tensor(logps)

    metrics[_FAILED[SCORES_TOP_K]] = _place(teacher, rows, results, place)


def _attach_token_logps(teacher: Any, micro_batches: list[dict], metrics: dict, only: str | None) -> None:
    rows = teacher_forced_rows(micro_batches, only)
    results = (
        teacher.token_logprobs_async([seq for _, _, seq, _ in rows], [n for *_, n in rows]).result() if rows else []
    )
    for micro in _holding(rows):
        micro[TEACHER_LOGPS_FIELD] = torch.zeros(micro["completion_ids"].shape, device=micro["completion_ids"].device)

    def place(micro: dict, r: int, logps: list[float]) -> None:
        micro[TEACHER_LOGPS_FIELD][r, : len(logps)] = torch.tensor(logps)

    metrics[_FAILED[SCORES_TOKEN_LOGPS]] = _place(teacher, rows, results, place)


def teacher_forced_rows(micro_batches: list[dict], only: str | None = None) -> list[tuple]:
    """``(micro-batch, row, prompt + completion token ids, prompt length)`` of every sequence with a completion
    token in the trained micro-batches (with ``only``: the rows that field marks), for the teacher server to score
    teacher-forced. Token ids cannot carry a question's images: image rows are refused."""
    rows = []
    for micro in micro_batches:
        if is_skipped(micro) or (only is not None and only not in micro):
            continue
        wanted = [r for r in range(micro["completion_ids"].size(0)) if only is None or micro[only][r] > 0]
        if wanted and micro.get("pixel_values") is not None:
            raise ValueError(
                "the teacher server scores token ids, which cannot carry a question's images: for image "
                "questions set distill_teacher to load the teacher next to the student"
            )
        for r in wanted:
            completion = micro["completion_ids"][r][micro["completion_mask"][r].bool()]
            if completion.numel():
                prompt = micro["prompt_ids"][r][micro["prompt_mask"][r].bool()]
                rows.append((micro, r, prompt.tolist() + completion.tolist(), prompt.numel()))
    return rows


def _place(teacher: Any, rows: list[tuple], results: list, place: Callable) -> int:
    """Put each row's teacher result on its micro-batch with ``place(micro, row, result)``; a row whose request
    failed (None) leaves the loss (its completion mask zeroed). Returns the failed count; every row failing is an
    error."""
    failed = 0
    for (micro, r, _, _), result in zip(rows, results):
        if result is None:
            failed += 1
            micro["completion_mask"][r] = 0
        else:
            place(micro, r, result)
    if rows and failed == len(rows):
        raise RuntimeError(
            f"every teacher log-prob request of this step failed ({teacher.base_url}); see the warning above"
        )
    return failed


def _holding(rows: list[tuple]) -> list[dict]:
    """The micro-batches that hold the teacher-forced ``rows``, once each, in order."""
    return list({id(micro): micro for micro, *_ in rows}.values())
