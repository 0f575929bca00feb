"""The hybrid RL + distillation rows (KDRL†, RLAD†; the paper's teacher-side table): each named term's formula,
checked on hand-computed values, and the configuration that selects them.

Written out independently of the code (minimize form, N the update's token count, A the rollout's advantage,
r = pi / pi_old, d = log pi - log pi_T the gap to the teacher at the sampled token):

* KDRL: ``-(1/N) sum_t min(r A, clip(r) A) + beta_t (1/N) sum_t 0.5 d^2``, ``beta_t = max(5e-3 - 5e-5 t, 1e-3)``:
  each token's gradient with respect to its own log pi is ``(-r A + beta_t d) / N`` inside the clip.
* RLAD: the same clipped surrogate on ``log r = 0.5 (log pi - log pi_old) + 0.5 clamp(d, -1, 1)``; inside the
  clip a token's gradient is ``-r A (0.5 + 0.5 [|d| < 1]) / N``, zero where the clip binds.
"""

from __future__ import annotations

import math

import pytest
import torch

from zppo_trl import ZPPOConfig
from zppo_trl.hybrid_objectives import kdrl_coefficient, kdrl_loss, rlad_log_ratio, rlad_loss
from zppo_trl.objectives import loss_for, policy_objectives

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from loss_fixtures import CPU, loss_args, response_inputs
    from settings import UNREACHABLE_TEACHER as TEACHER
except ImportError:
    from tests.loss_fixtures import CPU, loss_args, response_inputs
    from tests.settings import UNREACHABLE_TEACHER as TEACHER


def _args(**overrides):
    """The paper's clip settings and the rows' defaults, written out."""
    defaults = dict(
        kdrl_beta=5e-3,
        kdrl_beta_decay=5e-5,
        kdrl_beta_min=1e-3,
        rlad_alpha=0.5,
        rlad_teacher_log_ratio_bound=1.0,
    )
    return loss_args(**{**defaults, **overrides})


def test_kdrl_coefficient_anneals_linearly_to_its_floor():
    args = _args()
    assert kdrl_coefficient(args, 0) == pytest.approx(5e-3)
    assert kdrl_coefficient(args, 40) == pytest.approx(5e-3 - 40 * 5e-5)  # 3e-3
    assert kdrl_coefficient(args, 80) == pytest.approx(1e-3)  # reaches the floor at step 80
    assert kdrl_coefficient(args, 500) == pytest.approx(1e-3)
    assert kdrl_coefficient(_args(kdrl_beta_decay=0.0, kdrl_beta=2e-3), 10_000) == pytest.approx(2e-3)


def test_kdrl_is_grpo_plus_the_annealed_k2_reverse_kl_per_token():
    # on-policy (r = 1): the GRPO part is -A per token; the teacher is half as likely on token 0, equal on token 1,
    # twice as likely on token 2; token 3 is padding and must not count
    p = [0.5, 0.25, 0.125, 0.9]
    pt = [0.25, 0.25, 0.25, 0.01]
    logp, logt = [math.log(x) for x in p], [math.log(x) for x in pt]
    A, step = 0.7, 40
    inputs = response_inputs(logp, logp, logt, [A], [1, 1, 1, 0], step=step)
    out = kdrl_loss(inputs, _args())
    beta = 3e-3
    d = [math.log(2), 0.0, -math.log(2)]
    N = 3
    expected = -A + beta * sum(0.5 * x * x for x in d) / N
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    out.loss.backward()
    expected_grad = [(-A + beta * x) / N for x in d] + [0.0]
    assert inputs.logps.grad[0].tolist() == pytest.approx(expected_grad, rel=1e-12, abs=1e-15)
    total, count = out.means["kdrl/reverse_kl"]
    assert float(total / count) == pytest.approx(sum(0.5 * x * x for x in d) / N)
    assert float(out.means["kdrl/beta"][0] / out.means["kdrl/beta"][1]) == pytest.approx(beta)


def test_kdrl_keeps_grpos_clip_on_its_rl_part():
    # token 0 at r = 1.5 with A > 0 is clipped (no gradient from the RL part); only the KL part pushes it
    logp, old, teacher = [math.log(0.6)], [math.log(0.4)], [math.log(0.3)]
    inputs = response_inputs(logp, old, teacher, [1.0], [1])
    out = kdrl_loss(inputs, _args(kdrl_beta_decay=0.0))
    assert out.loss.item() == pytest.approx(-1.28 + 5e-3 * 0.5 * math.log(2) ** 2, rel=1e-12)
    out.loss.backward()
    assert float(inputs.logps.grad[0, 0]) == pytest.approx(5e-3 * math.log(2), rel=1e-12)


