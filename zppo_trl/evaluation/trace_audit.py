"""The trace-overlap audit of a training run (``zppo-eval audit-traces``).

Source of truth: the paper's appendix on the trace-overlap diagnostic and its judge figure. For
every question that graduated from the 0% admission bin, each of the ``G_S`` plain rollouts of the
group it graduated with (wrong ones included) is paired with the question's one fixed teacher
reference, and every judge labels the pair under the paper's memorization prompt
(`zppo_trl.prompts.MEMORIZATION_JUDGE_TEMPLATE`). The parser accepts only ``{"verdict":
"transfer"}`` and ``{"verdict": "memorization"}``; any other reply is *unparsed* and labels
nothing. A rollout counts toward the trace-overlap rate when at least two of the three judges
label it memorization.

With another number of judges the rule is the strict majority of the judges given (more than half
of them): two judges must both say memorization, one judge decides alone. That is not the paper's
protocol, and the summary says so (``paper_protocol: false``). An unparsed label is never a
memorization vote, so it can only lower the rate.

The run's ``audit_traces.jsonl`` (written with ``audit_traces: true``, `zppo_trl.trace_log`) holds
the rollouts and, for a row that shows BCQ prompts, the references. ``--references`` takes the
references of another run's file instead (the paper holds one reference per question across rows,
and GRPO†, the control, shows none). A graduated question without a reference is left out and counted.

An audit directory holds::

    audit.json                           the trace file, the references file and the judges, fixed at the first call
    judges/<judge>/records.jsonl         one line per verdict, appended as they come (resumable)
    questions.jsonl, table.md            per question: rollouts, each judge's memorization labels, flagged rollouts
    summary.json                         the trace-overlap rate (flagged / audited rollouts), per judge, agreement

Requests that fail after the client's retries are not recorded; the call stops with an error, and
running it again asks only for what is missing.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..prompts import render_memorization_judge
from ..teacher import TeacherClient
from ..trace_log import TRACE_LOG_NAME, AuditQuestion, read_trace_log
from .arguments import json_object, label_slug, positive_int
from .parallel import run_all
from .runner import ask_judge
from .store import EvaluationError, RecordStore, fingerprint, write_json

__all__ = [
    "MEMORIZATION",
    "PAPER_JUDGES",
    "TRANSFER",
    "audit_questions",
    "audit_summary",
    "audit_traces",
    "audit_traces_main",
    "flagged",
    "parse_memorization_verdict",
    "votes_needed",
]

logger = logging.getLogger(__name__)

MEMORIZATION, TRANSFER = "memorization", "transfer"
PAPER_JUDGES = 3
"""The paper's protocol: three judges from three model families, two of three to flag a rollout."""


def parse_memorization_verdict(reply: str | None) -> str | None:
    """``"memorization"`` or ``"transfer"`` for exactly the JSON object ``{"verdict": ...}`` with one of those
    values (JSON's own whitespace allowed); None for anything else: prose, code fences, other keys or casing."""
    if not isinstance(reply, str):
        return None
    try:
        value = json.loads(reply, object_pairs_hook=lambda pairs: pairs)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, list) or len(value) != 1 or value[0][0] != "verdict":
        return None
    verdict = value[0][1]
    return verdict if verdict in (MEMORIZATION, TRANSFER) else None


def votes_needed(judges: int) -> int:
    """Memorization labels that flag a rollout: a strict majority of the judges (two of the paper's three)."""
    if judges < 1:
        raise ValueError(f"the audit needs at least one judge, got {judges}")
    return judges // 2 + 1


def flagged(labels: Sequence[str | None]) -> bool:
    """Whether one rollout counts toward the trace-overlap rate: a strict majority of ``labels`` (one per
    judge; None for an unparsed reply) are memorization."""
    return sum(label == MEMORIZATION for label in labels) >= votes_needed(len(labels))


def audit_questions(trace_file: Path, references: Path | None = None) -> tuple[list[AuditQuestion], list[str]]:
    """The graduated questions that have a reference (from ``references`` where given, else the run's own),
    and the ids of those that have none."""
    questions = read_trace_log(trace_file)
    held = read_trace_log(references, graduated_only=False) if references is not None else questions
    kept, missing = [], []
    for key, question in questions.items():
        reference = held.get(key)
        if reference is None or reference.reference is None:
            missing.append(str(key))
            continue
        question.reference = reference.reference
        kept.append(question)
    return kept, missing


