"""Step 6's alternative objectives (sec:appendix:backbones): the loss training runs is each one's formula.

``ZPPOConfig.policy_objective`` picks Step 6's objective: "grpo" (the paper's, checked in
test_loss.py), "gspo", "cispo" and "dispo" (zppo_trl.losses). GSPO averages per response (the GSPO
paper's aggregation; its "zppo_table" reading keeps DAPO's token mean); the others keep DAPO's
token-level aggregation: the per-token terms are summed over the completion tokens and divided by
their number. Here each objective's formula is written out
independently of the code (maximize form, r = pi_theta / pi_old, A the rollout's advantage,
sg the stop-gradient):

* GSPO: s = exp(mean over the rollout's tokens of log r); l = min(s A, clip(s, 1 - eps_low,
  1 + eps_high) A), and max(l, c_dual A) for A < 0; with the GSPO paper's (3e-4, 4e-4) each rollout's
  l counts once, with the ZPPO table's (0.2, 0.28) once per token.
* CISPO: sg(min(r, 5)) A log pi (MiniMax-M1: no lower bound).
* DISPO: sg(r * 1[r inside its side's interval]) A log pi, the interval [1 - low_pos, 1 + high_pos]
  for A > 0 and [1 - low_neg, 1 + high_neg] for A < 0: zero gradient outside it.

and compared with the trainer's real ``_compute_loss`` on a tiny model, with old log-probs offset so
that every token sits at a chosen ratio in every clip region, for A > 0, A < 0 and A = 0, with
padding tokens: the loss value, every parameter gradient, and each token's gradient with respect to
its own log pi (read through a zero probe added to the trainer's log-probs). For CISPO and DISPO the
last one is -w A / N exactly: the weight is a stop-gradient coefficient, and the old log-probs get no
gradient at all.
"""

from __future__ import annotations

import contextlib
import logging
import math

import pytest
import torch
from datasets import Dataset
from trl import GRPOTrainer, TrlParser

import zppo_trl.trainer as trainer_module
from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.config import PAPER_OBJECTIVE
from zppo_trl.losses import sequence_level_warning_expected

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from settings import CPU as CPU_ONLY
except ImportError:
    from tests.settings import CPU as CPU_ONLY

try:  # tests/ is on sys.path under pytest's default (rootdir-less, prepend) import mode
    from tiny_models import SPECIAL_TOKENS, tiny_text_model, tiny_tokenizer
except ImportError:  # tests/ imported as a package
    from tests.tiny_models import SPECIAL_TOKENS, tiny_text_model, tiny_tokenizer

# The paper's constants (tab:appendix:hyperparameters), written out rather than read from the config.
EPS_LOW, EPS_HIGH, C_DUAL = 0.20, 0.28, 10.0
# DISPO's default epsilons, written out: correct responses keep a gradient on [0.8, 11], incorrect on [0, 101].
DISPO_DEFAULT = dict(low_pos=0.2, high_pos=10.0, low_neg=1.0, high_neg=100.0)
# Tight DISPO bounds, so that each of the four binds somewhere: [0.8, 1.5] for A > 0, [0.5, 3.0] for A < 0.
DISPO_TIGHT = dict(low_pos=0.2, high_pos=0.5, low_neg=0.5, high_neg=2.0)
PROMPT_LEN = 6
PAD_RATIO = 1000.0  # the ratio given to padding tokens: absurd on purpose, it must never count
CPU = {**CPU_ONLY, "augmentations": []}


# --------------------------------------------------------------------------- the formulas, independently


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


# --------------------------------------------------------------------------- the real loss path


def _zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def make_trainer(tmp_path, length: int, **overrides):
    """A trainer on the tiny model (GRPO† pipeline without replay) with ``overrides`` on the config."""
    name = "-".join(f"{k}-{v}" for k, v in overrides.items()) or "default"
    args = ZPPOConfig(
        **{**CPU, "output_dir": str(tmp_path / name)},
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=length,
        replay_fraction=0.0,
        **overrides,
    )
    trainer = ZPPOTrainer(
        model=tiny_text_model(seed=0),
        reward_funcs=_zero_reward,
        args=args,
        train_dataset=Dataset.from_list(
            [
                dict(id=f"q{i}", question=q, images=[], answer="42", source="t", subdataset="t")
                for i, q in enumerate(["What is 12 + 30?", "Compute 7 * 6."])
            ]
        ),
        processing_class=tiny_tokenizer(),
    )
    trainer.model.train()  # `_compute_loss` picks its train-mode normalizer from `model.training`
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by the training loop only
    return trainer


