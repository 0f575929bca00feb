"""From a run's records to its scores: per-setting and per-family summaries, results.json and the details files.

In a run directory (see `zppo_trl.evaluation.runner`) this module owns::

    results.json               per setting: mean over passes, its stderr, n; per family: macro average
    details/<setting>.parquet  per-sample details (one file per setting, like lighteval's --save-details)

Everything here reads a `zppo_trl.evaluation.store.RecordStore`'s tables and the run's manifest (run.json's
dict); nothing here sends a request.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .aggregation import official_figures, setting_score
from .audit import audit_summary
from .stats import family_macro_averages, mean_and_stderr
from .store import RecordStore, parse_key, write_json
from .tasks import FAMILIES, PAPER_DECODING, SUITE, TaskSpec

logger = logging.getLogger(__name__)

__all__ = [
    "RESULTS_FILE",
    "family_summary",
    "read_results",
    "scored_by_pass",
    "summarize_setting",
    "warn_skips",
    "write_details",
    "write_results",
]

RESULTS_FILE = "results.json"

# The columns of a details parquet, in order: one row per generated or skipped item.
_DETAIL_COLUMNS = (
    "key", "pass", "row_id", "part", "prompt", "response", "extracted", "gold", "rule", "det_score",
    "judge_prompt", "judge_reply", "judge_score", "judge_parsed", "score", "group", "answered", "skipped",
)  # fmt: skip


def _details(store: RecordStore) -> list[dict]:
    """One detail row per generated or skipped item, from the records."""
    rows = []
    for key in {**store.generations, **store.skips}:
        generation = store.generations.get(key, {})
        judgment = store.judgments.get(key, {})
        pass_index, row_id, part = parse_key(key)
        row = {column: judgment.get(column) for column in _DETAIL_COLUMNS}
        row.update(
            {
                "key": key,
                "pass": pass_index,
                "row_id": row_id,
                "part": part,
                "prompt": generation.get("prompt"),
                "response": generation.get("response"),
                "skipped": store.skips.get(key, {}).get("reason"),
            }
        )
        if row["skipped"]:
            row["group"] = store.skips[key].get("group")
            row["score"] = None
        rows.append(row)
    return rows


def scored_by_pass(
    spec: TaskSpec, judgments: Mapping[str, Mapping[str, Any]], skips: Mapping[str, Mapping[str, Any]], passes: int
) -> tuple[dict[int, list[dict]], dict[int, int], int]:
    """(pass -> its scored items, pass -> its skipped items, groups left out of worst-case scoring).

    `judgments` and `skips` map item keys (`item_key`) to their records (a `RecordStore`'s tables;
    a judgment needs ``score`` and, under a grouped aggregation, ``group``). Skipped items are
    never scored. Under ``worst_case_variants`` (DynaMath) a seed with a skipped variant is left
    out of that pass entirely: its worst case is unknown.
    """
    skipped = dict.fromkeys(range(passes), 0)
    broken: dict[int, set] = {p: set() for p in range(passes)}
    for key, skip in skips.items():
        pass_index = parse_key(key)[0]
        if pass_index < passes:
            skipped[pass_index] += 1
            broken[pass_index].add(skip.get("group"))
    by_pass: dict[int, list[dict]] = {p: [] for p in range(passes)}
    left_out = 0
    for key, judgment in judgments.items():
        pass_index, _, part = parse_key(key)
        if key in skips or pass_index >= passes:
            continue
        if spec.aggregation == "worst_case_variants" and judgment.get("group") in broken[pass_index]:
            left_out += 1
            continue
        by_pass[pass_index].append(
            {"score": judgment["score"], "group": judgment.get("group"), "part": part,
             "facets": judgment.get("facets") or {}, "answered": judgment.get("answered")}
        )  # fmt: skip
    return by_pass, skipped, left_out


def summarize_setting(spec: TaskSpec, store: RecordStore, passes: int, complete_rows: bool) -> tuple[dict, list[dict]]:
    """The setting's results entry (scores in percent) and its per-sample detail rows.

    ``score`` is the mean over passes of each pass's official aggregate, ``stderr`` its standard
    error (None with one pass), ``n`` the scored items of one pass, ``skipped`` the most items
    any pass skipped; ``complete`` is False on a subset (max_samples), with skipped items, or with
    a pass missing.
    """
    by_pass, skipped, left_out = scored_by_pass(spec, store.judgments, store.skips, passes)
    scored = [p for p in range(passes) if by_pass[p]]
    entry: dict[str, Any] = {
        "family": spec.family,
        "skipped": max(skipped.values()),
        "judge_unparsed": sum(
            1
            for key, judgment in store.judgments.items()
            if judgment.get("judge_parsed") is False and key not in store.skips
        ),  # fmt: skip
    }
    if left_out:
        entry["left_out_with_skipped_variants"] = left_out
    if not scored:
        entry.update(score=None, stderr=None, n=0, passes=[], complete=False)
        return entry, _details(store)
    pass_scores = [100.0 * setting_score(spec, by_pass[p]) for p in scored]
    mean, stderr = mean_and_stderr(pass_scores)
    entry.update(
        score=round(mean, 4), stderr=None if len(pass_scores) == 1 else round(stderr, 4), n=len(by_pass[scored[0]]),
        passes=[round(score, 4) for score in pass_scores],
        complete=complete_rows and not store.skips and len(scored) == passes,
    )  # fmt: skip
    official = _official_by_pass(spec, [by_pass[p] for p in scored])
    if official:
        entry["official_aggregates"] = official
    audits = [audit for key, audit in store.audits.items() if store.judgments.get(key, {}).get("det_score") == 1.0]
    if audits:
        entry["rule_audit"] = audit_summary(audits)
    return entry, _details(store)


def _official_by_pass(spec: TaskSpec, passes: list[list[dict]]) -> dict[str, float]:
    """The benchmark's own figures (`official_figures`), each the mean over the passes that have it, in percent."""
    per_pass = [official_figures(spec, items) for items in passes]
    labels = list(dict.fromkeys(label for figures in per_pass for label in figures))
    return {
        label: round(100.0 * sum(values) / len(values), 4)
        for label in labels
        if (values := [figures[label] for figures in per_pass if label in figures])
    }