def test_rlad_ratio_is_taken_against_the_geometric_mix_of_old_policy_and_teacher():
    logps = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64)
    old = torch.tensor([[-1.2, -0.8, -1.0]], dtype=torch.float64)
    teacher = torch.tensor([[-1.5, -3.5, 0.5]], dtype=torch.float64)
    got = rlad_log_ratio(logps, old, teacher, 0.5, 1.0)
    # 0.5 * 0.2 + 0.5 * 0.5; 0.5 * -0.2 + 0.5 * clamp(2.5) = 1; 0 + 0.5 * clamp(-1.5) = -1
    assert got[0].tolist() == pytest.approx([0.35, 0.4, -0.5])
    assert rlad_log_ratio(logps, old, teacher, 1.0, 1.0)[0].tolist() == pytest.approx([0.2, -0.2, 0.0])  # GRPO


def test_rlad_loss_and_gradients_follow_the_mixture_ratio_inside_and_outside_the_clip():
    # A > 0, token 0: log r = 0.5 * 0.1 + 0.5 * 0.2 = 0.15, inside the clip, the teacher part unclamped
    # A > 0, token 1: log r = 0.5 * 0.1 + 0.5 * clamp(3) = 0.55, r = 1.733 > 1.28: clipped, no gradient
    # A < 0: log r = 0.5 * -0.1 + 0.5 * clamp(1.5) = 0.45, r = 1.568 below the dual clip: the unclipped term
    #        binds, and only the old-policy half of the ratio carries a gradient
    A_pos, A_neg = 0.5, -0.4
    logp = [-1.0, -1.0]
    inputs_pos = response_inputs(logp, [-1.1, -1.1], [-1.2, -4.0], [A_pos], [1, 1])
    out = rlad_loss(inputs_pos, _args())
    r0 = math.exp(0.15)
    N = 2
    assert out.loss.item() == pytest.approx(-(r0 * A_pos + 1.28 * A_pos) / N, rel=1e-12)
    out.loss.backward()
    assert inputs_pos.logps.grad[0].tolist() == pytest.approx([-r0 * A_pos * 1.0 / N, 0.0], rel=1e-12)
    inputs_neg = response_inputs([-1.0], [-0.9], [-2.5], [A_neg], [1])
    out = rlad_loss(inputs_neg, _args())
    r2 = math.exp(0.45)
    assert out.loss.item() == pytest.approx(-(r2 * A_neg), rel=1e-12)
    out.loss.backward()
    assert float(inputs_neg.logps.grad[0, 0]) == pytest.approx(-r2 * A_neg * 0.5, rel=1e-12)
    total, count = out.means["rlad/teacher_log_ratio"]
    assert float(total / count) == pytest.approx(1.5)


def test_without_the_teachers_log_probs_the_rows_refuse_to_train():
    inputs = response_inputs([-1.0], [-1.0], [-1.0], [1.0], [1])
    inputs.teacher_logps = None
    for loss in (kdrl_loss, rlad_loss):
        with pytest.raises(ValueError, match="teacher's log-prob of every sampled token"):
            loss(inputs, _args())


@pytest.mark.parametrize("objective, printed", [("kdrl", "KDRL\u2020"), ("rlad", "RLAD\u2020")])
def test_the_rows_are_registered_objectives_named_as_the_papers_table(objective, printed):
    config = ZPPOConfig(policy_objective=objective, **TEACHER, **CPU)
    assert config.variant == printed
    assert policy_objectives()[objective].needs_teacher_logps and loss_for(config).needs_teacher_logps
    assert not any(policy_objectives()[o].needs_teacher_logps for o in ("grpo", "gspo", "cispo", "dispo"))
    local = ZPPOConfig(policy_objective=objective, distill_teacher="some/teacher", **CPU)  # a local teacher suffices
    assert local.variant == printed


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(policy_objective="kdrl"), "policy_objective='kdrl' reads the teacher's log-prob"),
        (dict(policy_objective="rlad", rlad_alpha=1.5, **TEACHER), "rlad_alpha must be a finite number in"),
        (dict(policy_objective="rlad", rlad_teacher_log_ratio_bound=-1, **TEACHER), "rlad_teacher_log_ratio_bound"),
        (dict(policy_objective="kdrl", kdrl_beta=float("inf"), **TEACHER), "kdrl_beta must be a finite number"),
        (dict(policy_objective="kdrl", kdrl_beta_min=0.01, **TEACHER), "kdrl_beta_min .* must not exceed kdrl_beta"),
    ],
)
def test_bad_settings_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        ZPPOConfig(**overrides, **CPU)


def test_their_settings_on_another_row_warn_that_nothing_reads_them():
    with pytest.warns(UserWarning, match="kdrl_beta=0.01 has no effect on this row .*only policy_objective: kdrl"):
        ZPPOConfig(kdrl_beta=0.01, **CPU)
    with pytest.warns(UserWarning, match="rlad_alpha=0.3 has no effect .*only policy_objective: rlad"):
        ZPPOConfig(policy_objective="kdrl", rlad_alpha=0.3, **TEACHER, **CPU)