def make_batch(trainer, ratios, advantages, padded_rows=()):
    """Rows of a prompt and a completion, each token at its ratio; ``padded_rows`` end in a padding token."""
    vocab = len(trainer.processing_class)
    g = torch.Generator().manual_seed(0)
    ratios = torch.tensor(ratios, dtype=torch.float64)
    rows, length = ratios.shape
    prompt_ids = torch.randint(len(SPECIAL_TOKENS), vocab, (rows, PROMPT_LEN), generator=g)
    completion_ids = torch.randint(len(SPECIAL_TOKENS), vocab, (rows, length), generator=g)
    completion_mask = torch.ones(rows, length, dtype=torch.long)
    for row in padded_rows:
        completion_mask[row, -1] = 0
        completion_ids[row, -1] = trainer.processing_class.pad_token_id
    ratios[completion_mask == 0] = PAD_RATIO
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(advantages, dtype=torch.float64),
    }
    return inputs, ratios


def current_logps(trainer, inputs):
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, input_ids, attention_mask, inputs["completion_ids"].size(1)
    )
    return logps


def _grads(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def run_real_loss(trainer, inputs, ratios, loss_fn=None):
    """The trainer's ``_compute_loss`` (or ``loss_fn(trainer, model, inputs)``), instrumented.

    ``old_per_token_logps = logp - log(ratio)`` puts every token at its ratio (a leaf requiring
    grad); a zero float64 probe added to the log-probs the trainer computes reads each token's
    d loss / d log pi. Returns the loss, the parameter gradients, that per-token gradient and the
    gradient the old log-probs received (None when they got none).
    """
    with torch.no_grad():
        logps = current_logps(trainer, inputs).double()
    old = (logps - ratios.log()).requires_grad_(True)
    probe = torch.zeros_like(ratios, requires_grad=True)
    scorer = trainer._get_per_token_logps_and_entropies

    def probed(*args, **kwargs):
        out_logps, entropies, aux = scorer(*args, **kwargs)
        return out_logps + probe, entropies, aux

    real_inputs = dict(
        inputs,
        old_per_token_logps=old,
        num_items_in_batch=inputs["completion_mask"].sum() * trainer.args.steps_per_generation,
    )
    trainer.model.zero_grad(set_to_none=True)
    trainer._get_per_token_logps_and_entropies = probed
    try:
        loss = (loss_fn or type(trainer)._compute_loss)(trainer, trainer.model, real_inputs)
    finally:
        del trainer._get_per_token_logps_and_entropies
    loss.backward()
    return loss.detach(), _grads(trainer.model), probe.grad, old.grad


def run_reference(trainer, inputs, ratios, formula):
    """``formula(logp, old, adv, mask)`` from the same model; its loss, gradients and d loss / d log pi."""
    with torch.no_grad():
        old = current_logps(trainer, inputs).double() - ratios.log()
    trainer.model.zero_grad(set_to_none=True)
    logp = current_logps(trainer, inputs).double()
    logp.retain_grad()
    loss = formula(logp, old, inputs["advantages"].unsqueeze(1), inputs["completion_mask"].double())
    loss.backward()
    return loss.detach(), _grads(trainer.model), logp.grad, torch.exp(logp.detach() - old)


def assert_same(real, ref):
    (real_loss, real_grads, real_tok, _), (ref_loss, ref_grads, ref_tok, _) = real, ref
    torch.testing.assert_close(real_loss, ref_loss, rtol=1e-12, atol=1e-12)
    assert real_grads.keys() == ref_grads.keys() and any(g.abs().max() > 0 for g in ref_grads.values())
    for name, grad in ref_grads.items():
        torch.testing.assert_close(real_grads[name], grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
    torch.testing.assert_close(real_tok, ref_tok, rtol=1e-12, atol=1e-15)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("objectives")


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


def test_cispo_clips_the_weight_at_its_bound_and_stops_its_gradient(tmp):
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
    real_grads = _grads(trainer.model)
    trainer.model.zero_grad(set_to_none=True)
    logp = current_logps(trainer, inputs).double()
    mask = inputs["completion_mask"].double()
    ref = -(inputs["advantages"].unsqueeze(1) * logp * mask).sum() / mask.sum()
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-12, atol=1e-12)
    for name, grad in _grads(trainer.model).items():
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


# --------------------------------------------------------------------------- GRPO: unchanged


def test_grpo_is_trls_loss_bit_for_bit(tmp):
    """The default objective takes TRL's `_compute_loss` unchanged: same loss and gradients, bit for bit."""
    trainer = make_trainer(tmp, len(CISPO_RATIOS))
    assert trainer.args.policy_objective == "grpo" and trainer.epsilon_high == EPS_HIGH
    inputs, ratios = make_batch(trainer, [CISPO_RATIOS, CISPO_RATIOS[::-1]], [1.0, -2.5], padded_rows=(1,))
    ours = run_real_loss(trainer, inputs, ratios)
    trl = run_real_loss(trainer, inputs, ratios, loss_fn=GRPOTrainer._compute_loss)
    assert torch.equal(ours[0], trl[0]) and torch.equal(ours[2], trl[2]) and torch.equal(ours[3], trl[3])
    assert ours[1].keys() == trl[1].keys() and all(torch.equal(ours[1][k], trl[1][k]) for k in trl[1])


# --------------------------------------------------------------------------- the configuration


def test_each_objective_sets_what_it_needs_and_nothing_else():
    base = ZPPOConfig(**CPU)
    expected = {
        "grpo": {},
        "gspo": {"importance_sampling_level": "sequence"},
        "cispo": {"loss_type": "cispo"},
        "dispo": {},
    }
    for objective, changes in expected.items():
        c = ZPPOConfig(**CPU, policy_objective=objective)
        for name, (required, _why) in PAPER_OBJECTIVE.items():
            assert getattr(c, name) == changes.get(name, required), (objective, name)
        # every other setting follows the paper's table
        assert (c.epsilon, c.epsilon_high, c.delta, c.beta, c.learning_rate) == (
            base.epsilon,
            base.epsilon_high,
            base.delta,
            base.beta,
            base.learning_rate,
        )
        # a configuration of this objective, saved with the TRL values it set, loads again
        assert ZPPOConfig(**CPU, policy_objective=objective, **changes).policy_objective == objective


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(policy_objective="ppo"), "policy_objective"),
        (dict(policy_objective="GSPO"), "policy_objective"),
        (dict(policy_objective="dispo", dispo_epsilon_low_pos=-0.1), "dispo_epsilon_low_pos"),
        (dict(policy_objective="dispo", dispo_epsilon_high_pos=float("inf")), "dispo_epsilon_high_pos"),
        (dict(dispo_epsilon_low_neg="1"), "dispo_epsilon_low_neg"),
        (dict(dispo_epsilon_high_neg=-5.0), "dispo_epsilon_high_neg"),
        (dict(policy_objective="gspo", delta=None), "delta"),
        (dict(policy_objective="gspo", delta=1.2), "delta"),
        (dict(policy_objective="gspo", gspo_settings="table"), "gspo_settings"),
        (dict(policy_objective="cispo", cispo_weight_bound=0.28), "cispo_weight_bound"),
        (dict(policy_objective="cispo", cispo_weight_bound=float("inf")), "cispo_weight_bound"),
        (dict(policy_objective="dispo", dispo_out_of_bounds="mask"), "dispo_out_of_bounds"),
    ],
)
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"^{field}"):
        ZPPOConfig(**CPU, **overrides)


