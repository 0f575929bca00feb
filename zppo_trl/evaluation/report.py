"""Comparison reports over finished evaluation runs: the paper's tables, its bootstrap, a plot.

Input is the ``results.json`` a run of ``zppo-eval run`` leaves in its run directory (scores in
percent, one entry per setting that was run). Output is markdown in the paper's layout:

* `comparison_table`: one table per family, as the paper's main results table (the 16 VLM
  settings) and its generalization table (the 10 LLM and 5 Video blocks, each with its own Avg)
  print them: rows
  are runs, columns the settings in suite order and the family's macro average, the column
  maxima in bold (shared by ties), and a signed Δ row (last run minus the baseline).
* `bootstrap_table`: the layout of the paper's appendix table of bootstrap intervals for the
  main comparison, one row per family block, one column per
  comparator, ``Δ [low, high] (wins/n)`` from `stats.paired_bootstrap_table`.
* `family_plot`: grouped bars of the family macro averages.
* `official_table`: the benchmarks' own aggregations where they differ from the paper's rule
  (OCRBench v2's category means, answered-only accuracy, CharXiv's halves, ...), one row per
  setting and figure, labelled as not the setting's score; and the rule audit's counts where a
  run asked for one (``--audit-rule``).

`compare_main` is the ``zppo-eval compare`` command line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .stats import BootstrapResult, macro_average, paired_bootstrap, paired_bootstrap_table
from .summaries import RESULTS_FILE
from .tasks import FAMILIES, FAMILY_NAMES, SUITE, select

__all__ = [
    "RunResults",
    "bootstrap_table",
    "compare_main",
    "comparison_table",
    "family_plot",
    "load_run",
    "official_table",
]

FAMILY_TITLES = {"vlm": "VLM", "llm": "LLM", "video": "Video"}
"""How the paper's tables spell each family."""

INCOMPLETE_MARK = "‡"
"""Suffix of a cell whose setting ran on a subset or had skipped items (``complete: false``)."""


@dataclass(frozen=True)
class RunResults:
    """One finished evaluation run, as read from its ``results.json``.

    `scores` (percent) and `stderr` (over passes; NaN where the file gives none) hold the
    settings that have a score, in suite order; a setting the file lists with ``score: null``
    (nothing scored) is absent from both. `complete` is each scored setting's ``complete`` flag.
    `families` is the macro average of the run's scored settings per family, computed from
    `scores` (the same numbers the tables print), and `family_complete` whether the family has
    every suite setting, each complete. `raw` is the parsed file.
    """

    name: str
    scores: dict[str, float]
    stderr: dict[str, float]
    complete: dict[str, bool]
    families: dict[str, float]
    family_complete: dict[str, bool]
    path: Path
    raw: dict


def _results_path(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"no {RESULTS_FILE} in run directory {path.parent} (has the run finished a setting?)"
            )
    elif not path.is_file():
        raise FileNotFoundError(f"{path}: no such results file or run directory")
    return path


def _field(container: Mapping, key: str, where: str, file: Path) -> Any:
    if key not in container:
        raise ValueError(f"{file}: missing key {where + key!r}")
    return container[key]


def _number(value: Any, where: str, file: Path) -> float:
    # bool is an int subclass; true/false in a score field is a malformed file, not 1/0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{file}: {where!r} must be a number, got {value!r}")
    return float(value)


