"""The policy loss that training actually runs equals the paper's dual-clip surrogate (eq. dualclip).

The paper (maximize form), with rho the per-token ratio pi_theta / pi_old and A the rollout's advantage:

    q(rho, A) = min(rho * A, clip(rho, 1 - eps_low, 1 + eps_high) * A)
    l(rho, A) = max(q(rho, A), c_dual * A)   if A < 0
              = q(rho, A)                    if A >= 0

and the loss is -l summed over every completion token of the mini-batch, divided by the number of
those tokens (DAPO's token-level aggregation). `ZPPOConfig` does not implement this itself: it sets
TRL's ``epsilon``/``epsilon_high``/``delta``/``loss_type="dapo"`` and claims (module docstring) that
TRL's ``delta``, a clamp of the unclipped ratio inside the min, *is* the dual clip.

These tests check that claim twice:

* on a grid of (rho, A), the paper's formula against an independent re-derivation of the form the
  config docstring describes, ``min(min(rho, delta) * A, clip(rho) * A)`` (exact equality);
* through the trainer's real ``_compute_loss`` on a tiny model, with hand-built inputs whose
  old log-probs are offset so that every token sits at a chosen ratio (inside the band, below
  1 - eps_low, above 1 + eps_high, above c_dual) for A > 0, A < 0 and A = 0, plus padding tokens:
  loss value, parameter gradients, per-token losses and per-token gradients all match the paper;
  and with ``delta=None`` they do not, exactly on the tokens with A < 0 and rho > c_dual.
"""

from __future__ import annotations

import math

import pytest
import torch
from datasets import Dataset

from zppo_trl import ZPPOConfig, ZPPOTrainer

try:  # tests/ is on sys.path under pytest's default (rootdir-less, prepend) import mode
    from tiny_models import SPECIAL_TOKENS, tiny_text_model, tiny_tokenizer
except ImportError:  # tests/ imported as a package
    from tests.tiny_models import SPECIAL_TOKENS, tiny_text_model, tiny_tokenizer

# The trainer whose loss path is under test: ZPPOTrainer, which keeps GRPOTrainer's `_compute_loss`.
TRAINER_CLASS = ZPPOTrainer

# The paper's constants (tab:appendix:hyperparameters), written out rather than read from the config,
# so the reference below does not inherit a wrong default.
EPS_LOW, EPS_HIGH, C_DUAL = 0.20, 0.28, 10.0

# Ratios covering every regime: below 1 - eps_low (0.2, 0.5, 0.79), inside the band (0.9, 1.0, 1.1,
# 1.27), above 1 + eps_high (1.5, 3, 9.9), above c_dual (10.5, 50). None sits exactly on a boundary,
# where the two forms could legitimately pick different sub-gradients.
RATIOS = [0.2, 0.5, 0.79, 0.9, 1.0, 1.1, 1.27, 1.5, 3.0, 9.9, 10.5, 50.0]
# One advantage per row: positive, negative, zero, and a second negative of another magnitude.
ADVANTAGES = [1.0, -1.0, 0.0, -2.5]
PROMPT_LEN = 6
PAD_RATIO = 1000.0  # the ratio given to padding tokens: absurd on purpose, it must never count


# --------------------------------------------------------------------------- the paper's formula


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


# --------------------------------------------------------------------------- elementwise, on a grid


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


# --------------------------------------------------------------------------- the real loss path


def _zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def make_trainer(tmp_path, delta: float = C_DUAL):
    """A trainer on the tiny model with ZPPOConfig's defaults (GRPO: no teacher, no replay)."""
    args = ZPPOConfig(
        output_dir=str(tmp_path / f"out-delta-{delta}"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=len(RATIOS),
        augmentations=[],
        replay_fraction=0.0,
        delta=delta,
    )
    trainer = TRAINER_CLASS(
        model=tiny_text_model(seed=0),
        reward_funcs=_zero_reward,
        args=args,
        train_dataset=Dataset.from_list(
            [
                dict(id=f"q{i}", question=q, images=[], answer=a, source="toy", subdataset="toy")
                for i, (q, a) in enumerate([("What is 12 + 30?", "42"), ("Compute 7 * 6.", "42")])
            ]
        ),
        processing_class=tiny_tokenizer(),
    )
    trainer.model.train()  # `_compute_loss` picks its train-mode normalizer from `model.training`
    # Set by Trainer's training loop only (from the length of the current accumulation window); the
    # loss reads it, so a direct call has to provide it: one micro-batch per optimizer step here.
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer


def make_batch(trainer):
    """Hand-built rows: a prompt, a completion of len(RATIOS) tokens, and the target ratio of each token.

    Rows 0 and 1 use every ratio for A = +1 and A = -1; rows 2 (A = 0) and 3 (A = -2.5, ratios
    reversed) end in a padding token. Returns the model inputs (without old log-probs) and the
    float64 (B, T) target ratios.
    """
    vocab = len(trainer.processing_class)
    g = torch.Generator().manual_seed(0)
    rows, length = len(ADVANTAGES), len(RATIOS)
    prompt_ids = torch.randint(len(SPECIAL_TOKENS), vocab, (rows, PROMPT_LEN), generator=g)
    completion_ids = torch.randint(len(SPECIAL_TOKENS), vocab, (rows, length), generator=g)
    completion_mask = torch.ones(rows, length, dtype=torch.long)
    completion_mask[2:, -1] = 0  # right padding
    completion_ids[2:, -1] = trainer.processing_class.pad_token_id
    ratios = torch.tensor([RATIOS, RATIOS, RATIOS, RATIOS[::-1]], dtype=torch.float64)
    ratios[completion_mask == 0] = PAD_RATIO
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": torch.ones_like(prompt_ids),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor(ADVANTAGES, dtype=torch.float64),
    }
    return inputs, ratios


