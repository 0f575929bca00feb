"""The BenchJudge scoring path: each benchmark's own judge prompt, run on the shared judge checkpoint.

Source of truth: the paper's "Benchmark-specific judge prompts" paragraph (its benchmark
appendix) and its judge-prompt figures for MM-Vet, MultiChallenge, MMVU, HLE and CharXiv
(Reasoning and Descriptive). The settings with ``TaskSpec.scoring == "benchjudge"`` are scored
this way; each benchmark module defines its template, how a row fills it and how the judge's
reply is read (`TaskSpec.bench_judge`). The judge is the shared checkpoint at
`spec.JUDGE_DECODING` (temperature 0, 512 tokens); one call per item, no retries.

What is verbatim and what is reconstructed. The paper's figures "give the executed instruction
text and runtime fields"; every template constant is that text, with LaTeX rendered as plain
text (ASCII quotes for LaTeX quote ligatures, ``∈`` and ``–`` where the figure typesets them).
The paper shortens two static blocks "for space": the rest of MM-Vet's few-shot table and the
per-category CharXiv rubric bodies. Those are reconstructed from the upstream evaluators and
marked ``RECONSTRUCTED`` where they are defined, with the upstream file and commit. Line breaks
are not recoverable from a typeset figure; where the figure does not show them they follow the
upstream evaluator.

Parsers never raise: a reply they cannot read scores 0 with ``parsed=False``. A row missing a
field the prompt needs raises ValueError naming it. This module dispatches on the setting:
`render_bench_judge` / `score_bench_judge`. Pure: no TRL, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .spec import EvalRequest, JudgeScore, TaskSpec
from .tasks import SUITE

__all__ = ["BENCH_JUDGE_SETTINGS", "JudgeScore", "render_bench_judge", "request_judge_prompt", "score_bench_judge"]

BENCH_JUDGE_SETTINGS = tuple(name for name, spec in SUITE.items() if spec.bench_judge is not None)
"""The settings scored by their benchmark's own judge prompt, as named in `tasks.SUITE`."""


def _judged(spec_name: str) -> TaskSpec:
    spec = SUITE.get(spec_name)
    if spec is None or spec.bench_judge is None:
        raise ValueError(f"{spec_name!r} is not a BenchJudge setting; those are {BENCH_JUDGE_SETTINGS}")
    return spec


def render_bench_judge(spec_name: str, row: Mapping[str, Any], response: str | None, part: Any = None) -> str:
    """The judge prompt of a BenchJudge setting for one row and one student response.

    ``part`` is for the settings whose rows carry several questions only (CharXiv:
    ``"reasoning"`` or the descriptive question index 1..4).
    """
    spec = SUITE.get(spec_name)
    judge = spec.bench_judge if spec is not None else None
    if judge is not None and judge.takes_part:
        return judge.render(row, response, part)
    if part is not None:
        with_parts = [
            name for name, each in SUITE.items() if each.bench_judge is not None and each.bench_judge.takes_part
        ]
        raise ValueError(f"part is for {', '.join(with_parts)} only, not {spec_name!r}")
    return _judged(spec_name).bench_judge.render(row, response)


def score_bench_judge(spec_name: str, row: Mapping[str, Any], reply: str | None) -> JudgeScore:
    """The judge's reply to `render_bench_judge`'s prompt, read by that setting's rule.

    The row is needed where the reading depends on it (MultiChallenge's ``pass_criteria``).
    Never raises on the reply; raises ValueError for an unknown setting or a row without the
    field it needs.
    """
    return _judged(spec_name).bench_judge.parse(row, reply)


def request_judge_prompt(spec: TaskSpec, request: EvalRequest, response: str | None) -> str:
    """The benchmark judge's prompt for one request's response (its part mapped as the judge takes it)."""
    judge = spec.bench_judge
    if judge is None:
        raise ValueError(f"{spec.name!r} is not a BenchJudge setting; those are {BENCH_JUDGE_SETTINGS}")
    if not judge.takes_part:
        return judge.render(request.row, response)
    part = judge.request_part(request.part) if judge.request_part is not None else request.part
    return judge.render(request.row, response, part)
