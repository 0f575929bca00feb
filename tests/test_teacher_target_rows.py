"""The teacher-target zero-variance rows (zppo_trl.terms.zero_variance): ReLIFT† and RSTG†.

On hand-computed values: which questions receive a teacher target (all-wrong plain groups only, with a
graded-correct teacher rollout), where ReLIFT's target rows train (their question's partition, zero advantage, a
partition of only an all-wrong group no longer skipped), the two terms' arithmetic (ReLIFT's weighted NLL on the
target rows only, RSTG's weighted JSD on the all-wrong rows only); the rows' names, checks and recipes; and, on a
tiny in-process model, that the term is the only gradient an all-wrong step gets.
"""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator

from zppo_trl import ZPPOConfig
from zppo_trl.distill import DistillInputs
from zppo_trl.logp_paths import completion_logps
from zppo_trl.partitioning import is_skipped, policy_partitions
from zppo_trl.plan import print_plan
from zppo_trl.ranks import Ranks
from zppo_trl.recipe import parse_recipe_args
from zppo_trl.terms.zero_variance import (
    MARK_FIELD,
    TARGET_FIELD,
    all_wrong_keys,
    partition_signal,
    relift_targets,
    teacher_target_term,
)

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from settings import CPU as CPU_ONLY
    from settings import UNREACHABLE_TEACHER
except ImportError:
    from tests.settings import CPU as CPU_ONLY
    from tests.settings import UNREACHABLE_TEACHER

CPU = {**CPU_ONLY, **UNREACHABLE_TEACHER}


def _args(signal: str, alpha: float | None = None, partitions: int = 1, **extra) -> SimpleNamespace:
    return SimpleNamespace(
        num_partitions=partitions,
        gradient_accumulation_steps=1,
        advantage_normalization="without_zero",
        advantage_epsilon=1e-6,
        zero_variance_signal=signal,
        zero_variance_alpha=alpha,
        **extra,
    )


# ---------------------------------------------------------------- which questions receive a target


def test_all_wrong_keys_are_the_plain_questions_with_every_reward_at_most_correct():
    # two ranks, groups of 2; a reward of 0.5 is not correct (rewards are correct above 0.5)
    groups = [[("plain", "a"), ("plain", "b")], [("replay", "c"), ("filler", "a")]]
    rewards = [0.0, 0.5, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert all_wrong_keys(groups, rewards, 2) == ["a", "c"]  # b is mixed; the filler never names a question


def test_a_question_split_over_ranks_is_all_wrong_only_if_every_part_is():
    groups = [[("plain", "a")], [("plain", "a")]]
    assert all_wrong_keys(groups, [0.0, 0.0, 0.0, 1.0], 2) == []
    assert all_wrong_keys(groups, [0.0, 0.0, 0.0, 0.0], 2) == ["a"]


def test_relift_targets_one_graded_correct_teacher_rollout_per_all_wrong_question():
    correct = {"a": ["sol-a"], "b": [], "c": ["c1", "c2", "c3"], "d": ["never"]}
    targets = relift_targets(["a", "b", "c"], correct, random.Random(0))
    assert [key for key, _ in targets] == ["a", "c"]  # b has no correct teacher rollout; d is not all-wrong
    assert targets[0] == ("a", "sol-a") and targets[1][1] in correct["c"]
    # uniform over the question's correct rollouts: every one is drawn over seeds
    drawn = {relift_targets(["c"], correct, random.Random(seed))[0][1] for seed in range(50)}
    assert drawn == set(correct["c"])


def test_relift_marks_no_rollout_and_rstg_marks_the_all_wrong_ones():
    rewards, groups = [1.0, 0.0, 0.0, 0.0], ["g0", "g0", "g1", "g1"]
    relift_marked, relift_extra = partition_signal(_args("relift"), rewards, groups)
    rstg_marked, rstg_extra = partition_signal(_args("rstg"), rewards, groups)
    assert relift_marked.tolist() == [False] * 4 and rstg_marked.tolist() == [False, False, True, True]
    assert relift_extra.tolist() == rstg_extra.tolist() == [0.0] * 4  # neither changes an advantage


# ---------------------------------------------------------------- where ReLIFT's target rows train


@pytest.fixture(scope="module")
def ranks():
    return Ranks(Accelerator(cpu=True))


def _batch(rows: int, lengths: list[int]) -> dict:
    mask = torch.tensor([[1] * n + [0] * (4 - n) for n in lengths])
    return {
        "prompt_ids": torch.ones(rows, 2, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 2, dtype=torch.long),
        "completion_ids": torch.arange(rows)[:, None].repeat(1, 4),
        "completion_mask": mask,
        "advantages": torch.zeros(rows),
    }


def _relift_partitions(ranks, targets_per_rank, partitions=2):
    # groups of 2: g0 mixed (rows 0, 1), g1 all-wrong (rows 2, 3); row 4: a target anchored to g1
    batch = _batch(5, [3, 3, 3, 3, 4])
    rewards = [[1.0, 0.0, 0.0, 0.0]]
    return policy_partitions(
        batch,
        [["plain", "plain"]],
        rewards,
        2,
        _args("relift", partitions=partitions),
        ranks,
        0,
        None,
        targets_per_rank,
    )


def test_a_target_row_trains_in_its_questions_partition_with_zero_advantage(ranks):
    result = _relift_partitions(ranks, [[(4, (0, 1))]], partitions=1)
    (micro,) = result.micro_batches
    rows = micro["completion_ids"][:, 0].tolist()
    assert sorted(rows) == [0, 1, 2, 3, 4]
    flags = dict(zip(rows, micro[TARGET_FIELD].tolist()))
    advantages = dict(zip(rows, micro["advantages"].tolist()))
    assert flags == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0, 4: 1.0}
    assert advantages[4] == 0.0 and advantages[2] == advantages[3] == 0.0 and advantages[0] > 0 > advantages[1]
    assert float(micro["num_items_in_batch"]) == 3 * 4 + 4  # the update's token mean counts the target's tokens
    assert (0, 4) not in result.trained  # a target is no RL rollout


