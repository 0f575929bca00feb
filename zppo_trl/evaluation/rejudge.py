"""The judge sweep: finished runs' stored responses re-scored under other judges (``zppo-eval rejudge``).

Source of truth: the paper's appendix on evaluation-scoring robustness to the judge model and its
table caption. The control varies the judge alone: the scored responses stay fixed. The sweep
covers the settings the shared judge template decides once the deterministic scorer awards no
credit (the ``exact+judge`` and ``rule+judge`` paths: 11 of the 16 VLM, 8 of the 10 LLM and 4 of
the 5 Video settings). Det. settings (no judge) and BenchJudge settings (their benchmark's own
prompt) stay out. Each judge reads the very prompt the run's default judge read, stored in the
run's details (``judge_prompt``: the shared template's instruction text with its runtime fields
filled), at the shared judge decoding, and its reply goes through the same strict-JSON parser
and fallback (`runner.judge_score`: anything but ``{"verdict": "correct"}`` scores 0).

What is re-asked: in a swept setting, every item not skipped whose deterministic score is 0.
Items the deterministic step scored 1 keep their 1 under every judge, as in the run. Nothing is
generated again: the student endpoint is not needed.

A sweep directory holds::

    sweep.json                             the runs it covers (name, directory), fixed at its first call
    judges/<judge>/judge.json              the judge: its label, model, endpoint, extra body
    judges/<judge>/<run>/records/<setting>.jsonl   one line per verdict, appended as they come (resumable)
    judges/<judge>/results.json            per run and swept setting: score, verdicts re-asked, changed, unparsed
    table.md, table.json                   family averages over the swept settings, one row per judge

One judge per call: each judge has its own endpoint, key and request fields, and a judge whose
endpoint fails stops its own call only. Every call rewrites the table over all the judges the
directory holds; the default judge's row is each run's own stored scores, re-averaged over the
same swept settings so that the rows compare.

A refused judge prompt (the endpoint answers it with a client error, which retrying cannot
help) scores 0 as an unparsed verdict would, and is counted: the item set must stay the same in
every row. Requests that fail after the client's retries are not recorded; the call stops with
an error, and running it again asks only for what is missing.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..teacher import TeacherClient
from .aggregation import setting_score
from .arguments import json_object, label_slug, positive_int
from .parallel import run_all
from .runner import ask_judge, judge_score
from .stats import family_macro_averages, mean_and_stderr
from .store import RUN_FILE, EvaluationError, RecordStore, fingerprint, write_json
from .summaries import RESULTS_FILE, scored_by_pass
from .tasks import FAMILIES, FAMILY_NAMES, SUITE, TaskSpec

__all__ = [
    "SWEPT_SCORINGS",
    "StoredRun",
    "judge_sweep",
    "load_stored_run",
    "mean_and_population_std",
    "rejudge_items",
    "rejudge_main",
    "setting_result",
    "swept",
    "swept_settings",
    "sweep_table",
    "write_table",
]

logger = logging.getLogger(__name__)

SWEPT_SCORINGS = ("exact+judge", "rule+judge")
"""The scoring paths whose judge is the shared template: the settings the sweep covers."""

SWEEP_FILE = "sweep.json"
TABLE_FILE = "table.md"
TABLE_JSON = "table.json"

# The detail columns the sweep reads: what scores an item, and (for the items it re-asks) the prompt.
_SCORE_COLUMNS = ["key", "det_score", "score", "group", "skipped"]
_ASK_COLUMNS = ["key", "det_score", "judge_prompt", "skipped"]
_FAMILY_TITLES = {"vlm": "VLM", "llm": "LLM", "video": "Video"}


def swept(spec: TaskSpec) -> bool:
    """Whether the shared judge template decides this setting's zero-credit items (the sweep covers it)."""
    return spec.scoring in SWEPT_SCORINGS


def swept_settings(family: str | None = None) -> list[str]:
    """The swept settings in suite order, of one family or all."""
    names = FAMILIES[family] if family is not None else SUITE
    return [name for name in names if swept(SUITE[name])]


