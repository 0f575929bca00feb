"""zppo_trl/losses.py: the loss registry, and each built-in loss's formula, on hand-computed tensors and as training
runs it.

On hand-computed tensors, every case puts tokens in a regime whose answer is known by hand (inside the clip band,
clipped above or below, the dual clip, outside DISPO's interval) and checks the loss value and the per-token gradient,
so a wrong formula or a wrong regime boundary fails here.

As training runs it: the trainer's real ``_compute_loss`` (the configuration's registered loss) on a tiny model, with
old log-probs offset so that every token sits at a chosen ratio in every clip region, for A > 0, A < 0 and A = 0,
with padding tokens (tests/loss_fixtures.py), against each objective's formula written out independently of the
code (maximize form, r = rho = pi_theta / pi_old per token, A the rollout's advantage, sg the stop-gradient):

* the paper's objective, ``policy_objective="grpo"`` (eq. dualclip)::

      q(rho, A) = min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)
      l(rho, A) = max(q(rho, A), c_dual * A)   if A < 0
                = q(rho, A)                    if A >= 0

  and the loss is -l summed over every completion token of the mini-batch, divided by the number of those tokens
  (DAPO's token-level aggregation). The ``dapo`` loss clamps the unclipped ratio at ``delta`` inside the min, as
  TRL's ``delta`` does, and the ZPPOConfig docstring claims that this *is* the dual clip. Checked twice: on a grid of
  (rho, A), the paper's formula against an independent re-derivation of the form the config docstring describes,
  ``min(min(rho, delta) * A, clip(rho) * A)`` (exact equality); and through the real loss (loss value, parameter
  gradients, per-token losses and per-token gradients), which with ``delta=None`` misses it, exactly on the tokens
  with A < 0 and rho > c_dual. The loss is also TRL's own, bit for bit.
* GSPO: s = exp(mean over the rollout's tokens of log r); l = min(s A, clip(s, 1 - eps_low, 1 + eps_high) A), and
  max(l, c_dual A) for A < 0; with the GSPO paper's (3e-4, 4e-4) each rollout's l counts once, with the ZPPO
  table's (0.2, 0.28) once per token.
* CISPO: sg(min(r, 5)) A log pi (MiniMax-M1: no lower bound).
* DISPO: sg(r * 1[r inside its side's interval]) A log pi, the interval [1 - low_pos, 1 + high_pos] for A > 0 and
  [1 - low_neg, 1 + high_neg] for A < 0: zero gradient outside it.

For GSPO, CISPO and DISPO each token's gradient with respect to its own log pi is read through a zero probe added to
the trainer's log-probs; for CISPO and DISPO it is -w A / N exactly: the weight is a stop-gradient coefficient, and
the old log-probs get no gradient at all. Which loss a configuration trains with, and the settings that pick it, are
tests/test_objectives.py's.
"""

from __future__ import annotations

import contextlib
import logging
import math
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOTrainer

import zppo_trl.trainer as trainer_module
from zppo_trl import ZPPOConfig
from zppo_trl.losses import LOSSES, LossInputs, register_loss, sequence_level_warning_expected

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    import loss_fixtures as fixtures
except ImportError:
    from tests import loss_fixtures as fixtures

ARGS, C_DUAL, CPU, EPS_HIGH, EPS_LOW = (
    fixtures.ARGS,
    fixtures.C_DUAL,
    fixtures.CPU,
    fixtures.EPS_HIGH,
    fixtures.EPS_LOW,
)
assert_same, current_logps, grads, make_batch = (
    fixtures.assert_same,
    fixtures.current_logps,
    fixtures.grads,
    fixtures.make_batch,
)
make_trainer, ratio_inputs, run_reference = fixtures.make_trainer, fixtures.ratio_inputs, fixtures.run_reference
run_real_loss, run_real_loss_per_token = fixtures.run_real_loss, fixtures.run_real_loss_per_token


def _per_token_grad(name, inputs, args=ARGS):
    out = LOSSES[name].fn(inputs, args)
    out.loss.backward()
    return out, inputs.logps.grad


# =========================================================================== on hand-computed tensors


# --------------------------------------------------------------------------- the registry


def test_registering_twice_or_with_an_unknown_need_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_loss("dapo")(lambda inputs, args: None)
    with pytest.raises(ValueError, match="computes"):
        register_loss("new", computes="hidden_states")
    with pytest.raises(ValueError, match="only a policy objective trains with a term"):
        register_loss("new", term=object)


# --------------------------------------------------------------------------- each loss


def test_dapo_regimes_token_by_token():
    # one response per regime, one token each; N = 6 tokens, so d loss / d log pi = -r A / 6 where the ratio passes
    ratios = [[1.1], [2.0], [0.5], [0.5], [20.0], [1.5]]
    advantages = [[1.0], [1.0], [1.0], [-1.0], [-2.0], [-1.0]]
    out, grad = _per_token_grad("dapo", ratio_inputs(ratios, advantages))
    expected_token_loss = [-1.1, -1.28, -0.5, 0.8, 20.0, 1.5]  # clip-high; unclipped below; clip-low; dual clip 10 * 2
    assert out.loss.item() == pytest.approx(sum(expected_token_loss) / 6, abs=1e-12)
    expected_grad = [-1.1 / 6, 0.0, -0.5 / 6, 0.0, 0.0, 1.5 / 6]
    torch.testing.assert_close(
        grad.squeeze(1), torch.tensor(expected_grad, dtype=torch.float64), rtol=1e-12, atol=1e-15
    )
    low, count = out.means["clip_ratio/low_mean"]
    high, _ = out.means["clip_ratio/high_mean"]
    assert (low.item(), high.item(), count.item()) == (1.0, 1.0, 6.0)  # 0.5 with A < 0; 2.0 with A > 0