def test_the_all_wrong_partition_trains_only_because_of_its_target(ranks):
    without = _relift_partitions(ranks, [[]])
    with_target = _relift_partitions(ranks, [[(4, (0, 1))]])
    assert without.skipped == 1 and with_target.skipped == 0
    trained = [m for m in with_target.micro_batches if not is_skipped(m) and TARGET_FIELD in m]
    (micro,) = trained  # the partition of g1 holds g1's rollouts and the target, nothing of g0
    assert sorted(micro["completion_ids"][:, 0].tolist()) == [2, 3, 4]
    assert micro[TARGET_FIELD].tolist() == [float(i == 4) for i in micro["completion_ids"][:, 0].tolist()]


# ---------------------------------------------------------------- the terms' arithmetic


def _not_called():
    raise AssertionError("ReLIFT needs no distributions")


def test_relift_term_is_the_weighted_nll_of_the_target_rows_only():
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, -4.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    inputs = {TARGET_FIELD: torch.tensor([0.0, 1.0])}
    loss, means = teacher_target_term(_args("relift"), inputs, logps, mask, 10.0, _not_called)
    assert float(loss) == pytest.approx((0.5 + 0.25 + 4.0) / 10.0)  # alpha 1.0; row 0 is an RL row
    total, count = means["relift/nll"]
    assert float(total) == pytest.approx(4.75) and float(count) == 3.0
    weighted, _ = teacher_target_term(_args("relift", alpha=0.2), inputs, logps, mask, 10.0, _not_called)
    assert float(weighted) == pytest.approx(0.2 * 4.75 / 10.0)
    changed = logps.clone()
    changed[0] = -9.0  # the RL row's log-probs never enter the term
    assert float(teacher_target_term(_args("relift"), inputs, changed, mask, 10.0, _not_called)[0]) == float(loss)


def test_a_micro_batch_without_target_rows_or_without_a_teacher_row_adds_nothing():
    logps, mask = torch.zeros(1, 2), torch.ones(1, 2)
    assert teacher_target_term(_args("relift"), {TARGET_FIELD: torch.zeros(1)}, logps, mask, 1.0, _not_called) is None
    assert teacher_target_term(_args("relift"), {}, logps, mask, 1.0, _not_called) is None
    assert teacher_target_term(_args("lens"), {TARGET_FIELD: torch.ones(1)}, logps, mask, 1.0, _not_called) is None


def _jsd(p: list[float], q: list[float]) -> float:
    """beta = 0.5 JSD of two distributions, by hand."""
    m = [(a + b) / 2 for a, b in zip(p, q)]
    return 0.5 * sum(a * math.log(a / c) for a, c in zip(p, m)) + 0.5 * sum(b * math.log(b / c) for b, c in zip(q, m))