@pytest.mark.parametrize(
    "name, value, objective",
    [("loss_type", "cispo", "cispo"), ("importance_sampling_level", "sequence", "gspo"), ("loss_type", "grpo", None)],
)
def test_trl_settings_set_directly_are_refused_and_point_to_policy_objective(name, value, objective):
    with pytest.raises(ValueError, match=rf"^{name}=.* changes ZPPO's objective.*Set {name}=") as err:
        ZPPOConfig(**CPU, **{name: value})
    assert (f"policy_objective='{objective}'" in str(err.value)) == (objective is not None)
    # and an objective does not license another objective's setting
    with pytest.raises(ValueError, match=rf"^{name}="):
        ZPPOConfig(**CPU, policy_objective="dispo", **{name: value})


def test_the_dual_clip_is_checked_only_where_it_acts():
    for objective in ("cispo", "dispo"):  # they bound the importance weight themselves
        assert ZPPOConfig(**CPU, policy_objective=objective, delta=None).delta is None


@pytest.mark.parametrize(
    "reformulations, replay_fraction, objective, variant",
    [
        (["bcq", "ncq"], 0.25, "grpo", "ZPPO"),
        ([], 0.25, "grpo", "GRPO\u2020"),
        (["bcq", "ncq"], 0.25, "gspo", "ZPPO (GSPO)"),
        (["bcq", "ncq"], 0.25, "cispo", "ZPPO (CISPO)"),
        (["bcq", "ncq"], 0.25, "dispo", "ZPPO (DISPO)"),
        ([], 0.25, "gspo", "GSPO\u2020"),
        ([], 0.25, "cispo", "CISPO\u2020"),
        ([], 0.25, "dispo", "DISPO\u2020"),
        ([], 0.0, "dispo", "DISPO"),  # the objective alone, without the buffer (as GRPO is to GRPO†)
        (["bcq"], 0.25, "cispo", "GRPO\u2020+BCQ (CISPO)"),
        (["bcq", "ncq"], 0.0, "gspo", "GRPO+Both (GSPO)"),
    ],
)
def test_variant_names_the_objective_as_the_paper_does(reformulations, replay_fraction, objective, variant):
    teacher = dict(teacher_base_url="http://127.0.0.1:8000/v1", teacher_model="t") if reformulations else {}
    c = ZPPOConfig(
        **{**CPU, "augmentations": reformulations},
        **teacher,
        replay_fraction=replay_fraction,
        policy_objective=objective,
    )
    assert c.variant == variant


def test_command_line():
    args = [
        "--output_dir",
        "unused",
        "--use_cpu",
        "--bf16",
        "false",
        "--augmentations",
        "",
        "--policy_objective",
        "dispo",
        "--dispo_epsilon_high_neg",
        "50",
    ]
    (config,) = TrlParser((ZPPOConfig,)).parse_args_and_config(args)
    assert (
        config.policy_objective == "dispo" and config.dispo_bounds.high_neg == 50.0 and config.variant == "DISPO\u2020"
    )
