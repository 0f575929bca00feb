"""The paper's Hint and Prefix controls (alg:hint, alg:prefix) train end to end against a real teacher server.

Each test runs two rollout steps of the GRPO† pipeline with one control switched on, on the boxed
toy student and teacher (`transformers serve` on 127.0.0.1), and checks what makes that row itself:

* Hint: every hinted prompt is question + ``<hint>`` block + closer (the block before the closer),
  the hint is the teacher's reply to the hint prompt and carries no ``\\boxed{}``; hinted rows enter
  optimizer updates; the buffer is refreshed from the plain groups only.
* Prefix: each prefix group's generation prompt is the plain prompt followed by the first
  ``floor(0.4 L)`` tokens of one of that question's graded-correct teacher rollouts; those tokens
  are never completion tokens (no loss); prefix and continuation share ``max_completion_length``;
  what is graded is prefix || continuation.
"""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.augmentation import answer_free
from zppo_trl.prompts import RL_CLOSER, compose_prompt, hint_block
from zppo_trl.replay import PromptReplayBuffer
from zppo_trl.rewards import boxed_accuracy_reward, completion_text

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from boxed_models import HINT_REPLY, toy_rows
except ImportError:  # tests/ imported as a package
    from tests.boxed_models import HINT_REPLY, toy_rows

pytestmark = pytest.mark.integration


class Spy:
    """The boxed reward, recording every student scoring round: prompt texts, ids, graded texts."""

    __name__ = "boxed"

    def __init__(self):
        self.calls: list[dict] = []

    def __call__(self, prompts, completions, answer, id, completion_ids=None, **kwargs):
        rewards = boxed_accuracy_reward(completions, answer)
        if completion_ids is not None:  # the trainer grades teacher rollouts without ids
            self.calls.append(dict(prompts=[p[-1]["content"] for p in prompts], ids=list(id), texts=[completion_text(c) for c in completions], rewards=rewards))
        return rewards


def _config(tmp_path, server, reformulations, **overrides) -> ZPPOConfig:
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
        reformulations=reformulations,
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
    return ZPPOConfig(**{**settings, **overrides})


def _trainer(student_dir, server, tmp_path, reformulations, spy) -> ZPPOTrainer:
    return ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(student_dir),
        reward_funcs=spy,
        args=_config(tmp_path, server, reformulations),
        train_dataset=Dataset.from_list(toy_rows("text")),
        processing_class=AutoTokenizer.from_pretrained(student_dir),
    )


def _rollout_logs(trainer) -> list[dict]:
    return [{k[5:]: v for k, v in h.items() if k.startswith("zppo/")} for h in trainer.state.log_history if "zppo/buffer_size" in h]


def _expected_buffer(plain_calls) -> PromptReplayBuffer:
    expected = PromptReplayBuffer(capacity=10_000, threshold=0.5)
    for call in plain_calls:
        scores = defaultdict(list)
        for key, r in zip(call["ids"], call["rewards"]):
            scores[key].append(r)
        expected.update({key: sum(v) / len(v) for key, v in scores.items()})
    return expected


def test_hint_row_puts_an_answer_free_teacher_hint_before_the_closer(boxed_text_student_dir, boxed_teacher_server, tmp_path):
    spy = Spy()
    trainer = _trainer(boxed_text_student_dir, boxed_teacher_server, tmp_path, ["hint"], spy)
    assert trainer.args.variant == "GRPO\u2020+Hint"
    trainer.train()

    logs = _rollout_logs(trainer)
    assert len(logs) == 2
    assert trainer.counters["hint_trained_total"] > 0, logs
    assert all("bcq_trained" not in log for log in logs)  # no BCQ/NCQ in this row
    questions = {row["id"]: row["question"] for row in toy_rows("text")}
    hint_text = HINT_REPLY.split("</think>")[1].removesuffix("<|im_end|>").strip()
    hinted = [c for c in spy.calls if "<hint>" in c["prompts"][0]]
    plain = [c for c in spy.calls if "<hint>" not in c["prompts"][0]]
    assert len(plain) == 2 and 1 <= len(hinted) <= 2
    hints = []
    for call in hinted:
        for prompt, key in zip(call["prompts"], call["ids"]):
            hint = prompt.split("<hint>\n", 1)[1].split("\n</hint>", 1)[0]
            assert hint.strip() and answer_free(hint)
            assert prompt == compose_prompt(questions[key], hint_block(hint), RL_CLOSER)
            assert prompt.index("</hint>") < prompt.index(RL_CLOSER)
            hints.append(hint)
    assert len(hints) == trainer.num_generations * trainer.counters["hint_trained_total"]
    assert hint_text in hints  # the teacher's learnt reply to fig:prompt-hint (it samples at temperature 1)
    assert trainer.replay_buffer.residents() == _expected_buffer(plain).residents()