def load_run(path: str | Path) -> RunResults:
    """Read a run's ``results.json`` (`path` is the file or the run directory holding it).

    Raises FileNotFoundError where there is no such file, and ValueError naming the file and
    the offending key for a malformed one: invalid JSON, a missing ``run_name``/``settings``/
    per-setting ``score`` or ``complete``, a setting outside the suite or filed under the wrong
    family, a score that is not a finite percentage.
    """
    file = _results_path(path)
    try:
        raw = json.loads(file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{file}: not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: expected a JSON object at the top level, got {type(raw).__name__}")
    name = _field(raw, "run_name", "", file)
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{file}: 'run_name' must be a non-empty string, got {name!r}")
    settings = _field(raw, "settings", "", file)
    if not isinstance(settings, dict):
        raise ValueError(f"{file}: 'settings' must be an object of setting -> entry")
    scores: dict[str, float] = {}
    stderr: dict[str, float] = {}
    complete: dict[str, bool] = {}
    for setting in sorted(settings, key=lambda s: list(SUITE).index(s) if s in SUITE else -1):
        entry = settings[setting]
        where = f"settings.{setting}."
        if setting not in SUITE:
            raise ValueError(
                f"{file}: unknown setting {setting!r} under 'settings' (not in the suite: {', '.join(SUITE)})"
            )
        if not isinstance(entry, dict):
            raise ValueError(f"{file}: {where[:-1]!r} must be an object")
        if "family" in entry and entry["family"] != SUITE[setting].family:
            raise ValueError(
                f"{file}: {where + 'family'!r} is {entry['family']!r}; "
                f"the suite files {setting} under {SUITE[setting].family!r}"
            )
        score = _field(entry, "score", where, file)
        flag = _field(entry, "complete", where, file)
        if not isinstance(flag, bool):
            raise ValueError(f"{file}: {where + 'complete'!r} must be true or false, got {flag!r}")
        if score is None:  # the runner's entry for a setting where nothing was scored
            continue
        score = _number(score, where + "score", file)
        if not (math.isfinite(score) and 0.0 <= score <= 100.0):
            raise ValueError(f"{file}: {where + 'score'!r} must be a percentage in [0, 100], got {score!r}")
        error = entry.get("stderr")
        scores[setting] = score
        stderr[setting] = math.nan if error is None else _number(error, where + "stderr", file)
        complete[setting] = flag
    families = {
        family: macro_average(scores, family)
        for family in FAMILY_NAMES
        if any(name in scores for name in FAMILIES[family])
    }
    family_complete = {
        family: all(complete.get(setting, False) for setting in FAMILIES[family]) for family in families
    }
    return RunResults(name.strip(), scores, stderr, complete, families, family_complete, file, raw)


# ------------------------------------------------------------------ shared layout helpers


def _check_runs(runs: Sequence[RunResults]) -> list[RunResults]:
    runs = list(runs)
    if not runs:
        raise ValueError("no runs to compare")
    seen: dict[str, Path] = {}
    for run in runs:
        if run.name in seen:
            raise ValueError(
                f"two runs are named {run.name!r} ({seen[run.name]} and {run.path}); rename one (run_name)"
            )
        seen[run.name] = run.path
    return runs


def _find_run(runs: Sequence[RunResults], name: str, role: str) -> RunResults:
    for run in runs:
        if run.name == name:
            return run
    raise ValueError(f"{role} {name!r} is not one of the runs: {', '.join(run.name for run in runs)}")


@dataclass(frozen=True)
class _Columns:
    """The settings a report shows and the ones it leaves out, with why."""

    shown: list[str]
    partial: dict[str, list[str]]  # setting -> runs without a score for it
    absent: list[str]  # requested settings no run has


def _columns(runs: Sequence[RunResults], settings: Sequence[str] | None) -> _Columns:
    if settings is None:
        wanted = [name for name in SUITE if any(name in run.scores for run in runs)]
    else:
        unknown = [name for name in settings if name not in SUITE]
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(map(repr, unknown))}; settings: {', '.join(SUITE)}")
        wanted = [name for name in SUITE if name in set(settings)]  # suite order, whatever order was asked
    shown, partial, absent = [], {}, []
    for name in wanted:
        missing = [run.name for run in runs if name not in run.scores]
        if not missing:
            shown.append(name)
        elif len(missing) == len(runs):
            absent.append(name)
        else:
            partial[name] = missing
    if not shown:
        raise ValueError(
            "no setting is scored in every run" + (f" (asked: {', '.join(settings)})" if settings else "")
        )
    return _Columns(shown, partial, absent)


