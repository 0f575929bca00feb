"""`ZPPOTrainer` on the tiny random text model with synthetic rewards (no teacher).

These tests pin the trainer's bookkeeping: the replay buffer follows the plain groups,
empty-signal partitions leave the parameters and the optimizer state untouched, and a
resumed run continues the same run. BCQ/NCQ against a real teacher server are in
``test_trainer_zppo.py``.
"""

from __future__ import annotations

import json
import re
import zlib
from collections import defaultdict

import pytest
import torch
from datasets import Dataset
from tiny_models import save_tiny_hybrid_text_model
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.evaluation.condition import CONDITION_KEY
from zppo_trl.replay import PromptReplayBuffer
from zppo_trl.rewards import completion_text
from zppo_trl.trainer import ZPPO_STATE_NAME

pytestmark = pytest.mark.integration

QUESTIONS = [
    dict(id=f"q{i:02d}", question=f"What is {i} + {i}?", images=[], answer=str(2 * i), source="toy", subdataset="sum")
    for i in range(24)
]


def _config(tmp_path, **overrides) -> ZPPOConfig:
    settings = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=8,  # 2 new questions per partition at G=4
        num_generations=4,
        max_completion_length=6,
        num_partitions=2,
        gradient_accumulation_steps=1,
        augmentations=[],
        replay_fraction=0.5,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        data_seed=0,
        disable_tqdm=True,
    )
    settings.update(overrides)
    return ZPPOConfig(**settings)


def _trainer(model_dir, args, reward, **kwargs) -> ZPPOTrainer:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return ZPPOTrainer(
        model=model,
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(QUESTIONS),
        processing_class=tokenizer,
        **kwargs,
    )


class CoinReward:
    """A pseudo-random 0/1 reward per rollout, a function of the question and the completion text.

    Each question has a bias (``id % 4`` quarters), so groups mix trivial and non-trivial.
    Being a pure function of the rollout, it scores a resumed run exactly like the
    original. ``calls`` keeps (question id, reward) per rollout of each call (one call
    = one scoring round), so a test can recompute the plain accuracies the trainer saw.
    """

    __name__ = "coin"

    def __init__(self, seed: int = 0, trivial_after: int | None = None):
        self.seed = seed
        self.trivial_after = trivial_after
        self.calls: list[list[tuple[str, float]]] = []

    def __call__(self, completions, id, trainer_state, **kwargs):
        if self.trivial_after is not None and trainer_state.global_step >= self.trivial_after:
            rewards = [0.0] * len(completions)  # every group trivial: no learning signal
        else:
            rewards = []
            for n, (key, completion) in enumerate(zip(id, completions)):
                coin = zlib.crc32(f"{self.seed}|{key}|{n}|{completion_text(completion)}".encode()) % 1000 / 1000
                rewards.append(float(coin < (int(key[1:]) % 4) / 4))
        self.calls.append(list(zip(id, rewards)))
        return rewards


def _snapshot(trainer):
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    optimizer_state = trainer.optimizer.state if trainer.optimizer is not None else {}
    state = {
        n: {k: v.clone() if torch.is_tensor(v) else v for k, v in optimizer_state[p].items()}
        for n, p in trainer.model.named_parameters()
        if p in optimizer_state
    }
    return params, state


def _same(a, b) -> bool:
    (pa, sa), (pb, sb) = a, b
    if pa.keys() != pb.keys() or sa.keys() != sb.keys():
        return False
    if any(not torch.equal(pa[n], pb[n]) for n in pa):
        return False
    return all(
        set(sa[n]) == set(sb[n])
        and all(torch.equal(torch.as_tensor(sa[n][k]), torch.as_tensor(sb[n][k])) for k in sa[n])
        for n in sa
    )


class Snapshots(TrainerCallback):
    """Parameters + optimizer state after every optimizer step, and whether that step was skipped."""

    def __init__(self):
        self.trainer = None
        self.after: dict[int, tuple] = {}
        self.skipped: dict[int, bool] = {}

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        self.after[state.global_step] = _snapshot(t)
        self.skipped[state.global_step] = bool(
            t._buffered_inputs[(t._step - 1) % args.steps_per_generation].get("zppo_skip")
        )