def family_summary(settings: Mapping[str, Mapping[str, Any]]) -> dict[str, dict]:
    """Per family: the macro average of its scored settings, how many, and whether it is the full family."""
    scores = {name: entry["score"] for name, entry in settings.items() if entry.get("score") is not None}
    averages = family_macro_averages(scores)
    return {
        family: {
            "average": round(average, 4),
            "settings": sum(1 for name in FAMILIES[family] if name in scores),
            "complete": all(name in settings and settings[name].get("complete") for name in FAMILIES[family]),
        }
        for family, average in averages.items()
    }


def warn_skips(name: str, store: RecordStore) -> None:
    """Log how many of setting `name`'s items were skipped, with the first reason, where any were."""
    if store.skips:
        first = next(iter(store.skips.values()))["reason"]
        logger.warning("%s: %d item(s) skipped, not scored (e.g. %s); their reasons are in details/%s.parquet",
                       name, len(store.skips), first[:200], name)  # fmt: skip


def read_results(run_dir: Path) -> dict:
    """The run directory's results.json as a dict; empty where there is none yet."""
    path = run_dir / RESULTS_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def write_results(run_dir: Path, manifest: dict, settings: Mapping[str, Any], judged: bool) -> dict:
    """Write results.json from the run's manifest and per-setting entries (in suite order); returns its dict."""
    ordered = {name: settings[name] for name in SUITE if name in settings}
    results = {
        "run_name": manifest["run_name"],
        "model": manifest["model"],
        "base_url": manifest["base_url"],
        "judge_model": manifest["judge_model"],
        "judged": judged,
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "passes": manifest["passes"],
        "max_samples": manifest["max_samples"],
        "paper_decoding": manifest["decoding"] == dataclasses.asdict(PAPER_DECODING)
        and manifest["sampling_fields"] == "all",
        "settings": ordered,
        "families": family_summary(ordered),
    }
    write_json(run_dir / RESULTS_FILE, results)
    return results


def write_details(path: Path, details: list[dict]) -> None:
    """Write a setting's detail rows (`summarize_setting`) as parquet, through a temporary file and a rename."""
    import pandas as pd

    frame = pd.DataFrame(details, columns=list(_DETAIL_COLUMNS))
    frame = frame.sort_values(["pass", "key"], kind="stable")
    for column in ("det_score", "judge_score", "score"):
        frame[column] = frame[column].astype("float64")
    tmp = path.with_name(path.name + ".tmp")
    frame.to_parquet(tmp, index=False)
    tmp.replace(path)
