"""The trace-overlap audit end to end against a real judge server, and the trainer's ``audit_traces`` switch.

The judge is the tiny random text model behind `transformers serve`, named three times: its replies are
noise, so every verdict is unparsed and nothing may be flagged (an unparsed reply is never a memorization
vote). The checks are about the audit: one verdict per (rollout, reference) pair per judge, the table and
summary written, a second call asking nothing again."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.evaluation.cli import main
from zppo_trl.trace_log import TRACE_LOG_NAME, TraceLog, read_trace_log

try:
    from conftest import SHORT_JUDGE
except ImportError:  # tests/ imported as a package
    from tests.conftest import SHORT_JUDGE

try:
    from boxed_models import toy_rows
except ImportError:  # tests/ imported as a package
    from tests.boxed_models import toy_rows

pytestmark = pytest.mark.integration


def test_the_audit_asks_every_judge_about_every_pair_and_resumes(teacher_server, tmp_path, capsys):
    run = tmp_path / "run"
    log = TraceLog(run / TRACE_LOG_NAME)
    log.references(0, [("q1", "What is 1+1?", "1+1 = 2, \\boxed{2}"), ("q2", "What is 2+2?", "\\boxed{4}")])
    log.graduations(3, [("q1", "What is 1+1?", ["so \\boxed{2}", "\\boxed{3}"], [1.0, 0.0])])
    log.graduations(5, [("q9", "What is 9+9?", ["\\boxed{18}"], [1.0])])  # no reference
    judges = []
    for name in ("a", "b", "c"):
        judges += ["--judge-base-url", teacher_server.base_url, "--judge-model", teacher_server.model,
                   "--judge-name", name]  # fmt: skip
    argv = ["audit-traces", str(run), *judges, "--concurrency", "2", "--max-retries", "0"]
    argv += ["--judge-extra-body", SHORT_JUDGE]
    assert main(argv) == 0
    out = run / "trace_audit"
    for name in ("a", "b", "c"):
        records = [json.loads(line) for line in (out / "judges" / name / "records.jsonl").read_text().splitlines()]
        assert sorted(r["key"] for r in records) == ["q1/0", "q1/1"]
        assert all(r["judge_reply"] is not None for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rollouts"] == 2 and summary["questions"] == 1 and summary["questions_without_reference"] == ["q9"]
    unparsed = sum(summary["per_judge"][n]["unparsed"] for n in "abc")
    memorization = sum(summary["per_judge"][n]["memorization"] for n in "abc")
    assert unparsed + memorization + sum(summary["per_judge"][n]["transfer"] for n in "abc") == 6
    assert summary["flagged"] <= memorization // 2
    assert "Trace-overlap rate" in capsys.readouterr().out
    sizes = {n: (out / "judges" / n / "records.jsonl").stat().st_size for n in "abc"}
    assert main(argv) == 0  # resumed: nothing asked again
    assert sizes == {n: (out / "judges" / n / "records.jsonl").stat().st_size for n in "abc"}
    assert main(["audit-traces", str(run), *judges[:6]]) == 2  # another judge set (one judge) on the same directory


def _reward(completions, trainer_state, completion_ids=None, **kwargs):
    """The teacher's rollouts (graded with completion_ids=None) are right; the student's plain rollouts are
    wrong at the first rollout step and right afterwards, so every question admitted at 0 graduates when
    it is replayed."""
    if completion_ids is None:
        return [1.0] * len(completions)
    return [float(trainer_state.global_step > 0)] * len(completions)


def test_audit_traces_writes_references_and_graduations(boxed_text_student_dir, boxed_teacher_server, tmp_path):
    args = ZPPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=16,
        num_generations=4, max_completion_length=32, num_partitions=2, gradient_accumulation_steps=1, max_steps=6,
        replay_fraction=1.0, augment_fraction=1.0, teacher_base_url=boxed_teacher_server.base_url,
        teacher_model=boxed_teacher_server.model, teacher_max_tokens=32, compress_candidates=False,
        learning_rate=1e-4, logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True, audit_traces=True,
    )  # fmt: skip
    trainer = ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(boxed_text_student_dir),
        reward_funcs=_reward,
        args=args,
        train_dataset=Dataset.from_list(toy_rows("text")),
        processing_class=AutoTokenizer.from_pretrained(boxed_text_student_dir),
    )
    trainer.train()
    questions = read_trace_log(tmp_path / "out" / TRACE_LOG_NAME, graduated_only=False)
    graduated = [q for q in questions.values() if q.rollouts]
    referenced = [q for q in questions.values() if q.reference is not None]
    assert graduated and referenced
    assert trainer.counters["graduated_bin_0of4_total"] == len(graduated)
    for q in graduated:
        assert len(q.rollouts) == 4 and q.rewards == [1.0] * 4 and q.graduation_step > 0
    for q in referenced:
        assert q.reference_step == 0 and "\\boxed{" in q.reference  # a raw teacher rollout (no compression)
    assert ZPPOConfig.__dataclass_fields__["audit_traces"].default is False  # off unless asked for