def test_buffer_follows_plain_groups(tiny_text_model_dir, tmp_path):
    reward = CoinReward(seed=1)
    trainer = _trainer(tiny_text_model_dir, _config(tmp_path, max_steps=8), reward)
    trainer.train()
    # Recompute the refresh from what the reward function scored in each plain round.
    expected = PromptReplayBuffer(capacity=10_000, threshold=0.5)
    replayed = 0
    for call in reward.calls:
        scores = defaultdict(list)
        for key, r in call:
            scores[key].append(r)
        replayed += sum(1 for key in scores if key in expected)
        expected.update({key: sum(v) / len(v) for key, v in scores.items()})
    assert len(reward.calls) == 4  # one plain round per rollout step, nothing else is scored in GRPO†
    assert trainer.replay_buffer.residents() == expected.residents()
    assert replayed > 0, "residents must come back as replayed questions"
    logs = [h for h in trainer.state.log_history if "zppo/buffer_size" in h]
    assert [h["zppo/buffer_size"] for h in logs][-1] == len(expected)
    assert sum(h["zppo/replayed"] for h in logs) == replayed
    assert trainer.counters["admitted_total"] == sum(h["zppo/admitted"] for h in logs)


def test_empty_signal_partitions_change_nothing(tiny_text_model_dir, tmp_path):
    # Rollout step 1 (global steps 0-1) has signal; from global step 2 on every group is trivial.
    reward = CoinReward(seed=3, trivial_after=2)
    snaps = Snapshots()
    trainer = _trainer(tiny_text_model_dir, _config(tmp_path, max_steps=4), reward, callbacks=[snaps])
    snaps.trainer = trainer
    before = _snapshot(trainer)
    trainer.train()
    assert snaps.skipped == {1: False, 2: False, 3: True, 4: True}
    assert not _same(before, snaps.after[1]) and not _same(snaps.after[1], snaps.after[2])
    # Parameters and optimizer state (moments and step counts) unchanged through the skipped updates.
    assert snaps.after[2][1], "AdamW state must exist after the real updates"
    assert _same(snaps.after[2], snaps.after[3]) and _same(snaps.after[3], snaps.after[4])
    logs = [h for h in trainer.state.log_history if "zppo/skipped_partitions" in h]
    assert [h["zppo/skipped_partitions"] for h in logs] == [0.0, 2.0]


def test_resume_continues_the_same_run(tiny_text_model_dir, tmp_path):
    def run(out, max_steps, resume=False, save=False):
        overrides = dict(output_dir=str(out), max_steps=max_steps)
        if save:
            overrides.update(save_strategy="steps", save_steps=4)
        trainer = _trainer(tiny_text_model_dir, _config(tmp_path, **overrides), CoinReward(seed=5))
        trainer.train(resume_from_checkpoint=resume or None)
        return trainer

    straight = run(tmp_path / "straight", 8)
    half = run(tmp_path / "resumed", 4, save=True)
    state = json.loads((tmp_path / "resumed" / "checkpoint-4" / ZPPO_STATE_NAME).read_text())
    # a GRPO row's checkpoint is evaluated under the shared prompt: it records no condition
    assert CONDITION_KEY not in json.loads((tmp_path / "resumed" / "checkpoint-4" / "config.json").read_text())
    assert state["buffer"]["residents"] == half.replay_buffer.residents()
    resumed = run(tmp_path / "resumed", 8, resume=True)
    assert resumed.replay_buffer.residents() == straight.replay_buffer.residents()
    assert len(straight.replay_buffer) > 0
    assert dict(resumed.counters) == dict(straight.counters)
    assert resumed.zppo_state.rng.getstate() == straight.zppo_state.rng.getstate()
    for name, p in straight.model.named_parameters():
        torch.testing.assert_close(resumed.model.get_parameter(name), p, rtol=0, atol=0)


def test_a_grpo_row_clears_the_condition_of_the_checkpoint_it_starts_from(tiny_text_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_text_model_dir)
    model.config.update({CONDITION_KEY: "<correct>"})  # a Correction-SFT checkpoint as the starting point
    trainer = ZPPOTrainer(
        model=model,
        reward_funcs=CoinReward(),
        args=_config(tmp_path),
        train_dataset=Dataset.from_list(QUESTIONS),
        processing_class=AutoTokenizer.from_pretrained(tiny_text_model_dir),
    )
    trainer.save_model()
    assert CONDITION_KEY not in json.loads((tmp_path / "out" / "config.json").read_text())


def _staircase_reward(completions, id, **kwargs):
    """Question q's rollout i (of each group of 4) is right when i < q % 4: trivial and mixed groups by
    construction."""
    return [float(n % 4 < int(key[1:]) % 4) for n, key in enumerate(id)]


