"""GRPO-CARE's consistency bonus (zppo_trl.terms.grpo_care), on hand-computed values.

Written out independently of the code, per group: S = the rollouts with reward > 0.1 and at least the group's mean
reward; pbar = the mean over S of min(p, 0.95); a rollout of S with min(p, 0.95) >= pbar - margin gets 0.5 x its
reward; the EMA reference moves as theta_ref <- 0.995 theta_ref + 0.005 theta every 10 optimizer steps.
"""

from __future__ import annotations

import math

import pytest
import torch

from zppo_trl import ZPPOConfig
from zppo_trl.terms.grpo_care import (
    CARE_DECAY,
    CARE_EVERY,
    EMAReference,
    answer_likelihood,
    answer_token_span,
    consistency_bonus,
)

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from settings import CPU as CPU_ONLY
except ImportError:
    from tests.settings import CPU as CPU_ONLY

try:
    from tiny_models import tiny_tokenizer
except ImportError:
    from tests.tiny_models import tiny_tokenizer

CPU = CPU_ONLY


def test_the_bonus_goes_to_correct_rollouts_at_least_as_consistent_as_their_correct_peers():
    # group a: rewards 1, 1, 1, 0 (mean 0.75): S = the three correct ones, likelihoods 0.9, 0.5, 0.99 -> capped
    #          0.9, 0.5, 0.95, pbar = 2.35 / 3 = 0.7833: the first and third get 0.5, the second (0.5) does not
    # group b: all wrong: no bonus; group c: one correct of four with p = 0.1: it alone is S, pbar = its own p
    rewards = [1, 1, 1, 0] + [0, 0, 0, 0] + [0, 1, 0, 0]
    likelihoods = [0.9, 0.5, 0.99, 0.99] + [0.99] * 4 + [0.8, 0.1, 0.9, 0.9]
    groups = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    assert consistency_bonus(rewards, likelihoods, groups) == [0.5, 0, 0.5, 0] + [0] * 4 + [0, 0.5, 0, 0]
    # a margin of 0.3 lets the second rollout of group a in (0.5 >= 0.7833 - 0.3)
    assert consistency_bonus(rewards, likelihoods, groups, margin=0.3)[:4] == [0.5, 0.5, 0.5, 0]
    # the bonus is the coefficient times the reward, and the cap decides ties: 0.96 and 0.99 both cap to 0.95
    assert consistency_bonus([1, 1], [0.96, 0.99], ["g", "g"], coefficient=0.2) == [0.2, 0.2]
    # without the cap the second would be alone above the mean
    assert consistency_bonus([1, 1], [0.96, 0.99], ["g", "g"], cap=1.0) == [0, 0.5]


def test_equal_likelihoods_all_get_the_bonus_however_their_mean_rounds():
    # three identical correct rollouts: each is its group's mean, which in floats is 0.10000000000000002 > 0.1
    assert sum([0.1] * 3) / 3 > 0.1
    assert consistency_bonus([1, 1, 1, 0], [0.1, 0.1, 0.1, 0.9], ["g"] * 4) == [0.5, 0.5, 0.5, 0]
    # a rollout really below the mean still gets none
    assert consistency_bonus([1, 1, 1], [0.1, 0.1, 0.1000001], ["g"] * 3) == [0, 0, 0.5]


def test_a_reward_at_or_below_the_threshold_or_below_its_groups_mean_is_never_high_accuracy():
    # graded rewards: 0.1 is not above 0.1; 0.4 is below the group mean 0.5
    assert consistency_bonus([0.1, 0.4, 1.0], [0.9, 0.9, 0.1], ["g"] * 3) == [0, 0, 0.5]
    with pytest.raises(ValueError, match="3 rewards, 2 likelihoods and 3 group ids"):
        consistency_bonus([1, 0, 1], [0.5, 0.5], ["g"] * 3)


