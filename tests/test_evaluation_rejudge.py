"""The judge sweep's selection and arithmetic, without a server (`zppo_trl.evaluation.rejudge`).

Which settings are swept (the paper's counts), which items of a run each judge is asked about,
how the re-scored items become a setting score (per pass, then the mean) and a family average
(each swept setting once), and the ``Mean ± pop. std`` row, all on hand-computed values that a
pooled mean or a sample standard deviation would miss. The sweep against real judge endpoints is
in test_evaluation_rejudge_run.py.
"""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest

from zppo_trl.evaluation.cli import main
from zppo_trl.evaluation.rejudge import (
    load_stored_run,
    mean_and_population_std,
    rejudge_items,
    setting_result,
    sweep_table,
    swept_settings,
)
from zppo_trl.evaluation.tasks import FAMILIES, SUITE


def _row(key: str, det: float | None, score: float | None, prompt: str | None = None, group=None, skipped=None):
    return {"key": key, "det_score": det, "score": score, "judge_prompt": prompt, "group": group, "skipped": skipped}


def test_the_sweep_covers_the_settings_the_paper_counts(paper_tex):
    text = re.sub(r"\s+", " ", paper_tex)
    counts = re.search(r"decides \$(\d+)/(\d+)\$ LLM, \$(\d+)/(\d+)\$ VLM, and \$(\d+)/(\d+)\$ Video", text)
    llm, llm_all, vlm, vlm_all, video, video_all = map(int, counts.groups())
    assert (len(swept_settings("llm")), len(FAMILIES["llm"])) == (llm, llm_all)
    assert (len(swept_settings("vlm")), len(FAMILIES["vlm"])) == (vlm, vlm_all)
    assert (len(swept_settings("video")), len(FAMILIES["video"])) == (video, video_all)
    left_out = [name for name in SUITE if name not in swept_settings()]
    # "The other three settings are scored deterministically only. Five use a benchmark-specific judge prompt."
    assert sorted(SUITE[name].scoring for name in left_out) == ["benchjudge"] * 5 + ["det"] * 3


def test_only_unskipped_zero_credit_items_are_asked_again():
    spec = SUITE[swept_settings("llm")[0]]
    rows = [
        _row("p0/a", 1.0, 1.0),  # the deterministic step gave credit: its 1 stands under every judge
        _row("p0/b", 0.0, 0.0, "prompt b"),
        _row("p0/c", 0.0, 1.0, "prompt c"),  # the default judge said correct: asked again all the same
        _row("p0/d", None, None, skipped="prompt: unreadable image"),
        _row("p1/a", 0.0, 0.0, "prompt a1"),
    ]
    assert [item["key"] for item in rejudge_items(spec, rows)] == ["p0/b", "p0/c", "p1/a"]
    assert rejudge_items(spec, rows)[1]["judge_prompt"] == "prompt c"

    with pytest.raises(ValueError, match="'p0/e' scored 0 but has no stored judge prompt"):
        rejudge_items(spec, rows + [_row("p0/e", 0.0, 0.0)])
    for name in (name for name in SUITE if name not in swept_settings()):
        with pytest.raises(ValueError, match="the sweep covers the exact\\+judge and rule\\+judge settings only"):
            rejudge_items(SUITE[name], rows)


