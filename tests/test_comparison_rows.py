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

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.augmentations import answer_free, leaks_answer
from zppo_trl.evaluation.condition import CONDITION_KEY
from zppo_trl.prompts import CORRECT_TAG, RL_CLOSER, compose_prompt, hint_block
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
            self.calls.append(
                dict(
                    prompts=[p[-1]["content"] for p in prompts],
                    ids=list(id),
                    texts=[completion_text(c) for c in completions],
                    rewards=rewards,
                )
            )
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
        augmentations=reformulations,
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


def _trainer(student_dir, server, tmp_path, reformulations, spy, **overrides) -> ZPPOTrainer:
    return ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(student_dir),
        reward_funcs=spy,
        args=_config(tmp_path, server, reformulations, **overrides),
        train_dataset=Dataset.from_list(toy_rows("text")),
        processing_class=AutoTokenizer.from_pretrained(student_dir),
    )


def _rollout_logs(trainer) -> list[dict]:
    return [
        {k[5:]: v for k, v in h.items() if k.startswith("zppo/")}
        for h in trainer.state.log_history
        if "zppo/buffer_size" in h
    ]


def _expected_buffer(plain_calls) -> PromptReplayBuffer:
    expected = PromptReplayBuffer(capacity=10_000, threshold=0.5)
    for call in plain_calls:
        scores = defaultdict(list)
        for key, r in zip(call["ids"], call["rewards"]):
            scores[key].append(r)
        expected.update({key: sum(v) / len(v) for key, v in scores.items()})
    return expected


def test_hint_row_puts_an_answer_free_teacher_hint_before_the_closer(
    boxed_text_student_dir, boxed_teacher_server, tmp_path
):
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
    golds = {row["id"]: row["answer"] for row in toy_rows("text")}
    hints, leaks = [], 0.0
    for call in hinted:
        for prompt, key in zip(call["prompts"], call["ids"]):
            hint = prompt.split("<hint>\n", 1)[1].split("\n</hint>", 1)[0]
            assert hint.strip() and answer_free(hint)
            assert prompt == compose_prompt(questions[key], hint_block(hint), RL_CLOSER)
            assert prompt.index("</hint>") < prompt.index(RL_CLOSER)
            hints.append(hint)
            leaks += leaks_answer(hint, golds[key]) / trainer.num_generations  # G rollouts per hinted group
    assert len(hints) == trainer.num_generations * trainer.counters["hint_trained_total"]
    assert hint_text in hints  # the teacher's learnt reply to fig:prompt-hint (it samples at temperature 1)
    # The leak count: accepted hints that state their question's gold answer, counted, not filtered.
    assert logs[-1]["hint_leaked_total"] == sum(log["hint_leaked"] for log in logs) == leaks
    for log in logs:
        assert log["hint_leak_rate"] == (log["hint_leaked"] / log["hint_trained"] if log["hint_trained"] else 0.0)
    assert trainer.replay_buffer.residents() == _expected_buffer(plain).residents()