def test_the_answer_span_is_the_content_of_the_last_box_in_tokens():
    tokenizer = tiny_tokenizer()
    text = "First \\boxed{3}, then more thinking. The answer is \\boxed{42}. Done"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    start, end = answer_token_span(ids, tokenizer)
    assert 0 < start < end <= len(ids)
    assert "42" in tokenizer.decode(ids[start:end]) and "boxed" not in tokenizer.decode(ids[start:end])
    assert "Done" not in tokenizer.decode(ids[start:end])
    # the span is the tightest: one token fewer on either side loses part of the answer
    assert "42" not in tokenizer.decode(ids[start + 1 : end]) and "42" not in tokenizer.decode(ids[start : end - 1])
    none = tokenizer("no box here", add_special_tokens=False)["input_ids"]
    assert answer_token_span(none, tokenizer) == (len(none), len(none))
    cut = tokenizer("so \\boxed{4", add_special_tokens=False)["input_ids"]  # a truncated box has no content span
    assert answer_token_span(cut, tokenizer) == (len(cut), len(cut))


def test_the_answer_likelihood_is_the_geometric_mean_over_the_span():
    logps = torch.log(torch.tensor([0.5, 0.25, 0.8, 0.5]))
    assert answer_likelihood(logps, (1, 3)) == pytest.approx(math.sqrt(0.25 * 0.8))
    assert answer_likelihood(logps, (4, 4)) == 1.0  # no answer: 1, as its code (then capped)


def test_the_ema_reference_moves_by_its_decay_every_k_steps_only():
    torch.manual_seed(0)
    student = torch.nn.Linear(3, 2)
    reference = EMAReference(student, decay=0.995, every=10)
    start = [p.detach().clone() for p in reference.model.parameters()]
    assert all(not p.requires_grad for p in reference.model.parameters())
    with torch.no_grad():
        for p in student.parameters():
            p.add_(1.0)
    assert not reference.after_step(student, 7) and not reference.after_step(student, 0)
    assert all(torch.equal(a, b) for a, b in zip(reference.model.parameters(), start))
    assert reference.after_step(student, 10)
    for ema, init, live in zip(reference.model.parameters(), start, student.parameters()):
        torch.testing.assert_close(ema, 0.995 * init + 0.005 * live.detach())
    state = reference.state_dict()
    other = EMAReference(torch.nn.Linear(3, 2), decay=CARE_DECAY, every=CARE_EVERY)
    other.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(other.model.parameters(), reference.model.parameters()))


def test_the_ema_reference_runs_its_own_weights_when_the_students_forward_was_patched():
    """The trainer patches the student's forward per instance with closures over the student (TRL's fused LM head):
    the reference must not inherit that, or it would compute with the live student's weights."""
    import types

    torch.manual_seed(0)
    student = torch.nn.Linear(3, 2)
    unpatched = student.forward
    student.forward = types.MethodType(lambda self, x: unpatched(x), student)
    reference = EMAReference(student, decay=CARE_DECAY, every=CARE_EVERY)
    with torch.no_grad():
        student.weight.add_(5.0)
    x = torch.randn(4, 3)
    own = torch.nn.functional.linear(x, reference.model.weight, reference.model.bias)
    torch.testing.assert_close(reference.model(x), own)
    assert not torch.allclose(reference.model(x), student(x))


def test_the_row_is_named_as_the_papers_table_and_checked():
    assert ZPPOConfig(augmentations=[], reward_term="grpo_care", **CPU).variant == "GRPO-CARE\u2020"
    assert ZPPOConfig(augmentations=[], reward_term="grpo_care", replay_fraction=0.0, **CPU).variant == "GRPO-CARE"
    with pytest.raises(ValueError, match="reward_term must be one of"):
        ZPPOConfig(augmentations=[], reward_term="care", **CPU)
    with pytest.raises(ValueError, match="is a row on GRPO\u2020's pipeline"):
        ZPPOConfig(reward_term="grpo_care", teacher_base_url="http://127.0.0.1:1/v1", teacher_model="t", **CPU)
    with pytest.raises(ValueError, match="care_ema_decay must be a finite number in"):
        ZPPOConfig(augmentations=[], reward_term="grpo_care", care_ema_decay=1.5, **CPU)
    with pytest.raises(ValueError, match="care_ema_every must be an integer >= 1"):
        ZPPOConfig(augmentations=[], reward_term="grpo_care", care_ema_every=0, **CPU)
    with pytest.warns(UserWarning, match="care_margin=0.01 has no effect on this row .*reward_term: grpo_care"):
        ZPPOConfig(augmentations=[], care_margin=0.01, **CPU)