def test_a_setting_score_is_the_mean_over_passes_of_each_pass_with_new_verdicts():
    spec = next(SUITE[name] for name in swept_settings() if SUITE[name].aggregation == "mean")
    rows = [
        _row("p0/a", 1.0, 1.0),
        _row("p0/b", 0.0, 1.0, "b"),
        _row("p0/c", 0.0, 0.0, "c"),
        _row("p0/d", 0.0, 0.0, "d"),
        _row("p1/a", 1.0, 1.0),
        _row("p1/b", 1.0, 1.0),
        _row("p1/c", 0.0, 1.0, "c"),
        _row("p1/d", None, None, skipped="score: a row without its gold"),
    ]
    # The default judge: pass 0 is 2/4, pass 1 is 3/3 (the skip left out) -> (50 + 100) / 2.
    default = setting_result(spec, rows, passes=2)
    assert default["score"] == pytest.approx(75.0) and default["n"] == 4 and default["changed"] == 0
    assert default["stderr"] == pytest.approx(25.0)  # sample std 35.355 / sqrt(2)
    # Another judge flips b and c of pass 0 and c of pass 1: pass 0 is 2/4 (a, c), pass 1 is 2/3.
    verdicts = {"p0/b": 0.0, "p0/c": 1.0, "p0/d": 0.0, "p1/c": 0.0}
    other = setting_result(spec, rows, passes=2, verdicts=verdicts)
    assert other["score"] == pytest.approx((50.0 + 200.0 / 3) / 2, abs=1e-4)  # 58.3333, not the pooled 4/7
    assert other["changed"] == 3
    with pytest.raises(KeyError, match="no verdict for item 'p1/c'"):
        setting_result(spec, rows, passes=2, verdicts={"p0/b": 0.0, "p0/c": 1.0, "p0/d": 0.0})


def test_a_grouped_setting_is_re_aggregated_by_its_own_rule():
    spec = next(SUITE[name] for name in swept_settings() if SUITE[name].aggregation == "worst_case_variants")
    rows = [
        _row("p0/s1v1", 1.0, 1.0, group="1"),
        _row("p0/s1v2", 0.0, 0.0, "x", group="1"),
        _row("p0/s2v1", 1.0, 1.0, group="2"),
        _row("p0/s2v2", 1.0, 1.0, group="2"),
        _row("p0/s3v1", 0.0, 1.0, "y", group="3"),
        _row("p0/s3v2", None, None, group="3", skipped="prompt: unreadable image"),  # seed 3 is left out
    ]
    assert setting_result(spec, rows, passes=1)["score"] == pytest.approx(50.0)  # seeds 1 and 2: 0 and 1
    # the new judge credits seed 1's second variant: both seeds now hold every variant (item mean would say 75)
    assert setting_result(spec, rows, passes=1, verdicts={"p0/s1v2": 1.0, "p0/s3v1": 0.0})["score"] == 100.0


def test_the_table_averages_each_swept_setting_once_and_reports_the_population_std(tmp_path):
    assert mean_and_population_std([50.0, 54.0, 58.0]) == pytest.approx((54.0, math.sqrt(32.0 / 3)))  # not 4.0

    run_dir = _stored_run(tmp_path / "zppo")
    run = load_stored_run(run_dir)
    table = sweep_table(
        [run],
        [
            ("default", {"zppo": {"llm": 50.0, "vlm": 40.0}}),
            ("judge b", {"zppo": {"llm": 54.0, "vlm": 44.0}}),
            ("judge c", {"zppo": {"llm": 58.0}}),  # its VLM verdicts are not all in: left out of the summary
        ],
    )
    assert [(c["run"], c["family"]) for c in table["columns"]] == [("zppo", "vlm"), ("zppo", "llm")]
    assert [row["values"] for row in table["rows"]] == [[40.0, 50.0], [44.0, 54.0], [None, 58.0]]
    assert table["summary"][0] == pytest.approx({"mean": 42.0, "pop_std": 2.0})
    assert table["summary"][1] == pytest.approx({"mean": 54.0, "pop_std": math.sqrt(32.0 / 3)})