# ------------------------------------------------------------------ reading a finished run


@dataclass(frozen=True)
class StoredRun:
    """A finished ``zppo-eval run`` directory, as the sweep reads it.

    `settings` are its swept settings that have a score and a details file, in suite order;
    `passes` is the run's pass count; `judge_model` the default judge it was scored with.
    """

    name: str
    path: Path
    passes: int
    judge_model: str
    settings: tuple[str, ...]

    def details(self, setting: str, columns: Sequence[str], zero_credit_only: bool = False) -> list[dict]:
        """The setting's detail rows (only `columns`), NaN read as None; with `zero_credit_only`,
        only rows whose deterministic score is 0 are read (the prompts of the rest are never loaded)."""
        import pandas as pd

        filters = [("det_score", "==", 0.0)] if zero_credit_only else None
        frame = pd.read_parquet(self.path / "details" / f"{setting}.parquet", columns=list(columns), filters=filters)
        frame = frame.astype(object).where(frame.notna(), None)
        return frame.to_dict("records")


def load_stored_run(run_dir: str | Path) -> StoredRun:
    """Read a run directory's run.json and results.json and find its swept settings' details.

    Raises FileNotFoundError for a directory without run.json, results.json or the details of a
    swept setting it scored, and ValueError for a run scored without a judge or with no swept
    setting.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run directory")
    for name in (RUN_FILE, RESULTS_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path}: no {name}; is it the --output-dir of a finished `zppo-eval run`?")
    manifest = json.loads((path / RUN_FILE).read_text())
    results = json.loads((path / RESULTS_FILE).read_text())
    if not results.get("judged") or not manifest.get("judge_model"):
        raise ValueError(
            f"{path} was scored without a judge (--no-judge): its details hold no judge prompt to ask again"
        )
    scored = [name for name, entry in results.get("settings", {}).items() if entry.get("score") is not None]
    settings = tuple(name for name in SUITE if name in scored and swept(SUITE[name]))
    if not settings:
        raise ValueError(
            f"{path} scored none of the settings the shared judge decides ({', '.join(swept_settings())})"
        )
    missing = [name for name in settings if not (path / "details" / f"{name}.parquet").is_file()]
    if missing:
        raise FileNotFoundError(
            f"{path}: no per-sample details for {', '.join(missing)} (details/<setting>.parquet); "
            "resume the run with its own command to write them"
        )
    name = results.get("run_name") or manifest.get("run_name") or path.name
    return StoredRun(name, path, int(manifest["passes"]), manifest["judge_model"], settings)


# ------------------------------------------------------------------ which items, and how they score


def rejudge_items(spec: TaskSpec, rows: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The detail rows of one setting that the sweep asks each judge about.

    Those the deterministic step scored 0 and that were not skipped, on a swept setting; an item
    scored 1 keeps its 1 under every judge. ValueError for a setting outside the sweep, and for a
    selected row without its stored judge prompt (naming the key).
    """
    if not swept(spec):
        raise ValueError(
            f"{spec.name} is scored {spec.scoring!r}; the sweep covers the "
            f"{' and '.join(SWEPT_SCORINGS)} settings only"
        )
    chosen = []
    for row in rows:
        if row.get("skipped") or row.get("det_score") != 0.0:
            continue
        if not isinstance(row.get("judge_prompt"), str):
            raise ValueError(
                f"{spec.name}: item {row.get('key')!r} scored 0 but has no stored judge prompt; "
                "resume the run with its own command to judge it first"
            )
        chosen.append(dict(row))
    return chosen