def test_rstg_term_is_the_weighted_jsd_on_the_all_wrong_rows_only():
    # vocabulary of 2; head is the identity, so the states are the logits. Row 0 is a mixed-group rollout (not
    # marked), row 1 an all-wrong rollout with 2 loss tokens.
    student = torch.tensor([[[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [math.log(3.0), 0.0]]], requires_grad=True)
    teacher = torch.tensor([[[5.0, 0.0], [5.0, 0.0]], [[math.log(9.0), 0.0], [0.0, math.log(4.0)]]])
    distill = DistillInputs(student, lambda s: s, 2, teacher_states=teacher, teacher_head=lambda s: s)
    mask = torch.ones(2, 2)
    args = _args("rstg", distill_beta=0.5, distill_chunk_size=1)
    loss, means = teacher_target_term(args, {MARK_FIELD: torch.tensor([0.0, 1.0])}, None, mask, 4.0, lambda: distill)
    expected = _jsd([0.5, 0.5], [0.9, 0.1]) + _jsd([0.75, 0.25], [0.2, 0.8])
    assert float(loss.detach()) == pytest.approx(expected / 4.0, rel=1e-6)
    assert float(means["rstg/jsd"][1]) == 2.0
    loss.backward()
    assert student.grad[0].abs().sum() == 0 and student.grad[1].abs().sum() > 0  # only the all-wrong row learns
    halved, _ = teacher_target_term(
        _args("rstg", alpha=0.5, distill_beta=0.5, distill_chunk_size=1),
        {MARK_FIELD: torch.tensor([0.0, 1.0])},
        None,
        mask,
        4.0,
        lambda: distill,
    )
    assert float(halved) == pytest.approx(0.5 * expected / 4.0, rel=1e-6)


# ---------------------------------------------------------------- the configuration and the rows


@pytest.mark.parametrize(
    "overrides, name",
    [
        (dict(augmentations=[], zero_variance_signal="relift"), "ReLIFT\u2020"),
        (dict(augmentations=[], zero_variance_signal="rstg"), "RSTG\u2020"),
        (dict(augmentations=[], zero_variance_signal="rstg", replay_fraction=0.0), "RSTG"),
        (dict(zero_variance_signal="relift"), "ZPPO (ReLIFT)"),
    ],
)
def test_variant_names_the_teacher_target_rows(overrides, name):
    assert ZPPOConfig(**CPU, **overrides).variant == name


def test_the_teacher_target_rows_need_the_teacher_server_and_an_rl_row():
    no_teacher = {k: v for k, v in CPU.items() if k not in ("teacher_base_url", "teacher_model")}
    for signal in ("relift", "rstg"):
        with pytest.raises(ValueError, match="teacher_base_url"):
            ZPPOConfig(**no_teacher, augmentations=[], zero_variance_signal=signal)
    with pytest.raises(ValueError, match="this row trains the 'jsd' loss"):
        ZPPOConfig(**CPU, augmentations=[], distillation="on", zero_variance_signal="rstg")
    with pytest.raises(ValueError, match="this row trains the 'sft' loss"):  # a supervised control: no advantages
        ZPPOConfig(**CPU, augmentations=["correction"], zero_variance_signal="rl_zvp")


def test_rstg_reads_the_distillation_settings_and_relift_does_not():
    with pytest.warns(UserWarning, match="distill_beta"):
        ZPPOConfig(**CPU, augmentations=[], zero_variance_signal="relift", distill_beta=0.3)
    ZPPOConfig(**CPU, augmentations=[], zero_variance_signal="rstg", distill_beta=0.3, distill_top_k=8)


@pytest.mark.parametrize(
    "recipe, headline, signal",
    [
        ("recipes/rows/relift_dagger.yaml", "ReLIFT\u2020", "relift"),
        ("recipes/rows/rstg_dagger.yaml", "RSTG\u2020", "rstg"),
    ],
)
def test_the_dry_run_headline_names_the_row(recipe, headline, signal):
    script, args, _ = parse_recipe_args(["--config", recipe, "--dry_run"])
    lines: list[str] = []
    print_plan(script, args, lines.append)
    assert lines[0] == f"ZPPO dry run: {headline}"
    assert args.zero_variance_signal == signal and args.augmentations == [] and args.replay_fraction == 0.25


# ---------------------------------------------------------------- a tiny trainer: the term is the all-wrong gradient


def _tiny_trainer(tmp_path, signal: str, teacher_model=None):
    from datasets import Dataset

    from zppo_trl import ZPPOTrainer

    try:  # tests/ is on sys.path under pytest's default import mode
        from tiny_models import tiny_text_model, tiny_tokenizer
    except ImportError:
        from tests.tiny_models import tiny_text_model, tiny_tokenizer

    args = ZPPOConfig(
        output_dir=str(tmp_path / signal),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=2,
        num_generations=2,
        num_partitions=1,
        max_completion_length=4,
        augmentations=[],
        zero_variance_signal=signal,
        teacher_base_url="http://127.0.0.1:1/v1",
        teacher_model="t",
        fused_lm_head=False,
    )
    return ZPPOTrainer(
        model=tiny_text_model(seed=0),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list(
            [dict(id="q0", question="What is 12 + 30?", images=[], answer="42", source="toy", subdataset="toy")]
        ),
        processing_class=tiny_tokenizer(),
        distill_teacher_model=teacher_model,
    )


def _rows(trainer, n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    vocab = len(trainer.processing_class)
    prompt_ids, completion_ids = (
        torch.randint(10, vocab, (n, 5), generator=g),
        torch.randint(10, vocab, (n, 4), generator=g),
    )
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": torch.ones_like(completion_ids),
        "advantages": torch.zeros(n),
    }
    with torch.no_grad():
        batch["old_per_token_logps"], _, _ = completion_logps(
            trainer._get_per_token_logps_and_entropies, trainer.model, batch
        )
    return batch


def _train_step(trainer, micro_batches) -> float:
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = trainer.args.gradient_accumulation_steps
    trainer.model.zero_grad(set_to_none=True)
    total = 0.0
    for micro in micro_batches:
        if not is_skipped(micro):
            loss = trainer._compute_loss(trainer.model, micro)
            loss.backward()
            total += float(loss)
    return total


def test_relift_trains_the_teacher_target_of_an_all_wrong_question_and_nothing_else(tmp_path):
    from zppo_trl.rollout import Round, empty_round

    trainer = _tiny_trainer(tmp_path, "relift")
    assert trainer.args.variant == "ReLIFT\u2020" and trainer.teacher is not None
    plain = Round(_rows(trainer, 2, 0), torch.zeros(2), ["", ""], [[("plain", "q0")]])
    target = _rows(trainer, 2, 1)
    target["completion_mask"][1] = 0  # a filler row: no loss tokens
    targets = Round(target, None, [], [[("relift", "q0"), ("filler", "q0")]])
    assert all(is_skipped(m) for m in trainer.batches.policy(plain, empty_round(1)))  # GRPO† alone: none
    micro_batches = trainer.batches.policy(plain, empty_round(1), targets)
    (micro,) = [m for m in micro_batches if not is_skipped(m)]
    loss = _train_step(trainer, micro_batches)
    # by hand: the target row's NLL over the partition's 2 x 4 rollout tokens plus its own 4 tokens
    with torch.no_grad():
        logps, _, _ = completion_logps(trainer._get_per_token_logps_and_entropies, trainer.model, target)
    assert loss == pytest.approx(float(-logps[0].sum() / 12.0), rel=1e-5)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())


