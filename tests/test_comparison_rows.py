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

The Hint, Prefix and supervised-control tests also record each rollout step's selection and teacher requests
(`_record_steps`, `RecordingTeacher`) and check them against the paper's shared augmentation-branch convention
(`_check_pre_cap`) and against each row's algorithm: what the hint generator, the corrector and the refiner
receive, and that only replies graded correct by the trainer's reward become targets.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.augmentations import BuiltGroup, answer_free, leaks_answer
from zppo_trl.evaluation.condition import CONDITION_KEY
from zppo_trl.prompts import (
    CORRECT_TAG,
    INCORRECT_TAG,
    RL_CLOSER,
    compose_prompt,
    hint_block,
    render_correction,
    render_hint,
    render_reflection,
)
from zppo_trl.replay import PromptReplayBuffer
from zppo_trl.rewards import boxed_accuracy_reward, completion_text, grade_batch
from zppo_trl.teacher import TeacherClient

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


def _trainer(student_dir, server, tmp_path, reformulations, spy, teacher=None, rows=None, **overrides) -> ZPPOTrainer:
    return ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(student_dir),
        reward_funcs=spy,
        args=_config(tmp_path, server, reformulations, **overrides),
        train_dataset=Dataset.from_list(rows or toy_rows("text")),
        processing_class=AutoTokenizer.from_pretrained(student_dir),
        teacher=teacher,
    )