def test_prefix_row_continues_a_correct_teacher_prefix_that_carries_no_loss(
    boxed_text_student_dir, boxed_teacher_server, tmp_path
):
    spy = Spy()
    trainer = _trainer(boxed_text_student_dir, boxed_teacher_server, tmp_path, ["prefix"], spy)
    assert trainer.args.variant == "GRPO\u2020+Prefix"
    tokenizer = trainer.processing_class
    evidence, rounds = [], []
    gather, generate = trainer._gather_evidence, trainer._generate_round

    def gather_evidence(*args, **kwargs):
        evidence.append(gather(*args, **kwargs))
        return evidence[-1]

    def generate_round(groups, name, metrics):
        result = generate(groups, name, metrics)
        rounds.append((list(groups), result.batch))
        return result

    trainer._gather_evidence, trainer._generate_round = gather_evidence, generate_round
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
                [{"role": "user", "content": compose_prompt(group.row["question"], None, RL_CLOSER)}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
            for i in range(g * G, (g + 1) * G):
                prompt = out["prompt_ids"][i][out["prompt_mask"][i].bool()].tolist()
                completion = out["completion_ids"][i][out["completion_mask"][i].bool()].tolist()
                assert prompt == [*plain_prompt, *prefix]  # the prefix conditions the rollout ...
                assert len(completion) <= budget - len(prefix)  # ... shares the length budget ...
                assert call["texts"][i] == tokenizer.decode(
                    [*prefix, *completion], skip_special_tokens=True
                )  # ... and is graded with it
                checked += 1
    assert checked == G * trainer.counters["prefix_trained_total"]
    plain = [c for (groups, _), c in zip(rounds, spy.calls) if groups[0].kind in ("new", "replay")]
    assert trainer.replay_buffer.residents() == _expected_buffer(plain).residents()


@pytest.mark.parametrize(
    "objective, variant, logged",
    [
        ("gspo", "ZPPO (GSPO)", "clip_ratio/region_mean"),
        ("cispo", "ZPPO (CISPO)", "cispo_clip_ratio"),
        ("dispo", "ZPPO (DISPO)", "clip_ratio/neg_high_mean"),
    ],
)
def test_zppo_trains_under_each_step_6_objective(
    boxed_text_student_dir, boxed_teacher_server, tmp_path, objective, variant, logged
):
    trainer = _trainer(
        boxed_text_student_dir,
        boxed_teacher_server,
        tmp_path,
        ["bcq", "ncq"],
        Spy(),
        policy_objective=objective,
        max_steps=2,
    )
    assert trainer.args.variant == variant
    # the TRL settings the objective sets, and the registered loss that trains it (the loss formulas
    # themselves, CISPO's bound 1 + eps_high included: tests/test_objectives.py and tests/test_losses.py)
    assert (trainer.importance_sampling_level, trainer.loss_type) == {
        "gspo": ("sequence", "dapo"),
        "cispo": ("token", "cispo"),
        "dispo": ("token", "dapo"),
    }[objective]
    assert trainer.objective_loss.name == objective and trainer.objective_loss.objective == objective
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


def _train_recorded(trainer) -> dict:
    """Train ``trainer``, recording its plain rounds, gradings, teacher requests and every trained micro-batch."""
    record = dict(plain=[], graded=[], requests=[], micro=[])
    generate_round, grade, prepare = trainer._generate_round, trainer._grade, trainer._prepare_inputs

    def generate(groups, name, metrics):
        out = generate_round(groups, name, metrics)
        record["plain"].append(out)
        return out

    def graded(row, texts):
        verdicts = grade(row, texts)
        record["graded"] += [(row["id"], t, v) for t, v in zip(texts, verdicts)]
        return verdicts

    def prepare_inputs(batch):
        out = prepare(batch)
        if not isinstance(batch, dict) and not out.get(
            "zppo_skip"
        ):  # a micro-batch is prepared once more inside training_step
            record["micro"].append(out)
        return out

    if trainer.teacher is not None:
        sample = trainer.teacher.sample_async

        def sample_async(conversations, *args, **kwargs):
            record["requests"] += [
                (c[-1]["content"], kwargs.get("n", args[0] if args else None)) for c in conversations
            ]
            return sample(conversations, *args, **kwargs)

        trainer.teacher.sample_async = sample_async
    trainer._generate_round, trainer._grade, trainer._prepare_inputs = generate, graded, prepare_inputs
    trainer.train()
    return record


def _supervised_run(student_dir, server, tmp_path, kind, **overrides):
    """Train the supervised ``kind`` row (two rollout steps unless ``max_steps`` says); recorded."""
    trainer = _trainer(student_dir, server, tmp_path, [kind], Spy(), **overrides)
    return trainer, _train_recorded(trainer)


def _trained_rows(trainer, micro_batches):
    """(prompt text, target text) of every row with loss tokens."""
    tokenizer = trainer.processing_class
    rows = []
    for micro in micro_batches:
        for i in range(micro["prompt_ids"].size(0)):
            if micro["completion_mask"][i].any():
                prompt = tokenizer.decode(micro["prompt_ids"][i][micro["prompt_mask"][i].bool()])
                target = tokenizer.decode(
                    micro["completion_ids"][i][micro["completion_mask"][i].bool()], skip_special_tokens=True
                )
                rows.append((prompt, target))
    return rows


def _plain_scores(record):
    """The plain rounds as `_expected_buffer` reads them: question id and reward per rollout (fillers left out)."""
    for plain in record["plain"]:
        G = len(plain.texts) // len(plain.groups_per_rank[0])
        kept = [
            (key, plain.rewards[g * G : (g + 1) * G].tolist())
            for g, (kind, key) in enumerate(plain.groups_per_rank[0])
            if kind != "filler"
        ]
        yield {
            "ids": [key for key, rewards in kept for _ in rewards],
            "rewards": [r for _, rewards in kept for r in rewards],
        }


def _check_cross_entropy(trainer, micro):
    """The trainer's loss on a supervised micro-batch is the summed NLL of its target tokens over the partition's
    count."""
    model = trainer.model
    ids = torch.cat([micro["prompt_ids"], micro["completion_ids"]], dim=1)
    attention = torch.cat([micro["prompt_mask"], micro["completion_mask"]], dim=1)
    with torch.no_grad():
        loss = trainer._compute_loss(model, micro)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, micro["prompt_ids"].size(1) - 1 : -1]
    logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, micro["completion_ids"].unsqueeze(-1)).squeeze(-1)
    args = trainer.args
    tokens = micro["num_items_in_batch"] * args.gradient_accumulation_steps / args.steps_per_generation
    expected = -(logps * micro["completion_mask"]).sum() / tokens
    assert float(loss) == pytest.approx(float(expected), rel=1e-4, abs=1e-6)


