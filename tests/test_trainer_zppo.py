"""ZPPO end to end: a student that writes ``\\boxed{}``, a real teacher server, BCQ and NCQ.

The students and teachers are tiny models fine-tuned at the start of the session
(``boxed_models.py``) to answer the toy questions with per-question reliability, so some
questions are hard, the teacher is right on most of them, and wrong answers parse. The
teacher is a real server on 127.0.0.1: vLLM's CPU engine (the production server) and
``transformers serve`` for the text teacher, ``transformers serve`` for the VLM teacher
(vLLM's Qwen-VL code needs torchvision, which CPU torch cannot have here).
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3_5ForConditionalGeneration, TrainerCallback

from zppo_trl import ZPPOConfig, ZPPOTrainer, logp_paths
from zppo_trl.group_log import GROUP_LOG_NAME, read_group_log
from zppo_trl.processing import load_processor
from zppo_trl.prompts import BCQ_INSTRUCTION, RL_CLOSER, bcq_block, compose_prompt, ncq_block
from zppo_trl.replay import PromptReplayBuffer
from zppo_trl.rewards import boxed_accuracy_reward, completion_text, extract_boxed
from zppo_trl.teacher import TeacherClient

try:
    from boxed_models import toy_rows
    from conftest import require_vllm
    from servers import SERVERS
except ImportError:  # tests/ imported as a package
    from tests.boxed_models import toy_rows
    from tests.conftest import require_vllm
    from tests.servers import SERVERS

pytestmark = pytest.mark.integration

# Every zppo/ metric the issue asks for (per rollout step).
REQUIRED_METRICS = [
    "buffer_size", "admitted", "graduated", "evicted", "admitted_total", "graduated_total", "evicted_total",
    "admitted_bin_0of4", "admitted_bin_1of4", "graduated_bin_0of4", "graduated_bin_1of4",
    "hard", "hard_bcq_possible", "hard_ncq_only", "bcq", "ncq", "teacher_success_rate",
    "bcq_accuracy", "ncq_accuracy", "bcq_match_teacher", "bcq_match_student", "bcq_match_neither",
    "ncq_repeat_rate", "positive_advantage_fraction", "skipped_partitions", "teacher/latency_s", "teacher/failures",
]  # fmt: skip


class Spy:
    """The boxed reward, recording every scoring call: prompts, question ids, completions, rewards."""

    __name__ = "boxed"

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, prompts, completions, answer, id, completion_ids=None, **kwargs):
        rewards = boxed_accuracy_reward(completions, answer)
        self.calls.append(
            dict(
                prompts=prompts,
                ids=list(id),
                texts=[completion_text(c) for c in completions],
                rewards=rewards,
                teacher=completion_ids is None,
                tokens=None if completion_ids is None else sum(len(ids) for ids in completion_ids),
            )
        )
        return rewards

    def rounds(self, reformulated: bool) -> list[dict]:
        """The student's scoring rounds: plain ones, or BCQ/NCQ ones."""
        return [
            c for c in self.calls if not c["teacher"] and ("<candidate>" in _text(c["prompts"][0])) == reformulated
        ]


class TrainedRows(TrainerCallback):
    """After each optimizer step that was not skipped: the prompt, advantage and image count of every row with loss
    tokens."""

    def __init__(self):
        self.trainer = None
        self.prompts: list[str] = []
        self.advantages: list[float] = []
        self.images: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        micro = t._buffered_inputs[(t._step - 1) % args.steps_per_generation]
        if micro.get("zppo_skip"):
            return
        tokenizer = getattr(t.processing_class, "tokenizer", t.processing_class)
        for row in range(micro["prompt_ids"].size(0)):
            if micro["completion_mask"][row].any():
                ids = micro["prompt_ids"][row][micro["prompt_mask"][row].bool()]
                self.prompts.append(tokenizer.decode(ids))
                self.advantages.append(float(micro["advantages"][row]))
                self.images.append(micro["num_images"][row] if "num_images" in micro else 0)


def _text(prompt) -> str:
    content = prompt[-1]["content"]
    return (
        content if isinstance(content, str) else "".join(p.get("text", "") for p in content if p.get("type") == "text")
    )