def test_rstg_distils_only_the_all_wrong_rollouts(tmp_path):
    from zppo_trl.rollout import Round, empty_round

    try:
        from tiny_models import tiny_text_model
    except ImportError:
        from tests.tiny_models import tiny_text_model

    trainer = _tiny_trainer(tmp_path, "rstg", teacher_model=tiny_text_model(seed=1))
    assert trainer.args.variant == "RSTG\u2020" and trainer.distill_teacher is not None
    # group q0 all-wrong (rows 0, 1), group q1 mixed (rows 2, 3)
    batch = _rows(trainer, 4, 0)
    plain = Round(batch, torch.tensor([0.0, 0.0, 1.0, 0.0]), [""] * 4, [[("plain", "q0"), ("plain", "q1")]])
    micro_batches = trainer.batches.policy(plain, empty_round(1))
    (micro,) = [m for m in micro_batches if not is_skipped(m)]
    marks = {tuple(row): mark for row, mark in zip(micro["completion_ids"].tolist(), micro[MARK_FIELD].tolist())}
    assert marks == {tuple(batch["completion_ids"][i].tolist()): float(i < 2) for i in range(4)}
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    with torch.no_grad():
        total = trainer._compute_loss(trainer.model, micro)
        unmarked = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in micro.items()}
        unmarked[MARK_FIELD] = torch.zeros_like(micro[MARK_FIELD])
        policy_only = trainer._compute_loss(trainer.model, unmarked)
    # the difference is the JSD of the two all-wrong rollouts against the local teacher, by a direct forward
    ids, vocab = torch.cat([micro["prompt_ids"], micro["completion_ids"]], dim=1), len(trainer.processing_class)
    with torch.no_grad():
        s = torch.log_softmax(trainer.model(input_ids=ids).logits[:, 4:-1, :vocab].float(), -1)
        t = torch.log_softmax(trainer.distill_teacher(input_ids=ids).logits[:, 4:-1, :vocab].float(), -1)
    m = torch.logsumexp(torch.stack([s, t]), 0) - math.log(2)
    jsd = 0.5 * (t.exp() * (t - m)).sum(-1) + 0.5 * (s.exp() * (s - m)).sum(-1)
    marked = micro[MARK_FIELD].bool()
    expected = float(jsd[marked].sum() / micro["num_items_in_batch"])
    assert float(total - policy_only) == pytest.approx(expected, rel=1e-4) and expected > 0