def _exclusion_notes(columns: _Columns, family: str) -> list[str]:
    notes = []
    partial = {name: runs for name, runs in columns.partial.items() if SUITE[name].family == family}
    if partial:
        listed = "; ".join(f"{name} (missing from {', '.join(runs)})" for name, runs in partial.items())
        notes.append(f"Not shown, not scored in every run: {listed}.")
    absent = [name for name in columns.absent if SUITE[name].family == family]
    if absent:
        notes.append(f"Not shown, in no run: {', '.join(absent)}.")
    return notes


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _delta(value: float, decimals: int = 2) -> str:
    text = f"{value:+.{decimals}f}"
    # a difference that rounds to zero prints unsigned, as the paper's \dzero cells do
    return f"{0.0:.{decimals}f}" if float(text) == 0.0 else text


def _family_title(family: str, count: int) -> str:
    return f"{count} {FAMILY_TITLES[family]} benchmark{'s' if count != 1 else ''}"


# ------------------------------------------------------------------ the comparison table


def comparison_table(
    runs: Sequence[RunResults],
    settings: Sequence[str] | None = None,
    baseline: str | None = None,
    stderr: bool = False,
) -> str:
    """The paper's main tables for `runs`, as markdown: one table per family, in suite order.

    Rows are the runs in the given order, columns the family's settings (default: every setting
    any run has; `settings` selects) followed by ``Avg``, the macro average over the shown
    settings with each setting weighted once. Cells print two decimals; the maximum of each
    column, compared as printed, is bold in every run row that attains it. With two or more runs
    a ``Δ`` row gives the last run minus `baseline` (a run name; default the first run) per
    column, signed. A setting that some runs lack is left out of every row, so that each Avg is
    over the same settings, and is named in a note under its family's table. With `stderr` each
    setting cell adds ``± stderr`` (over passes). A cell marked ``‡`` ran on a subset or had
    skipped items; its table's note names them.

    Raises ValueError for duplicate run names, an unknown setting or baseline, a baseline that
    is the last run, or when no setting is scored in every run.
    """
    runs = _check_runs(runs)
    columns = _columns(runs, settings)
    base = None
    if len(runs) > 1:
        base = runs[0] if baseline is None else _find_run(runs, baseline, "baseline")
        if base is runs[-1]:
            raise ValueError(
                f"baseline {base.name!r} is the last run; Δ is the last run minus the baseline, so name another run"
            )
    elif baseline is not None:
        _find_run(runs, baseline, "baseline")
    sections = []
    for family in FAMILY_NAMES:
        names = [name for name in columns.shown if SUITE[name].family == family]
        notes = _exclusion_notes(columns, family)
        if not names:
            if notes:
                sections.append(f"{FAMILY_TITLES[family]}: no setting is scored in every run. " + " ".join(notes))
            continue
        lines = _family_table(runs, family, names, base, stderr)
        incomplete = [
            f"{run.name}: {', '.join(name for name in names if not run.complete[name])}"
            for run in runs
            if not all(run.complete[name] for name in names)
        ]
        if incomplete:
            notes.append(f"{INCOMPLETE_MARK} ran on a subset (--max-samples) or with skipped items; "
                         f"Avg{INCOMPLETE_MARK} includes such a setting: {'; '.join(incomplete)}.")  # fmt: skip
        sections.append("\n".join(lines + ([""] + notes if notes else [])))
    if stderr:
        sections.append("± is the standard error over evaluation passes (0.00 with one pass); Avg cells carry none.")
    return "\n\n".join(sections) + "\n"