def test_dapo_without_the_dual_clip_is_unbounded_for_negative_advantages():
    args = SimpleNamespace(**{**vars(ARGS), "delta": None})
    out, grad = _per_token_grad("dapo", ratio_inputs([[20.0]], [[-2.0]]), args)
    assert out.loss.item() == pytest.approx(40.0) and grad.item() == pytest.approx(40.0)


def test_dapo_masks_padding_and_divides_by_the_normalizer():
    inputs = ratio_inputs([[1.0, 1.0, 5.0]], [[1.0]], mask=[[1, 1, 0]], normalizer=8)
    out, grad = _per_token_grad("dapo", inputs)
    assert out.loss.item() == pytest.approx(-2 / 8) and grad[0, 2].item() == 0.0


def test_gspo_paper_clips_the_sequence_ratio_at_its_range_and_averages_per_response():
    """The GSPO paper's clip (1 - 3e-4, 1 + 4e-4) binds on sequence ratios a 0.2 / 0.28 clip never touches, and
    each response counts once whatever its length (a token mean would weight row 0 three times row 1)."""
    s = [1.0002, 1.0006, 0.9995, 0.9999]  # inside (A > 0); above 1 + 4e-4 (A > 0); below 1 - 3e-4 (A < 0); inside
    ratios = [[s[0]] * 3, [s[1], 1.0, 1.0], [s[2]] * 2 + [1.0], [s[3]] * 2 + [1.0]]
    mask = [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]]
    inputs = ratio_inputs(ratios, [[1.0], [1.0], [-1.0], [-1.0]], mask=mask)
    inputs.sequences = torch.tensor(4.0, dtype=torch.float64)
    out, grad = _per_token_grad("gspo", inputs, SimpleNamespace(**{**vars(ARGS), "gspo_settings": "gspo_paper"}))
    expected = (-s[0] - (1 + 4e-4) + (1 - 3e-4) + s[3]) / 4  # clipped rows at their bound
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    # d/d log pi_t of -s A / 4 with s the geometric mean over the row's n tokens: -s A / (4 n) per real token
    expected_grad = torch.tensor(
        [[-s[0] / 12] * 3, [0.0] * 3, [0.0] * 3, [s[3] / 8, s[3] / 8, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-15)
    low, count = out.means["clip_ratio/low_mean"]
    high, _ = out.means["clip_ratio/high_mean"]
    assert (low.item(), high.item(), count.item()) == (1.0, 1.0, 4.0)
    # the ZPPO table's reading of the same rollouts: nothing clipped, and a token mean (N = 8)
    table = SimpleNamespace(**{**vars(ARGS), "gspo_settings": "zppo_table"})
    inputs.logps.grad = None
    out, grad = _per_token_grad("gspo", inputs, table)
    assert out.loss.item() == pytest.approx((-s[0] * 3 - s[1] + s[2] * 2 + s[3] * 2) / 8, abs=1e-12)
    assert torch.all(grad[torch.tensor(mask) > 0] != 0)


def test_gspo_zppo_table_reading_clips_one_ratio_per_response():
    # geometric mean of (2.0, 0.5) is 1 (inside the band: the gradient flows); of (4, 1) is 2 (clipped above for A > 0)
    inputs = ratio_inputs([[2.0, 0.5], [4.0, 1.0]], [[1.0], [1.0]])
    out, grad = _per_token_grad("gspo", inputs, SimpleNamespace(**{**vars(ARGS), "gspo_settings": "zppo_table"}))
    assert out.loss.item() == pytest.approx((-1.0 * 2 - 1.28 * 2) / 4, abs=1e-12)
    # d/d log pi_t of -s A summed over the row's 2 tokens / 4: -s A * (1/2) * 2 / 4 = -1/4 per token, for row 0
    torch.testing.assert_close(grad[0], torch.tensor([-0.25, -0.25], dtype=torch.float64), rtol=1e-12, atol=0)
    assert torch.all(grad[1] == 0)
    high, count = out.means["clip_ratio/high_mean"]
    assert (high.item(), count.item()) == (1.0, 2.0)  # counted per response


def test_cispo_clips_the_weight_at_its_bound_and_stops_its_gradient():
    """CISPO's weight is min(r, 5) (ScaleRL's eps_max; MiniMax-M1 states none): 2.0 passes whole, where the
    old bound of 1 + eps_high = 1.28 clipped it; 7.0 is capped at 5 for either sign; no lower bound."""
    inputs = ratio_inputs([[0.05], [2.0], [7.0], [7.0]], [[1.0], [1.0], [1.0], [-1.0]])
    out, grad = _per_token_grad("cispo", inputs, SimpleNamespace(**{**vars(ARGS), "cispo_weight_bound": 5.0}))
    log_pi = inputs.logps.detach().squeeze(1)
    weight = torch.tensor([0.05, 2.0, 5.0, 5.0], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0], dtype=torch.float64)
    assert out.loss.item() == pytest.approx(float((-weight * adv * log_pi).sum() / 4), abs=1e-12)
    torch.testing.assert_close(grad.squeeze(1), -weight * adv / 4, rtol=1e-12, atol=0)  # the weight is a constant
    clipped, _ = out.means["cispo_clip_ratio"]
    assert clipped.item() == 1.0  # only the A > 0 token above the bound


def test_dispo_clamp_reading_keeps_a_bounded_gradient_outside_the_interval():
    """``dispo_out_of_bounds="clamp"``: the four regimes clamp the weight to their side's bound instead of
    zeroing it (bounds A > 0 in [0.8, 11], A < 0 in [0, 101])."""
    inputs = ratio_inputs([[0.5], [1.5], [12.0], [0.01], [150.0]], [[1.0], [1.0], [1.0], [-1.0], [-1.0]])
    args = SimpleNamespace(**{**vars(ARGS), "dispo_out_of_bounds": "clamp"})
    out, grad = _per_token_grad("dispo", inputs, args)
    expected = torch.tensor([-0.8 / 5, -1.5 / 5, -11.0 / 5, 0.01 / 5, 101.0 / 5], dtype=torch.float64)
    torch.testing.assert_close(grad.squeeze(1), expected, rtol=1e-12, atol=1e-15)
    assert out.means["clip_ratio/region_mean"][0].item() == 3.0  # still counted as outside


def test_dispo_zero_gradient_outside_each_sides_interval():
    # bounds: A > 0 in [0.8, 11]; A < 0 in [0 (no lower bound), 101]
    inputs = ratio_inputs([[0.5], [1.5], [12.0], [0.01], [150.0]], [[1.0], [1.0], [1.0], [-1.0], [-1.0]])
    out, grad = _per_token_grad("dispo", inputs)
    expected = torch.tensor([0.0, -1.5 / 5, 0.0, 0.01 / 5, 0.0], dtype=torch.float64)
    torch.testing.assert_close(grad.squeeze(1), expected, rtol=1e-12, atol=1e-15)
    assert out.means["clip_ratio/pos_low_mean"][0].item() == 1.0
    assert out.means["clip_ratio/pos_high_mean"][0].item() == 1.0
    assert out.means["clip_ratio/neg_high_mean"][0].item() == 1.0
    assert out.means["clip_ratio/neg_low_mean"][0].item() == 0.0
    assert out.means["clip_ratio/region_mean"][0].item() == 3.0


def test_sft_is_the_token_mean_negative_log_likelihood():
    inputs = ratio_inputs([[1.0, 1.0]], [[0.0]], mask=[[1, 0]], normalizer=1)
    out, grad = _per_token_grad("sft", inputs)
    assert out.loss.item() == pytest.approx(1.0)  # -log pi = 1 on the one response token
    torch.testing.assert_close(grad, torch.tensor([[-1.0, 0.0]], dtype=torch.float64))
    nll, count = out.means["sft/nll"]
    assert (nll.item(), count.item()) == (pytest.approx(1.0), 1.0)


def test_jsd_is_zero_for_equal_distributions_and_the_symmetric_jsd_otherwise():
    from zppo_trl.distill import DistillInputs

    def jsd(teacher_logits):  # one position, two tokens; the states are the logits (an identity head)
        student = torch.tensor([[[0.0, 0.0]]], dtype=torch.float64, requires_grad=True)
        distill = DistillInputs(student, lambda x: x, 2, teacher_states=teacher_logits, teacher_head=lambda x: x)
        return LOSSES["jsd"].fn(LossInputs(mask=torch.ones(1, 1), normalizer=1.0, distill=distill), ARGS)

    assert jsd(torch.zeros(1, 1, 2, dtype=torch.float64)).loss.item() == pytest.approx(0.0, abs=1e-12)
    out = jsd(torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64))  # (1/4, 3/4) against (1/2, 1/2)
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75])
    m = (p + q) / 2
    expected = 0.5 * float((p * (p / m).log()).sum()) + 0.5 * float((q * (q / m).log()).sum())
    assert out.loss.item() == pytest.approx(expected, rel=1e-6)