def test_logged_advantages_are_the_trained_ones(tiny_text_model_dir, tmp_path):
    # A reward that does not depend on the sampled text: every rollout step trains mixed groups.
    trainer = _trainer(tiny_text_model_dir, _config(tmp_path, max_steps=2, log_completions=True), _staircase_reward)
    trainer.train()
    # What the one rollout step trained: every micro-batch's rows that carry loss tokens.
    trained = []
    for micro in trainer._buffered_inputs:
        if not micro.get("zppo_skip"):
            real = micro["completion_mask"].sum(1) > 0
            trained += micro["advantages"][real].tolist()
    assert trained and any(a != 0 for a in trained)
    t = torch.tensor(trained, dtype=torch.float64)
    logged = next(h for h in trainer.state.log_history if "zppo/advantages/mean" in h)
    assert logged["zppo/advantages/trained_rollouts"] == len(trained)
    for name, value in (("mean", t.mean()), ("std", t.std(unbiased=False)), ("min", t.min()), ("max", t.max())):
        assert logged[f"zppo/advantages/{name}"] == pytest.approx(float(value), abs=1e-6), name
    # "Norm w/o Zero": the non-trivial groups' advantages have unit spread, not TRL's per-group scale
    nonzero = t[t != 0]
    assert nonzero.numel() and abs(float(t.mean())) < 1e-6
    # The completions table (log_completions) shows the same advantages, not TRL's own.
    table = list(trainer._logs["advantages"])
    assert sorted(a for a in table if a != 0) == pytest.approx(sorted(a for a in trained if a != 0), abs=1e-6)


def test_async_reward_functions_grade_teacher_rollouts(tiny_text_model_dir, tmp_path):
    from zppo_trl.rewards import boxed_accuracy_reward

    async def async_boxed(completions, answer, **kwargs):
        return boxed_accuracy_reward(completions, answer)

    trainer = _trainer(tiny_text_model_dir, _config(tmp_path, max_steps=2), [async_boxed])
    row = trainer.train_dataset[3]  # "What is 3 + 3?" -> 6
    assert trainer.grader.grade([row], [["so \\boxed{6}", "\\boxed{7}", "no box"]]) == [[True, False, False]]


def test_teacher_rollouts_of_every_hard_question_are_graded_in_one_call(tiny_text_model_dir, tmp_path):
    # One reward call for all of a step's teacher replies, as TRL scores a round: a judge then answers them
    # concurrently instead of one question after another.
    from zppo_trl.rewards import boxed_accuracy_reward

    calls, asked = [], []

    def counting_boxed(prompts, completions, answer, id, **kwargs):
        calls.append(list(id))
        asked.extend(prompt[-1]["content"] for prompt in prompts)
        return boxed_accuracy_reward(completions, answer)

    trainer = _trainer(tiny_text_model_dir, _config(tmp_path, max_steps=2), [counting_boxed])
    three, five, seven = (trainer.train_dataset[i] for i in (3, 5, 7))  # answers 6, 10, 14
    grades = trainer.grader.grade(
        [three, five, seven], [["\\boxed{6}", "\\boxed{10}"], [], ["\\boxed{14}", "14", "\\boxed{6}"]]
    )
    assert grades == [[True, False], [], [True, False, False]]
    assert calls == [["q03", "q03", "q07", "q07", "q07"]]
    assert [p.startswith(q) for p, q in zip(asked, ["What is 3 + 3?"] * 2 + ["What is 7 + 7?"] * 3)] == [True] * 5
    assert trainer.grader.grade([three], [[]]) == [[]] and len(calls) == 1  # nothing to grade: no call