def _family_table(
    runs: Sequence[RunResults], family: str, names: list[str], base: RunResults | None, stderr: bool
) -> list[str]:
    header = [_family_title(family, len(names))] + names + ["Avg"]
    values = [
        [run.scores[name] for name in names] + [macro_average({n: run.scores[n] for n in names})] for run in runs
    ]
    printed = [[f"{value:.2f}" for value in row] for row in values]
    # the maximum as printed, so that two cells that read the same are both bold
    best = [max(float(row[col]) for row in printed) for col in range(len(header) - 1)]
    lines = [_row(header), _row(["---"] + ["---:"] * (len(header) - 1))]
    for run, row in zip(runs, printed, strict=False):
        cells = [_escape(run.name)]
        for col, text in enumerate(row):
            cell = f"**{text}**" if float(text) == best[col] else text
            if col < len(names):
                name = names[col]
                if stderr and math.isfinite(run.stderr[name]):
                    cell += f" ± {run.stderr[name]:.2f}"
                if not run.complete[name]:
                    cell += INCOMPLETE_MARK
            elif not all(run.complete[name] for name in names):
                cell += INCOMPLETE_MARK
            cells.append(cell)
        lines.append(_row(cells))
    if base is not None:
        last, first = values[-1], values[runs.index(base)]
        label = f"Δ ({_escape(runs[-1].name)} − {_escape(base.name)})"
        lines.append(_row([label] + [_delta(a - b) for a, b in zip(last, first, strict=False)]))
    return lines


# ------------------------------------------------------------------ the bootstrap table


def bootstrap_table(
    runs: Sequence[RunResults],
    target: str | None = None,
    resamples: int | None = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    settings: Sequence[str] | None = None,
) -> str:
    """The paper's appendix table of bootstrap intervals (main comparison) for `runs`, as markdown.

    One row per family block, one column per run other than `target` (a run name; default the
    last run), each cell ``Δ [low, high] (wins/n)``: the paired macro-average delta target minus
    that run over the block's settings, its percentile interval at `confidence`, and the
    settings where the target is higher. The numbers are `stats.paired_bootstrap_table`'s, so a
    row's columns share one resample (`resamples` draws with `seed`; None enumerates exactly,
    blocks of at most 10 settings). The settings are those every run has (or `settings`); the
    ones left out are named in a note. A block of one setting has no resampling distribution:
    its cell is the delta and win count alone, and a note says so.

    Raises ValueError for fewer than two runs, duplicate names, an unknown target or setting.
    """
    runs = _check_runs(runs)
    if len(runs) < 2:
        raise ValueError("the bootstrap compares runs: give at least two")
    chosen = runs[-1] if target is None else _find_run(runs, target, "target")
    others = [run for run in runs if run is not chosen]
    columns = _columns(runs, settings)
    blocks = {family: [n for n in columns.shown if SUITE[n].family == family] for family in FAMILY_NAMES}
    resampled = {family: names for family, names in blocks.items() if len(names) >= 2}
    single = {family: names for family, names in blocks.items() if len(names) == 1}
    shown = [name for names in resampled.values() for name in names]
    results: dict[str, dict[str, BootstrapResult]] = {}
    if shown:
        results = paired_bootstrap_table(
            {name: chosen.scores[name] for name in shown},
            {run.name: {name: run.scores[name] for name in shown} for run in others},
            resamples=resamples,
            seed=seed,
            confidence=confidence,
            families=resampled,
        )
    for family, names in single.items():
        # one setting: every resample is that setting, so the "interval" is the point itself
        results[family] = {
            run.name: paired_bootstrap(
                {names[0]: chosen.scores[names[0]]}, {names[0]: run.scores[names[0]]}, resamples=1, seed=seed
            )
            for run in others
        }
    level = f"{100 * confidence:g}%"
    draws = "the exact resampling distribution" if resamples is None else f"{resamples:,} resamples (seed {seed})"
    lines = [
        f"Paired setting-bootstrap: Δ [{level} CI] (Win) of the family macro average, {_escape(chosen.name)} minus "
        f"each run; {draws}, shared by the columns of a row; Win counts the settings where "
        f"{_escape(chosen.name)} is higher.",
        "",
        _row(["Family"] + [f"{_escape(chosen.name)} − {_escape(run.name)}" for run in others]),
        _row(["---"] * (len(others) + 1)),
    ]
    for family in FAMILY_NAMES:
        if family not in results:
            continue
        cells = []
        for run in others:
            result = results[family][run.name]
            if family in single:
                cells.append(f"{_delta(result.delta)} ({result.wins}/{result.n})")
            else:
                cells.append(str(result))
        label = f"{FAMILY_TITLES[family]} ({len(blocks[family])})"
        lines.append(_row([label] + cells))
    notes = [note for family in FAMILY_NAMES for note in _exclusion_notes(columns, family)]
    for family in single:
        notes.append(f"{FAMILY_TITLES[family]} has one setting ({single[family][0]}): its Δ has no interval.")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