def current_logps(trainer, inputs):
    """Per-token log-probs of the completion under the current model, through the trainer's own scorer."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, input_ids, attention_mask, inputs["completion_ids"].size(1)
    )
    return logps


def run_real_loss(trainer, inputs, ratios):
    """One call of the trainer's ``_compute_loss``, instrumented to read per-token quantities back.

    * ``old_per_token_logps = logp - log(ratio)`` (float64) puts every token at its target ratio;
      it is a leaf requiring grad, so its gradient is minus d loss / d log(rho) per token.
    * ``tool_mask`` (TRL multiplies it into the loss mask and nothing else) is an all-ones float
      leaf requiring grad: the loss is linear in it, so its gradient is each token's masked
      contribution per_token_loss / normalizer, for every token in the same call.
    * ``num_items_in_batch`` is the token count of the whole generation batch as TRL's sampler
      computes it: steps_per_generation mini-batches, each with this one's token count.

    Returns the loss, the parameter gradients, the per-token losses (unnormalized) and the
    per-token gradients d loss / d log(rho).
    """
    with torch.no_grad():
        logps = current_logps(trainer, inputs).double()
    n_tokens = inputs["completion_mask"].sum()
    old = (logps - ratios.log()).requires_grad_(True)
    tool_mask = torch.ones_like(ratios).requires_grad_(True)
    real_inputs = dict(
        inputs,
        old_per_token_logps=old,
        tool_mask=tool_mask,
        num_items_in_batch=n_tokens * trainer.args.steps_per_generation,
    )
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(trainer.model, real_inputs)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, tool_mask.grad * n_tokens, -old.grad


def run_reference_loss(trainer, inputs, ratios):
    """The paper's loss from the same model: logp with grad, the same old log-probs, eq. dualclip."""
    with torch.no_grad():
        old = current_logps(trainer, inputs).double() - ratios.log()
    trainer.model.zero_grad(set_to_none=True)
    log_rho = current_logps(trainer, inputs).double() - old
    log_rho.retain_grad()  # per-token d loss / d log(rho)
    rho = torch.exp(log_rho)
    mask = inputs["completion_mask"].double()
    adv = inputs["advantages"].unsqueeze(1)
    loss = paper_loss(rho, adv, mask)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    per_token = -paper_surrogate(rho.detach(), adv) * mask
    return loss.detach(), grads, per_token, log_rho.grad, rho.detach()


@pytest.fixture(scope="module")
def trainers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loss")
    off = make_trainer(tmp, delta=C_DUAL)
    off.args.delta = None  # past ZPPOConfig's validation, which refuses it: TRL reads args.delta per loss call
    return {"dual": make_trainer(tmp, delta=C_DUAL), "off": off}


def test_real_loss_is_the_papers_dual_clip(trainers):
    trainer = trainers["dual"]
    assert (trainer.args.delta, trainer.args.loss_type, trainer.beta) == (C_DUAL, "dapo", 0.0)
    inputs, ratios = make_batch(trainer)
    mask = inputs["completion_mask"].bool()
    adv = inputs["advantages"].unsqueeze(1).expand_as(ratios)

    real_loss, real_grads, real_tok, real_tok_grad = run_real_loss(trainer, inputs, ratios)
    ref_loss, ref_grads, ref_tok, ref_tok_grad, rho = run_reference_loss(trainer, inputs, ratios)

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
    inputs, ratios = make_batch(trainer)
    mask = inputs["completion_mask"].bool()
    adv = inputs["advantages"].unsqueeze(1).expand_as(ratios)

    real_loss, _, real_tok, real_tok_grad = run_real_loss(trainer, inputs, ratios)
    ref_loss, _, ref_tok, ref_tok_grad, rho = run_reference_loss(trainer, inputs, ratios)

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
    inputs, ratios = make_batch(trainer)
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