# =========================================================================== as training runs it


# --------------------------------------------------------------------------- the formulas, independently


def paper_surrogate(rho: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """l(rho, A) of eq. dualclip (maximize form), elementwise; ``adv`` broadcasts against ``rho``."""
    q = torch.minimum(rho * adv, torch.clamp(rho, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)
    return torch.where(adv < 0, torch.maximum(q, C_DUAL * adv), q)


def paper_loss(rho: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """-l summed over the unmasked completion tokens, divided by their number (DAPO token level)."""
    return -(paper_surrogate(rho, adv) * mask).sum() / mask.sum()


def clamp_inside_min_form(rho: torch.Tensor, adv: torch.Tensor, delta: float | None) -> torch.Tensor:
    """The form the ZPPOConfig docstring describes: the unclipped ratio clamped at ``delta`` inside the min.

    ``min(min(rho, delta) * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)``; ``delta=None`` drops the clamp.
    Written from that description, for any sign of A (no case split).
    """
    unclipped = rho if delta is None else torch.clamp(rho, max=delta)
    return torch.minimum(unclipped * adv, torch.clamp(rho, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)


def gspo_reference(logp, old, adv, mask):
    """-(1/N) sum over rollouts of |o_i| * l_i: GSPO's sequence-level clipped surrogate with the dual clip."""
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    a = adv.squeeze(1)
    q = torch.minimum(s * a, torch.clamp(s, 1 - EPS_LOW, 1 + EPS_HIGH) * a)
    surrogate = torch.where(a < 0, torch.maximum(q, C_DUAL * a), q)
    return -(surrogate * mask.sum(-1)).sum() / mask.sum(), s


CISPO_BOUND = 5.0  # ScaleRL's eps_max (MiniMax-M1 states no value), written out


def cispo_weight(rho):
    return torch.clamp(rho, max=CISPO_BOUND)


def dispo_weight(rho, adv, low_pos, high_pos, low_neg, high_neg):
    inside_pos = (rho >= 1 - low_pos) & (rho <= 1 + high_pos)
    inside_neg = (rho >= 1 - low_neg) & (rho <= 1 + high_neg)
    inside = torch.where(adv > 0, inside_pos, torch.where(adv < 0, inside_neg, torch.ones_like(inside_pos)))
    return rho * inside


def reinforce_reference(logp, weight, adv, mask):
    """-(1/N) sum_t sg(w_t) A log pi_t over the completion tokens (CISPO's and DISPO's form)."""
    return -(weight.detach() * adv * logp * mask).sum() / mask.sum()


# DISPO's default epsilons, written out: correct responses keep a gradient on [0.8, 11], incorrect on [0, 101].
DISPO_DEFAULT = dict(low_pos=0.2, high_pos=10.0, low_neg=1.0, high_neg=100.0)
# Tight DISPO bounds, so that each of the four binds somewhere: [0.8, 1.5] for A > 0, [0.5, 3.0] for A < 0.
DISPO_TIGHT = dict(low_pos=0.2, high_pos=0.5, low_neg=0.5, high_neg=2.0)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("losses")


# --------------------------------------------------------------------------- the paper's objective (GRPO)


# Ratios covering every regime: below 1 - eps_low (0.2, 0.5, 0.79), inside the band (0.9, 1.0, 1.1,
# 1.27), above 1 + eps_high (1.5, 3, 9.9), above c_dual (10.5, 50). None sits exactly on a boundary,
# where the two forms could legitimately pick different sub-gradients.
DUAL_CLIP_RATIOS = [0.2, 0.5, 0.79, 0.9, 1.0, 1.1, 1.27, 1.5, 3.0, 9.9, 10.5, 50.0]
# One advantage per row: positive, negative, zero, and a second negative of another magnitude.
DUAL_CLIP_ADVANTAGES = [1.0, -1.0, 0.0, -2.5]


def test_config_defaults_are_the_constants_used_here():
    c = ZPPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to=[], augmentations=[])
    assert (c.epsilon, c.epsilon_high, c.delta, c.loss_type, c.beta) == (EPS_LOW, EPS_HIGH, C_DUAL, "dapo", 0.0)


def test_clamp_inside_min_is_the_dual_clip_on_a_grid():
    # Ratios spanning 1e-3 .. 1e3, plus the regime boundaries and points just either side of them.
    edges = torch.tensor([1 - EPS_LOW, 1 + EPS_HIGH, C_DUAL, 1.0], dtype=torch.float64)
    rho = torch.cat([torch.logspace(-3, 3, 4001, dtype=torch.float64), edges, edges * (1 + 1e-9), edges * (1 - 1e-9)])
    adv = torch.tensor([-50.0, -2.5, -1.0, -1e-3, -1e-12, 0.0, 1e-12, 1e-3, 1.0, 2.5, 50.0], dtype=torch.float64)
    rho, adv = torch.meshgrid(rho, adv, indexing="ij")

    paper = paper_surrogate(rho, adv)
    clamped = clamp_inside_min_form(rho, adv, delta=C_DUAL)
    # The docstring's claim, exactly (no tolerance): both forms produce the very same products.
    torch.testing.assert_close(clamped, paper, rtol=0, atol=0)

    # Where the paper's dual clip binds (A < 0 and c_dual * A strictly above q): exactly rho > c_dual.
    q = torch.minimum(rho * adv, torch.clamp(rho, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)
    assert torch.equal((adv < 0) & (C_DUAL * adv > q), (adv < 0) & (rho > C_DUAL))

    # The clamp never changes anything for A >= 0 (1 + eps_high < delta), and for A < 0 it changes
    # exactly the tokens with rho > delta.
    unclamped = clamp_inside_min_form(rho, adv, delta=None)
    nonneg = adv >= 0
    torch.testing.assert_close(clamped[nonneg], unclamped[nonneg], rtol=0, atol=0)
    torch.testing.assert_close(clamped[nonneg], q[nonneg], rtol=0, atol=0)
    changed = clamped != unclamped
    assert torch.equal(changed, (adv < 0) & (rho > C_DUAL))


def dual_clip_batch(trainer):
    """Rows 0 and 1 use every ratio for A = +1 and A = -1; rows 2 (A = 0) and 3 (A = -2.5, ratios reversed) end in
    a padding token."""
    rows = [DUAL_CLIP_RATIOS, DUAL_CLIP_RATIOS, DUAL_CLIP_RATIOS, DUAL_CLIP_RATIOS[::-1]]
    return make_batch(trainer, rows, DUAL_CLIP_ADVANTAGES, padded_rows=(2, 3))


def run_paper_loss(trainer, inputs, ratios):
    """The paper's loss from the same model (eq. dualclip): its loss, gradients, per-token losses and per-token
    d loss / d log(rho), and the ratios the tokens sit at."""
    loss, ref_grads, tok_grad, rho = run_reference(
        trainer, inputs, ratios, lambda logp, old, adv, mask: paper_loss(torch.exp(logp - old), adv, mask)
    )
    mask = inputs["completion_mask"].double()
    per_token = -paper_surrogate(rho, inputs["advantages"].unsqueeze(1)) * mask
    return loss, ref_grads, per_token, tok_grad, rho


@pytest.fixture(scope="module")
def trainers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loss")
    off = make_trainer(tmp, len(DUAL_CLIP_RATIOS), delta=C_DUAL)
    off.args.delta = None  # past ZPPOConfig's validation, which refuses it: the loss reads args.delta per call
    return {"dual": make_trainer(tmp, len(DUAL_CLIP_RATIOS), delta=C_DUAL), "off": off}


def test_real_loss_is_the_papers_dual_clip(trainers):
    trainer = trainers["dual"]
    assert (trainer.args.delta, trainer.args.loss_type, trainer.beta) == (C_DUAL, "dapo", 0.0)
    inputs, ratios = dual_clip_batch(trainer)
    mask = inputs["completion_mask"].bool()
    adv = inputs["advantages"].unsqueeze(1).expand_as(ratios)

    real_loss, real_grads, real_tok, real_tok_grad = run_real_loss_per_token(trainer, inputs, ratios)
    ref_loss, ref_grads, ref_tok, ref_tok_grad, rho = run_paper_loss(trainer, inputs, ratios)

    # The hand-set ratios landed where intended (so every regime is really exercised).
    torch.testing.assert_close(rho[mask], ratios[mask], rtol=1e-12, atol=0)

    # The loss value, and every parameter gradient.
    assert real_loss.dtype == torch.float64
    torch.testing.assert_close(real_loss, ref_loss, rtol=1e-12, atol=1e-12)
    assert real_grads.keys() == ref_grads.keys() and real_grads
    assert any(g.abs().max() > 0 for g in ref_grads.values())
    for name, grad in ref_grads.items():
        torch.testing.assert_close(real_grads[name], grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")

    # Per token: the loss of each token and its gradient w.r.t. log(rho); padding contributes nothing.
    torch.testing.assert_close(real_tok, ref_tok, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(real_tok_grad, ref_tok_grad, rtol=1e-12, atol=1e-12)
    assert torch.all(real_tok[~mask] == 0) and torch.all(real_tok_grad[~mask] == 0)

    # The dual clip binds on exactly the tokens with A < 0 and rho > c_dual: there the token's loss
    # is -c_dual * A and its gradient vanishes; every other A < 0 token above the band still pulls.
    binds = mask & (adv < 0) & (rho > C_DUAL)
    assert binds.sum() == 4  # rows 1 and 3, rho = 10.5 and 50
    torch.testing.assert_close(real_tok[binds], -C_DUAL * adv[binds], rtol=1e-12, atol=0)
    assert torch.all(real_tok_grad[binds] == 0)
    neg = mask & (adv < 0)
    assert torch.all(real_tok_grad[neg & (rho > 1 - EPS_LOW) & (rho < C_DUAL)] != 0)
    assert torch.all(real_tok_grad[neg & (rho < 1 - EPS_LOW)] == 0)  # the low clip
    # For A > 0 the high clip stops the gradient above 1 + eps_high (delta plays no part); the
    # A = 0 row contributes nothing at all.
    pos = mask & (adv > 0)
    assert torch.all(real_tok_grad[pos & (rho > 1 + EPS_HIGH)] == 0)
    assert torch.all(real_tok_grad[pos & (rho < 1 + EPS_HIGH)] != 0)
    assert torch.all(real_tok[mask & (adv == 0)] == 0)


def test_without_delta_the_real_loss_misses_the_dual_clip(trainers):
    """Negative control: with the dual clip off, the same check fails, on the right tokens only."""
    trainer = trainers["off"]
    assert trainer.args.delta is None
    inputs, ratios = dual_clip_batch(trainer)
    mask = inputs["completion_mask"].bool()
    adv = inputs["advantages"].unsqueeze(1).expand_as(ratios)

    real_loss, _, real_tok, real_tok_grad = run_real_loss_per_token(trainer, inputs, ratios)
    ref_loss, _, ref_tok, ref_tok_grad, rho = run_paper_loss(trainer, inputs, ratios)

    assert not math.isclose(real_loss.item(), ref_loss.item(), rel_tol=1e-3)
    binds = mask & (adv < 0) & (rho > C_DUAL)
    # Those tokens are penalized without bound (rho * |A|) and keep their gradient ...
    torch.testing.assert_close(real_tok[binds], -(rho * adv)[binds], rtol=1e-12, atol=0)
    assert torch.all(real_tok[binds] > ref_tok[binds]) and torch.all(real_tok_grad[binds] != 0)
    # ... while every other token still matches the paper.
    torch.testing.assert_close(real_tok[~binds], ref_tok[~binds], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(real_tok_grad[~binds], ref_tok_grad[~binds], rtol=1e-12, atol=1e-12)


def test_dapo_normalizer_is_the_generation_batch_average(trainers):
    """What TRL divides by: num_items_in_batch * grad_accum / (num_processes * steps_per_generation).

    That is the average token count of a mini-batch of the generation batch, not this mini-batch's
    own count; the two agree (as in the test above) only when the partitions carry equal token
    counts. Pinned here so a trainer that partitions rollouts unevenly knows to pass its own count.
    """
    trainer = trainers["dual"]
    inputs, ratios = dual_clip_batch(trainer)
    with torch.no_grad():
        old = current_logps(trainer, inputs).double() - ratios.log()
        n_tokens = inputs["completion_mask"].sum()
        spg = trainer.args.steps_per_generation
        assert spg == trainer.args.num_partitions * trainer.args.gradient_accumulation_steps == 4
        losses = [
            trainer._compute_loss(trainer.model, dict(inputs, old_per_token_logps=old, num_items_in_batch=n))
            for n in (n_tokens * spg, n_tokens * spg * 3)
        ]
    torch.testing.assert_close(losses[1], losses[0] / 3, rtol=1e-12, atol=0)


# --------------------------------------------------------------------------- GSPO


# One target sequence ratio s per rollout, covering every region of the clipped surrogate.
GSPO_ROWS = [  # (s, A, padded)
    (1.1, 1.0, False),  # inside the band: the ratio's gradient
    (2.0, 1.0, False),  # above 1 + eps_high, A > 0: clipped, no gradient
    (0.6, 1.0, True),  # below the band, A > 0: unclipped, gradient
    (0.5, -1.0, False),  # below 1 - eps_low, A < 0: clipped, no gradient
    (1.5, -1.0, True),  # above the band, A < 0: unclipped, gradient
    (20.0, -2.5, False),  # above c_dual, A < 0: the dual clip, loss -c_dual A per token, no gradient
    (0.9, -1.0, True),  # inside the band, A < 0
    (3.0, 0.0, False),  # A = 0: nothing
]
GSPO_LEN = 7


def gspo_ratios(rows=GSPO_ROWS):
    """Per-token ratios whose geometric mean over each row's real tokens is the row's target s."""
    g = torch.Generator().manual_seed(1)
    table = []
    for s, _adv, padded in rows:
        real = GSPO_LEN - 1 if padded else GSPO_LEN
        z = torch.rand(real, generator=g, dtype=torch.float64) - 0.5
        tokens = (s * torch.exp(z - z.mean())).tolist()
        table.append(tokens + [1.0] * (GSPO_LEN - real))
    return table


def gspo_paper_reference(logp, old, adv, mask):
    """-(1/B) sum over rollouts of l_i: GSPO's sequence-level clipped surrogate as the GSPO paper trains it."""
    s = torch.exp(((logp - old) * mask).sum(-1) / mask.sum(-1))
    a = adv.squeeze(1)
    q = torch.minimum(s * a, torch.clamp(s, 1 - 3e-4, 1 + 4e-4) * a)
    return -torch.where(a < 0, torch.maximum(q, C_DUAL * a), q).mean()


# Sequence ratios around the GSPO paper's clip range: the first four are clipped there and not at 0.2 / 0.28.
GSPO_PAPER_ROWS = [  # (s, A, padded)
    (1.0002, 1.0, False),  # inside, A > 0: gradient
    (1.0006, 1.0, True),  # above 1 + 4e-4, A > 0: clipped, no gradient
    (0.9995, -1.0, False),  # below 1 - 3e-4, A < 0: clipped, no gradient
    (1.0005, -1.0, True),  # above the band, A < 0: unclipped, gradient
    (0.9999, -1.0, False),  # inside, A < 0
]


def test_gspo_paper_settings_clip_at_its_range_and_average_per_response(tmp):
    """The default GSPO row: the sequence ratio clipped to [1 - 3e-4, 1 + 4e-4], each rollout's term counted
    once over the update's rollout count (carried as num_sequences_in_batch, as the partitions carry it)."""
    trainer = make_trainer(tmp, GSPO_LEN, policy_objective="gspo")
    assert trainer.args.gspo_settings == "gspo_paper"
    inputs, ratios = make_batch(
        trainer,
        gspo_ratios(GSPO_PAPER_ROWS),
        [a for _, a, _ in GSPO_PAPER_ROWS],
        [i for i, row in enumerate(GSPO_PAPER_ROWS) if row[2]],
    )
    inputs["num_sequences_in_batch"] = torch.tensor(float(len(GSPO_PAPER_ROWS)) * trainer.args.steps_per_generation)
    real = run_real_loss(trainer, inputs, ratios)
    ref = run_reference(trainer, inputs, ratios, gspo_paper_reference)
    assert_same(real, ref)
    mask = inputs["completion_mask"].bool()
    tok = real[2]
    for row in range(len(GSPO_PAPER_ROWS)):
        values = tok[row][mask[row]]
        assert torch.all(values == 0) if row in (1, 2) else torch.all(values != 0), row
    # d loss / d log pi_t = -s A / (B n_i): a padded row's tokens (n = 6) each weigh more than a full row's (7)
    torch.testing.assert_close(
        tok[0][0], torch.tensor(-1.0002 / (5 * GSPO_LEN), dtype=torch.float64), rtol=1e-6, atol=0
    )
    torch.testing.assert_close(
        tok[3][0], torch.tensor(1.0005 / (5 * (GSPO_LEN - 1)), dtype=torch.float64), rtol=1e-6, atol=0
    )


def test_gspo_zppo_table_reading_is_the_sequence_level_clipped_surrogate(tmp):
    trainer = make_trainer(tmp, GSPO_LEN, policy_objective="gspo", gspo_settings="zppo_table")
    assert (trainer.importance_sampling_level, trainer.loss_type, trainer.args.delta) == ("sequence", "dapo", C_DUAL)
    inputs, ratios = make_batch(
        trainer, gspo_ratios(), [a for _, a, _ in GSPO_ROWS], [i for i, row in enumerate(GSPO_ROWS) if row[2]]
    )
    mask = inputs["completion_mask"].bool()

    real = run_real_loss(trainer, inputs, ratios)
    ref = run_reference(trainer, inputs, ratios, lambda *a: gspo_reference(*a)[0])
    assert_same(real, ref)

    # The rows sit at their target s (padding, at ratio 1000, does not count), and a row's tokens
    # share one gradient: the sequence ratio's, through the mean of log r.
    with torch.no_grad():
        logp = current_logps(trainer, inputs).double()
        _, s = gspo_reference(logp, logp - ratios.log(), inputs["advantages"].unsqueeze(1), mask.double())
    torch.testing.assert_close(s, torch.tensor([row[0] for row in GSPO_ROWS], dtype=torch.float64), rtol=1e-12, atol=0)
    tok = real[2]
    zero = [1, 3, 5, 7]  # clipped above, clipped below, the dual clip, A = 0
    for row in range(len(GSPO_ROWS)):
        values = tok[row][mask[row]]
        assert torch.all(values == 0) if row in zero else torch.all(values != 0), row
        torch.testing.assert_close(values, values[:1].expand_as(values), rtol=1e-10, atol=0)
    assert torch.all(tok[~mask] == 0)
    # d loss / d log pi = -(1/N) d l / d s * s for every token of the row; e.g. inside the band, -s A / N.
    n = mask.sum()
    torch.testing.assert_close(tok[0][0], torch.tensor(-1.1 * 1.0, dtype=torch.float64) / n, rtol=1e-10, atol=0)
    # The old log-probs enter the ratio: they get minus the same gradient.
    torch.testing.assert_close(real[3], -tok, rtol=1e-12, atol=1e-15)


def test_gspo_trl_warning_about_dapo_is_expected_and_silenced(tmp, caplog, monkeypatch):
    """TRL warns that a sequence-level ratio under loss_type "dapo" weights rollouts by length; ZPPO's
    GSPO keeps DAPO's aggregation on purpose, so the warning is dropped for it and for nothing else."""
    message = "When using `importance_sampling_level='sequence'`"
    with caplog.at_level(logging.WARNING):
        make_trainer(tmp / "quiet", GSPO_LEN, policy_objective="gspo")
    assert not [r for r in caplog.records if message in r.getMessage()]

    caplog.clear()
    monkeypatch.setattr(trainer_module, "sequence_level_warning_expected", lambda *args: contextlib.nullcontext())
    with caplog.at_level(logging.WARNING):
        make_trainer(tmp / "loud", GSPO_LEN, policy_objective="gspo")
    assert [r for r in caplog.records if message in r.getMessage()], "TRL no longer warns: drop the filter"

    # The filter passes the same message for any other objective, and other TRL warnings always.
    trl_logger = logging.getLogger(GRPOTrainer.__module__)
    monkeypatch.undo()
    for objective, kept in (("grpo", 2), ("gspo", 1)):
        caplog.clear()
        with (
            caplog.at_level(logging.WARNING),
            sequence_level_warning_expected(
                ZPPOConfig(**CPU, policy_objective=objective).row.objective, trl_logger.name
            ),
        ):
            trl_logger.warning(message + " ...")
            trl_logger.warning("another warning")
        assert len(caplog.records) == kept


# --------------------------------------------------------------------------- CISPO


# Below, inside and above the weight bound 5 (and the old 1 + eps_high = 1.28), far above c_dual.
CISPO_RATIOS = [0.2, 0.27, 0.5, 0.79, 0.9, 1.0, 1.1, 1.27, 1.29, 1.5, 3.0, 4.9, 5.1, 9.9, 10.5, 50.0]
ADVANTAGES = [1.0, -1.0, 0.0, -2.5, 0.7]  # rows 2..4 end in a padding token; rows 3 and 4 reverse the ratios


def test_real_loss_is_cispos_reinforce_loss_with_the_capped_weight(tmp):
    trainer = make_trainer(tmp, len(CISPO_RATIOS), policy_objective="cispo")
    # ZPPO's cispo loss (zppo_trl.losses) clamps at cispo_weight_bound (5), checked token by token below; the
    # table's epsilon_high keeps its value (CISPO does not read it).
    assert trainer.args.cispo_weight_bound == CISPO_BOUND and trainer.args.epsilon_high == EPS_HIGH
    rows = [CISPO_RATIOS, CISPO_RATIOS, CISPO_RATIOS, CISPO_RATIOS[::-1], CISPO_RATIOS[::-1]]
    inputs, ratios = make_batch(trainer, rows, ADVANTAGES, padded_rows=(2, 3, 4))
    mask = inputs["completion_mask"].bool()
    adv = inputs["advantages"].unsqueeze(1).expand_as(ratios)

    real = run_real_loss(trainer, inputs, ratios)
    ref = run_reference(
        trainer,
        inputs,
        ratios,
        lambda logp, old, a, m: reinforce_reference(logp, cispo_weight(torch.exp(logp - old)), a, m),
    )
    assert_same(real, ref)

    # Each token's gradient is -w A / N with w = min(r, 5): never zero for A != 0 (no trust region,
    # no lower bound, no dual clip), constant above the bound, and the old log-probs get none.
    rho, n = ref[3], mask.sum()
    w = torch.clamp(rho, max=CISPO_BOUND)
    torch.testing.assert_close(real[2][mask], (-w * adv / n)[mask], rtol=1e-12, atol=0)
    assert torch.all(real[2][mask & (adv != 0)] != 0) and torch.all(real[2][~mask | (adv == 0)] == 0)
    above = mask & (rho > CISPO_BOUND) & (adv > 0)
    torch.testing.assert_close(real[2][above], (-CISPO_BOUND * adv / n.item())[above], rtol=1e-12, atol=0)
    assert real[3] is None or torch.all(real[3] == 0)
    # With the old bound (1 + eps_high = 1.28) the weights would differ from 1.29 on: the bound matters here.
    assert not torch.allclose(torch.clamp(rho, max=1 + EPS_HIGH)[mask], w[mask])
    assert trainer._metrics["train"]["cispo_clip_ratio"][-1] == pytest.approx(
        above.sum().item() / n.item(), rel=1e-6
    )  # TRL averages in float32


# --------------------------------------------------------------------------- DISPO


# Each side of each tight bound: A > 0 keeps [0.8, 1.5], A < 0 keeps [0.5, 3.0].
DISPO_RATIOS = [0.2, 0.45, 0.55, 0.79, 0.81, 1.0, 1.2, 1.49, 1.51, 2.9, 3.1, 10.5, 50.0]
# With the default bounds: A > 0 keeps [0.8, 11], A < 0 keeps [0, 101].
DISPO_DEFAULT_RATIOS = [0.01, 0.5, 0.79, 0.81, 1.0, 5.0, 10.9, 11.1, 50.0, 100.9, 101.1, 500.0]


def _dispo_config(bounds):
    return {f"dispo_epsilon_{k}": v for k, v in bounds.items()}


@pytest.mark.parametrize(
    "bounds, table", [(DISPO_TIGHT, DISPO_RATIOS), (DISPO_DEFAULT, DISPO_DEFAULT_RATIOS)], ids=["tight", "default"]
)
def test_dispo_is_the_four_way_clipped_reinforce_loss(tmp, bounds, table):
    overrides = dict(policy_objective="dispo", **({} if bounds is DISPO_DEFAULT else _dispo_config(bounds)))
    trainer = make_trainer(tmp, len(table), **overrides)
    assert trainer.args.dispo_bounds.__dict__ == bounds  # the defaults are the ones written out above
    rows = [table, table, table, table[::-1], table[::-1]]
    inputs, ratios = make_batch(trainer, rows, ADVANTAGES, padded_rows=(2, 3, 4))
    mask = inputs["completion_mask"].bool()
    adv = inputs["advantages"].unsqueeze(1).expand_as(ratios)

    real = run_real_loss(trainer, inputs, ratios)
    ref = run_reference(
        trainer,
        inputs,
        ratios,
        lambda logp, old, a, m: reinforce_reference(logp, dispo_weight(torch.exp(logp - old), a, **bounds), a, m),
    )
    assert_same(real, ref)

    # Each token's gradient is -r A / N inside its side's interval and exactly 0 outside it; padding
    # and A = 0 give nothing; the weight is a stop-gradient (the old log-probs get no gradient).
    rho, n, tok = ref[3], mask.sum(), real[2]
    lo_pos, hi_pos, lo_neg, hi_neg = (
        1 - bounds["low_pos"],
        1 + bounds["high_pos"],
        1 - bounds["low_neg"],
        1 + bounds["high_neg"],
    )
    regimes = {
        "pos_low": mask & (adv > 0) & (rho < lo_pos),
        "pos_high": mask & (adv > 0) & (rho > hi_pos),
        "neg_low": mask & (adv < 0) & (rho < lo_neg),
        "neg_high": mask & (adv < 0) & (rho > hi_neg),
    }
    outside = regimes["pos_low"] | regimes["pos_high"] | regimes["neg_low"] | regimes["neg_high"]
    inside = mask & (adv != 0) & ~outside
    assert torch.all(tok[outside] == 0) and torch.all(tok[~mask] == 0) and torch.all(tok[mask & (adv == 0)] == 0)
    torch.testing.assert_close(tok[inside], (-rho * adv / n)[inside], rtol=1e-12, atol=0)
    assert torch.all(tok[inside] != 0)
    assert real[3] is None or torch.all(real[3] == 0)

    # Which bounds bind is what the table was built for: all four (tight), or the two of correct
    # responses plus the upper one of incorrect responses (default: no lower bound at 1 - 1.0 = 0).
    counts = {name: int(where.sum()) for name, where in regimes.items()}
    if bounds is DISPO_TIGHT:
        # rows 3 and 4 lose their last (reversed: lowest) ratio to padding
        assert counts == {"pos_low": 4 + 3, "pos_high": 5 + 5, "neg_low": 2 + 1, "neg_high": 3 + 3}
        assert int(inside.sum()) == 4 + 4 + 8 + 8
    else:
        assert counts == {"pos_low": 3 + 2, "pos_high": 5 + 5, "neg_low": 0, "neg_high": 2 + 2}
        assert torch.all(tok[mask & (adv < 0) & (rho < 0.05)] != 0)  # a weight of 0.01 still pushes down
    # The clip fractions it logged, over the completion tokens.
    metrics = trainer._metrics["train"]
    for name, where in regimes.items():
        assert metrics[f"clip_ratio/{name}_mean"][-1] == pytest.approx(where.sum().item() / n.item(), abs=1e-12)
    assert metrics["clip_ratio/region_mean"][-1] == pytest.approx(outside.sum().item() / n.item(), abs=1e-12)
    assert math.isfinite(metrics["entropy"][-1])


def test_dispo_without_old_logps_is_the_on_policy_reinforce_loss(tmp):
    """No stored old log-probs (one pass per rollout step): r = 1, inside every default interval."""
    trainer = make_trainer(tmp, len(DISPO_RATIOS), policy_objective="dispo")
    inputs, _ = make_batch(trainer, [DISPO_RATIOS] * 3, [1.0, -1.0, 0.0], padded_rows=(2,))
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum() * trainer.args.steps_per_generation
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    real_grads = grads(trainer.model)
    trainer.model.zero_grad(set_to_none=True)
    logp = current_logps(trainer, inputs).double()
    mask = inputs["completion_mask"].double()
    ref = -(inputs["advantages"].unsqueeze(1) * logp * mask).sum() / mask.sum()
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=1e-12)
    for name, grad in grads(trainer.model).items():
        torch.testing.assert_close(real_grads[name], grad, rtol=1e-5, atol=1e-7)


def test_dispo_divides_by_trls_dapo_normalizer(tmp):
    """DISPO's divisor is TRL's "dapo" one, num_items_in_batch / processes * grad_accum / steps_per_generation
    in training and num_items_in_batch / processes in evaluation: checked against TRL's own dapo loss."""
    dispo = make_trainer(tmp, len(DISPO_RATIOS), policy_objective="dispo", dispo_epsilon_high_pos=0.5)
    grpo = make_trainer(tmp, len(DISPO_RATIOS))
    rows = [DISPO_RATIOS, DISPO_RATIOS[::-1]]
    losses = {}
    for name, trainer in (("dispo", dispo), ("grpo", grpo)):
        inputs, ratios = make_batch(trainer, rows, [1.0, -1.0], padded_rows=(1,))
        with torch.no_grad():
            old = current_logps(trainer, inputs).double() - ratios.log()
            n = inputs["completion_mask"].sum()
            for k, ga, train in ((1, 1, True), (3, 1, True), (1, 2, True), (3, 2, True), (1, 1, False), (3, 2, False)):
                trainer.model.train(train)
                trainer.current_gradient_accumulation_steps = ga
                batch = dict(
                    inputs, old_per_token_logps=old, num_items_in_batch=n * trainer.args.steps_per_generation * k
                )
                losses[name, k, ga, train] = trainer._compute_loss(trainer.model, batch)
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = 1
    for key in losses:
        if key[0] == "dispo":
            torch.testing.assert_close(
                losses[key] / losses["dispo", 1, 1, True],
                losses[("grpo", *key[1:])] / losses["grpo", 1, 1, True],
                rtol=1e-12,
                atol=0,
            )
    # In training the divisor is the mini-batch's own token count here (num_items = n * steps_per_generation).
    assert dispo.args.steps_per_generation == 4


# --------------------------------------------------------------------------- GRPO: TRL's loss, bit for bit


def test_grpo_is_trls_loss_bit_for_bit(tmp):
    """The default objective takes TRL's `_compute_loss` unchanged: same loss and gradients, bit for bit."""
    trainer = make_trainer(tmp, len(CISPO_RATIOS))
    assert trainer.args.policy_objective == "grpo" and trainer.epsilon_high == EPS_HIGH
    inputs, ratios = make_batch(trainer, [CISPO_RATIOS, CISPO_RATIOS[::-1]], [1.0, -2.5], padded_rows=(1,))
    ours = run_real_loss(trainer, inputs, ratios)
    trl = run_real_loss(trainer, inputs, ratios, loss_fn=GRPOTrainer._compute_loss)
    assert torch.equal(ours[0], trl[0]) and torch.equal(ours[2], trl[2]) and torch.equal(ours[3], trl[3])
    assert ours[1].keys() == trl[1].keys() and all(torch.equal(ours[1][k], trl[1][k]) for k in trl[1])