# ------------------------------------------------------------------ the plot


def family_plot(runs: Sequence[RunResults], path: str | Path) -> Path:
    """Write a PNG of each run's family macro averages (grouped bars, one group per family).

    Each bar is `RunResults.families` (the run's own scored settings), labelled with its value;
    a family that lacks suite settings or has an incomplete one in that run is hatched and
    labelled "(incomplete)". The y axis starts at 0. Returns the written path.
    """
    # The Agg canvas directly, not pyplot: no global backend switch, no figure registry to leak.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = _check_runs(runs)
    path = Path(path)
    families = [family for family in FAMILY_NAMES if any(family in run.families for run in runs)]
    if not families:
        raise ValueError("no run has a scored setting to plot")
    figure = Figure(figsize=(max(6.0, 1.2 + 0.9 * len(families) * len(runs)), 4.5), dpi=120)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    width = 0.8 / len(runs)
    top = 0.0
    for index, run in enumerate(runs):
        xs = [position + (index - (len(runs) - 1) / 2) * width for position in range(len(families))]
        heights = [run.families.get(family, math.nan) for family in families]
        incomplete = [family in run.families and not run.family_complete[family] for family in families]
        bars = axes.bar(xs, heights, width, label=run.name, color=f"C{index % 10}")
        for bar, height, partial in zip(bars, heights, incomplete, strict=False):
            if math.isnan(height):
                continue
            top = max(top, height)
            if partial:
                bar.set_hatch("//")
            label = f"{height:.1f}" + ("\n(incomplete)" if partial else "")
            axes.annotate(label, (bar.get_x() + bar.get_width() / 2, height), xytext=(0, 2),
                          textcoords="offset points", ha="center", va="bottom", fontsize=8)  # fmt: skip
    axes.set_xticks(range(len(families)), [FAMILY_TITLES[family] for family in families])
    axes.set_ylim(0, max(top * 1.3, 1.0))  # head room for the labels and the legend
    axes.set_ylabel("macro average (%)")
    axes.set_title("Family macro averages")
    axes.legend(loc="upper center", ncol=min(len(runs), 4), fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


# ------------------------------------------------------------------ the benchmarks' own figures


def official_table(runs: Sequence[RunResults], settings: Sequence[str] | None = None) -> str:
    """The benchmarks' own aggregations and the rule audits of `runs`, as markdown ("" where none has any).

    One row per (setting, figure) that some run reports under ``official_aggregates``, in suite
    order, one column per run (``n/a`` where a run lacks it): these are what the benchmark's own
    script would print, not the setting's score, which follows the paper's rule. Then, where a
    run has ``rule_audit`` entries, one row per setting: the items the judge scored 0 of those
    the deterministic step scored 1 that it re-checked.
    """
    runs = _check_runs(runs)
    names = [name for name in SUITE if settings is None or name in set(settings)]
    figures = [
        (name, label)
        for name in names
        for label in dict.fromkeys(
            label for run in runs for label in run.raw["settings"].get(name, {}).get("official_aggregates", {})
        )
    ]
    sections = []
    header = [_row(["setting", "figure", *map(_escape, (run.name for run in runs))]), _row(["---"] * (2 + len(runs)))]
    if figures:
        lines = ["The benchmarks' own aggregations, beside the scores above (not the settings' scores):", ""]
        lines += header
        for name, label in figures:
            cells = []
            for run in runs:
                value = run.raw["settings"].get(name, {}).get("official_aggregates", {}).get(label)
                cells.append("n/a" if value is None else f"{_number(value, f'{name}.{label}', run.path):.2f}")
            lines.append(_row([name, _escape(label), *cells]))
        sections.append("\n".join(lines))
    audited = [name for name in names if any("rule_audit" in run.raw["settings"].get(name, {}) for run in runs)]
    if audited:
        lines = ["Rule audit: rule-positive items the shared judge scores 0, of those it re-checked:", ""]
        lines += [_row(["setting", *map(_escape, (run.name for run in runs))]), _row(["---"] * (1 + len(runs)))]
        for name in audited:
            cells = []
            for run in runs:
                audit = run.raw["settings"].get(name, {}).get("rule_audit")
                cells.append("n/a" if audit is None else f"{audit['judge_disagrees']}/{audit['checked']}")
            lines.append(_row([name, *cells]))
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + ("\n" if sections else "")


# ------------------------------------------------------------------ the command line


def _compare_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zppo-eval compare",
        description="The paper's tables for finished evaluation runs: per-family scores with Avg and Δ, "
        "optionally the paired setting-bootstrap and a plot of the family averages.",
    )
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run directories or their results.json, in row order")
    parser.add_argument(
        "--baseline", metavar="NAME", help="the run Δ subtracts from the last run (default: the first)"
    )
    parser.add_argument("--settings", nargs="+", metavar="SETTING",
                        help="settings or families to show, comma or space separated (default: every setting "
                             "any run has)")  # fmt: skip
    parser.add_argument("--stderr", action="store_true", help="add ± the standard error over passes to each cell")
    parser.add_argument("--bootstrap", action="store_true",
                        help="add the paired setting-bootstrap table (target: the last run, or --target)")  # fmt: skip
    parser.add_argument("--target", metavar="NAME", help="the bootstrap's target run (default: the last)")
    parser.add_argument("--plot", type=Path, metavar="OUT.png", help="write a bar plot of the family averages")
    parser.add_argument("--output", type=Path, metavar="OUT.md", help="also write the tables to this file")
    return parser