def test_prefix_row_continues_a_correct_teacher_prefix_that_carries_no_loss(boxed_text_student_dir, boxed_teacher_server, tmp_path):
    spy = Spy()
    trainer = _trainer(boxed_text_student_dir, boxed_teacher_server, tmp_path, ["prefix"], spy)
    assert trainer.args.variant == "GRPO\u2020+Prefix"
    tokenizer = trainer.processing_class
    evidence, rounds = [], []
    gather, score = trainer._gather_evidence, trainer._score_round

    def gather_evidence(*args, **kwargs):
        evidence.append(gather(*args, **kwargs))
        return evidence[-1]

    def score_round(groups):
        result = score(groups)
        rounds.append((list(groups), result[0]))
        return result

    trainer._gather_evidence, trainer._score_round = gather_evidence, score_round
    trainer.train()

    logs = _rollout_logs(trainer)
    assert trainer.counters["prefix_trained_total"] > 0, logs
    G, budget = trainer.num_generations, trainer.args.max_completion_length
    assert len(rounds) == len(spy.calls)  # one scoring call per student round
    checked = 0
    step = -1
    for (groups, out), call in zip(rounds, spy.calls):
        if groups[0].kind in ("new", "replay", "filler"):
            step += 1
            continue
        for g, group in enumerate(groups):
            if group.kind != "prefix":
                continue
            prefix = list(group.response_prefix)
            # the prefix is floor(0.4 L) tokens of one of this question's graded-correct teacher rollouts
            correct = evidence[step].teacher_correct[group.row["id"]]
            cuts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in correct]
            assert any(ids[: math.floor(0.4 * len(ids))] == prefix for ids in cuts)
            plain_prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": compose_prompt(group.row["question"], None, RL_CLOSER)}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            for i in range(g * G, (g + 1) * G):
                prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
                completion = out["completion_ids"][i][out["completion_mask"][i].bool()].tolist()
                assert prompt == [*plain_prompt, *prefix]  # the prefix conditions the rollout ...
                assert len(completion) <= budget - len(prefix)  # ... shares the length budget ...
                assert call["texts"][i] == tokenizer.decode([*prefix, *completion], skip_special_tokens=True)  # ... and is graded with it
                checked += 1
    assert checked == G * trainer.counters["prefix_trained_total"]
    plain = [c for (groups, _), c in zip(rounds, spy.calls) if groups[0].kind in ("new", "replay")]
    assert trainer.replay_buffer.residents() == _expected_buffer(plain).residents()


@pytest.mark.parametrize(
    "objective, variant, logged",
    [("gspo", "ZPPO (GSPO)", "clip_ratio/region_mean"), ("cispo", "ZPPO (CISPO)", "cispo_clip_ratio"), ("dispo", "ZPPO (DISPO)", "clip_ratio/neg_high_mean")],
)
def test_zppo_trains_under_each_step_6_objective(boxed_text_student_dir, boxed_teacher_server, tmp_path, objective, variant, logged):
    spy = Spy()
    args = _config(tmp_path, boxed_teacher_server, ["bcq", "ncq"], policy_objective=objective, max_steps=2)
    trainer = ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(boxed_text_student_dir),
        reward_funcs=spy,
        args=args,
        train_dataset=Dataset.from_list(toy_rows("text")),
        processing_class=AutoTokenizer.from_pretrained(boxed_text_student_dir),
    )
    assert args.variant == variant
    # what makes it that objective in TRL's loss (the loss formulas themselves: tests/test_objectives.py)
    assert (trainer.importance_sampling_level, trainer.loss_type) == {"gspo": ("sequence", "dapo"), "cispo": ("token", "cispo"), "dispo": ("token", "dapo")}[objective]
    if objective == "cispo":
        assert trainer.epsilon_high == pytest.approx(1.28)  # MiniMax-M1's bound 1 + eps_high
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    calls = []
    loss = trainer._compute_loss

    def compute_loss(model, inputs):
        calls.append(objective)
        return loss(model, inputs)

    trainer._compute_loss = compute_loss
    trainer.train()
    assert calls, "no optimizer update ran a loss"
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert any(logged in h for h in trainer.state.log_history), logged  # the objective's own metric
    assert trainer.counters["bcq_trained_total"] + trainer.counters["ncq_trained_total"] > 0