def _item_key(question: AuditQuestion, index: int) -> str:
    return f"{question.id}/{index}"


def _prompt(question: AuditQuestion, index: int) -> str:
    return render_memorization_judge(question.question, question.reference, question.rollouts[index])


class _JudgeRun:
    """One judge over every (rollout, reference) pair not yet answered, asked in parallel."""

    def __init__(self, judge: TeacherClient, store: RecordStore, concurrency: int):
        self.judge, self.store, self.concurrency = judge, store, concurrency
        self.failed = 0
        self.abort = threading.Event()
        self._lock = threading.Lock()

    def run(self, items: list[tuple[str, str]], label: str) -> None:
        todo = [(key, prompt) for key, prompt in items if self._pending(key, prompt)]
        bar = tqdm(total=len(items), initial=len(items) - len(todo), desc=label, unit="pair", dynamic_ncols=True)
        try:
            run_all(lambda item: self._ask(*item), todo, concurrency=self.concurrency, abort=self.abort, progress=bar)
        finally:
            bar.close()

    def _pending(self, key: str, prompt: str) -> bool:
        # a verdict is tied to the prompt it answered: another reference or rollout is asked again
        return self.store.judgments.get(key, {}).get("digest") != fingerprint(prompt, self.judge.model)

    def _ask(self, key: str, prompt: str) -> None:
        if self.abort.is_set():
            return
        reply, error = ask_judge(self.judge, prompt)
        if reply is None and not error.startswith("rejected: "):
            with self._lock:
                self.failed += 1
                if self.failed >= max(8, self.concurrency):  # a dead endpoint: stop early
                    self.abort.set()
            return
        self.store.add(
            {
                "kind": "judgment",
                "key": key,
                "digest": fingerprint(prompt, self.judge.model),
                "judge_reply": reply,
                "judge_error": error or None,
                "label": parse_memorization_verdict(reply),
            }
        )


def _check_audit(out_dir: Path, trace_file: Path, references: Path | None, names: Sequence[str]) -> None:
    """Fix the audit's inputs and judges at its first call; a later call must name the same."""
    record = {
        "traces": str(trace_file.resolve()),
        "references": None if references is None else str(references.resolve()),
        "judges": list(names),
    }
    path = out_dir / "audit.json"
    if path.exists():
        previous = json.loads(path.read_text())
        for key in ("traces", "references", "judges"):
            if previous.get(key) != record[key]:
                raise ValueError(
                    f"{out_dir} is the audit of {key}={previous.get(key)!r}, not {record[key]!r}; give the same "
                    "inputs and judges, or use a new --output-dir"
                )
    write_json(path, record)


def audit_traces(
    trace_file: Path,
    judges: Sequence[tuple[str, TeacherClient]],
    out_dir: Path,
    references: Path | None = None,
    concurrency: int = 32,
) -> dict:
    """Ask every judge about every (rollout, reference) pair of the run into ``out_dir``; returns the summary
    (also written, with the per-question table). Resumes what ``out_dir`` holds. Raises `EvaluationError` where
    a judge does not answer or requests failed after retries (the verdicts received stay recorded)."""
    names = [name for name, _ in judges]
    if len({label_slug(name) for name in names}) != len(names):
        raise ValueError(f"two judges share a name ({', '.join(names)}); give each its own --judge-name")
    questions, missing = audit_questions(trace_file, references)
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_audit(out_dir, trace_file, references, names)
    items = [(_item_key(q, i), _prompt(q, i)) for q in questions for i in range(len(q.rollouts))]
    stores = {}
    for name, judge in judges:
        if not judge.health(timeout=30):
            raise EvaluationError(f"the judge endpoint {judge.base_url} (model {judge.model!r}) does not answer")
        store = RecordStore(out_dir / "judges" / label_slug(name) / "records.jsonl")
        store.path.parent.mkdir(parents=True, exist_ok=True)
        run = _JudgeRun(judge, store, concurrency)
        run.run(items, name)
        if run.failed:
            raise EvaluationError(
                f"{name}: {run.failed} verdict(s) failed after retries (is {judge.base_url} up?); the verdicts "
                f"received are saved in {store.path}; run the same command again to resume"
            )
        stores[name] = store
    labels = {
        name: {key: store.judgments[key]["label"] for key, _ in items if key in store.judgments}
        for name, store in stores.items()
    }
    return write_audit(out_dir, questions, missing, labels)


