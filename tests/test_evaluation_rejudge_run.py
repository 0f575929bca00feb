"""The judge sweep end to end: `zppo-eval rejudge` on a finished `zppo-eval run`, against real servers.

The run is the tiny random VLM behind `transformers serve` (student) scored by the tiny text model
behind another (the default judge), on one setting per scoring path. The sweep's other judge is a
second `transformers serve` process. Their replies are noise, so the checks are about the sweep:
exactly the zero-credit items of the shared-judge settings are asked (never a Det. or BenchJudge
item, never a skipped one, never one with credit), nothing is generated again, an unparsed verdict
scores 0, the table's rows are the run's own scores and the new judge's, and an interrupted sweep
resumes asking only for what is missing. A judge endpoint that does not answer stops with exit 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHORT_JUDGE
from eval_fixtures import write_fixture
from servers import free_port

from zppo_trl.evaluation.cli import main
from zppo_trl.evaluation.rejudge import swept
from zppo_trl.evaluation.tasks import SUITE
from zppo_trl.teacher import parse_verdict

pytestmark = pytest.mark.integration

# A swept setting per family (AI2D: Exact + Judge, GPQA-D: Exact + Judge on text, MVBench: Rule + Judge
# on video frames), and one of each path the sweep leaves out (InfoVQA: Det., MM-Vet: BenchJudge).
SETTINGS = ("AI2D", "InfoVQA", "MM-Vet", "GPQA-D", "MVBench")


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _det_only_score(details: pd.DataFrame) -> float:
    """The setting's score when every re-asked verdict is 0: per pass, the deterministic credit over the
    scored items; then the mean over passes (the suite's item-accuracy rule)."""
    scored = details[details["skipped"].isna()]
    return float(scored.groupby("pass")["det_score"].mean().mean() * 100.0)


def test_a_judge_sweep_re_asks_only_the_zero_credit_shared_judge_items(
    vlm_server, teacher_server, make_server, tmp_path, capsys
):
    data_dir = tmp_path / "data"
    for name in SETTINGS:
        write_fixture(name, data_dir / name, rows=3)
    table = data_dir / "AI2D" / "test.parquet"  # an unreadable image: a skipped item the sweep must leave alone
    frame = pd.read_parquet(table)
    frame.at[1, "image"] = {"bytes": b"\x89PNG\r\n\x1a\n truncated", "path": None}
    frame.to_parquet(table)
    run_dir = tmp_path / "zppo"
    run = [
        "run", "--base-url", vlm_server.base_url, "--model", vlm_server.model,
        "--judge-base-url", teacher_server.base_url, "--judge-model", teacher_server.model,
        "--tasks", ",".join(SETTINGS), "--data-dir", str(data_dir), "--output-dir", str(run_dir),
        "--max-new-tokens", "12", "--max-frames", "4", "--concurrency", "4", "--passes", "2",
        "--sampling-fields", "openai", "--max-retries", "1", "--judge-extra-body", SHORT_JUDGE,
    ]  # fmt: skip
    assert main(run) == 0, capsys.readouterr().err[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    generations = {name: (run_dir / "records" / f"{name}.jsonl").read_text() for name in SETTINGS}
    capsys.readouterr()

    other = make_server()  # the sweep's other judge: its own process and port
    out = tmp_path / "sweep"
    sweep = ["rejudge", str(run_dir), "--output-dir", str(out), "--judge-base-url", other.base_url,
             "--judge-model", other.model, "--judge-name", "judge b", "--concurrency", "4",
             "--max-retries", "1", "--judge-extra-body", SHORT_JUDGE]  # fmt: skip
    assert main(sweep) == 0, capsys.readouterr().err[-3000:]
    printed = capsys.readouterr().out

    records_dir = out / "judges" / "judge-b" / "zppo" / "records"
    assert sorted(p.stem for p in records_dir.glob("*.jsonl")) == sorted(n for n in SETTINGS if swept(SUITE[n]))
    judge_results = json.loads((out / "judges" / "judge-b" / "results.json").read_text())
    assert judge_results["model"] == other.model and judge_results["name"] == "judge b"
    swept_scores = {}
    for name in (n for n in SETTINGS if swept(SUITE[n])):
        details = pd.read_parquet(run_dir / "details" / f"{name}.parquet")
        asked = details[(details["det_score"] == 0) & details["skipped"].isna()]
        records = _records(records_dir / f"{name}.jsonl")
        # every zero-credit item once, nothing else (no skipped item, no item the rule credited)
        assert sorted(r["key"] for r in records) == sorted(asked["key"])
        for record in records:
            parsed = parse_verdict(record["judge_reply"])
            assert record["judge_parsed"] == (parsed is not None)
            assert record["judge_score"] == (1.0 if parsed is True else 0.0)  # unparsed: the fallback's 0
        entry = judge_results["runs"]["zppo"]["settings"][name]
        assert entry["rejudged"] == len(asked) and entry["missing"] == 0
        assert entry["default_score"] == pytest.approx(results["settings"][name]["score"])
        if not any(r["judge_score"] for r in records):  # the tiny judge's noise never parses
            assert entry["score"] == pytest.approx(_det_only_score(details), abs=1e-4)
        swept_scores[name] = entry["score"]
    assert pd.read_parquet(run_dir / "details" / "AI2D.parquet")["skipped"].notna().sum() == 2  # one a pass
    # nothing was generated again: the run's records are untouched
    assert {name: (run_dir / "records" / f"{name}.jsonl").read_text() for name in SETTINGS} == generations

    table = json.loads((out / "table.json").read_text())
    assert [(c["family"], c["settings"]) for c in table["columns"]] == [
        ("vlm", ["AI2D"]), ("llm", ["GPQA-D"]), ("video", ["MVBench"])
    ]  # fmt: skip
    default, judge_b = table["rows"]
    assert default["judge"] == f"{teacher_server.model} (default)"
    assert default["values"] == pytest.approx([results["settings"][n]["score"] for n in ("AI2D", "GPQA-D", "MVBench")])
    assert judge_b["judge"] == "judge b"
    assert judge_b["values"] == pytest.approx([swept_scores[n] for n in ("AI2D", "GPQA-D", "MVBench")])
    assert "| judge b |" in printed and "Mean ± pop. std" in printed

    # Interrupted: the last half of a setting's verdicts lost; the same command asks for those alone.
    path = records_dir / "GPQA-D.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    kept = lines[: len(lines) // 2]
    path.write_text("".join(kept))
    assert main(sweep) == 0
    capsys.readouterr()
    again = path.read_text().splitlines(keepends=True)
    assert again[: len(kept)] == kept and len(again) == len(lines)
    assert sorted(json.loads(line)["key"] for line in again) == sorted(json.loads(line)["key"] for line in lines)
    for name in ("AI2D", "MVBench"):  # complete settings: not one request more
        assert (
            len(_records(records_dir / f"{name}.jsonl")) == judge_results["runs"]["zppo"]["settings"][name]["rejudged"]
        )

    # No judge: the table alone, over the judges the directory holds.
    assert main(["rejudge", str(run_dir), "--output-dir", str(out)]) == 0
    assert [row["judge"] for row in json.loads((out / "table.json").read_text())["rows"]] == [
        default["judge"],
        "judge b",
    ]

    # A judge endpoint that does not answer: exit 1, naming it; nothing of judge b is touched.
    dead = f"http://127.0.0.1:{free_port()}/v1"
    args = ["rejudge", str(run_dir), "--output-dir", str(out), "--judge-base-url", dead, "--judge-model", "gone",
            "--max-retries", "0"]  # fmt: skip
    assert main(args) == 1
    assert f"the judge endpoint {dead} (model 'gone') does not answer" in capsys.readouterr().err