def _stored_run(path, judged: bool = True):
    """A finished run directory as `zppo-eval run` leaves it: two swept LLM settings, one swept VLM
    setting, and a Det. setting whose score must not enter the sweep's averages."""
    llm = [name for name in swept_settings("llm") if SUITE[name].aggregation == "mean"][:2]
    vlm = [name for name in swept_settings("vlm") if SUITE[name].aggregation == "mean"][:1]
    det = next(name for name in SUITE if SUITE[name].scoring == "det")
    details = {
        llm[0]: [_row("p0/a", 1.0, 1.0), _row("p0/b", 0.0, 0.0, "b")],  # 50
        llm[1]: [_row("p0/a", 0.0, 1.0, "a"), _row("p0/b", 0.0, 1.0, "b"), _row("p0/c", 1.0, 1.0),
                 _row("p0/d", 0.0, 0.0, "d")],  # 75
        vlm[0]: [_row("p0/a", 0.0, 0.0, "a"), _row("p0/b", 1.0, 1.0), _row("p0/c", 0.0, 0.0, "c"),
                 _row("p0/d", 0.0, 0.0, "d"), _row("p0/e", 0.0, 0.0, "e")],  # 20
        det: [_row("p0/a", 1.0, 1.0)],  # 100, deterministic only
    }  # fmt: skip
    (path / "details").mkdir(parents=True)
    for name, rows in details.items():
        frame = pd.DataFrame(rows)
        frame["det_score"] = frame["det_score"].astype("float64")
        frame["score"] = frame["score"].astype("float64")
        frame.to_parquet(path / "details" / f"{name}.parquet", index=False)
    scores = {llm[0]: 50.0, llm[1]: 75.0, vlm[0]: 20.0, det: 100.0}
    (path / "run.json").write_text(json.dumps({"run_name": path.name, "passes": 1, "judge_model": "judge-27b"}))
    settings = {
        name: {"family": SUITE[name].family, "score": score, "complete": True} for name, score in scores.items()
    }
    (path / "results.json").write_text(json.dumps({"run_name": path.name, "judged": judged, "settings": settings}))
    return path


def test_the_default_row_is_the_runs_scores_over_the_swept_settings_only(tmp_path, capsys):
    run_dir = _stored_run(tmp_path / "zppo")
    out = tmp_path / "sweep"
    assert main(["rejudge", str(run_dir), "--output-dir", str(out)]) == 0  # no judge: the table alone
    table = json.loads((out / "table.json").read_text())
    # LLM: (50 + 75) / 2 over its two swept settings; VLM: the swept setting's 20, not (20 + 100) / 2 with Det.
    assert table["rows"] == [{"judge": "judge-27b (default)", "values": [20.0, 62.5]}]
    assert "| judge-27b (default) | 20.00 | 62.50 |" in capsys.readouterr().out
    assert json.loads((out / "sweep.json").read_text())["runs"][0]["name"] == "zppo"


def test_a_run_without_details_or_judge_and_a_mismatched_sweep_are_refused(tmp_path, capsys):
    run_dir = _stored_run(tmp_path / "zppo")
    name = next(p.stem for p in (run_dir / "details").glob("*.parquet") if SUITE[p.stem].family == "vlm"
                and SUITE[p.stem].scoring != "det")  # fmt: skip
    (run_dir / "details" / f"{name}.parquet").unlink()
    assert main(["rejudge", str(run_dir), "--output-dir", str(tmp_path / "sweep")]) == 2
    assert f"no per-sample details for {name} (details/<setting>.parquet)" in capsys.readouterr().err

    unjudged = _stored_run(tmp_path / "unjudged", judged=False)
    assert main(["rejudge", str(unjudged), "--output-dir", str(tmp_path / "sweep")]) == 2
    assert "scored without a judge (--no-judge)" in capsys.readouterr().err

    assert main(["rejudge", str(tmp_path / "nowhere"), "--output-dir", str(tmp_path / "sweep")]) == 2
    assert "no such run directory" in capsys.readouterr().err

    other = _stored_run(tmp_path / "grpo")
    zppo = _stored_run(tmp_path / "again" / "zppo")
    assert main(["rejudge", str(zppo), "--output-dir", str(tmp_path / "sweep2")]) == 0
    assert main(["rejudge", str(other), "--output-dir", str(tmp_path / "sweep2")]) == 2
    assert "is the sweep of the runs zppo, not grpo" in capsys.readouterr().err

    args = ["rejudge", str(zppo), "--output-dir", str(tmp_path / "sweep3"), "--judge-model", "m"]
    assert main(args) == 2
    assert "give --judge-base-url and --judge-model together" in capsys.readouterr().err