def audit_summary(
    questions: Sequence[AuditQuestion], missing: Sequence[str], labels: Mapping[str, Mapping[str, str | None]]
) -> tuple[list[dict], dict]:
    """(per-question rows, summary) from each judge's label per item key (``"<id>/<rollout>"``)."""
    names = list(labels)
    rows, totals = [], {"rollouts": 0, "flagged": 0, "agreed": 0}
    per_judge = {name: {"memorization": 0, "transfer": 0, "unparsed": 0} for name in names}
    for question in questions:
        row = {
            "id": question.id,
            "graduation_step": question.graduation_step,
            "rollouts": len(question.rollouts),
            "correct": sum(r > 0.5 for r in question.rewards),
            "memorization": dict.fromkeys(names, 0),
            "flagged": 0,
        }
        for index in range(len(question.rollouts)):
            votes = [labels[name].get(_item_key(question, index)) for name in names]
            for name, label in zip(names, votes):
                per_judge[name][label or "unparsed"] += 1
                row["memorization"][name] += label == MEMORIZATION
            row["flagged"] += flagged(votes)
            totals["agreed"] += len(set(votes)) == 1
        totals["rollouts"] += row["rollouts"]
        totals["flagged"] += row["flagged"]
        rows.append(row)
    n = totals["rollouts"]
    summary = {
        "judges": names,
        "votes_needed": votes_needed(len(names)),
        "paper_protocol": len(names) == PAPER_JUDGES,
        "questions": len(rows),
        "questions_without_reference": list(missing),
        "rollouts": n,
        "flagged": totals["flagged"],
        "trace_overlap_rate": totals["flagged"] / n if n else None,
        "all_judges_agree": totals["agreed"] / n if n else None,
        "per_judge": {
            name: {**counts, "memorization_rate": counts["memorization"] / n if n else None}
            for name, counts in per_judge.items()
        },
    }
    return rows, summary


def write_audit(
    out_dir: Path, questions: Sequence[AuditQuestion], missing: Sequence[str], labels: Mapping[str, Mapping]
) -> dict:
    """Write ``questions.jsonl``, ``table.md`` and ``summary.json``; returns the summary."""
    rows, summary = audit_summary(questions, missing, labels)
    with (out_dir / "questions.jsonl").open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    write_json(out_dir / "summary.json", summary)
    (out_dir / "table.md").write_text(_markdown(rows, summary))
    return summary


