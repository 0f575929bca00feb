"""The evaluation harness end to end: `zppo-eval run` against real servers on 127.0.0.1.

The student is the tiny random VLM behind `transformers serve` (images and video frames reach
it), the judge the tiny random text model behind another. Their answers are noise, so the checks
are about the harness: every item generated once, scored on its setting's path, the judge asked
exactly where the path says, garbage verdicts counted and scored 0, results, details and the
comparison written, and a killed run or a dead endpoint resumed without regenerating anything.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHORT_JUDGE, require_vllm
from eval_fixtures import write_fixture
from servers import VLLMServer
from transformers import AutoConfig

from zppo_trl.evaluation.cli import main
from zppo_trl.evaluation.condition import record_condition
from zppo_trl.evaluation.data import load_setting
from zppo_trl.evaluation.prompting import build_requests
from zppo_trl.evaluation.scorers import exact_gold
from zppo_trl.evaluation.tasks import SUITE
from zppo_trl.prompts import CORRECT_TAG, RL_CLOSER

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
        "--max-retries", "1", "--judge-extra-body", SHORT_JUDGE, *extra,
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
    # `transformers serve` names the model by its directory (its /v1/models lists no root): that is the
    # checkpoint read for a recorded condition, and this one records none
    run = json.loads((out / "run.json").read_text())
    assert run["condition"] is None
    assert run["condition_source"] == (
        f"none recorded in {Path(vlm_server.model) / 'config.json'} (the served model name, a local directory)"
    )

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
    # vLLM's /v1/models reports the directory it serves (root): read for a recorded condition, none here
    run = json.loads((out / "run.json").read_text())
    assert run["condition"] is None and run["condition_source"] == (
        f"none recorded in {Path(vllm_teacher_server.model) / 'config.json'} "
        f"(the root of {vllm_teacher_server.model!r} in the endpoint's /v1/models)"
    )


def test_a_served_correction_sft_checkpoint_is_evaluated_under_its_recorded_condition(
    tiny_text_model_dir, tmp_path, capsys, caplog
):
    """vLLM serves a checkpoint that records ``<correct>`` under another name: `zppo-eval run` finds the
    directory through /v1/models's root and puts the tag before the closer of every question, unless
    ``--condition none`` says otherwise; run.json says which and why."""
    require_vllm()
    checkpoint = tmp_path / "correction-sft"
    shutil.copytree(tiny_text_model_dir, checkpoint)
    config = AutoConfig.from_pretrained(checkpoint)
    record_condition(config, CORRECT_TAG)  # as ZPPOTrainer records it for the correction row
    config.save_pretrained(checkpoint)
    caplog.set_level(logging.INFO, logger="zppo_trl.evaluation.cli")

    class RenamedVLLMServer(VLLMServer):
        model = "correction-sft"  # --served-model-name: only the root in /v1/models leads to the directory

        def command(self) -> list[str]:
            return [*super().command(), "--served-model-name", self.model]

    server = RenamedVLLMServer(checkpoint, log_dir=tmp_path).start()
    try:
        data_dir = _data_dir(tmp_path / "data", ["GPQA-D"], rows=2)
        runs = {}
        for name, extra in (("default", ()), ("none", ("--condition", "none"))):
            args = [*_run_args(server, server, data_dir, tmp_path / name, "GPQA-D", "--passes", "1", *extra)]
            args[args.index("--judge-base-url") : args.index("--judge-base-url") + 4] = ["--no-judge"]
            assert main(args) == 0, capsys.readouterr().err[-2000:]
            runs[name] = json.loads((tmp_path / name / "run.json").read_text())
            prompts = pd.read_parquet(tmp_path / name / "details" / "GPQA-D.parquet")["prompt"]
            assert len(prompts) == 2
            tagged = [
                f"\n\n{CORRECT_TAG}\n\n{RL_CLOSER}" in prompt and prompt.endswith(RL_CLOSER) for prompt in prompts
            ]
            assert all(tagged) if name == "default" else not any(tagged), prompts.tolist()
    finally:
        server.stop()
    assert runs["default"]["condition"] == CORRECT_TAG
    assert runs["default"]["condition_source"] == (
        f"recorded in {checkpoint / 'config.json'} (the root of 'correction-sft' in the endpoint's /v1/models)"
    )
    assert runs["none"]["condition"] is None and runs["none"]["condition_source"] == "--condition none"
    assert f"evaluation condition: '{CORRECT_TAG}' (recorded in {checkpoint / 'config.json'}" in caplog.text
    assert "evaluation condition: none, the shared prompt (--condition none)" in caplog.text


def _rewrite_responses(run_dir: Path, name: str, response_of) -> None:
    """Append a generation record per item with `response_of(row_id)` as its response (later lines win)."""
    records = run_dir / "records" / f"{name}.jsonl"
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    with records.open("a") as handle:
        for record in lines:
            if record["kind"] == "generation":
                handle.write(json.dumps({**record, "response": response_of(record["row_id"])}) + "\n")


def test_the_rule_audit_asks_the_judge_about_rule_positive_items(vlm_server, teacher_server, tmp_path, capsys):
    data_dir = _data_dir(tmp_path / "data", ["AI2D"], rows=5)
    out = tmp_path / "run"
    args = _run_args(vlm_server, teacher_server, data_dir, out, "AI2D", "--passes", "1")
    assert main(args) == 0
    # Make every recorded response the boxed gold letter: the deterministic step scores all of them 1.
    spec = SUITE["AI2D"]
    golds = {row["_id"]: exact_gold(spec, row) for row in load_setting(spec, data_dir / "AI2D")}
    _rewrite_responses(out, "AI2D", lambda row_id: f"The answer is \\boxed{{{golds[row_id]}}}.")
    capsys.readouterr()

    assert main([*args, "--audit-rule", "3"]) == 0
    printed = capsys.readouterr().out
    entry = json.loads((out / "results.json").read_text())["settings"]["AI2D"]
    assert entry["score"] == 100.0  # the audit never changes a score
    records = [json.loads(line) for line in (out / "records" / "AI2D.jsonl").read_text().splitlines()]
    audits = [record for record in records if record["kind"] == "audit"]
    assert len(audits) == 3 and len({audit["key"] for audit in audits}) == 3
    for audit in audits:  # the prompt the judge would have read had the rule said 0: snippet and gold
        gold = golds[audit["key"].split("/", 1)[1]]
        assert f"## Model Response\n{gold}\n\n## Ground Truth Answer\n{gold}" in audit["judge_prompt"]
        assert isinstance(audit["judge_reply"], str)
    disagreeing = sum(1 for audit in audits if audit["judge_parsed"] and audit["judge_score"] == 0.0)
    assert entry["rule_audit"]["checked"] == 3
    assert entry["rule_audit"]["judge_disagrees"] == disagreeing
    assert entry["rule_audit"]["judge_unparsed"] == sum(1 for audit in audits if not audit["judge_parsed"])
    assert f"rule audit: the judge scores 0 on {disagreeing} of 3" in printed

    # Resumed: the audited items are not asked again.
    assert main([*args, "--audit-rule", "3"]) == 0
    again = [json.loads(line) for line in (out / "records" / "AI2D.jsonl").read_text().splitlines()]
    assert sum(1 for record in again if record["kind"] == "audit") == 3
    assert main(["compare", str(out)]) == 0
    assert f"| AI2D | {disagreeing}/3 |" in capsys.readouterr().out