class RecordingTeacher(TeacherClient):
    """The real teacher client, keeping every chat request it sent to the server (its messages) with the
    reply texts (None where the request failed)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.exchanges: list[tuple[list[dict], list[str] | None]] = []

    async def _chat(self, messages, n, params, failures):
        texts, rejected = await super()._chat(messages, n, params, failures)
        self.exchanges.append((messages, texts))
        return texts, rejected


def _recording_teacher(server) -> RecordingTeacher:
    return RecordingTeacher(server.base_url, server.model)


def _record_steps(trainer) -> list[dict]:
    """Record, per rollout step, the selection as the trainer made it (its own methods, wrapped to watch).

    Each step: ``draw``, ``plain`` (the plain round) and ``accuracy`` (the r_x step 4 ranks), ``evidence``
    (what step 4 handed step 5), ``limit`` and ``plan`` (step 5's instances), ``built`` and ``build_metrics``
    (its build), and, with a `RecordingTeacher`, ``sampled`` (the exchanges of step 2's teacher rollouts) and
    ``requests`` (those of the build: hint, correction or revision requests). A step's teacher rollouts are the
    exchanges between the previous step's stages and its build: its new questions went to the teacher as the
    previous step's stages ended (``prefetch_teacher_samples``), its replayed ones when it started.
    """
    steps: list[dict] = []
    teacher = trainer.teacher if isinstance(trainer.teacher, RecordingTeacher) else None
    sampling_from: list[int | None] = [None]  # where this step's teacher sampling began (None: no sampling yet)
    start, augmented = trainer.teacher_sampler.start, trainer._steps_4_to_6
    gather, plan, build = trainer.teacher_sampler.evidence, trainer.source.plan, trainer.source.build

    def start_teacher_sampling(plain):
        if sampling_from[0] is None:  # the first step
            sampling_from[0] = len(teacher.exchanges) if teacher else 0
        return start(plain)

    def augmented_batches(teacher_future, draw, plain_round, accuracy):
        steps.append(dict(draw=draw, plain=plain_round, accuracy=dict(accuracy)))
        out = augmented(teacher_future, draw, plain_round, accuracy)
        sampling_from[0] = len(teacher.exchanges) if teacher else 0  # the next step's sampling starts after this
        return out

    def gather_evidence(*args, **kwargs):
        steps[-1]["evidence"] = gather(*args, **kwargs)
        return steps[-1]["evidence"]

    def planned(evidence, limit, rng, metrics):
        steps[-1].update(limit=limit, plan=list(plan(evidence, limit, rng, metrics)))
        return steps[-1]["plan"]

    def built(instances, teacher_, args, metrics, ready=None):
        before = len(teacher.exchanges) if teacher else 0
        out = build(instances, teacher_, args, metrics, ready=ready)
        steps[-1].update(built=out, build_metrics=dict(metrics))
        if teacher:  # step 2's sampling was awaited in step 4: every exchange since is this build's
            sampled = teacher.exchanges[sampling_from[0] : before] if sampling_from[0] is not None else []
            steps[-1].update(sampled=sampled, requests=teacher.exchanges[before:])
        return out

    trainer.teacher_sampler.start, trainer._steps_4_to_6 = start_teacher_sampling, augmented_batches
    trainer.teacher_sampler.evidence = gather_evidence
    trainer.source.plan, trainer.source.build = planned, built
    return steps


def _check_pre_cap(trainer, steps) -> None:
    """The shared augmentation-branch convention as the trainer applied it in every recorded step (the paper's
    Algorithm 1 step 2, and "each selects at most the top rho_aug |X_new| hard questions (r_x < tau), ranked by
    ascending r_x"): r_x is the plain group's accuracy; the hard questions handed to step 5 are those with
    r_x < hard_threshold, hardest first, at most floor(augment_fraction x |X_new|) (new questions only, not the
    replayed ones), the easiest of them no easier than any left out; step 5 plans on those alone, under the
    same cap.

    Fails if the cap counted the replayed questions too (checked on a step that replayed enough of them for the
    two caps to differ), if the ranking were not ascending, if a question at or above the threshold or one left
    out by the cap got an instance.
    """
    args, G = trainer.args, trainer.num_generations
    told_apart = 0
    for step in steps:
        draw, plain, accuracy, hard = step["draw"], step["plain"], step["accuracy"], list(step["evidence"].hard)
        sums, counts = defaultdict(float), defaultdict(int)
        for g, (kind, key) in enumerate(plain.groups_per_rank[0]):
            if kind != "filler":
                sums[key] += float(plain.rewards[g * G : (g + 1) * G].sum())
                counts[key] += G
        assert accuracy == pytest.approx({key: sums[key] / counts[key] for key in counts})
        limit = math.floor(args.augment_fraction * len(draw.new_keys))
        assert step["limit"] == limit
        pool = [key for key, r in accuracy.items() if r < args.hard_threshold]
        assert set(hard) <= set(pool) and len(hard) == len(set(hard)) == min(limit, len(pool))
        assert [accuracy[key] for key in hard] == sorted(accuracy[key] for key in hard)  # hardest first
        assert all(accuracy[key] >= accuracy[hard[-1]] for key in set(pool) - set(hard))
        assert {inst.key for inst in step["plan"]} <= set(hard) and len(step["plan"]) <= limit
        told_apart += math.floor(args.augment_fraction * (len(draw.new_keys) + len(draw.replay_keys))) != limit
    assert told_apart, "no step replayed enough questions to tell the cap's |X_new| apart from |X|"


def _wrong_plain(trainer, step) -> dict:
    """key -> the step's wrong plain rollouts of that question (reward at most 0.5), in group order."""
    G, plain = trainer.num_generations, step["plain"]
    wrong = defaultdict(list)
    for g, (kind, key) in enumerate(plain.groups_per_rank[0]):
        if kind != "filler":
            wrong[key] += [plain.texts[i] for i in range(g * G, (g + 1) * G) if plain.rewards[i] <= 0.5]
    return wrong


def _teacher_rollouts(step, row) -> tuple[list[str], list[str]]:
    """The step's teacher rollouts on ``row``'s plain prompt, and those of them the boxed grader finds correct."""
    prompt = compose_prompt(row["question"], None, RL_CLOSER)
    rollouts = [t for messages, texts in step["sampled"] if messages[-1]["content"] == prompt for t in texts or ()]
    return rollouts, [t for t, ok in zip(rollouts, grade_batch(rollouts, [row["answer"]] * len(rollouts))) if ok]


def _teacher_correct(step, row) -> list[str]:
    return _teacher_rollouts(step, row)[1]


def _unsolvable(rows: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """``rows`` with the gold answer of ``keys`` set to one neither boxed model ever writes: every teacher (and
    student) rollout on those questions is graded wrong, as on a question the teacher cannot solve."""
    return [{**row, "answer": "-1"} if row["id"] in keys else row for row in rows]


def _replies(step) -> list[tuple[str, str]]:
    """The build's requests, each one user message and nothing else, as (its text, the teacher's reply)."""
    replies = []
    for messages, texts in step["requests"]:
        assert len(messages) == 1 and messages[0]["role"] == "user" and texts, messages
        replies.append((messages[0]["content"], texts[0]))
    return replies


def _check_verified_targets(step, rows, render) -> list:
    """A supervised build (the paper's alg:correctionsft and alg:errorreflectionsft): one teacher request per
    planned instance, ``render(instance)``; the instances whose reply the boxed grader finds correct, and only
    they, are built, in plan order; every other reply is counted in ``<kind>_rejected``. Returns them with
    their replies."""
    plan, built = step["plan"], step["built"]
    replies = dict(_replies(step))  # a supervised request names its question: one per question
    assert sorted(replies) == sorted(render(inst) for inst in plan) and len(replies) == len(step["requests"])
    verified = [
        (inst, replies[render(inst)])
        for inst in plan
        if grade_batch([replies[render(inst)]], [rows[inst.key]["answer"]])[0]
    ]
    assert built.instances == [inst for inst, _ in verified] and built.failures == 0
    kind = plan[0].kind if plan else None
    if plan:
        assert step["build_metrics"][f"{kind}_rejected"] == len(plan) - len(verified)
    return verified


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
    """The Hint row (alg:hint) end to end. Besides the hinted prompts and the buffer, pins its selection (the
    pre-cap, `_check_pre_cap`; one hint per pre-capped hard question with a graded-correct teacher rollout) and
    what the hint generator receives: fig:prompt-hint on exactly one of that question's graded-correct teacher
    rollouts, alone. Fails if a hint request carried the question, a student rollout, a second or a wrong teacher
    rollout, or if a hard question without a correct teacher rollout (or one past the cap) got a hint."""
    spy = Spy()
    teacher = _recording_teacher(boxed_teacher_server)
    trainer = _trainer(boxed_text_student_dir, boxed_teacher_server, tmp_path, ["hint"], spy, teacher=teacher)
    assert trainer.args.variant == "GRPO\u2020+Hint"
    steps = _record_steps(trainer)
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

    # alg:hint's selection, and what its hint generator received: for every pre-capped hard question with a
    # graded-correct teacher rollout (and no other), one request that is fig:prompt-hint on one such rollout
    # alone (no question, no student rollout, no second rollout).
    _check_pre_cap(trainer, steps)
    rows = {row["id"]: row for row in toy_rows("text")}
    for step in steps:
        evidence, wrong = step["evidence"], _wrong_plain(trainer, step)
        for key in evidence.hard:  # step 4 kept exactly the teacher rollouts the reward grades correct
            assert sorted(evidence.teacher_correct.get(key, [])) == sorted(_teacher_correct(step, rows[key]))
        assert [inst.key for inst in step["plan"]] == [k for k in evidence.hard if evidence.teacher_correct.get(k)]
        for inst in step["plan"]:
            assert inst.teacher_response in evidence.teacher_correct[inst.key]
            assert inst.teacher_response not in wrong[inst.key]
        requests = sorted(text for text, _ in _replies(step))
        assert requests == sorted(render_hint(inst.teacher_response) for inst in step["plan"])
    assert sum(len(step["plan"]) for step in steps) == trainer.counters["hint_total"] > 0


def test_prefix_row_continues_a_correct_teacher_prefix_that_carries_no_loss(
    boxed_text_student_dir, boxed_teacher_server, tmp_path
):
    """The Prefix row (alg:prefix) end to end. Besides the prefix itself, pins its selection: the pre-cap
    (`_check_pre_cap`) and one prefix group per pre-capped hard question with a graded-correct teacher rollout,
    cut from one such rollout. Fails if a question without a correct teacher rollout, or past the cap, got a
    prefix group, or if step 4 kept a teacher rollout the reward grades wrong."""
    spy = Spy()
    teacher = _recording_teacher(boxed_teacher_server)
    trainer = _trainer(boxed_text_student_dir, boxed_teacher_server, tmp_path, ["prefix"], spy, teacher=teacher)
    assert trainer.args.variant == "GRPO\u2020+Prefix"
    steps = _record_steps(trainer)
    tokenizer = trainer.processing_class
    evidence, rounds = [], []
    gather, generate = trainer.teacher_sampler.evidence, trainer.rounds.play

    def gather_evidence(*args, **kwargs):
        evidence.append(gather(*args, **kwargs))
        return evidence[-1]

    def generate_round(groups, name, early=None):
        result = generate(groups, name, early)
        rounds.append((list(groups), result.batch))
        return result

    trainer.teacher_sampler.evidence, trainer.rounds.play = gather_evidence, generate_round
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

    # alg:prefix's selection: every pre-capped hard question with a graded-correct teacher rollout, and no
    # other, is cut from one such rollout; the prefix control asks the teacher for nothing more.
    _check_pre_cap(trainer, steps)
    rows = {row["id"]: row for row in toy_rows("text")}
    for step in steps:
        evidence = step["evidence"]
        for key in evidence.hard:
            assert sorted(evidence.teacher_correct.get(key, [])) == sorted(_teacher_correct(step, rows[key]))
        assert [inst.key for inst in step["plan"]] == [k for k in evidence.hard if evidence.teacher_correct.get(k)]
        assert all(inst.teacher_response in evidence.teacher_correct[inst.key] for inst in step["plan"])
        assert step["requests"] == []


@pytest.mark.parametrize(
    "objective, variant, logged",
    [
        # the toy's rho_replay is 0.5 (to exercise the buffer), which ZPPO's name states
        ("gspo", "ZPPO (GSPO, \u03c1_replay=0.50)", "clip_ratio/region_mean"),
        ("cispo", "ZPPO (CISPO, \u03c1_replay=0.50)", "cispo_clip_ratio"),
        ("dispo", "ZPPO (DISPO, \u03c1_replay=0.50)", "clip_ratio/neg_high_mean"),
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
    generate_round, grade, prepare = trainer.rounds.play, trainer.grader.grade, trainer._prepare_inputs

    def generate(groups, name, early=None):
        out = generate_round(groups, name, early)
        record["plain"].append(out)
        return out

    def graded(rows, texts):
        verdicts = grade(rows, texts)
        for row, replies, row_verdicts in zip(rows, texts, verdicts, strict=True):
            record["graded"] += [(row["id"], t, v) for t, v in zip(replies, row_verdicts, strict=True)]
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
    trainer.rounds.play, trainer.grader.grade, trainer._prepare_inputs = generate, graded, prepare_inputs
    trainer.train()
    return record


def _supervised_run(student_dir, server, tmp_path, kind, rows=None, **overrides):
    """Train the supervised ``kind`` row (two rollout steps unless ``max_steps`` says) on ``rows`` (the toy rows
    by default) with a `RecordingTeacher`; recorded (`_train_recorded`), its steps too (`_record_steps`)."""
    teacher = _recording_teacher(server)
    trainer = _trainer(student_dir, server, tmp_path, [kind], Spy(), teacher=teacher, rows=rows, **overrides)
    steps = _record_steps(trainer)
    return trainer, _train_recorded(trainer), steps


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
    """The Correction-SFT row (alg:correctionsft) end to end. Pins its selection (the pre-cap; one corrector
    call per pre-capped hard question, on one of the step's wrong plain rollouts; no G_T teacher rollouts) and
    its targets: a correction the reward grades correct gives the pair (<correct>, correction) and (<incorrect>,
    the rollout it corrected), any other is counted rejected and trains nothing. Fails if an unverified
    correction became a target, a pair's wrong rollout were not the corrected one, or the cap or ranking
    changed."""
    trainer, record, steps = _supervised_run(boxed_text_student_dir, boxed_teacher_server, tmp_path, "correction")
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

    # alg:correctionsft: every pre-capped hard question (each has a wrong rollout) gets one corrector call on one
    # of its wrong plain rollouts, and no G_T teacher rollouts are sampled; a correction the reward grades correct
    # gives the pair (<correct>, correction) and (<incorrect>, that wrong rollout); any other is rejected.
    _check_pre_cap(trainer, steps)
    rows = {row["id"]: row for row in toy_rows("text")}
    for step in steps:
        evidence, wrong = step["evidence"], _wrong_plain(trainer, step)
        assert step["sampled"] == [] and all(wrong[key] for key in evidence.hard)
        assert [inst.key for inst in step["plan"]] == list(evidence.hard)
        assert all(inst.source in wrong[inst.key] and inst.attempts == () for inst in step["plan"])
        verified = _check_verified_targets(
            step, rows, lambda inst: render_correction(rows[inst.key]["question"], inst.source)
        )
        assert step["built"].groups == [
            group
            for inst, reply in verified
            for group in (
                BuiltGroup("correction", inst.key, CORRECT_TAG, target=reply),
                BuiltGroup("correction", inst.key, INCORRECT_TAG, target=inst.source),
            )
        ]


def test_error_reflection_sft_trains_verified_revisions_under_the_bare_question(
    boxed_text_student_dir, boxed_teacher_server, tmp_path
):
    """The Error-reflection-SFT row (alg:errorreflectionsft) end to end. Pins that the teacher's drafts are
    graded (only a draft the reward grades correct is revised), that the revision request carries every wrong
    plain rollout of the question in full, and that exactly the revisions graded correct train (under the bare
    question) while the others are counted rejected. Fails if a wrong draft were revised, an attempt were left
    out or cut, or a wrong revision trained."""
    # The tiny teacher verifies a revision of 3-4 wrong attempts about one time in six: six rollout steps
    # (24 revision requests) make a run without any verified revision unlikely (about 1%). The boxed teacher
    # solves nearly every toy question, so two of them are made unsolvable (`_unsolvable`): their drafts are all
    # graded wrong, which is what shows that drafts are graded. Both are hard for the student too (no rollout is
    # ever right), so over six steps they reach the pre-cap (the check below says so if they never did).
    unsolvable = ("toy-00", "toy-01")
    dataset = _unsolvable(toy_rows("text"), unsolvable)
    trainer, record, steps = _supervised_run(
        boxed_text_student_dir, boxed_teacher_server, tmp_path, "reflection", rows=dataset, max_steps=12
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

    # alg:errorreflectionsft: the G_T drafts are graded (step 4 keeps exactly those the reward grades correct);
    # every pre-capped hard question with a correct draft gets one revision call on one such draft with all of
    # the step's wrong plain rollouts of that question, in full; a revision graded correct is the target under
    # the bare question, any other is rejected and not trained.
    _check_pre_cap(trainer, steps)
    rows = {row["id"]: row for row in dataset}
    graded_wrong = 0  # teacher drafts of hard questions the reward graded wrong
    for step in steps:
        evidence, wrong = step["evidence"], _wrong_plain(trainer, step)
        for key in evidence.hard:
            drafts, correct = _teacher_rollouts(step, rows[key])
            assert wrong[key] and sorted(evidence.teacher_correct.get(key, [])) == sorted(correct)
            graded_wrong += len(drafts) - len(correct)
        assert [inst.key for inst in step["plan"]] == [k for k in evidence.hard if evidence.teacher_correct.get(k)]
        for inst in step["plan"]:
            assert inst.source in evidence.teacher_correct[inst.key]  # a graded-correct draft, never a wrong one
            assert inst.attempts == tuple(wrong[inst.key])  # every wrong plain rollout, none parsed away
        verified = _check_verified_targets(
            step, rows, lambda inst: render_reflection(rows[inst.key]["question"], inst.source, inst.attempts)
        )
        assert step["built"].groups == [
            BuiltGroup("reflection", inst.key, None, target=reply) for inst, reply in verified
        ]
    assert sum(len(step["built"].instances) for step in steps) == trainer.counters["reflection_trained_total"]
    assert graded_wrong > 0, "no hard question had a draft graded wrong: the draft grading went unexercised"
    assert not any(inst.key in unsolvable for step in steps for inst in step["plan"])


def test_a_correction_that_fails_grading_never_becomes_a_target(boxed_teacher_server, tmp_path):
    from zppo_trl.augmentations import CorrectionTargets, SupervisedInstance
    from zppo_trl.teacher import TeacherClient

    row = toy_rows("text")[0]
    graded = []

    def grade(keys, texts):
        graded.append((list(keys), [list(t) for t in texts]))
        return [[False] * len(t) for t in texts]  # a grader that finds every correction wrong

    targets = CorrectionTargets(
        lambda key: row["question"], lambda key, text: [{"role": "user", "content": text}], grade
    )
    args = _config(tmp_path, boxed_teacher_server, ["correction"])
    metrics: dict = {}
    instances = [SupervisedInstance("correction", row["id"], "<think> guess </think> \\boxed{1}")] * 2
    with TeacherClient(boxed_teacher_server.base_url, boxed_teacher_server.model) as teacher:
        built = targets.build(instances, teacher, args, metrics)
    # the teacher answered both and both replies were graded, in one call
    assert len(graded) == 1 and graded[0][0] == [row["id"]] * 2 and all(t and t[0] for t in graded[0][1])
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


def _teacher_token_logps(teacher, micro, vocab: int) -> torch.Tensor:
    """``teacher``'s own log-prob of each completion token of a micro-batch (B, C), at the positions predicting it."""
    ids = torch.cat([micro["prompt_ids"], micro["completion_ids"]], dim=1)
    attention = torch.cat([micro["prompt_mask"], micro["completion_mask"]], dim=1)
    width = micro["prompt_ids"].size(1)
    with torch.no_grad():
        logps = torch.log_softmax(
            teacher(input_ids=ids, attention_mask=attention).logits[:, width - 1 : -1, :vocab], -1
        )
    return logps.gather(-1, micro["completion_ids"].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("objective", ["kdrl", "rlad"])
def test_hybrid_rows_train_on_the_vllm_teacher_servers_log_prob_of_each_sampled_token(
    objective, boxed_text_student_dir, boxed_text_teacher_dir, vllm_boxed_teacher_server, tmp_path
):
    """KDRL† and RLAD† (policy_objective: kdrl / rlad on GRPO†'s pipeline): every rollout the step trains is scored
    by the teacher's vLLM server (prompt_logprobs), no teacher is loaded next to the student, the log-probs are the
    teacher's own at each sampled token, the row's term is logged, and the weights move. Under KDRL no partition is
    skipped: its reverse KL acts on every rollout."""
    trainer = _trainer(
        boxed_text_student_dir, vllm_boxed_teacher_server, tmp_path, [], Spy(), policy_objective=objective
    )
    assert trainer.args.variant == f"Replay-matched {objective.upper()}\u2020"  # the fixture replays at 0.5
    assert trainer.distill_teacher is None and trainer.teacher is not None
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    record = _train_recorded(trainer)
    assert record["micro"], _rollout_logs(trainer)
    teacher = AutoModelForCausalLM.from_pretrained(boxed_text_teacher_dir).eval()
    vocab = len(trainer.processing_class)
    for micro in record["micro"]:
        mask = micro["completion_mask"].bool()
        assert mask.any() and micro["teacher_logps"].shape == micro["completion_ids"].shape
        own = _teacher_token_logps(teacher, micro, vocab)
        torch.testing.assert_close(micro["teacher_logps"][mask], own[mask], rtol=0, atol=2e-3)
    logs = _rollout_logs(trainer)
    assert all(log.get("teacher_logps_failed") == 0 for log in logs)
    if objective == "kdrl":
        assert all(log["skipped_partitions"] == 0 for log in logs)
        kl = [h["kdrl/reverse_kl"] for h in trainer.state.log_history if "kdrl/reverse_kl" in h]
        betas = [h["kdrl/beta"] for h in trainer.state.log_history if "kdrl/beta" in h]
        assert kl and all(v > 0 for v in kl)  # student and teacher differ
        assert betas == pytest.approx([5e-3 - 5e-5 * step for step in range(len(betas))])  # annealed per update
    else:
        assert any(abs(h.get("rlad/teacher_log_ratio", 0)) > 0 for h in trainer.state.log_history)
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())


@pytest.mark.parametrize("objective", ["kdrl", "rlad"])
def test_hybrid_rows_against_a_local_copy_of_the_student_see_no_gap(
    objective, boxed_text_student_dir, boxed_teacher_server, tmp_path
):
    """With distill_teacher the teacher is loaded next to the student and scores each micro-batch itself; against
    the student's own weights (learning rate 0) KDRL's reverse KL and RLAD's teacher log-ratio are 0."""
    trainer = _trainer(
        boxed_text_student_dir,
        boxed_teacher_server,
        tmp_path,
        [],
        Spy(),
        policy_objective=objective,
        distill_teacher=str(boxed_text_student_dir),
        learning_rate=0.0,
        max_steps=2,
    )
    assert trainer.distill_teacher is not None
    record = _train_recorded(trainer)
    assert record["micro"] and not any("teacher_logps" in m for m in record["micro"])  # nothing asked of the server
    metric = "kdrl/reverse_kl" if objective == "kdrl" else "rlad/teacher_log_ratio"
    logged = [h[metric] for h in trainer.state.log_history if metric in h]
    assert logged and all(abs(v) < 1e-5 for v in logged)


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


def test_relift_trains_one_graded_correct_teacher_solution_per_all_wrong_question(
    boxed_text_student_dir, boxed_teacher_server, tmp_path
):
    """ReLIFT† (zero_variance_signal: relift) on the GRPO† pipeline: a target exactly for the plain questions the
    student got all wrong and the teacher solved (one of its graded-correct rollouts), none for a question the
    teacher cannot solve nor for any question the student solved once; the targets train (cross-entropy logged)."""
    from zppo_trl.terms.zero_variance import TARGET_FIELD

    rows = toy_rows("text")
    rows = _unsolvable(rows, (rows[0]["id"],))
    by_id = {row["id"]: row for row in rows}
    teacher = _recording_teacher(boxed_teacher_server)
    trainer = _trainer(
        boxed_text_student_dir,
        boxed_teacher_server,
        tmp_path,
        [],
        Spy(),
        teacher=teacher,
        rows=rows,
        zero_variance_signal="relift",
    )
    assert trainer.args.variant.startswith("ReLIFT\u2020")  # the fixture replays at 0.5
    calls = []
    original = trainer._with_terms

    def recorded(step):
        out = original(step)
        calls.append((step.round, out[1]))
        return out

    trainer._with_terms = recorded
    record = _train_recorded(trainer)
    tokenizer, G = trainer.processing_class, trainer.num_generations
    built_targets = []
    for plain, targets in calls:
        all_wrong = {
            key
            for g, (kind, key) in enumerate(plain.groups_per_rank[0])
            if kind != "filler" and all(r <= 0.5 for r in plain.rewards[g * G : (g + 1) * G].tolist())
        }
        solved = {key for key in all_wrong if _teacher_correct(dict(sampled=teacher.exchanges), by_id[key])}
        keys = (
            [key for kind, key in targets.groups_per_rank[0] if kind != "filler"] if targets.batch is not None else []
        )
        assert sorted(keys) == sorted(solved), (keys, all_wrong)  # one target per solved all-wrong question
        assert rows[0]["id"] not in keys
        for i, key in enumerate(targets.groups_per_rank[0]):
            if key[0] == "filler":
                continue
            ids = targets.batch["completion_ids"][i][targets.batch["completion_mask"][i].bool()]
            text = tokenizer.decode(ids, skip_special_tokens=True).strip()
            correct = [t.strip() for t in _teacher_correct(dict(sampled=teacher.exchanges), by_id[key[1]])]
            assert text in correct
            built_targets.append(text)
    assert built_targets, "no all-wrong question with a teacher solution in the run"
    trained = [
        tokenizer.decode(m["completion_ids"][i][m["completion_mask"][i].bool()], skip_special_tokens=True).strip()
        for m in record["micro"]
        if TARGET_FIELD in m
        for i in range(m["completion_ids"].size(0))
        if m[TARGET_FIELD][i] > 0 and m["completion_mask"][i].any()
    ]
    assert sorted(trained) == sorted(built_targets)  # every target trains once, as a target row
    assert any(h.get("relift/nll", 0) > 0 for h in trainer.state.log_history)


def _assert_ema_copy(copy, initial, trainer, student_dir, checkpoint) -> None:
    """An EMA copy of the student (GRPO-CARE's reference, SDPO's self-teacher) moved from its ``initial`` weights
    without becoming the student, and the ``checkpoint`` file holds it exactly."""
    from zppo_trl.terms.grpo_care import EMAReference

    ema = list(copy.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(ema, initial))
    assert any(not torch.equal(a, b) for a, b in zip(ema, trainer.model.parameters()))
    restored = EMAReference(AutoModelForCausalLM.from_pretrained(student_dir), decay=1.0)
    restored.load_state_dict(torch.load(checkpoint))
    assert all(torch.equal(a, b) for a, b in zip(restored.model.parameters(), ema))


def _checkpoint_log_probs(student_dir, conversation, completion: list[int]) -> torch.Tensor:
    """An independent forward of the saved student: its next-token log-probs (C, V) at each completion position,
    after ``conversation`` rendered by its tokenizer's chat template."""
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    prompt = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True, return_dict=True)
    prompt = list(prompt["input_ids"])
    with torch.no_grad():
        model = AutoModelForCausalLM.from_pretrained(student_dir).eval()
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1)


def test_sdpo_distils_each_rollout_towards_the_student_shown_a_correct_sibling(boxed_text_student_dir, tmp_path):
    """SDPO† (policy_objective: sdpo), two rollout steps, no teacher server: every rollout with another correct
    rollout in its group, and no other, is scored by the self-teacher after SDPO's prompt around the first such
    sibling's text; at the first step (the self-teacher is then the initial student) those log-probs equal an
    independent forward of the initial checkpoint on the chat-templated prompt and the sampled tokens; the term
    reaches the loss; the EMA self-teacher moves after the updates without becoming the student, and a checkpoint
    carries it."""
    from types import SimpleNamespace

    from zppo_trl.terms.self_teachers import sdpo_context

    no_server = SimpleNamespace(base_url=None, model=None)
    trainer = _trainer(
        boxed_text_student_dir,
        no_server,
        tmp_path,
        [],
        Spy(),
        policy_objective="sdpo",
        save_strategy="steps",
        save_steps=4,
    )
    assert trainer.args.variant.endswith("SDPO\u2020") and trainer.teacher is None
    (term,) = trainer.terms
    initial = [p.detach().clone() for p in term.copy.model.parameters()]
    calls = []
    with_terms, scored = trainer._with_terms, term.signal

    def recorded_round(step):
        calls.append(dict(plain=list(step.draw.plain), round=step.round))
        out = with_terms(step)
        calls[-1]["out"] = out[0]
        return out

    def recorded_scores(batch, rows, conversations):
        fields = scored(batch, rows, conversations)
        calls[-1].update(rows=list(rows), conversations=conversations, logps=fields["self_teacher_logps"][rows])
        return fields

    trainer._with_terms, term.signal = recorded_round, recorded_scores
    trainer.train()
    G = trainer.num_generations
    assert len(calls) == 2  # one per rollout step
    for call in calls:
        rewards = call["round"].rewards.tolist()
        texts, plain = call["round"].texts, call["plain"]
        expected_rows, expected_contexts = [], []
        for i in range(len(texts)):
            group = plain[i // G]
            siblings = [j for j in range(i - i % G, i - i % G + G) if j != i and rewards[j] > 0.5]
            if group.kind != "filler" and siblings:
                expected_rows.append(i)
                expected_contexts.append(sdpo_context(compose_prompt(group.row["question"]), texts[siblings[0]]))
        assert call.get("rows", []) == expected_rows
        assert [c[-1]["content"] for c in call.get("conversations", [])] == expected_contexts
        batch = call["out"].batch
        mask = batch["self_teacher_mask"]
        assert mask[expected_rows].eq(batch["completion_mask"][expected_rows]).all()
        assert mask.sum() == batch["completion_mask"][expected_rows].sum()
        assert batch["self_teacher_logps"][expected_rows].eq(call["logps"]).all()
    first = calls[0]
    assert first["rows"], "the first step had no rollout with a correct sibling: nothing was distilled"
    # the first step's self-teacher is the initial student: an independent forward of the checkpoint must agree
    batch = first["round"].batch
    for k, row in enumerate(first["rows"]):
        completion = batch["completion_ids"][row][batch["completion_mask"][row].bool()].tolist()
        full = _checkpoint_log_probs(boxed_text_student_dir, first["conversations"][k], completion)
        expected = full.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
        torch.testing.assert_close(first["logps"][k, : len(completion)], expected, atol=1e-4, rtol=1e-4)
    logs = _rollout_logs(trainer)
    assert [log["self_distill_rollouts"] for log in logs] == [len(c["rows"]) for c in calls]
    losses = [h for h in trainer.state.log_history if "self_distill/tokens" in h]
    assert losses and any(h["self_distill/tokens"] > 0 for h in losses)
    checkpoint = tmp_path / "out" / "checkpoint-4" / "self_teacher.pt"
    _assert_ema_copy(term.copy, initial, trainer, boxed_text_student_dir, checkpoint)


def test_opsd_distils_towards_the_initial_student_shown_the_teachers_correct_reply(
    boxed_text_student_dir, boxed_teacher_server, tmp_path
):
    """OPSD† (policy_objective: opsd), two rollout steps against the boxed teacher server: every rollout of a
    question the teacher answered correctly that step (graded here, independently), and no other, is scored by the
    self-teacher after OPSD's prompt around the teacher's first correct reply; that self-teacher is the initial
    student, frozen (an independent forward of the checkpoint gives the same top-k); the divergence reaches the loss
    and the student moves."""
    from zppo_trl.terms.self_teachers import opsd_context

    teacher = _recording_teacher(boxed_teacher_server)
    trainer = _trainer(
        boxed_text_student_dir,
        boxed_teacher_server,
        tmp_path,
        [],
        Spy(),
        teacher=teacher,
        policy_objective="opsd",
        prefetch_teacher_samples=False,  # each step's teacher replies are asked for within it
    )
    assert trainer.args.variant.endswith("OPSD\u2020")
    (term,) = trainer.terms
    initial = [p.detach().clone() for p in term.copy.model.parameters()]
    student_before = [p.detach().clone() for p in trainer.model.parameters()]
    calls, asked_until = [], [0]
    with_terms, signal = trainer._with_terms, term.signal

    def recorded_round(step):
        out = with_terms(step)
        calls.append(
            dict(
                plain=list(step.draw.plain),
                out=out[0],
                exchanges=teacher.exchanges[asked_until[0] :],
                **calls_seen[-1],
            )
        )
        asked_until[0] = len(teacher.exchanges)
        return out

    calls_seen = []

    def recorded_signal(batch, rows, conversations):
        fields = signal(batch, rows, conversations)
        calls_seen.append(dict(rows=list(rows), conversations=conversations, fields=fields))
        return fields

    trainer._with_terms, term.signal = recorded_round, recorded_signal
    trainer.train()
    G = trainer.num_generations
    assert len(calls) == 2
    distilled = 0
    for call in calls:
        replies = {}  # question text -> this step's teacher replies
        for messages, texts in call["exchanges"]:
            replies[messages[-1]["content"]] = texts or []
        expected_rows, expected_contexts = [], []
        for i in range(len(call["plain"]) * G):
            group = call["plain"][i // G]
            if group.kind == "filler":
                continue
            texts = replies[compose_prompt(group.row["question"])]
            right = [t for t, r in zip(texts, boxed_accuracy_reward(texts, [group.row["answer"]] * len(texts))) if r]
            if right:
                expected_rows.append(i)
                expected_contexts.append(opsd_context(group.row["question"], right[0], RL_CLOSER))
        assert call["rows"] == expected_rows
        assert [c[-1]["content"] for c in call["conversations"]] == expected_contexts
        batch = call["out"].batch
        assert batch["self_teacher_mask"].sum() == batch["completion_mask"][expected_rows].sum()
        distilled += len(expected_rows)
    assert distilled > 0, "the teacher answered no question correctly: nothing was distilled"
    # the self-teacher is the initial student, frozen: an independent forward of the checkpoint gives its top-k
    call = next(c for c in calls if c["rows"])
    batch, row = call["out"].batch, call["rows"][0]
    completion = batch["completion_ids"][row][batch["completion_mask"][row].bool()].tolist()
    full = _checkpoint_log_probs(boxed_text_student_dir, call["conversations"][0], completion)
    expected = full.topk(trainer.args.opsd_top_k, dim=-1)
    torch.testing.assert_close(
        batch["self_teacher_topk_logps"][row, : len(completion)], expected.values, atol=1e-4, rtol=1e-4
    )
    assert torch.equal(batch["self_teacher_topk_ids"][row, : len(completion), 0], expected.indices[:, 0])
    assert all(torch.equal(a, b) for a, b in zip(term.copy.model.parameters(), initial))
    assert any(not torch.equal(a, b) for a, b in zip(trainer.model.parameters(), student_before))
    logs = _rollout_logs(trainer)
    assert [log["self_distill_rollouts"] for log in logs] == [len(c["rows"]) for c in calls]
    losses = [h for h in trainer.state.log_history if "self_distill/jsd" in h]
    assert losses and any(h["self_distill/tokens"] > 0 and h["self_distill/jsd"] > 0 for h in losses)


def test_grpo_care_adds_its_consistency_bonus_to_the_advantages_and_nothing_else(
    boxed_text_student_dir, boxed_teacher_server, tmp_path
):
    """GRPO-CARE† (reward_term: grpo_care): the bonus is 0.5 x the reward of correct rollouts only, at least one
    correct rollout of every group with one gets it (the most consistent is never below its group's mean), the
    plain accuracy and the buffer see the correctness reward alone, the EMA reference moves after the optimizer
    steps (every step here) without becoming the student, and a checkpoint carries it."""
    trainer = _trainer(
        boxed_text_student_dir,
        boxed_teacher_server,
        tmp_path,
        [],
        Spy(),
        reward_term="grpo_care",
        care_ema_every=1,
        save_strategy="steps",
        save_steps=4,
    )
    assert trainer.args.variant == "GRPO-CARE\u2020 (\u03c1_replay=0.50)" and trainer.teacher is None
    (term,) = trainer.terms
    initial = [p.detach().clone() for p in term.reference.model.parameters()]
    calls = []
    original = trainer._with_terms

    def recorded(step):
        out = original(step)
        calls.append((step.round.rewards.clone(), out[0].rewards.clone(), step.round.groups_per_rank[0]))
        return out

    trainer._with_terms = recorded
    trainer.train()
    G = trainer.num_generations
    assert len(calls) == 2  # one per rollout step
    for before, after, groups in calls:
        extra = after - before
        bonused = extra > 0
        assert (extra >= 0).all() and (before[bonused] > 0.5).all()
        torch.testing.assert_close(extra[bonused], 0.5 * before[bonused])
        for g, (kind, _key) in enumerate(groups):
            rows = slice(g * G, (g + 1) * G)
            if kind != "filler" and (before[rows] > 0.5).any():
                assert bonused[rows].any(), (g, before[rows], extra[rows])
    logs = _rollout_logs(trainer)
    assert sum(log["care_bonused"] for log in logs) == sum(int((a - b).gt(0).sum()) for b, a, _ in calls) > 0
    assert all(0.0 <= log["plain_accuracy"] <= 1.0 for log in logs)
    checkpoint = tmp_path / "out" / "checkpoint-4" / "care_reference.pt"
    _assert_ema_copy(term.reference, initial, trainer, boxed_text_student_dir, checkpoint)


def test_rlkd_adds_the_structure_reward_of_rollouts_of_questions_holding_a_teacher_trace(
    boxed_text_student_dir, boxed_teacher_server, vllm_teacher_server, tmp_path
):
    """RLKD† (reward_term: rlkd): the boxed teacher server answers, vLLM's CPU server is the GSRM and the judge,
    its every reply held by a regex (structured outputs) to a two-step decomposition whose lines read both "yes" and
    "no". So every decomposition has two steps, each meta-reasoning is judged the same (yes), each sub-problem and
    answer different (no): every rollout of a question holding a teacher trace gains exactly 2 x 0.25 = 0.5, the
    others nothing. Pins the trace (the teacher's first reply graded correct, graded again here, held from the step
    it appears), one GSRM request per new trace and per scored rollout on its reasoning, and that the plain accuracy
    reads the correctness reward alone."""
    from zppo_trl.terms.rlkd import GSRM_SYSTEM

    steps = "".join(f"[sub-think {k}]: yes\n[Query {k}]: no\n[Answer {k}]: no\n" for k in (1, 2))
    held = {"structured_outputs": {"regex": re.escape(steps)}}
    teacher = _recording_teacher(boxed_teacher_server)
    trainer = _trainer(
        boxed_text_student_dir,
        boxed_teacher_server,
        tmp_path,
        [],
        Spy(),
        teacher=teacher,
        reward_term="rlkd",
        judge_base_url=vllm_teacher_server.base_url,
        judge_model=vllm_teacher_server.model,
        judge_extra_body=held,
        rlkd_gsrm_max_tokens=128,  # the tiny judge's context; the regex ends each reply well before
        prefetch_teacher_samples=False,  # each step's teacher replies are asked for within it
    )
    assert trainer.args.variant.startswith("RLKD†")  # "(ρ_replay=0.50)": the fixture replays at 0.5
    (term,) = trainer.terms
    judge = term.judge = RecordingTeacher(vllm_teacher_server.base_url, vllm_teacher_server.model, extra_body=held)
    calls, original, asked_until = [], trainer._with_terms, [0]

    def recorded(step):
        judged_before = len(judge.exchanges)
        out = original(step)
        calls.append(
            dict(
                before=step.round.rewards.clone(),
                after=out[0].rewards.clone(),
                plain=list(step.draw.plain),
                texts=list(step.round.texts),
                replies=teacher.exchanges[asked_until[0] :],
                gsrm=[m for m, _ in judge.exchanges[judged_before:] if m[0]["role"] == "system"],
                traces=dict(term.traces),
            )
        )
        asked_until[0] = len(teacher.exchanges)
        return out

    trainer._with_terms = recorded
    trainer.train()
    G, logs = trainer.num_generations, _rollout_logs(trainer)
    assert len(calls) == len(logs) == 2
    expected_traces: dict[str, str] = {}
    scored = 0
    for call, log in zip(calls, logs):
        replies = {messages[-1]["content"]: texts or [] for messages, texts in call["replies"]}
        new_traces = []
        for group in call["plain"]:
            if group.kind == "filler" or group.row["id"] in expected_traces:
                continue
            texts = replies[compose_prompt(group.row["question"])]
            right = [t for t, r in zip(texts, boxed_accuracy_reward(texts, [group.row["answer"]] * len(texts))) if r]
            if right:
                expected_traces[group.row["id"]] = right[0]
                new_traces.append(group.row)
        assert call["traces"] == expected_traces  # the first correct reply, held from the step it appears
        extra = call["after"] - call["before"]
        expected_requests = [(row["question"], expected_traces[row["id"]].split("</think>")[0]) for row in new_traces]
        for g, group in enumerate(call["plain"]):
            rows_of_group = slice(g * G, (g + 1) * G)
            if group.kind != "filler" and group.row["id"] in expected_traces:
                torch.testing.assert_close(extra[rows_of_group], torch.full((G,), 0.5, dtype=extra.dtype))
                expected_requests += [
                    (group.row["question"], t.split("</think>")[0]) for t in call["texts"][rows_of_group]
                ]
                scored += G
            else:
                assert (extra[rows_of_group] == 0).all()
        assert all(m[0]["content"] == GSRM_SYSTEM for m in call["gsrm"])
        sent = sorted(m[1]["content"] for m in call["gsrm"])
        assert sent == sorted(f"{q}\nYou should decompose this reasoning:\n{r}" for q, r in expected_requests)
        assert (
            log["rlkd_judged"]
            == sum(1 for g in call["plain"] if g.kind != "filler" and g.row["id"] in expected_traces) * G
        )
        assert log["rlkd_failed"] == 0 and log["rlkd_reward_mean"] == pytest.approx(0.5)
        real = [(g, group) for g, group in enumerate(call["plain"]) if group.kind != "filler"]
        accuracy = [float(call["before"][g * G : (g + 1) * G].mean()) for g, _ in real]
        assert log["plain_accuracy"] == pytest.approx(sum(accuracy) / len(accuracy))  # the correctness reward alone
    assert scored > 0, "no question held a teacher trace: nothing was scored"
    assert dict(trainer.zppo_state.state_dict()["structure_traces"]) == expected_traces  # checkpointed with the buffer


def test_perception_r1_adds_the_judges_fraction_of_stated_annotations_to_the_advantages_rewards(
    boxed_text_student_dir, vllm_teacher_server, tmp_path
):
    """Perception-R1† (reward_term: perception_r1) against a real judge: vLLM's CPU server, its reply held to one
    verdict by a regex (structured outputs), so each annotated rollout's r_v is known: the first of its question's
    two annotations stated, the second not, r_v = 0.5. Pins that every rollout of an annotated question (and no
    other) is judged once, on its own text with its question's annotations, that exactly 0.7 x 0.5 is added to its
    reward and nothing to the others, that a correct and a wrong rollout both get it (no gate on accuracy), and that
    the plain accuracy (so the buffer) reads the correctness reward alone."""
    from zppo_trl.terms.perception_r1 import ANNOTATIONS

    rows = toy_rows("text")
    annotated = {row["id"] for row in rows[::2]}
    for row in rows:
        row[ANNOTATIONS] = [f"the question asks about {row['id']}", "a red circle"] if row["id"] in annotated else []
    verdict = {"structured_outputs": {"regex": "<info1>1</info1><info2>0</info2>"}}
    trainer = _trainer(
        boxed_text_student_dir,
        vllm_teacher_server,
        tmp_path,
        [],
        Spy(),
        rows=rows,
        reward_term="perception_r1",
        judge_extra_body=verdict,
    )
    assert trainer.args.variant == "Perception-R1\u2020 (\u03c1_replay=0.50)" and trainer.teacher is None
    (term,) = trainer.terms
    assert term.judge.base_url == vllm_teacher_server.base_url
    judge = term.judge = RecordingTeacher(vllm_teacher_server.base_url, vllm_teacher_server.model, extra_body=verdict)
    calls, original = [], trainer._with_terms

    def recorded(step):
        out = original(step)
        calls.append(
            (step.round.rewards.clone(), out[0].rewards.clone(), list(step.draw.plain), list(step.round.texts))
        )
        return out

    trainer._with_terms = recorded
    trainer.train()
    G, logs = trainer.num_generations, _rollout_logs(trainer)
    assert len(calls) == len(logs) == 2
    expected_requests, rewarded_right, rewarded_wrong = [], 0, 0
    for (before, after, plain, texts), log in zip(calls, logs):
        extra = after - before
        judged = 0
        for g, group in enumerate(plain):
            rows_of_group = slice(g * G, (g + 1) * G)
            if group.kind != "filler" and group.row["id"] in annotated:
                torch.testing.assert_close(extra[rows_of_group], torch.full((G,), 0.35, dtype=extra.dtype))
                expected_requests += [(group.row[ANNOTATIONS], text) for text in texts[rows_of_group]]
                rewarded_right += int((before[rows_of_group] > 0.5).sum())
                rewarded_wrong += int((before[rows_of_group] <= 0.5).sum())
                judged += G
            else:
                assert (extra[rows_of_group] == 0).all()
        assert log["perception_judged"] == judged > 0 and log["perception_judge_failed"] == 0
        assert log["perception_reward_mean"] == pytest.approx(0.5)
        real = [(g, group) for g, group in enumerate(plain) if group.kind != "filler"]
        assert log["perception_unannotated"] == G * sum(group.row["id"] not in annotated for _, group in real)
        accuracy = [float(before[g * G : (g + 1) * G].mean()) for g, _ in real]
        assert log["plain_accuracy"] == pytest.approx(sum(accuracy) / len(accuracy))  # the correctness reward alone
    assert rewarded_right > 0 and rewarded_wrong > 0
    # one request per judged rollout (answered concurrently, so in any order): its question's two annotations as
    # numbered items, then its own text last
    sent = sorted(messages[-1]["content"] for messages, _ in judge.exchanges)
    lines = "<info1>{}</info1>\n<info2>{}</info2>"
    assert len(sent) == len(expected_requests)
    for notes, text in expected_requests:
        match = next(p for p in sent if lines.format(*notes) in p and p.endswith("Response:\n" + text))
        sent.remove(match)
    assert all(replies == ["<info1>1</info1><info2>0</info2>"] for _, replies in judge.exchanges)
