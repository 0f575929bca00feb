"""The loss registry (zppo_trl.losses): each loss on small hand-computed tensors, and the registry itself.

Every case puts tokens in a regime whose answer is known by hand (inside the clip band, clipped above or
below, the dual clip, outside DISPO's interval) and checks the loss value and the per-token gradient, so a
wrong formula or a wrong regime boundary fails here. tests/test_objectives.py and tests/test_loss.py check
the same losses through the trainer, against a real model and, for the paper's objective, TRL's own loss.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from zppo_trl.augmentations import CorrectionTargets
from zppo_trl.distill import OffDistill, OnDistill
from zppo_trl.losses import LOSSES, DispoBounds, LossInputs, register_loss
from zppo_trl.objectives import loss_for

ARGS = SimpleNamespace(
    epsilon=0.2,
    epsilon_high=0.28,
    delta=10.0,
    policy_objective="grpo",
    distillation=None,
    distill_beta=0.5,
    dispo_bounds=DispoBounds(0.2, 10.0, 1.0, 100.0),
    dispo_out_of_bounds="zero",
    gspo_settings="gspo_paper",
    cispo_weight_bound=5.0,
    distill_chunk_size=4,
)


def _inputs(ratios, advantages, mask=None, normalizer=None):
    """Log-probs whose ratio to the old ones is ``ratios`` (one row per response), with gradient."""
    ratios = torch.tensor(ratios, dtype=torch.float64)
    old = torch.full_like(ratios, -1.0)
    logps = (old + ratios.log()).requires_grad_(True)
    mask = torch.ones_like(ratios) if mask is None else torch.tensor(mask, dtype=torch.float64)
    normalizer = mask.sum() if normalizer is None else torch.tensor(float(normalizer), dtype=torch.float64)
    adv = torch.tensor(advantages, dtype=torch.float64)
    return LossInputs(
        mask=mask,
        normalizer=normalizer,
        logps=logps,
        old_logps=old,
        advantages=adv,
        entropies=torch.zeros_like(ratios),
    )


def _per_token_grad(name, inputs, args=ARGS):
    out = LOSSES[name].fn(inputs, args)
    out.loss.backward()
    return out, inputs.logps.grad


def test_registry_names_and_selection():
    assert set(LOSSES) >= {"dapo", "gspo", "cispo", "dispo", "sft", "jsd"}
    assert loss_for(ARGS).name == "dapo"
    assert loss_for(SimpleNamespace(**{**vars(ARGS), "policy_objective": "gspo"})).name == "gspo"
    assert loss_for(SimpleNamespace(**{**vars(ARGS), "policy_objective": "dispo"})).name == "dispo"
    # a row that fits targets trains the loss its step-5 part names (zppo_trl.augmentations.Source.loss)
    assert loss_for(ARGS, CorrectionTargets.loss).name == "sft" and loss_for(ARGS, OnDistill.loss).name == "jsd"
    assert loss_for(ARGS, OffDistill.loss).name == "jsd"
    assert LOSSES["jsd"].computes == "distributions" and LOSSES["dapo"].computes == "logps"


def test_registering_twice_or_with_an_unknown_need_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_loss("dapo")(lambda inputs, args: None)
    with pytest.raises(ValueError, match="computes"):
        register_loss("new", computes="hidden_states")


def test_dapo_regimes_token_by_token():
    # one response per regime, one token each; N = 6 tokens, so d loss / d log pi = -r A / 6 where the ratio passes
    ratios = [[1.1], [2.0], [0.5], [0.5], [20.0], [1.5]]
    advantages = [[1.0], [1.0], [1.0], [-1.0], [-2.0], [-1.0]]
    out, grad = _per_token_grad("dapo", _inputs(ratios, advantages))
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
    out, grad = _per_token_grad("dapo", _inputs([[20.0]], [[-2.0]]), args)
    assert out.loss.item() == pytest.approx(40.0) and grad.item() == pytest.approx(40.0)


def test_dapo_masks_padding_and_divides_by_the_normalizer():
    inputs = _inputs([[1.0, 1.0, 5.0]], [[1.0]], mask=[[1, 1, 0]], normalizer=8)
    out, grad = _per_token_grad("dapo", inputs)
    assert out.loss.item() == pytest.approx(-2 / 8) and grad[0, 2].item() == 0.0


def test_gspo_paper_clips_the_sequence_ratio_at_its_range_and_averages_per_response():
    """The GSPO paper's clip (1 - 3e-4, 1 + 4e-4) binds on sequence ratios a 0.2 / 0.28 clip never touches, and
    each response counts once whatever its length (a token mean would weight row 0 three times row 1)."""
    s = [1.0002, 1.0006, 0.9995, 0.9999]  # inside (A > 0); above 1 + 4e-4 (A > 0); below 1 - 3e-4 (A < 0); inside
    ratios = [[s[0]] * 3, [s[1], 1.0, 1.0], [s[2]] * 2 + [1.0], [s[3]] * 2 + [1.0]]
    mask = [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]]
    inputs = _inputs(ratios, [[1.0], [1.0], [-1.0], [-1.0]], mask=mask)
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
    inputs = _inputs([[2.0, 0.5], [4.0, 1.0]], [[1.0], [1.0]])
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
    inputs = _inputs([[0.05], [2.0], [7.0], [7.0]], [[1.0], [1.0], [1.0], [-1.0]])
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
    inputs = _inputs([[0.5], [1.5], [12.0], [0.01], [150.0]], [[1.0], [1.0], [1.0], [-1.0], [-1.0]])
    args = SimpleNamespace(**{**vars(ARGS), "dispo_out_of_bounds": "clamp"})
    out, grad = _per_token_grad("dispo", inputs, args)
    expected = torch.tensor([-0.8 / 5, -1.5 / 5, -11.0 / 5, 0.01 / 5, 101.0 / 5], dtype=torch.float64)
    torch.testing.assert_close(grad.squeeze(1), expected, rtol=1e-12, atol=1e-15)
    assert out.means["clip_ratio/region_mean"][0].item() == 3.0  # still counted as outside


def test_dispo_zero_gradient_outside_each_sides_interval():
    # bounds: A > 0 in [0.8, 11]; A < 0 in [0 (no lower bound), 101]
    inputs = _inputs([[0.5], [1.5], [12.0], [0.01], [150.0]], [[1.0], [1.0], [1.0], [-1.0], [-1.0]])
    out, grad = _per_token_grad("dispo", inputs)
    expected = torch.tensor([0.0, -1.5 / 5, 0.0, 0.01 / 5, 0.0], dtype=torch.float64)
    torch.testing.assert_close(grad.squeeze(1), expected, rtol=1e-12, atol=1e-15)
    assert out.means["clip_ratio/pos_low_mean"][0].item() == 1.0
    assert out.means["clip_ratio/pos_high_mean"][0].item() == 1.0
    assert out.means["clip_ratio/neg_high_mean"][0].item() == 1.0
    assert out.means["clip_ratio/neg_low_mean"][0].item() == 0.0
    assert out.means["clip_ratio/region_mean"][0].item() == 3.0


def test_sft_is_the_token_mean_negative_log_likelihood():
    inputs = _inputs([[1.0, 1.0]], [[0.0]], mask=[[1, 0]], normalizer=1)
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
