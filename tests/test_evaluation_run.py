"""The evaluation harness end to end: `zppo-eval run` against real servers on 127.0.0.1.

The student is the tiny random VLM behind `transformers serve` (images and video frames reach
it), the judge the tiny random text model behind another. Their answers are noise, so the checks
are about the harness: every item generated once, scored on its setting's path, the judge asked
exactly where the path says, garbage verdicts counted and scored 0, results, details and the
comparison written, and a killed run or a dead endpoint resumed without regenerating anything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from eval_fixtures import write_fixture

from zppo_trl.evaluation.cli import main
from zppo_trl.evaluation.data import load_setting
from zppo_trl.evaluation.prompting import build_requests
from zppo_trl.evaluation.tasks import SUITE

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]

# One setting per scoring path and per family: images (AI2D, InfoVQA, MM-Vet), text (GPQA-D),
# video frames (MVBench, MMVU), and CharXiv's five questions per row.
END_TO_END = ("AI2D", "InfoVQA", "MM-Vet", "CharXiv", "GPQA-D", "MVBench", "MMVU")


def _data_dir(root: Path, names, rows: int = 3) -> Path:
    for name in names:
        write_fixture(name, root / name, rows=rows)
    return root


def _run_args(student, judge, data_dir: Path, out: Path, tasks: str, *extra: str) -> list[str]:
    return [
        "run", "--base-url", student.base_url, "--model", student.model,
        "--judge-base-url", judge.base_url, "--judge-model", judge.model,
        "--tasks", tasks, "--data-dir", str(data_dir), "--output-dir", str(out),
        "--max-new-tokens", "12", "--max-frames", "4", "--concurrency", "4",
        "--sampling-fields", "openai",  # transformers serve rejects vLLM's extra sampling fields
        "--max-retries", "1", *extra,
    ]  # fmt: skip


def _items(name: str, data_dir: Path) -> int:
    """How many questions one pass of a setting asks (CharXiv: five per row)."""
    spec = SUITE[name]
    rows = load_setting(spec, data_dir / name, video_dir=data_dir / name / "videos")
    return sum(len(build_requests(spec, row, max_frames=2)) for row in rows)


def _generation_keys(run_dir: Path, name: str) -> list[str]:
    lines = (run_dir / "records" / f"{name}.jsonl").read_text().splitlines()
    return [record["key"] for record in map(json.loads, lines) if record["kind"] == "generation"]


def test_the_cli_evaluates_every_scoring_path_and_family(vlm_server, teacher_server, tmp_path, capsys):
    data_dir = _data_dir(tmp_path / "data", END_TO_END)
    out = tmp_path / "run"
    code = main(_run_args(vlm_server, teacher_server, data_dir, out, ",".join(END_TO_END), "--passes", "2"))
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]

    results = json.loads((out / "results.json").read_text())
    assert list(results["settings"]) == [name for name in SUITE if name in END_TO_END]
    assert set(results["families"]) == {"vlm", "llm", "video"}
    assert results["paper_decoding"] is False  # 12 new tokens, OpenAI's fields only: said in the results
    for name, entry in results["settings"].items():
        assert entry["n"] == _items(name, data_dir), name
        assert 0.0 <= entry["score"] <= 100.0 and len(entry["passes"]) == 2
        assert entry["skipped"] == 0 and entry["complete"] is True  # every row of the data given, nothing skipped
        details = pd.read_parquet(out / "details" / f"{name}.parquet")
        assert len(details) == 2 * entry["n"] and details["key"].is_unique
        assert details["response"].map(lambda text: isinstance(text, str)).all()
        spec = SUITE[name]
        judged = details["judge_reply"].notna()
        if spec.scoring == "benchjudge":
            assert judged.all()  # the benchmark's own judge scores every item
        elif spec.scoring == "det":
            assert not judged.any()  # Det. has no judge
        else:  # +Judge: the shared judge exactly where the deterministic step gave 0
            assert (judged == (details["det_score"] == 0)).all()
            assert (details.loc[~judged, "score"] == details.loc[~judged, "det_score"]).all()
        # A verdict that does not parse scores 0 and is counted; nothing unparsed counts as right.
        unparsed = details["judge_parsed"] == False  # noqa: E712 - a column of True/False/None
        assert entry["judge_unparsed"] == int(unparsed.sum())
        assert (details.loc[unparsed, "score"] == 0).all()
        assert "<image>" in details["prompt"].iloc[0] or spec.family == "llm"
    assert "CharXiv" in printed.out and "results:" in printed.out

    # The comparison reads the run back: the table has the run as a row and every setting as a column.
    assert main(["compare", str(out), "--plot", str(tmp_path / "families.png")]) == 0
    table = capsys.readouterr().out
    assert all(name in table for name in END_TO_END) and "| run |" in table
    assert (tmp_path / "families.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _cli(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-m", "zppo_trl.evaluation.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip


def _wait_for_generations(
    run_dir: Path, name: str, count: int, process: subprocess.Popen, timeout: float = 120
) -> None:
    deadline = time.monotonic() + timeout
    records = run_dir / "records" / f"{name}.jsonl"
    while time.monotonic() < deadline:
        if records.exists() and len(_generation_keys(run_dir, name)) >= count:
            return
        assert process.poll() is None, process.stdout.read()
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} generations within {timeout}s")


def test_a_killed_run_resumes_without_regenerating(vlm_server, teacher_server, tmp_path):
    data_dir = _data_dir(tmp_path / "data", ["AI2D"], rows=24)
    out = tmp_path / "run"
    args = _run_args(vlm_server, teacher_server, data_dir, out, "AI2D", "--passes", "2", "--concurrency", "2")
    first = _cli(args)
    _wait_for_generations(out, "AI2D", 6, first)
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = _generation_keys(out, "AI2D")
    assert 6 <= len(before) < 48, "the run must be killed mid-way"
    kept = (out / "records" / "AI2D.jsonl").read_text()

    second = _cli(args)
    output, _ = second.communicate(timeout=600)
    assert second.returncode == 0, output[-3000:]
    after = _generation_keys(out, "AI2D")
    assert len(after) == len(set(after)) == 48  # every item once: nothing generated twice
    assert (out / "records" / "AI2D.jsonl").read_text().startswith(kept.rsplit("\n", 1)[0])
    assert json.loads((out / "results.json").read_text())["settings"]["AI2D"]["n"] == 24


def test_an_endpoint_that_dies_mid_run_stops_with_the_way_to_resume(
    make_server, tiny_vlm_dir, teacher_server, tmp_path
):
    student = make_server(model_dir=tiny_vlm_dir)
    data_dir = _data_dir(tmp_path / "data", ["AI2D"], rows=24)
    out = tmp_path / "run"
    args = _run_args(student, teacher_server, data_dir, out, "AI2D", "--passes", "1", "--concurrency", "2")
    process = _cli(args)
    _wait_for_generations(out, "AI2D", 4, process)
    student.kill()
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 1, output[-3000:]
    assert "run the same command again to resume" in output
    done = len(_generation_keys(out, "AI2D"))
    assert 4 <= done < 24

    student.start()
    assert main(args[:]) == 0
    keys = _generation_keys(out, "AI2D")
    assert len(keys) == len(set(keys)) == 24


def test_a_run_directory_is_never_resumed_under_another_configuration(vlm_server, teacher_server, tmp_path, capsys):
    data_dir = _data_dir(tmp_path / "data", ["GPQA-D"], rows=2)
    out = tmp_path / "run"
    assert main(_run_args(vlm_server, teacher_server, data_dir, out, "GPQA-D", "--passes", "1")) == 0
    assert main(_run_args(vlm_server, teacher_server, data_dir, out, "GPQA-D", "--passes", "2")) == 2
    assert "passes=1" in capsys.readouterr().err


def test_bad_input_is_an_error_or_a_counted_skip(vlm_server, teacher_server, tmp_path, capsys):
    # A missing column: one error line naming it, exit 2.
    data_dir = _data_dir(tmp_path / "data", ["AI2D"], rows=3)
    table = data_dir / "AI2D" / "test.parquet"
    pd.read_parquet(table).drop(columns=["options"]).to_parquet(table)
    assert main(_run_args(vlm_server, teacher_server, data_dir, tmp_path / "a", "AI2D", "--passes", "1")) == 2
    assert "options" in capsys.readouterr().err

    # An unreadable image: that item is skipped, counted and named in the details; the rest scored.
    data_dir = _data_dir(tmp_path / "data2", ["AI2D"], rows=3)
    frame = pd.read_parquet(table := data_dir / "AI2D" / "test.parquet")
    frame.at[1, "image"] = {"bytes": b"\x89PNG\r\n\x1a\n truncated", "path": None}
    frame.to_parquet(table)
    out = tmp_path / "b"
    assert main(_run_args(vlm_server, teacher_server, data_dir, out, "AI2D", "--passes", "1")) == 0
    entry = json.loads((out / "results.json").read_text())["settings"]["AI2D"]
    assert entry["skipped"] == 1 and entry["n"] == 2 and entry["complete"] is False
    details = pd.read_parquet(out / "details" / "AI2D.parquet")
    skipped = details[details["skipped"].notna()]
    assert len(skipped) == 1 and "image" in skipped["skipped"].iloc[0] and skipped["score"].isna().all()

    # No judge and no --no-judge: refused, naming both ways.
    args = _run_args(vlm_server, teacher_server, data_dir, tmp_path / "c", "AI2D")
    del args[args.index("--judge-base-url") : args.index("--judge-base-url") + 4]
    assert main(args) == 2
    assert "--no-judge" in capsys.readouterr().err


def test_vllm_as_the_student_and_a_request_it_refuses_is_a_counted_skip(vllm_teacher_server, tmp_path, capsys):
    """vLLM serves the student with every paper sampling field; a prompt over its context is
    refused (HTTP 400), which no retry can fix: that item is skipped with the server's reason."""
    data_dir = _data_dir(tmp_path / "data", ["GPQA-D"], rows=3)
    table = data_dir / "GPQA-D" / "gpqa_diamond" / "train.parquet"
    frame = pd.read_parquet(table)
    frame.at[2, "Question"] = "why " * 5000  # over the server's 4,096-token context
    frame.to_parquet(table)
    out = tmp_path / "run"
    args = _run_args(vllm_teacher_server, vllm_teacher_server, data_dir, out, "GPQA-D", "--passes", "1")
    args[args.index("openai")] = "all"
    assert main(args) == 0, capsys.readouterr().err[-2000:]
    entry = json.loads((out / "results.json").read_text())["settings"]["GPQA-D"]
    assert entry["n"] == 2 and entry["skipped"] == 1 and entry["complete"] is False
    details = pd.read_parquet(out / "details" / "GPQA-D.parquet")
    reason = details["skipped"].dropna()
    assert len(reason) == 1 and reason.iloc[0].startswith("endpoint rejected: HTTP 400")