def setting_result(
    spec: TaskSpec, rows: Sequence[Mapping[str, Any]], passes: int, verdicts: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """One setting's score (percent) with the zero-credit items scored by `verdicts`.

    `rows` are the setting's detail rows (``key``, ``det_score``, ``score``, ``group``,
    ``skipped``); `verdicts` maps the key of each item `rejudge_items` selects to its new score
    (None: the stored scores, the default judge). Per pass, the setting's own aggregation rule
    (`aggregation.setting_score`, skipped items left out as the run leaves them out); the score
    is the mean over passes. Returns ``score``, ``stderr`` (None with one pass), ``n`` (items of
    a pass) and ``changed`` (verdicts that differ from the stored ones). KeyError names a
    selected item `verdicts` lacks.
    """
    judgments, skips, changed = {}, {}, 0
    for row in rows:
        if row.get("skipped"):
            skips[row["key"]] = {"group": row.get("group")}
            continue
        score = row["score"]
        if verdicts is not None and row.get("det_score") == 0.0:
            if row["key"] not in verdicts:
                raise KeyError(f"{spec.name}: no verdict for item {row['key']!r}")
            changed += verdicts[row["key"]] != score
            score = verdicts[row["key"]]
        judgments[row["key"]] = {"score": float(score), "group": row.get("group")}
    by_pass, _, _ = scored_by_pass(spec, judgments, skips, passes)
    scores = [100.0 * setting_score(spec, items) for items in by_pass.values() if items]
    if not scores:
        raise ValueError(f"{spec.name}: no scored item in its details")
    mean, stderr = mean_and_stderr(scores)
    return {
        "score": round(mean, 4),
        "stderr": None if math.isnan(stderr) else round(stderr, 4),
        "n": len(next(items for items in by_pass.values() if items)),
        "changed": changed,
    }


# ------------------------------------------------------------------ asking one judge


def _check_runs(out_dir: Path, runs: Sequence[StoredRun]) -> None:
    names = [run.name for run in runs]
    if len(set(names)) != len(names) or len({label_slug(name) for name in names}) != len(names):
        raise ValueError(f"two runs share a name ({', '.join(names)}); give each run its own run_name")
    path = out_dir / SWEEP_FILE
    covered = [{"name": run.name, "path": str(run.path.resolve())} for run in runs]
    if path.exists():
        previous = json.loads(path.read_text())["runs"]
        if [entry["name"] for entry in previous] != names:
            raise ValueError(
                f"{out_dir} is the sweep of the runs {', '.join(entry['name'] for entry in previous)}, not "
                f"{', '.join(names)}; give the same runs in the same order, or use a new --output-dir"
            )
    write_json(path, {"runs": covered})


def _judge_dir(out_dir: Path, name: str, judge: TeacherClient) -> Path:
    """The judge's directory, after checking that it holds this judge (label, model and request fields)."""
    directory = out_dir / "judges" / label_slug(name)
    record = {"name": name, "model": judge.model, "base_url": judge.base_url, "extra_body": judge.extra_body}
    path = directory / "judge.json"
    if path.exists():
        previous = json.loads(path.read_text())
        for key in ("name", "model", "extra_body"):
            if previous.get(key) != record[key]:
                raise ValueError(
                    f"{directory} holds the judge with {key}={previous.get(key)!r}, not {record[key]!r}; "
                    "give this judge another --judge-name"
                )
    write_json(path, record)
    return directory


class _SettingSweep:
    """One run's setting under one judge: the selected items not yet answered, asked in parallel."""

    def __init__(self, judge: TeacherClient, store: RecordStore, concurrency: int):
        self.judge, self.store, self.concurrency = judge, store, concurrency
        self.failed = 0
        self.abort = threading.Event()
        self._lock = threading.Lock()

    def run(self, spec: TaskSpec, items: list[dict], label: str) -> None:
        todo = [item for item in items if self._pending(item)]
        bar = tqdm(total=len(items), initial=len(items) - len(todo), desc=label, unit="q", dynamic_ncols=True)
        try:
            run_all(
                lambda item: self._ask(spec, item), todo, concurrency=self.concurrency, abort=self.abort, progress=bar
            )
        finally:
            bar.close()

    def _digest(self, item: Mapping[str, Any]) -> str:
        # ties a verdict to the prompt it answered: a run resumed since (a new response) is asked again
        return fingerprint(item["judge_prompt"], self.judge.model)

    def _pending(self, item: Mapping[str, Any]) -> bool:
        return self.store.judgments.get(item["key"], {}).get("digest") != self._digest(item)

    def _ask(self, spec: TaskSpec, item: Mapping[str, Any]) -> None:
        if self.abort.is_set():
            return
        reply, error = ask_judge(self.judge, item["judge_prompt"])
        record = {"kind": "judgment", "key": item["key"], "digest": self._digest(item), "judge_reply": reply,
                  "judge_error": None}  # fmt: skip
        if reply is None:
            if not error.startswith("rejected: "):
                with self._lock:
                    self.failed += 1
                    # a dead endpoint fails every request after its retries: stop early
                    if self.failed >= max(8, self.concurrency):
                        self.abort.set()
                return
            record.update(judge_error=error, judge_score=0.0, judge_parsed=False)  # the fallback: scores 0
        else:
            score, parsed = judge_score(spec, {}, reply)  # the shared template's parser reads no row
            record.update(judge_score=score, judge_parsed=parsed)
        self.store.add(record)


def judge_sweep(
    runs: Sequence[StoredRun], judge: TeacherClient, out_dir: str | Path, name: str, concurrency: int = 32
) -> Path:
    """Ask `judge` (labelled `name`) about every selected item of `runs` into `out_dir`; returns its directory.

    Resumes what `out_dir` holds. Raises `EvaluationError` where the endpoint does not answer or
    requests failed after retries (the verdicts received stay recorded), ValueError where
    `out_dir` belongs to other runs or holds another judge under `name`.
    """
    out_dir = Path(out_dir)
    _check_runs(out_dir, runs)
    directory = _judge_dir(out_dir, name, judge)
    if not judge.health(timeout=30):
        raise EvaluationError(
            f"the judge endpoint {judge.base_url} (model {judge.model!r}) does not answer; see the warning above"
        )
    for run in runs:
        for setting in run.settings:
            spec = SUITE[setting]
            items = rejudge_items(spec, run.details(setting, _ASK_COLUMNS, zero_credit_only=True))
            store = RecordStore(directory / label_slug(run.name) / "records" / f"{setting}.jsonl")
            store.path.parent.mkdir(parents=True, exist_ok=True)
            sweep = _SettingSweep(judge, store, concurrency)
            sweep.run(spec, items, f"{run.name}/{setting}")
            del items
            if sweep.failed:
                raise EvaluationError(
                    f"{run.name}/{setting}: {sweep.failed} judgment(s) failed after retries (is the judge "
                    f"endpoint {judge.base_url} up?); the verdicts received are saved in {directory}; "
                    "run the same command again to resume"
                )
    return directory


def _verdicts(directory: Path, run: StoredRun, setting: str) -> tuple[dict[str, float], dict[str, int]]:
    """(key -> score, counts) of a judge's recorded verdicts on one run's setting."""
    path = directory / label_slug(run.name) / "records" / f"{setting}.jsonl"
    if not path.exists():
        return {}, {"judge_unparsed": 0, "judge_refused": 0}
    store = RecordStore(path)
    verdicts = {key: float(record["judge_score"]) for key, record in store.judgments.items()}
    counts = {
        "judge_unparsed": sum(1 for record in store.judgments.values() if record.get("judge_parsed") is False),
        "judge_refused": sum(1 for record in store.judgments.values() if record.get("judge_error")),
    }
    return verdicts, counts


def _judge_results(runs: Sequence[StoredRun], directory: Path) -> dict:
    """Per run: each swept setting's score under the judge of `directory` (or the default judge where None)."""
    results: dict[str, Any] = {"runs": {}}
    for run in runs:
        settings: dict[str, Any] = {}
        for setting in run.settings:
            spec = SUITE[setting]
            rows = run.details(setting, _SCORE_COLUMNS)
            asked = {row["key"] for row in rows if not row.get("skipped") and row.get("det_score") == 0.0}
            verdicts, counts = _verdicts(directory, run, setting)
            # a verdict for an item no longer asked (its run was resumed with a new response) is dropped
            verdicts = {key: value for key, value in verdicts.items() if key in asked}
            missing = len(asked) - len(verdicts)
            entry: dict[str, Any] = {"rejudged": len(asked), "missing": missing, **counts}
            if not missing:
                entry.update(setting_result(spec, rows, run.passes, verdicts))
            settings[setting] = entry
        complete = all(not entry["missing"] for entry in settings.values())
        scores = {name: entry["score"] for name, entry in settings.items() if "score" in entry}
        families = {family: round(value, 4) for family, value in family_macro_averages(scores).items()}
        results["runs"][run.name] = {"settings": settings, "families": families if complete else {}}
    return results


def _default_results(run: StoredRun) -> dict:
    settings = {
        name: setting_result(SUITE[name], run.details(name, _SCORE_COLUMNS), run.passes) for name in run.settings
    }
    scores = {name: entry["score"] for name, entry in settings.items()}
    return {"settings": settings, "families": {f: round(v, 4) for f, v in family_macro_averages(scores).items()}}


# ------------------------------------------------------------------ the table


def mean_and_population_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (ddof=0: the judges are the whole population), as the
    paper's ``Mean ± pop. std`` row."""
    array = np.asarray(list(values), dtype=float)
    if array.size == 0:
        raise ValueError("no values")
    return float(array.mean()), float(array.std(ddof=0))


def sweep_table(runs: Sequence[StoredRun], rows: Sequence[tuple[str, Mapping[str, Mapping[str, float]]]]) -> dict:
    """The sweep's table as data: one column per (run, family), one row per judge, and the summary row.

    `rows` are ``(judge label, {run name: {family: average}})``, the default judge first; a judge
    without a run's averages (verdicts missing) has None there, and the summary row (mean and
    population standard deviation over the judges that have the cell) leaves it out.
    """
    columns = [
        {"run": run.name, "family": family, "settings": [s for s in run.settings if SUITE[s].family == family]}
        for run in runs
        for family in FAMILY_NAMES
        if any(SUITE[s].family == family for s in run.settings)
    ]
    table_rows = [
        {"judge": label, "values": [averages.get(c["run"], {}).get(c["family"]) for c in columns]}
        for label, averages in rows
    ]
    summary = []
    for index in range(len(columns)):
        present = [row["values"][index] for row in table_rows if row["values"][index] is not None]
        summary.append(None if not present else dict(zip(("mean", "pop_std"), mean_and_population_std(present))))
    return {"columns": columns, "rows": table_rows, "summary": summary}


def _markdown(table: Mapping[str, Any], notes: Sequence[str]) -> str:
    def row(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    columns = table["columns"]
    header = ["Judge"] + [f"{c['run']} {_FAMILY_TITLES[c['family']]} ({len(c['settings'])})" for c in columns]
    lines = [
        "Family averages over the settings the shared judge decides; the scored responses are fixed, only the "
        "judge changes across rows. The first row is the default judge.",
        "",
        row(header),
        row(["---"] + ["---:"] * len(columns)),
    ]
    for entry in table["rows"]:
        lines.append(row([entry["judge"]] + ["n/a" if v is None else f"{v:.2f}" for v in entry["values"]]))
    lines.append(
        row(["Mean ± pop. std"] + ["n/a" if s is None else f"{s['mean']:.2f} ± {s['pop_std']:.2f}"
                                   for s in table["summary"]])
    )  # fmt: skip
    listed = "; ".join(f"{c['run']} {_FAMILY_TITLES[c['family']]}: {', '.join(c['settings'])}" for c in columns)
    lines += ["", f"Settings averaged: {listed}."]
    return "\n".join(lines + list(notes)) + "\n"


def write_table(out_dir: str | Path, runs: Sequence[StoredRun]) -> str:
    """Rebuild the table over every judge `out_dir` holds (each judge's results.json rewritten), the
    default judge first; writes table.md and table.json and returns the markdown."""
    out_dir = Path(out_dir)
    defaults = {run.name: _default_results(run) for run in runs}
    models = sorted({run.judge_model for run in runs})
    default_label = f"{models[0]} (default)" if len(models) == 1 else f"default (each run's own: {', '.join(models)})"
    rows = [(default_label, {name: result["families"] for name, result in defaults.items()})]
    notes = []
    for path in sorted((out_dir / "judges").glob("*/judge.json")):
        judge = json.loads(path.read_text())
        results = _judge_results(runs, path.parent)
        for run in runs:
            for setting, entry in results["runs"][run.name]["settings"].items():
                entry["default_score"] = defaults[run.name]["settings"][setting]["score"]
                if entry["missing"]:
                    notes.append(f"{judge['name']}: {entry['missing']} of {entry['rejudged']} verdicts missing on "
                                 f"{run.name}/{setting}; run its command again to finish.")  # fmt: skip
                if entry["judge_unparsed"]:
                    notes.append(f"{judge['name']}: {entry['judge_unparsed']} verdict(s) on {run.name}/{setting} "
                                 "did not parse and score 0" + (f" ({entry['judge_refused']} refused prompts)"
                                                                if entry["judge_refused"] else "") + ".")  # fmt: skip
        write_json(path.parent / RESULTS_FILE, {**judge, **results})
        rows.append((judge["name"], {name: entry["families"] for name, entry in results["runs"].items()}))
    table = sweep_table(runs, rows)
    text = _markdown(table, [""] + notes if notes else [])
    write_json(out_dir / TABLE_JSON, table)
    (out_dir / TABLE_FILE).write_text(text)
    return text


# ------------------------------------------------------------------ the command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zppo-eval rejudge",
        description="The judge sweep: re-ask another judge about the stored zero-credit items of finished runs' "
        "shared-judge settings (no re-generation), and tabulate family averages per judge against the default "
        "judge. One judge per call; every call rewrites the table over all the judges in --output-dir "
        "(resumable; see docs/evaluation.md).",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="finished `zppo-eval run` directories (columns)")
    parser.add_argument("--output-dir", required=True, type=Path, help="the sweep directory (created; resumed)")
    judge = parser.add_argument_group("the judge of this call (omit all: only rewrite the table)")
    judge.add_argument("--judge-base-url", help="its OpenAI-compatible endpoint, e.g. http://127.0.0.1:8001/v1")
    judge.add_argument("--judge-model", help="its served model name")
    judge.add_argument("--judge-name", help="its row label in the table (default: --judge-model)")
    judge.add_argument("--judge-extra-body", type=json_object, help="JSON merged into every judge request")
    judge.add_argument("--api-key-env", help="environment variable holding the endpoint's API key")
    judge.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take (default 600)")
    judge.add_argument("--max-retries", type=int, default=3, help="retries of a failed request (default 3)")
    judge.add_argument("--concurrency", type=positive_int, default=32, help="requests in flight (default 32)")
    return parser


def rejudge_main(argv: Sequence[str] | None = None) -> int:
    """``zppo-eval rejudge``; returns the exit code: 2 for bad input (one ``error:`` line), 1 for a failing
    judge endpoint (what was received is kept; the same command resumes), 0 otherwise."""
    args = _parser().parse_args(None if argv is None else list(argv))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    judge = None
    try:
        if bool(args.judge_base_url) != bool(args.judge_model):
            raise ValueError("give --judge-base-url and --judge-model together (or neither, to rewrite the table)")
        if args.judge_name is not None and not args.judge_model:
            raise ValueError("--judge-name labels the judge of --judge-model; give the judge's endpoint too")
        runs = [load_stored_run(path) for path in args.runs]
        if args.judge_model:
            judge = TeacherClient(
                args.judge_base_url, args.judge_model, max_concurrency=args.concurrency, timeout=args.timeout,
                max_retries=args.max_retries, api_key_env=args.api_key_env, extra_body=args.judge_extra_body,
            )  # fmt: skip
            judge_sweep(runs, judge, args.output_dir, args.judge_name or args.judge_model, args.concurrency)
        else:
            _check_runs(args.output_dir, runs)
        text = write_table(args.output_dir, runs)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except EvaluationError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        if judge is not None:
            judge.close()
    sys.stdout.write(text)
    print(f"table: {args.output_dir / TABLE_FILE}", file=sys.stderr)
    return 0
