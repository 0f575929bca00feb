"""The zero-variance rows' named terms (zppo_trl.terms.zero_variance): RL-ZVP's token-level entropy signal and LENS's
confidence penalty on the all-wrong groups, on hand-computed values; their effect on the partitions (an
all-wrong group is no longer skipped); the rows' names and recipes; and, on a tiny in-process model, that an
all-wrong group gets a gradient under each row and none under GRPO†."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator

from zppo_trl import ZPPOConfig
from zppo_trl.logp_paths import completion_logps
from zppo_trl.partitioning import is_skipped, policy_partitions
from zppo_trl.plan import print_plan
from zppo_trl.ranks import Ranks
from zppo_trl.recipe import parse_recipe_args
from zppo_trl.terms.zero_variance import (
    MARK_FIELD,
    all_wrong_rows,
    lens_advantages,
    partition_signal,
    response_log_confidence,
    rl_zvp_token_advantages,
    token_advantages,
)

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from settings import CPU as CPU_ONLY
    from settings import UNREACHABLE_TEACHER
except ImportError:
    from tests.settings import CPU as CPU_ONLY
    from tests.settings import UNREACHABLE_TEACHER

CPU = {**CPU_ONLY, **UNREACHABLE_TEACHER}


def _args(signal: str = "none", alpha: float | None = None, partitions: int = 1) -> SimpleNamespace:
    return SimpleNamespace(
        num_partitions=partitions,
        gradient_accumulation_steps=1,
        advantage_normalization="without_zero",
        advantage_epsilon=1e-6,
        zero_variance_signal=signal,
        zero_variance_alpha=alpha,
    )


# ---------------------------------------------------------------- which groups receive the signal


def test_only_all_wrong_groups_are_marked():
    rewards = [0, 0, 1, 0, 1, 1, 0, 0]
    groups = ["wrong", "wrong", "mixed", "mixed", "right", "right", "wrong2", "wrong2"]
    assert all_wrong_rows(rewards, groups).tolist() == [True, True, False, False, False, False, True, True]


# ---------------------------------------------------------------- LENS (arXiv 2510.08696, section 5)


def test_lens_penalises_confident_mistakes_on_hand_computed_values():
    # pbar = (0.4, 0.2, 0.1, 0.1): D = 2 * 0.4 = 0.8; pbar / (D - pbar) = (1, 1/3, 1/7, 1/7); times -1/G (G = 4):
    # r~ = (-1/4, -1/12, -1/28, -1/28), mean -17/168; A = 0.25 (r~ + 17/168) = (-25, 3, 11, 11) / 672.
    pbar = torch.tensor([0.4, 0.2, 0.1, 0.1], dtype=torch.float64)
    advantages = lens_advantages(pbar.log(), ["q"] * 4, torch.ones(4, dtype=torch.bool), alpha=0.25)
    expected = torch.tensor([-25.0, 3.0, 11.0, 11.0], dtype=torch.float64) / 672
    torch.testing.assert_close(advantages, expected)
    assert advantages.sum().abs() < 1e-12  # de-meaned in the group, no std normalisation


def test_lens_leaves_unmarked_rows_at_zero_and_is_per_group():
    # two marked groups of 2 and an unmarked group: each marked group has its own D and its own mean.
    pbar = torch.tensor([0.5, 0.25, 0.9, 0.1, 0.3, 0.3], dtype=torch.float64)
    marked = torch.tensor([True, True, False, False, True, True])
    advantages = lens_advantages(pbar.log(), ["a", "a", "b", "b", "c", "c"], marked, alpha=1.0)
    # group a: D = 1.0, r~ = -(1/2) (1, 1/3) -> (-1/2, -1/6), mean -1/3: A = (-1/6, 1/6)
    # group c: equal confidences: r~ equal, A = 0 (nothing to tell them apart)
    torch.testing.assert_close(advantages, torch.tensor([-1 / 6, 1 / 6, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64))


def test_response_log_confidence_is_the_mean_sampling_log_prob_over_loss_tokens():
    batch = {
        "old_per_token_logps": torch.tensor([[-1.0, -3.0, -100.0], [-2.0, -2.0, -2.0]]),
        "completion_mask": torch.tensor([[1, 1, 0], [1, 1, 1]]),
    }
    assert response_log_confidence(batch) == [-2.0, -2.0]  # the padding token's -100 never counts
    with pytest.raises(ValueError, match="num_partitions >= 2"):
        response_log_confidence({"completion_mask": batch["completion_mask"]})


# ---------------------------------------------------------------- RL-ZVP (arXiv 2509.21880, eq. 5)


def test_rl_zvp_shapes_marked_rows_by_entropy_on_hand_computed_values():
    entropies = torch.tensor([[0.5, 2.0, 1.0, 9.0], [1.0, 0.2, 3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # row 0's last token is padding: its 9.0 is not the max
    advantages = torch.tensor([0.0, 0.7])
    marked = torch.tensor([1.0, 0.0])
    out = rl_zvp_token_advantages(advantages, entropies, mask, marked, alpha=0.1)
    # row 0 (all-wrong): -0.1 (2.0 - H) = (-0.15, 0, -0.1) and 0 on padding; every token pushed down, the
    # highest-entropy token least. Row 1 (mixed group): its advantage, unchanged, on every token.
    torch.testing.assert_close(out, torch.tensor([[-0.15, 0.0, -0.1, 0.0], [0.7, 0.7, 0.7, 0.7]]))


def test_rl_zvp_detaches_the_entropies():
    entropies = torch.tensor([[0.5, 2.0]], requires_grad=True)
    out = rl_zvp_token_advantages(torch.zeros(1), entropies, torch.ones(1, 2), torch.ones(1), alpha=0.1)
    assert not out.requires_grad


def test_token_advantages_apply_only_the_loss_time_signal():
    entropies, mask, marked = torch.tensor([[0.0, 1.0]]), torch.ones(1, 2), torch.ones(1)
    advantages = torch.zeros(1)
    assert token_advantages(_args("none"), advantages, entropies, mask, marked) is advantages
    assert token_advantages(_args("lens"), advantages, entropies, mask, marked) is advantages  # LENS: partition
    shaped = token_advantages(_args("rl_zvp", alpha=0.5), advantages, entropies, mask, marked)
    torch.testing.assert_close(shaped, torch.tensor([[-0.5, 0.0]]))


# ---------------------------------------------------------------- the partitions


@pytest.fixture(scope="module")
def ranks():
    return Ranks(Accelerator(cpu=True))


def _batch(rows: int) -> dict:
    return {
        "prompt_ids": torch.ones(rows, 2, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 2, dtype=torch.long),
        "completion_ids": torch.arange(rows)[:, None].repeat(1, 3),
        "completion_mask": torch.ones(rows, 3, dtype=torch.long),
        "advantages": torch.zeros(rows),
    }


# groups of 2: mixed (1, 0), all-wrong (0, 0), all-correct (1, 1)
REWARDS = [[1.0, 0.0, 0.0, 0.0, 1.0, 1.0]]
KINDS = [["plain", "plain", "plain"]]
# each row's mean sampling log-prob: the all-wrong group's first rollout is the confident mistake
CONFIDENCES = [[-1.0, -1.0, math.log(0.4), math.log(0.1), -1.0, -1.0]]


def _partition(ranks, signal, rewards=REWARDS, kinds=KINDS, confidences=CONFIDENCES):
    args = _args(signal)
    result = policy_partitions(
        _batch(len(rewards[0])),
        kinds,
        rewards,
        2,
        args,
        ranks,
        0,
        confidences,
        signal=lambda r, groups, c: partition_signal(args, r, groups, c),
    )
    return result, {i: a for (_, i), a in result.trained.items()}


def test_without_a_signal_the_all_wrong_group_stays_at_zero(ranks):
    result, adv = _partition(ranks, "none")
    assert result.skipped == 0 and adv[2] == adv[3] == 0.0 and MARK_FIELD not in result.micro_batches[0]
    assert adv[0] > 0 > adv[1]


def test_lens_gives_the_all_wrong_group_its_advantage_and_leaves_the_others(ranks):
    _, plain = _partition(ranks, "none")
    _, adv = _partition(ranks, "lens")
    assert adv[0] == plain[0] and adv[1] == plain[1]  # the mixed group's two-step advantages, exactly
    assert adv[4] == adv[5] == 0.0  # the all-correct group stays at zero
    # D = 0.8: r~ = -(1/2)(0.4/0.4, 0.1/0.7) = (-1/2, -1/14), mean -2/7; A = 0.25 (r~ + 2/7) = (-3/56, 3/56)
    assert adv[2] == pytest.approx(-3 / 56, rel=1e-6) and adv[3] == pytest.approx(3 / 56, rel=1e-6)


def test_rl_zvp_marks_the_all_wrong_rows_for_the_loss(ranks):
    result, adv = _partition(ranks, "rl_zvp")
    assert adv[2] == adv[3] == 0.0  # its signal is token-level: computed at the loss from the entropies
    micro = result.micro_batches[0]
    assert micro[MARK_FIELD].tolist() == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("signal, skipped", [("none", 1), ("rl_zvp", 0), ("lens", 0)])
def test_a_partition_of_only_an_all_wrong_group_is_skipped_only_without_a_signal(ranks, signal, skipped):
    result, _ = _partition(ranks, signal, rewards=[[0.0, 0.0]], kinds=[["plain"]], confidences=[[-1.0, -2.0]])
    assert result.skipped == skipped and is_skipped(result.micro_batches[0]) == bool(skipped)


def test_partition_signal_names_what_lens_needs():
    with pytest.raises(ValueError, match="log-confidence"):
        partition_signal(_args("lens"), [0.0, 0.0], ["g", "g"])


# ---------------------------------------------------------------- the configuration and the rows


def test_the_fields_are_validated_naming_the_field():
    with pytest.raises(ValueError, match="zero_variance_signal must be one of"):
        ZPPOConfig(**CPU, zero_variance_signal="zvp")
    with pytest.raises(ValueError, match="zero_variance_alpha"):
        ZPPOConfig(**CPU, zero_variance_signal="rl_zvp", zero_variance_alpha=0.0)
    with pytest.raises(ValueError, match="num_partitions >= 2"):
        ZPPOConfig(**CPU, augmentations=[], zero_variance_signal="lens", num_partitions=1)
    with pytest.raises(ValueError, match="policy_objective='gspo'"):
        ZPPOConfig(**CPU, augmentations=[], zero_variance_signal="rl_zvp", policy_objective="gspo")
    with pytest.raises(ValueError, match="cross-entropy"):
        ZPPOConfig(**CPU, augmentations=["correction"], zero_variance_signal="lens")


@pytest.mark.parametrize(
    "overrides, name",
    [
        (dict(augmentations=[], zero_variance_signal="rl_zvp"), "RL-ZVP\u2020"),
        (dict(augmentations=[], zero_variance_signal="lens"), "LENS\u2020"),
        (dict(augmentations=[], zero_variance_signal="lens", replay_fraction=0.0), "LENS"),
        (dict(zero_variance_signal="rl_zvp"), "ZPPO (RL-ZVP)"),
        (dict(augmentations=[], zero_variance_signal="lens", policy_objective="cispo"), "CISPO\u2020 (LENS)"),
        (dict(augmentations=[], zero_variance_signal="lens", replay_fraction=0.5), "LENS\u2020 (\u03c1_replay=0.50)"),
    ],
)
def test_variant_names_the_zero_variance_rows(overrides, name):
    assert ZPPOConfig(**CPU, **overrides).variant == name


@pytest.mark.parametrize(
    "recipe, headline, signal",
    [
        ("recipes/rows/rl_zvp_dagger.yaml", "RL-ZVP\u2020", "rl_zvp"),
        ("recipes/rows/lens_dagger.yaml", "LENS\u2020", "lens"),
    ],
)
def test_the_dry_run_headline_names_the_row(recipe, headline, signal):
    script, args, _ = parse_recipe_args(["--config", recipe, "--dry_run"])
    lines: list[str] = []
    print_plan(script, args, lines.append)
    assert lines[0] == f"ZPPO dry run: {headline}"
    assert args.zero_variance_signal == signal and args.augmentations == [] and args.replay_fraction == 0.25


# ---------------------------------------------------------------- a tiny trainer: the all-wrong group trains


def _tiny_trainer(tmp_path, signal: str):
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
        num_partitions=2,  # LENS reads the sampling log-probs, which TRL keeps when a step feeds 2+ updates
        max_completion_length=4,
        augmentations=[],
        zero_variance_signal=signal,
    )
    trainer = ZPPOTrainer(
        model=tiny_text_model(seed=0),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list(
            [dict(id="q0", question="What is 12 + 30?", images=[], answer="42", source="toy", subdataset="toy")]
        ),
        processing_class=tiny_tokenizer(),
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer


def _all_wrong_round(trainer):
    """One plain group of two wrong rollouts (reward 0), its sampling log-probs those of the current model
    shifted so that the first rollout is the more confident one."""
    from zppo_trl.rollout import Round

    g = torch.Generator().manual_seed(0)
    vocab = len(trainer.processing_class)
    prompt_ids = torch.randint(10, vocab, (2, 5), generator=g)
    completion_ids = torch.randint(10, vocab, (2, 4), generator=g)
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": torch.ones_like(completion_ids),
        "advantages": torch.zeros(2),
    }
    with torch.no_grad():
        logps, _, _ = completion_logps(trainer._get_per_token_logps_and_entropies, trainer.model, batch)
    # inside the clip band (ratios e^-0.05, e^0.05), so the surrogate's gradient is not clipped away
    batch["old_per_token_logps"] = logps + torch.tensor([[0.05], [-0.05]])
    return Round(batch, torch.zeros(2), ["", ""], [[("plain", "q0")]])


@pytest.mark.parametrize("signal", ["none", "rl_zvp", "lens"])
def test_an_all_wrong_group_gets_a_gradient_under_each_row_and_none_under_grpo_dagger(tmp_path, signal):
    from zppo_trl.rollout import empty_round

    trainer = _tiny_trainer(tmp_path, signal)
    assert trainer.args.variant == {"none": "GRPO\u2020", "rl_zvp": "RL-ZVP\u2020", "lens": "LENS\u2020"}[signal]
    micro_batches = trainer.batches.policy(_all_wrong_round(trainer), empty_round(1))
    trainer.model.zero_grad(set_to_none=True)
    for micro in micro_batches:
        if not is_skipped(micro):
            trainer._compute_loss(trainer.model, micro).backward()
    norm = sum(float(p.grad.norm()) for p in trainer.model.parameters() if p.grad is not None)
    if signal == "none":  # both partitions are empty-signal: skipped, no forward, no gradient
        assert trainer.recorder.metrics["skipped_partitions"] == 2 and norm == 0.0
    else:  # the group's partition trains; the other (empty) one is still skipped
        assert trainer.recorder.metrics["skipped_partitions"] == 1 and norm > 0.0
