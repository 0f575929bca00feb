"""How often the teacher solves the student's hard questions (``zppo-eval teacher-capability``).

Source of truth: the paper's scope appendix (ZPPO needs a teacher that solves some of the student's
hard questions; the measured teacher-success rate is lowest at 9B) and its BCQ/NCQ audit, which
reads the rate on the questions the post-cap admits. Both come from what a ZPPO run already logs
per rollout step in ``metrics.jsonl`` (`zppo_trl.callbacks.JsonlMetricsCallback`):

* pre-cap, the split of Fig. system (a): of the hard questions with a parsed wrong answer,
  ``zppo/hard_bcq_possible`` have a graded-correct teacher rollout and ``zppo/hard_ncq_only`` none;
  the rate is ``bcq_possible / (bcq_possible + ncq_only)``;
* post-cap: ``zppo/teacher_success_rate`` is BCQ instances over the questions the post-cap admits.
  The run logs the rate, not its denominator, so the run's post-cap rate is the mean of the steps'.

One row per logged rollout step (a ``metrics.jsonl`` row with ``zppo/hard``; with ``logging_steps``
spanning several rollout steps a row is TRL's mean over them, which the sums below weight equally),
and a summary per run: its student family (the run's ``variant``, which names a non-Qwen family) and
the rates over the whole run and over its last three logged steps (the paper's audit reads three).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..callbacks import read_metrics

__all__ = ["CapabilityStep", "capability_steps", "capability_summary", "capability_table", "teacher_capability_main"]

METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class CapabilityStep:
    """One logged rollout step: its global step, the hard questions with a parsed wrong answer, those the
    teacher solved, and the post-cap teacher-success rate."""

    step: int
    hard: float
    solved: float
    post_cap_rate: float | None

    @property
    def rate(self) -> float | None:
        return self.solved / self.hard if self.hard else None


def capability_steps(rows: Sequence[Mapping]) -> list[CapabilityStep]:
    """The rollout steps of ``metrics.jsonl`` rows that log the hard-question split (a ZPPO/BCQ row)."""
    steps = []
    for row in rows:
        if row.get("zppo/hard_bcq_possible") is None or row.get("zppo/hard_ncq_only") is None:
            continue
        solved, unsolved = float(row["zppo/hard_bcq_possible"]), float(row["zppo/hard_ncq_only"])
        post = row.get("zppo/teacher_success_rate")
        steps.append(
            CapabilityStep(int(row.get("step", 0)), solved + unsolved, solved, None if post is None else float(post))
        )
    return steps


def capability_summary(steps: Sequence[CapabilityStep]) -> dict:
    """The pre-cap rate (sum solved / sum hard) and the mean post-cap rate, over the run and its last three steps."""

    def rates(part: Sequence[CapabilityStep]) -> dict:
        hard, solved = sum(s.hard for s in part), sum(s.solved for s in part)
        post = [s.post_cap_rate for s in part if s.post_cap_rate is not None]
        return {
            "steps": len(part),
            "hard": hard,
            "solved": solved,
            "rate": solved / hard if hard else None,
            "post_cap_rate": sum(post) / len(post) if post else None,
        }

    return {"run": rates(steps), "last_3": rates(steps[-3:])}


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def capability_table(runs: Sequence[tuple[str, str | None, Sequence[CapabilityStep]]], per_step: bool = True) -> str:
    """Markdown: one summary row per run (label, family), then each run's per-step table."""
    lines = [
        "| Run | Student family | Steps | Teacher solves (pre-cap) | Last 3 steps | Post-cap rate (mean) |",
        "|---|---|---|---|---|---|",
    ]
    for label, family, steps in runs:
        s = capability_summary(steps)
        run, last = s["run"], s["last_3"]
        lines.append(
            f"| {label} | {family or 'Qwen3.5'} | {run['steps']} | {run['solved']:g}/{run['hard']:g} = "
            f"{_percent(run['rate'])} | {_percent(last['rate'])} | {_percent(run['post_cap_rate'])} |"
        )
    if per_step:
        for label, _family, steps in runs:
            lines += [
                "",
                f"{label}: per rollout step",
                "",
                "| Step | Hard (parsed) | Teacher solves | Rate | Post-cap rate |",
                "|---|---|---|---|---|",
            ]
            lines += [
                f"| {s.step} | {s.hard:g} | {s.solved:g} | {_percent(s.rate)} | {_percent(s.post_cap_rate)} |"
                for s in steps
            ]
    return "\n".join(lines) + "\n"


def _family(rows: Sequence[Mapping]) -> str | None:
    """The student family a run's variant names (``ZPPO (InternVL3.5-2B)``), None for the Qwen default."""
    variant = next((row.get("variant") for row in rows if row.get("variant")), None) or ""
    return variant[variant.index("(") + 1 : variant.rindex(")")] if "(" in variant and ")" in variant else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zppo-eval teacher-capability",
        description="How often the teacher solves the student's hard questions, per run (student) and per "
        "rollout step, from the runs' metrics.jsonl (see docs/diagnostics.md).",
    )
    parser.add_argument(
        "runs", nargs="+", type=Path, metavar="RUN_DIR", help="training output_dirs (or their metrics.jsonl)"
    )
    parser.add_argument("--summary-only", action="store_true", help="only the per-run rows")
    return parser


def teacher_capability_main(argv: Sequence[str] | None = None) -> int:
    """``zppo-eval teacher-capability``; prints the table; 2 with one ``error:`` line for bad input."""
    args = _parser().parse_args(None if argv is None else list(argv))
    runs = []
    try:
        for path in args.runs:
            file = path / METRICS_FILE if path.is_dir() else path
            if not file.is_file():
                raise ValueError(f"{file} does not exist (a training run writes it in its output_dir)")
            rows = read_metrics(file)
            steps = capability_steps(rows)
            if not steps:
                raise ValueError(f"{file} logs no zppo/hard_bcq_possible: not a ZPPO (BCQ) run")
            label = os.path.basename(os.path.normpath(path if path.is_dir() else path.parent))
            runs.append((label, _family(rows), steps))
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(capability_table(runs, per_step=not args.summary_only))
    return 0