def _config(tmp_path, server, **overrides) -> ZPPOConfig:
    settings = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=16,  # 4 new questions per partition at G=4
        num_generations=4,
        max_completion_length=32,
        num_partitions=2,
        gradient_accumulation_steps=1,
        max_steps=4,  # two rollout steps
        replay_fraction=0.5,
        augment_fraction=0.5,
        teacher_base_url=server.base_url,
        teacher_model=server.model,
        teacher_max_tokens=32,
        compression_max_tokens=48,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    settings.update(overrides)
    return ZPPOConfig(**settings)


def _rollout_logs(trainer) -> list[dict]:
    return [
        {k[5:]: v for k, v in h.items() if k.startswith("zppo/")}
        for h in trainer.state.log_history
        if "zppo/buffer_size" in h
    ]


def _check_reformulated_prompt(text: str, question: str) -> str:
    """Assert ``text`` is exactly question + a block re-rendered from its own parts + closer; return the kind."""
    candidates = re.findall(r"<candidate>\n(.*?)\n</candidate>", text, flags=re.DOTALL)
    assert candidates, text
    if BCQ_INSTRUCTION in text:
        kind, block = "bcq", bcq_block(candidates)
        assert len(candidates) == 2
    else:
        listed = re.search(r"The following answers are all WRONG: (.*?)\.?\n", text)
        assert listed, text
        wrong = [extract_boxed(part) for part in listed.group(1).split(", ")]
        kind, block = "ncq", ncq_block(wrong, candidates)
    assert text == compose_prompt(question, block, RL_CLOSER)
    return kind


@pytest.mark.parametrize("backend", ["vllm", "transformers"])
def test_zppo_trains_bcq_and_ncq_groups_against_a_real_teacher(boxed_text_student_dir, backend, request, tmp_path):
    boxed_teacher_server = request.getfixturevalue(
        "vllm_boxed_teacher_server" if backend == "vllm" else "boxed_teacher_server"
    )
    rows = toy_rows("text")
    questions = {row["id"]: row["question"] for row in rows}
    spy, trained = Spy(), TrainedRows()
    trainer = ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(boxed_text_student_dir),
        reward_funcs=spy,
        args=_config(tmp_path, boxed_teacher_server, log_groups=True),
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(boxed_text_student_dir),
        callbacks=[trained],
    )
    trained.trainer = trainer
    trainer.train()

    logs = _rollout_logs(trainer)
    assert len(logs) == 2
    for name in REQUIRED_METRICS:
        assert all(name in log for log in logs), name
    # The second step's 8 new questions went to the teacher during the first step's updates; its replayed ones
    # when it started (prefetch_teacher_samples)
    assert [log["teacher_prefetched"] for log in logs] == [0, 8] and logs[1]["replayed"] > 0
    assert trainer.counters["bcq_total"] > 0 and trainer.counters["ncq_total"] > 0, logs
    assert sum(log["bcq_trained"] for log in logs) > 0 and sum(log["ncq_trained"] for log in logs) > 0

    # The student saw exactly the rendered prompts: question, block, closer; NCQ lists its own wrong answers.
    plain_rounds, reformulated_rounds = spy.rounds(False), spy.rounds(True)
    assert len(plain_rounds) == 2 and 1 <= len(reformulated_rounds) <= 2
    kinds = defaultdict(int)
    for call in reformulated_rounds:
        for prompt, key in zip(call["prompts"][:: trainer.num_generations], call["ids"][:: trainer.num_generations]):
            kinds[_check_reformulated_prompt(_text(prompt), questions[key])] += 1
    assert kinds["bcq"] > 0 and kinds["ncq"] > 0
    assert sum(kinds.values()) == sum(log["bcq_trained"] + log["ncq_trained"] for log in logs)

    # BCQ/NCQ rows were trained on: optimizer updates took reformulated rows (their completion tokens
    # in the loss), next to plain rows; some rows carried signal.
    assert any("<candidate>" in p for p in trained.prompts)
    assert any("<candidate>" not in p for p in trained.prompts)
    assert any(a != 0 for a in trained.advantages)

    # The buffer evolved as the plain groups say, and only they.
    expected = PromptReplayBuffer(capacity=10_000, threshold=0.5)
    for call in plain_rounds:
        scores = defaultdict(list)
        for key, r in zip(call["ids"], call["rewards"]):
            scores[key].append(r)
        expected.update({key: sum(v) / len(v) for key, v in scores.items()})
    assert trainer.replay_buffer.residents() == expected.residents()
    assert logs[-1]["buffer_size"] == len(expected) > 0

    # The group log has, per step, every group the student's scoring rounds scored, in order, with its kind; the
    # step's token counts are what the student generated, and what the updates that ran trained on.
    G = trainer.num_generations
    per_step: list[list[dict]] = []
    for call in [c for c in spy.calls if not c["teacher"]]:
        reformulated = "<candidate>" in _text(call["prompts"][0])
        if not reformulated:
            per_step.append([])
        per_step[-1].append(call)
    steps = read_group_log(tmp_path / "out" / GROUP_LOG_NAME)
    assert list(steps) == [1, 2]
    for step, calls, log in zip(steps, per_step, logs):
        expected_groups = [
            (
                _check_reformulated_prompt(_text(call["prompts"][g]), questions[call["ids"][g]])
                if "<candidate>" in _text(call["prompts"][g])
                else "plain",
                call["ids"][g],
                call["rewards"][g : g + G],
            )
            for call in calls
            for g in range(0, len(call["ids"]), G)
        ]
        written = [(g["kind"] if g["kind"] in ("bcq", "ncq") else "plain", g["id"], g["rewards"]) for g in steps[step]]
        assert written == expected_groups
        assert {g["kind"] for g in steps[step]} - {"bcq", "ncq"} <= {"new", "replay"}
        assert log["generated_tokens"] == sum(call["tokens"] for call in calls) > 0
        assert 0 < log["trained_tokens"] <= log["generated_tokens"]
        if log["skipped_partitions"] == 0:
            assert log["trained_tokens"] == log["generated_tokens"]
    assert trainer.counters["generated_tokens_total"] == sum(log["generated_tokens"] for log in logs)