def _markdown(rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> str:
    names = summary["judges"]
    lines = [
        "| Question | Graduated at step | Rollouts (correct) | "
        + " | ".join(f"{n}: memorization" for n in names)
        + f" | Flagged ({summary['votes_needed']} of {len(names)}) |",
        "|---" * (4 + len(names)) + "|",
    ]
    for row in rows:
        cells = [str(row["id"]), str(row["graduation_step"]), f"{row['rollouts']} ({row['correct']})"]
        cells += [str(row["memorization"][name]) for name in names] + [str(row["flagged"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(_summary_text(summary))
    return "\n".join(lines) + "\n"


def _summary_text(summary: Mapping[str, Any]) -> str:
    rate = summary["trace_overlap_rate"]
    text = (
        f"Trace-overlap rate: {summary['flagged']}/{summary['rollouts']} rollouts"
        + ("" if rate is None else f" = {100 * rate:.1f}%")
        + f" of {summary['questions']} graduated question(s); a rollout is flagged when "
        f"{summary['votes_needed']} of {len(summary['judges'])} judge(s) label it memorization."
    )
    if not summary["paper_protocol"]:
        text += f" Not the paper's protocol ({PAPER_JUDGES} judges, two of three)."
    if summary["questions_without_reference"]:
        text += f" {len(summary['questions_without_reference'])} graduated question(s) have no reference: left out."
    if summary["all_judges_agree"] is not None:
        text += f" All judges agree on {100 * summary['all_judges_agree']:.1f}% of rollouts."
    return text


# ------------------------------------------------------------------ the command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zppo-eval audit-traces",
        description="The paper's trace-overlap audit of a training run (audit_traces: true): each judge labels "
        "every plain rollout of every question that graduated from the 0%% bin against the question's fixed "
        "teacher reference; a rollout is flagged by two of three judges (resumable; see docs/diagnostics.md).",
    )
    parser.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help=f"the training run's output_dir (its {TRACE_LOG_NAME})"
    )
    parser.add_argument(
        "--references",
        type=Path,
        help=f"another run's {TRACE_LOG_NAME} (or its output_dir) whose references to hold fixed "
        "(default: the run's own; GRPO† has none)",
    )
    parser.add_argument("--output-dir", type=Path, help="the audit directory (default: RUN_DIR/trace_audit; resumed)")
    judge = parser.add_argument_group("the judges (repeat each flag once per judge, in the same order)")
    judge.add_argument("--judge-base-url", action="append", required=True, help="an OpenAI-compatible endpoint")
    judge.add_argument("--judge-model", action="append", required=True, help="its served model name")
    judge.add_argument("--judge-name", action="append", help="its label (default: its model name)")
    judge.add_argument(
        "--judge-extra-body",
        action="append",
        type=json_object,
        help="JSON merged into its requests (give once for all judges, or once per judge)",
    )
    judge.add_argument(
        "--api-key-env",
        action="append",
        help="environment variable holding its API key (once for all judges, or once per judge)",
    )
    judge.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take (default 600)")
    judge.add_argument("--max-retries", type=int, default=3, help="retries of a failed request (default 3)")
    judge.add_argument(
        "--concurrency", type=positive_int, default=32, help="requests in flight per judge (default 32)"
    )
    return parser


def _per_judge(values: list | None, count: int, flag: str) -> list:
    """A repeatable flag's value for each judge: none, one for all, or one per judge."""
    if not values:
        return [None] * count
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise ValueError(f"{flag} is given {len(values)} times for {count} judges: give it once or once per judge")
    return values


def _trace_file(path: Path) -> Path:
    path = path / TRACE_LOG_NAME if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"{path} does not exist: train with audit_traces: true to write it")
    return path


def audit_traces_main(argv: Sequence[str] | None = None) -> int:
    """``zppo-eval audit-traces``; returns the exit code: 2 for bad input (one ``error:`` line), 1 for a failing
    judge endpoint (what was received is kept; the same command resumes), 0 otherwise."""
    args = _parser().parse_args(None if argv is None else list(argv))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    clients: list[TeacherClient] = []
    try:
        count = len(args.judge_model)
        if len(args.judge_base_url) != count:
            raise ValueError(
                f"{len(args.judge_base_url)} --judge-base-url for {count} --judge-model: give them in pairs"
            )
        names = args.judge_name or args.judge_model
        if len(names) != count:
            raise ValueError(f"{len(names)} --judge-name for {count} judges: name every judge or none")
        bodies = _per_judge(args.judge_extra_body, count, "--judge-extra-body")
        keys = _per_judge(args.api_key_env, count, "--api-key-env")
        if count != PAPER_JUDGES:
            logger.warning(
                "%d judge(s): a rollout is flagged by %d of them (the paper: two of three)", count, votes_needed(count)
            )
        trace_file = _trace_file(args.run_dir)
        references = _trace_file(args.references) if args.references is not None else None
        for url, model, body, key in zip(args.judge_base_url, args.judge_model, bodies, keys):
            clients.append(
                TeacherClient(
                    url,
                    model,
                    max_concurrency=args.concurrency,
                    timeout=args.timeout,
                    max_retries=args.max_retries,
                    api_key_env=key,
                    extra_body=body,
                )
            )
        out_dir = args.output_dir or args.run_dir / "trace_audit"
        summary = audit_traces(trace_file, list(zip(names, clients)), out_dir, references, args.concurrency)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except EvaluationError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        for client in clients:
            client.close()
    print(_summary_text(summary))
    print(f"table: {out_dir / 'table.md'}; summary: {out_dir / 'summary.json'}", file=sys.stderr)
    return 0