def test_prompts_that_leave_less_than_a_completion_in_the_context_are_counted_and_warned(
    tiny_text_model_dir, tmp_path, caplog
):
    # vllm_max_model_length is the student's context (TRL reads it only under use_vllm; ZPPO checks every round
    # against it).
    roomy = _trainer(
        tiny_text_model_dir, _config(tmp_path / "roomy", max_steps=2, vllm_max_model_length=4096), CoinReward(seed=1)
    )
    roomy.train()
    logged = next(h for h in roomy.state.log_history if "zppo/prompts_over_context" in h)
    assert logged["zppo/prompts_over_context"] == 0 and logged["zppo/plain_prompt_tokens_max"] > 0
    longest = int(logged["zppo/plain_prompt_tokens_max"])

    # A context one token short for the longest prompt: it, and any prompt as long, is over.
    tight = _trainer(
        tiny_text_model_dir,
        _config(tmp_path / "tight", max_steps=2, vllm_max_model_length=longest + 6 - 1),
        CoinReward(seed=1),
    )
    with caplog.at_level("WARNING", logger="zppo_trl.trainer"):
        tight.train()
    logged = next(h for h in tight.state.log_history if "zppo/prompts_over_context" in h)
    assert logged["zppo/plain_prompt_tokens_max"] == longest
    assert 1 <= logged["zppo/prompts_over_context"] <= 4  # 4 new questions per rollout step here
    assert tight.counters["prompts_over_context_total"] == logged["zppo/prompts_over_context"]
    assert any("leave less than max_completion_length=6" in r.message for r in caplog.records)


def test_the_console_shows_a_line_per_rollout_step_not_trls_metrics_dict(tiny_text_model_dir, tmp_path, capsys):
    trainer = _trainer(tiny_text_model_dir, _config(tmp_path, max_steps=4, disable_tqdm=False), CoinReward(seed=1))
    trainer.train()
    out = capsys.readouterr()
    console = out.out + out.err
    lines = [line for line in console.splitlines() if line.startswith("rollout ")]
    assert [line.split(" |")[0] for line in lines] == ["rollout 1/2", "rollout 2/2"]
    assert all(
        "plain acc" in line and "buffer" in line and "BCQ" not in line for line in lines
    )  # GRPO†: no augmentation
    assert all(re.search(r"\| RSS \d+\.\d GB \(peak \d+\.\d GB\)$", line) for line in lines)  # host memory last
    memory = [h for h in trainer.state.log_history if "zppo/rss_gb" in h]
    assert len(memory) == 2 and all(0.1 < h["zppo/rss_gb"] <= h["zppo/rss_peak_gb"] for h in memory)
    assert "training done: 4 optimizer updates" in console
    assert "'learning_rate'" not in console and "zppo/buffer_size" not in console  # TRL's dict stays off the console
    assert "4/4" in console  # the progress bar
    # the loggers still get everything
    assert any("zppo/buffer_size" in h and "learning_rate" in h for h in trainer.state.log_history)

    loud = _trainer(
        tiny_text_model_dir,
        _config(tmp_path / "loud", max_steps=2, disable_tqdm=False, full_console_logs=True),
        CoinReward(seed=1),
    )
    loud.train()
    out = capsys.readouterr()
    assert "'zppo/buffer_size'" in out.out + out.err and "rollout 1/1 |" in out.out + out.err


def _assert_same_trained_weights(model, reference, start_dir) -> None:
    """``model``'s weights equal ``reference``'s within 1e-6, while training moved them by more than 1e-2 from
    the checkpoint in ``start_dir``: far more than the two differ."""
    start = AutoModelForCausalLM.from_pretrained(start_dir)
    moved = 0.0
    for name, p in reference.named_parameters():
        torch.testing.assert_close(model.get_parameter(name), p, rtol=0, atol=1e-6, msg=name)
        moved = max(moved, float((p.detach() - start.get_parameter(name)).abs().max()))
    assert moved > 1e-2


@pytest.mark.parametrize("student", ["qwen3", "qwen3_5-hybrid"])
def test_padding_free_trains_the_same_weights(student, tiny_text_model_dir, tmp_path):
    # One rollout step (2 optimizer updates on the same rollouts), its old log-probs and both losses
    # packed, against the padded run: the same rollouts, the same old log-probs, the same weights (up to
    # the float rounding in which the two forward passes differ). Plain SGD: AdamW's first step,
    # g / (|g| + eps), would turn rounding-level differences of near-zero gradient entries into full steps.
    # The hybrid student (Qwen3.5's Gated DeltaNet + full attention, the paper's students) trains with
    # gradient checkpointing, so its segmented linear attention is also replayed in the backward pass.
    model_dir = tiny_text_model_dir if student == "qwen3" else save_tiny_hybrid_text_model(tmp_path / "hybrid")
    hybrid = dict(gradient_checkpointing=True) if student != "qwen3" else {}

    # The Qwen3 student also trains with shared_prompt_forward (each group's prompt once, zppo_trl.shared_prompts),
    # its old log-probs scored one pass per prompt: the same rollouts, old log-probs and weights again.
    def run(padding_free, shared=False):
        args = _config(
            tmp_path / f"{padding_free}-{shared}",
            max_steps=2,
            padding_free=padding_free,
            shared_prompt_forward=shared,
            optim="sgd",
            learning_rate=1.0,
            **hybrid,
        )
        trainer = _trainer(model_dir, args, _staircase_reward)
        trainer.train()
        return trainer

    padded, packed = run(False), run(True)
    assert packed.counters["padded_micro_batches_total"] == 0  # every pass was packed
    others = [packed]
    if student == "qwen3":
        shared = run(False, shared=True)
        assert shared.counters["unshared_micro_batches_total"] == 0  # every pass was shared
        assert shared.counters["shared_prompt_tokens_saved_total"] > 0
        others.append(shared)
    for other in others:
        for mine, theirs in zip(other._buffered_inputs, padded._buffered_inputs, strict=True):
            assert torch.equal(mine["completion_ids"], theirs["completion_ids"])
            assert ("old_per_token_logps" in mine) == ("old_per_token_logps" in theirs)
            if "old_per_token_logps" in mine:  # the second partition's (defer_old_logps)
                torch.testing.assert_close(
                    mine["old_per_token_logps"], theirs["old_per_token_logps"], rtol=0, atol=1e-5
                )
        _assert_same_trained_weights(other.model, padded.model, model_dir)