def test_correction_sft_trains_verified_corrections_and_the_wrong_attempt_under_their_tags(
    boxed_text_student_dir, boxed_teacher_server, tmp_path
):
    trainer, record = _supervised_run(boxed_text_student_dir, boxed_teacher_server, tmp_path, "correction")
    assert trainer.args.variant == "Correction-SFT\u2020"
    questions = {row["id"]: row["question"] for row in toy_rows("text")}
    assert trainer.counters["correction_trained_total"] > 0, _rollout_logs(trainer)
    assert all(n == 1 for _, n in record["requests"])  # one corrector call per question, no G_T sampling
    assert all("<incorrect_attempt>" in text for text, _ in record["requests"])
    verified = {(key, text.strip()) for key, text, ok in record["graded"] if ok}
    wrong = defaultdict(set)
    G = trainer.num_generations
    for plain in record["plain"]:
        for i, text in enumerate(plain.texts):
            if plain.rewards.view(trainer.accelerator.num_processes, -1)[0][i] <= 0.5:
                wrong[plain.groups_per_rank[0][i // G][1]].add(text.strip())
    rows = _trained_rows(trainer, record["micro"])
    tags = defaultdict(int)
    for prompt, target in rows:
        key = next(
            k
            for k, q in questions.items()
            if compose_prompt(q, "<correct>", RL_CLOSER) in prompt
            or compose_prompt(q, "<incorrect>", RL_CLOSER) in prompt
        )
        tag = "<correct>" if compose_prompt(questions[key], "<correct>", RL_CLOSER) in prompt else "<incorrect>"
        tags[tag] += 1
        if tag == "<correct>":
            assert (key, target.strip()) in verified  # graded before it became a target
        else:
            assert target.strip() in wrong[key]  # the student's own wrong attempt
    assert tags["<correct>"] == tags["<incorrect>"] == trainer.counters["correction_trained_total"]
    _check_cross_entropy(trainer, record["micro"][0])
    assert trainer.replay_buffer.residents() == _expected_buffer(_plain_scores(record)).residents()
    # The saved model (every checkpoint, save_model, push_to_hub) records the condition it is evaluated under,
    # for `zppo-eval run` to apply; the card says so.
    trainer.save_model()
    trainer.create_model_card()
    out = Path(trainer.args.output_dir)
    assert json.loads((out / "config.json").read_text())[CONDITION_KEY] == CORRECT_TAG
    assert (
        f"- **Evaluation:** every question carries `{CORRECT_TAG}` before the closer"
        in (out / "README.md").read_text()
    )


def test_error_reflection_sft_trains_verified_revisions_under_the_bare_question(
    boxed_text_student_dir, boxed_teacher_server, tmp_path
):
    # The tiny teacher verifies a revision of 3-4 wrong attempts about one time in six: six rollout steps
    # (24 revision requests) make a run without any verified revision unlikely (about 1%).
    trainer, record = _supervised_run(
        boxed_text_student_dir, boxed_teacher_server, tmp_path, "reflection", max_steps=12
    )
    assert trainer.args.variant == "Error-reflection-SFT\u2020"
    questions = {row["id"]: row["question"] for row in toy_rows("text")}
    assert trainer.counters["reflection_trained_total"] > 0, _rollout_logs(trainer)
    revisions = [text for text, n in record["requests"] if n == 1]
    assert revisions and all("<student_attempts>" in text and "<your_draft>" in text for text in revisions)
    verified = {(key, text.strip()) for key, text, ok in record["graded"] if ok}
    rows = _trained_rows(trainer, record["micro"])
    assert len(rows) == trainer.counters["reflection_trained_total"]
    for prompt, target in rows:
        key = next(k for k, q in questions.items() if compose_prompt(q, None, RL_CLOSER) in prompt)
        assert "<correct>" not in prompt and "<student_attempts>" not in prompt  # mistakes shape only the target
        assert (key, target.strip()) in verified
    _check_cross_entropy(trainer, record["micro"][0])
    trainer.save_model()  # trained under the bare question: evaluated under the shared prompt
    assert CONDITION_KEY not in json.loads((Path(trainer.args.output_dir) / "config.json").read_text())


def test_a_correction_that_fails_grading_never_becomes_a_target(boxed_teacher_server, tmp_path):
    from zppo_trl.augmentations import CorrectionTargets, SupervisedInstance
    from zppo_trl.teacher import TeacherClient

    row = toy_rows("text")[0]
    graded = []

    def grade(key, texts):
        graded.append((key, list(texts)))
        return [False] * len(texts)  # a grader that finds every correction wrong

    targets = CorrectionTargets(
        lambda key: row["question"], lambda key, text: [{"role": "user", "content": text}], grade
    )
    args = _config(tmp_path, boxed_teacher_server, ["correction"])
    metrics: dict = {}
    instances = [SupervisedInstance("correction", row["id"], "<think> guess </think> \\boxed{1}")] * 2
    with TeacherClient(boxed_teacher_server.base_url, boxed_teacher_server.model) as teacher:
        built = targets.build(instances, teacher, args, metrics)
    assert len(graded) == 2 and all(texts and texts[0] for _, texts in graded)  # the teacher answered and was graded
    assert built.groups == [] and built.instances == [] and metrics["correction_rejected"] == 2


def _direct_jsd(student_logits, teacher_logits, mask, beta=0.5):
    """GKD's generalized JSD per position, written out from probabilities: beta KL(T||M) + (1-beta) KL(S||M),
    M = beta T + (1-beta) S."""
    s, t = torch.softmax(student_logits.double(), -1), torch.softmax(teacher_logits.double(), -1)
    m = beta * t + (1 - beta) * s
    kl = lambda p, q: (p * (p.clamp_min(1e-300).log() - q.clamp_min(1e-300).log())).sum(-1)  # noqa: E731
    return ((beta * kl(t, m) + (1 - beta) * kl(s, m)) * mask).sum()


def _distill_run(student_dir, teacher_dir, server, tmp_path, mode, **overrides):
    """Train the ``mode`` distillation row against ``teacher_dir``'s logits, recorded (`_train_recorded`)."""
    trainer = _trainer(
        student_dir, server, tmp_path, [], Spy(), distillation=mode, distill_teacher=str(teacher_dir), **overrides
    )
    return trainer, _train_recorded(trainer)


def _check_jsd_loss(trainer, micro):
    """The trainer's loss on a distillation micro-batch is the direct JSD of student and teacher over the
    partition's tokens."""
    ids = torch.cat([micro["prompt_ids"], micro["completion_ids"]], dim=1)
    attention = torch.cat([micro["prompt_mask"], micro["completion_mask"]], dim=1)
    width, vocab = micro["prompt_ids"].size(1), len(trainer.processing_class)
    with torch.no_grad():
        loss = trainer._compute_loss(trainer.model, micro)
        student = trainer.model(input_ids=ids, attention_mask=attention).logits[:, width - 1 : -1, :vocab]
        teacher = trainer.distill_teacher(input_ids=ids, attention_mask=attention).logits[:, width - 1 : -1, :vocab]
    args = trainer.args
    tokens = micro["num_items_in_batch"] * args.gradient_accumulation_steps / args.steps_per_generation
    assert float(loss) == pytest.approx(
        float(_direct_jsd(student, teacher, micro["completion_mask"]) / tokens), rel=1e-4, abs=1e-7
    )
    assert float(loss) > 0


def test_on_distill_imitates_the_teacher_on_every_student_rollout(
    boxed_text_student_dir, boxed_text_teacher_dir, boxed_teacher_server, tmp_path
):
    trainer, record = _distill_run(
        boxed_text_student_dir, boxed_text_teacher_dir, boxed_teacher_server, tmp_path, "on"
    )
    assert trainer.args.variant == "On-Distill\u2020" and trainer.teacher is None  # no teacher server: logits only
    sampled = {text.strip() for plain in record["plain"] for text in plain.texts}
    rows = _trained_rows(trainer, record["micro"])
    real = (
        sum(kind != "filler" for plain in record["plain"] for kind, _ in plain.groups_per_rank[0])
        * trainer.num_generations
    )
    assert len(rows) == real  # every student rollout of every question, no other
    assert all(target.strip() in sampled for _, target in rows)
    assert not any("<candidate>" in prompt or "<hint>" in prompt for prompt, _ in rows)
    _check_jsd_loss(trainer, record["micro"][0])
    assert any("distill/jsd" in h for h in trainer.state.log_history)
    assert trainer.replay_buffer.residents() == _expected_buffer(_plain_scores(record)).residents()


def test_off_distill_imitates_only_graded_correct_teacher_rollouts(
    boxed_text_student_dir, boxed_text_teacher_dir, boxed_teacher_server, tmp_path
):
    trainer, record = _distill_run(
        boxed_text_student_dir, boxed_text_teacher_dir, boxed_teacher_server, tmp_path, "off", replay_fraction=0.0
    )
    assert trainer.args.variant == "Off-Distill"
    correct = {(key, text.strip()) for key, text, ok in record["graded"] if ok}
    questions = {row["id"]: row["question"] for row in toy_rows("text")}
    rows = _trained_rows(trainer, record["micro"])
    assert rows and len(rows) == len([1 for _, _, ok in record["graded"] if ok])  # every correct rollout, once
    for prompt, target in rows:
        key = next(k for k, q in questions.items() if compose_prompt(q, None, RL_CLOSER) in prompt)
        assert (key, target.strip()) in correct
    _check_jsd_loss(trainer, record["micro"][0])


def _check_server_topk(trainer, micro, teacher_dir):
    """The top-k the vLLM server sent for a micro-batch are the teacher's own log-probs at the positions that
    predict each completion token, and the trainer's loss is the top-k JSD (plus the tail bucket) over them."""
    from zppo_trl.distill import generalized_jsd_per_token, top_k_support

    ids = torch.cat([micro["prompt_ids"], micro["completion_ids"]], dim=1)
    attention = torch.cat([micro["prompt_mask"], micro["completion_mask"]], dim=1)
    width, vocab = micro["prompt_ids"].size(1), len(trainer.processing_class)
    mask = micro["completion_mask"].bool()
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    with torch.no_grad():
        teacher_logps = torch.log_softmax(
            teacher(input_ids=ids, attention_mask=attention).logits[:, width - 1 : -1, :vocab], -1
        )
        loss = trainer._compute_loss(trainer.model, micro)
        student = torch.log_softmax(
            trainer.model(input_ids=ids, attention_mask=attention).logits[:, width - 1 : -1, :vocab], -1
        )
    topk_ids, topk_logps = micro["teacher_topk_ids"], micro["teacher_topk_logps"]
    assert topk_ids.size(-1) == trainer.args.distill_top_k
    torch.testing.assert_close(teacher_logps.gather(-1, topk_ids)[mask], topk_logps[mask], rtol=0, atol=2e-3)
    best = teacher_logps.topk(2, dim=-1).values
    clear = mask & (best[..., 0] - best[..., 1] > 1e-2)  # no near-tie for first place
    assert clear.any() and torch.equal(topk_ids[..., 0][clear], teacher_logps.argmax(-1)[clear])
    s, t = top_k_support(student, topk_ids, topk_logps)
    args = trainer.args
    tokens = micro["num_items_in_batch"] * args.gradient_accumulation_steps / args.steps_per_generation
    direct = (generalized_jsd_per_token(s, t, args.distill_beta) * mask).sum() / tokens
    assert float(loss) == pytest.approx(float(direct), rel=1e-4, abs=1e-7) and float(loss) > 0


@pytest.mark.parametrize("mode", ["on", "off"])
def test_distillation_rows_train_on_the_vllm_teacher_servers_top_k(
    mode, boxed_text_student_dir, boxed_text_teacher_dir, vllm_boxed_teacher_server, tmp_path
):
    """Without distill_teacher, the teacher's signal is its vLLM server's top-k log-probs (prompt_logprobs): no
    teacher is loaded next to the student, every trained sequence gets the server's top-k, and the loss trains."""
    trainer = _trainer(
        boxed_text_student_dir, vllm_boxed_teacher_server, tmp_path, [], Spy(), distillation=mode, distill_top_k=8
    )
    assert trainer.distill_teacher is None and trainer.teacher is not None
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    record = _train_recorded(trainer)
    assert record["micro"], _rollout_logs(trainer)
    assert all(m["teacher_topk_logps"].shape == (*m["completion_ids"].shape, 8) for m in record["micro"])
    _check_server_topk(trainer, record["micro"][0], boxed_text_teacher_dir)
    assert all(log.get("distill_teacher_failed") == 0 for log in _rollout_logs(trainer))
    assert any(h.get("distill/jsd", 0) > 0 for h in trainer.state.log_history)
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_distillation_against_itself_has_zero_divergence(boxed_text_student_dir, boxed_teacher_server, tmp_path):
    trainer, record = _distill_run(
        boxed_text_student_dir,
        boxed_text_student_dir,
        boxed_teacher_server,
        tmp_path,
        "on",
        max_steps=1,
        learning_rate=0.0,
    )
    logged = [h["distill/jsd"] for h in trainer.state.log_history if "distill/jsd" in h]
    assert logged and all(abs(v) < 1e-6 for v in logged)


def test_prefix_row_trains_a_vlm_student_whose_processor_marks_token_types(
    boxed_vlm_student_dir, boxed_vlm_teacher_server, tmp_path
):
    """Qwen3.5's processor returns mm_token_type_ids for every prompt: the prefix tokens extend them as text."""
    from transformers import Qwen3_5ForConditionalGeneration

    from zppo_trl.processing import load_processor

    trainer = ZPPOTrainer(
        model=Qwen3_5ForConditionalGeneration.from_pretrained(boxed_vlm_student_dir),
        reward_funcs=Spy(),
        args=_config(
            tmp_path,
            boxed_vlm_teacher_server,
            ["prefix"],
            per_device_train_batch_size=12,
            max_steps=2,
            augment_fraction=1.0,
            replay_fraction=0.0,
        ),
        train_dataset=Dataset.from_list(toy_rows("vlm")),
        processing_class=load_processor(boxed_vlm_student_dir),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.counters["prefix_trained_total"] > 0, _rollout_logs(trainer)
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


def test_a_distill_teacher_with_another_tokenizer_is_refused(boxed_text_student_dir, boxed_teacher_server, tmp_path):
    teacher_dir = tmp_path / "teacher"
    tokenizer = AutoTokenizer.from_pretrained(boxed_text_student_dir)
    tokenizer.add_tokens(["<not-the-student's>"])
    tokenizer.save_pretrained(teacher_dir)
    AutoModelForCausalLM.from_pretrained(boxed_text_student_dir).save_pretrained(teacher_dir)
    with pytest.raises(ValueError, match="another tokenizer than the student"):
        _distill_run(boxed_text_student_dir, teacher_dir, boxed_teacher_server, tmp_path, "on")