def compare_main(argv: Sequence[str] | None = None) -> int:
    """``zppo-eval compare``: print the comparison (and bootstrap) tables; returns the exit code.

    Bad input (a missing or malformed results file, an unknown setting or run name, --bootstrap
    with one run) prints one ``error: ...`` line to stderr and returns 2.
    """
    args = _compare_parser().parse_args(None if argv is None else list(argv))
    try:
        if args.bootstrap and len(args.runs) < 2:
            raise ValueError("--bootstrap compares runs: give at least two")
        if args.target is not None and not args.bootstrap:
            raise ValueError("--target applies to --bootstrap only")
        settings = None if args.settings is None else select(",".join(args.settings))
        runs = [load_run(path) for path in args.runs]
        parts = [comparison_table(runs, settings, baseline=args.baseline, stderr=args.stderr)]
        if args.bootstrap:
            parts.append(bootstrap_table(runs, target=args.target, settings=settings))
        official = official_table(runs, settings)
        if official:
            parts.append(official)
        text = "\n".join(parts)
        if args.plot is not None:
            family_plot(runs, args.plot)
        if args.output is not None:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(text)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    for label, written in (("plot", args.plot), ("tables", args.output)):
        if written is not None:
            print(f"{label}: {written}", file=sys.stderr)
    return 0