class SampleRecorder(TeacherClient):
    """The real client, keeping the replies to every sampling request by its question's text."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.replies: dict[str, list[str]] = {}

    def sample_async(self, conversations, *args, **kwargs):
        future = super().sample_async(conversations, *args, **kwargs)
        questions = [_text(conversation) for conversation in conversations]
        future.add_done_callback(lambda done: self.replies.update(zip(questions, done.result(), strict=True)))
        return future


def test_prefetching_teacher_samples_and_overlapping_old_logps_change_no_weight(
    boxed_text_student_dir, vllm_boxed_teacher_server, tmp_path, monkeypatch
):
    # The step's two overlaps against the serial schedule, seeded. A greedy teacher's replies depend on nothing but
    # the question. So the run that asks for the second step's new questions during the first step's updates and
    # the run that asks when the second step starts get the same replies, build the same BCQ/NCQ prompts from them
    # and train the same weights, to the bit. The overlapped run also computes the plain rollouts' old log-probs on
    # a second thread while the teacher is waited for, the candidates compressed and the BCQ/NCQ round generated:
    # the same numbers, to the bit. (It runs where the student's rollouts come from a vLLM server; here the
    # trainer generates them itself, so that both runs sample the same rollouts from the seed: the decision
    # "is the second round off this device" is taken as yes for both, and overlap_old_logps alone differs. The
    # second thread only reads the model, so the BCQ/NCQ round is generated on it meanwhile: test_lm_head.py holds
    # that interleaving in place. tests/test_student_server.py runs it in its real topology.)
    server = vllm_boxed_teacher_server
    monkeypatch.setattr(logp_paths, "rollouts_off_device", lambda args: True)

    def run(overlap: bool):
        teacher = SampleRecorder(server.base_url, server.model)
        trainer = ZPPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(boxed_text_student_dir),
            reward_funcs=Spy(),
            args=_config(
                tmp_path / str(overlap),
                server,
                teacher_temperature=0.0,
                teacher_num_generations=1,  # greedy: one reply per question
                prefetch_teacher_samples=overlap,
                overlap_old_logps=overlap,
            ),
            train_dataset=Dataset.from_list(toy_rows("text")),
            processing_class=AutoTokenizer.from_pretrained(boxed_text_student_dir),
            teacher=teacher,
        )
        try:
            trainer.train()
        finally:
            teacher.close()
        return trainer, _rollout_logs(trainer), teacher.replies

    (serial, serial_logs, serial_replies), (overlapped, overlapped_logs, overlapped_replies) = run(False), run(True)
    assert [log["teacher_prefetched"] for log in serial_logs] == [0, 0]
    assert all(log["time/old_logps_hidden_s"] > 0 for log in overlapped_logs)
    assert not any("time/old_logps_hidden_s" in log for log in serial_logs)
    assert [log["old_logps_rows"] for log in overlapped_logs] == [log["old_logps_rows"] for log in serial_logs]
    assert [log["teacher_prefetched"] for log in overlapped_logs] == [0, 8]
    assert overlapped_logs[1]["replayed"] > 0  # asked for on their own when the second step started
    assert overlapped_replies == serial_replies and len(serial_replies) > 8
    for name in ("bcq", "ncq", "bcq_trained", "ncq_trained"):
        assert [log[name] for log in overlapped_logs] == [log[name] for log in serial_logs], name
    assert sum(log["bcq_trained"] + log["ncq_trained"] for log in serial_logs) > 0
    start = AutoModelForCausalLM.from_pretrained(boxed_text_student_dir)
    moved = 0.0
    with torch.no_grad():
        for name, p in serial.model.named_parameters():
            assert torch.equal(overlapped.model.get_parameter(name), p), name
            moved = max(moved, float((p - start.get_parameter(name)).abs().max()))
    assert moved > 0


class CompressionRecorder(TeacherClient):
    """The real client, counting the candidates it was asked to compress."""

    compressed: int = 0

    def compress_async(self, responses, **kwargs):
        self.compressed += len(responses)
        return super().compress_async(responses, **kwargs)


def test_uncompressed_candidates_are_the_raw_rollouts(boxed_text_student_dir, boxed_teacher_server, tmp_path):
    # compress_candidates: false (the CPU demo's setting): no compression request reaches the teacher,
    # and every candidate is, verbatim, a rollout the student or the teacher wrote in that step.
    rows = toy_rows("text")
    spy = Spy()
    args = _config(tmp_path, boxed_teacher_server, compress_candidates=False, augment_fraction=1.0)
    teacher = CompressionRecorder(boxed_teacher_server.base_url, boxed_teacher_server.model)
    trainer = ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(boxed_text_student_dir),
        reward_funcs=spy,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(boxed_text_student_dir),
        teacher=teacher,
    )
    trainer.train()

    assert teacher.compressed == 0
    written = {
        text.strip() for call in spy.calls if "<candidate>" not in _text(call["prompts"][0]) for text in call["texts"]
    }
    teacher_written = {text.strip() for call in spy.calls if call["teacher"] for text in call["texts"]}
    kinds = defaultdict(int)
    for call in spy.rounds(True):
        for prompt in call["prompts"][:: trainer.num_generations]:
            text = _text(prompt)
            candidates = re.findall(r"<candidate>\n(.*?)\n</candidate>", text, flags=re.DOTALL)
            assert candidates and set(candidates) <= written, candidates
            kind = "bcq" if BCQ_INSTRUCTION in text else "ncq"
            kinds[kind] += 1
            if kind == "bcq":  # one of the two is the teacher's graded-correct rollout
                assert len(candidates) == 2 and set(candidates) & teacher_written
    assert kinds["bcq"] > 0 and kinds["ncq"] > 0, kinds


def test_vlm_student_sees_question_image_block_closer(boxed_vlm_student_dir, boxed_vlm_teacher_server, tmp_path):
    rows = toy_rows("vlm")
    by_id = {row["id"]: row for row in rows}
    spy, trained = Spy(), TrainedRows()
    trainer = ZPPOTrainer(
        model=Qwen3_5ForConditionalGeneration.from_pretrained(boxed_vlm_student_dir),
        reward_funcs=spy,
        args=_config(
            tmp_path,
            boxed_vlm_teacher_server,
            per_device_train_batch_size=12,
            max_steps=2,
            augment_fraction=1.0,
            replay_fraction=0.0,
        ),
        train_dataset=Dataset.from_list(rows),
        processing_class=load_processor(boxed_vlm_student_dir),
        callbacks=[trained],
    )
    trained.trainer = trainer
    trainer.train()

    reformulated = spy.rounds(True)
    assert reformulated, _rollout_logs(trainer)
    seen = defaultdict(int)
    for call in reformulated:
        for prompt, key in zip(call["prompts"], call["ids"]):
            parts = prompt[-1]["content"]
            images = [p["image"] for p in parts if p.get("type") == "image"]
            assert len(images) == 1 and images[0].tobytes() == by_id[key]["images"][0].tobytes()
            seen[_check_reformulated_prompt(_text(prompt), by_id[key]["question"])] += 1
    assert seen["ncq"] > 0, seen
    # Trained rows carry their image: every trained prompt holds the image tokens and one image.
    assert trained.prompts and all(n == 1 for n in trained.images)
    assert any("<candidate>" in p for p in trained.prompts)
    assert all("<|image_pad|>" in p for p in trained.prompts)


def _kill_mid_batch(server, client: TeacherClient) -> tuple[list, dict, bool]:
    """SIGKILL ``server`` once three of 200 requests ``client`` sends have been answered: (the 200 replies, the
    client's statistics since, whether it still calls the server healthy)."""
    future = client.sample_async([f"Question {i}" for i in range(200)], n=1, max_tokens=64)
    deadline = time.monotonic() + 60
    while client.stats()["succeeded"] < 3:
        assert time.monotonic() < deadline, "timed out waiting for the first replies"
        time.sleep(0.005)
    server.kill()
    replies = future.result(timeout=120)  # no exception
    return replies, client.stats(reset=True), client.health()


@pytest.mark.parametrize("backend", ["vllm", "transformers"])
def test_teacher_outage_degrades_and_recovers(boxed_text_student_dir, boxed_text_teacher_dir, backend, tmp_path):
    """The teacher server is SIGKILLed after the first rollout step, in the middle of a batch of a second client's
    requests, and restarted on the same port after the second: the run trains on without it, and both clients
    (the trainer's and the second) recover. One server of each kind for both: a vLLM start is half a minute."""
    if backend == "vllm":
        require_vllm()
    server = SERVERS[backend](boxed_text_teacher_dir, log_dir=tmp_path).start()
    other = TeacherClient(
        server.base_url, server.model, max_concurrency=2, max_retries=1, backoff_base=0.01, backoff_max=0.05
    )
    killed = {}

    class Outage(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:  # the second rollout step runs without a teacher
                killed["replies"], killed["stats"], killed["healthy"] = _kill_mid_batch(server, other)
            elif state.global_step == 4:
                server.restart()  # same port, same clients

    teacher = TeacherClient(
        server.base_url, server.model, max_retries=1, timeout=30, backoff_base=0.05, backoff_max=0.1
    )
    try:
        trainer = ZPPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(boxed_text_student_dir),
            reward_funcs=Spy(),
            args=_config(tmp_path, server, max_steps=6, replay_fraction=0.0, augment_fraction=1.0),
            train_dataset=Dataset.from_list(toy_rows("text")),
            processing_class=AutoTokenizer.from_pretrained(boxed_text_student_dir),
            callbacks=[Outage()],
            teacher=teacher,
        )
        trainer.train()
        # the second client after the restart
        assert other.health()
        assert [len(r) for r in other.sample(["a", "b", "c"], n=2, max_tokens=4)] == [2, 2, 2]
        assert other.stats()["failed"] == 0
    finally:
        teacher.close()
        other.close()
        server.stop()
    up, down, back = _rollout_logs(trainer)
    assert up["teacher/failures"] == 0 and up["bcq_trained"] + up["ncq_trained"] > 0
    assert down["teacher/failures"] > 0 and down["bcq_trained"] == down["ncq_trained"] == 0
    assert down["hard"] > 0  # there was work for the teacher; the step trained the plain groups anyway
    # The third step's samples, asked for ahead while the server was down, failed; the step asked again
    assert back["teacher_prefetched"] == 0 and back["bcq"] > 0 and back["bcq_trained"] > 0
    assert trainer.state.global_step == 6
    # the second client, killed mid-batch: every request answered or counted as failed, none raised
    replies, stats = killed["replies"], killed["stats"]
    assert len(replies) == 200
    assert 3 <= sum(len(r) == 1 for r in replies) < 200
    assert stats["failed"] == 200 - stats["succeeded"] > 0
    assert stats["retries"] >= stats["failed"] and stats["in_flight"] == 0
    assert not killed["healthy"]