def test_deferred_old_logps_train_the_same_weights(tiny_text_model_dir, tmp_path):
    # One rollout step, two partition updates, scored by TRL's schedule (old log-probs of every rollout at
    # generation) and by the deferred one (only the second partition's, from its micro-batches, before the first
    # update). The first partition's ratio is exactly 1 either way, so the same rollouts train the same weights,
    # up to the float rounding in which the padded round and the trimmed micro-batch differ. Plain SGD, as above.
    def run(defer):
        args = _config(tmp_path / str(defer), max_steps=2, defer_old_logps=defer, optim="sgd", learning_rate=1.0)
        trainer = _trainer(tiny_text_model_dir, args, _staircase_reward)
        trainer.train()
        return trainer, [h for h in trainer.state.log_history if "zppo/rollout_steps" in h]

    (serial, serial_logs), (deferred, deferred_logs) = run(False), run(True)
    first, second = deferred._buffered_inputs  # one micro-batch per partition
    assert not first.get("zppo_skip") and not second.get("zppo_skip")
    assert "old_per_token_logps" not in first  # never computed: its update ran on the sampling weights
    assert all("old_per_token_logps" in micro for micro in serial._buffered_inputs)
    assert torch.equal(second["completion_ids"], serial._buffered_inputs[1]["completion_ids"])
    torch.testing.assert_close(
        second["old_per_token_logps"], serial._buffered_inputs[1]["old_per_token_logps"], rtol=0, atol=1e-5
    )
    assert deferred_logs[0]["zppo/old_logps_rows"] == second["completion_ids"].size(0)
    assert "zppo/old_logps_rows" not in serial_logs[0]
    _assert_same_trained_weights(deferred.model, serial.model, tiny_text_model_dir)


def test_old_logps_skip_every_partition_before_the_first_update(tiny_text_model_dir, tmp_path):
    # A skipped partition changes no weight, so the first partition that updates runs on the sampling weights
    # too: with the first of three partitions skipped, only the third needs the sampling policy's log-probs.
    trainer = _trainer(tiny_text_model_dir, _config(tmp_path, num_partitions=3), _staircase_reward)
    tokenizer = trainer.processing_class
    prompt = torch.tensor([tokenizer("What is 2 + 2?")["input_ids"]] * 2)
    completions = [torch.tensor([tokenizer(" It is 4.")["input_ids"]] * 2), torch.tensor([[5, 6, 7], [8, 9, 10]])]
    second, third = (
        dict(
            prompt_ids=prompt,
            prompt_mask=torch.ones_like(prompt),
            completion_ids=ids,
            completion_mask=torch.ones_like(ids),
        )
        for ids in completions
    )
    trainer.old_logps.attach([{"zppo_skip": True}, second, third])
    assert "old_per_token_logps" not in second
    ids = torch.cat([prompt, completions[1]], dim=1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids).logits[:, prompt.size(1) - 1 : -1].float()
    expected = logits.log_softmax(-1).gather(-1, completions[1][..., None])[..., 0]
    torch.testing.assert_close(third["old_per_token_logps"], expected, rtol=0, atol=1e-5)
    assert trainer.recorder.metrics["old_logps_rows"] == 2
