"""What the loss tests share: a loss's inputs written by hand, and the trainer's real loss on hand-built batches.

* :func:`loss_args` and :data:`ARGS`: the ``args`` a loss function reads, the paper's clip settings
  (tab:appendix:hyperparameters) written out rather than read from the config, so that a reference does not inherit a
  wrong default; :data:`ARGS` adds the built-in losses' defaults (tests/test_losses.py, tests/test_objectives.py).
* :func:`ratio_inputs`: a :class:`~zppo_trl.losses.LossInputs` whose log-probs sit at given ratios to the old ones,
  one row per response (tests/test_losses.py); :func:`response_inputs`: one response's, from its log-probs, the
  sampling policy's and the teacher's (tests/test_hybrid_objectives.py, tests/test_self_teachers.py).
* :func:`make_trainer`, :func:`make_batch`, :func:`run_real_loss`, :func:`run_real_loss_per_token`,
  :func:`run_reference`: the trainer's ``_compute_loss`` on the tiny text model (tiny_models.py), on rows whose
  tokens each sit at a chosen ratio (old log-probs offset from the current ones), instrumented to read every
  token's gradient back, and a written-out formula on the same model to compare it with (tests/test_losses.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from datasets import Dataset

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.losses import DispoBounds, LossInputs

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from settings import CPU as CPU_ONLY
    from tiny_models import SPECIAL_TOKENS, tiny_text_model, tiny_tokenizer
except ImportError:
    from tests.settings import CPU as CPU_ONLY
    from tests.tiny_models import SPECIAL_TOKENS, tiny_text_model, tiny_tokenizer

# The paper's constants (tab:appendix:hyperparameters), written out rather than read from the config.
EPS_LOW, EPS_HIGH, C_DUAL = 0.20, 0.28, 10.0
PROMPT_LEN = 6
PAD_RATIO = 1000.0  # the ratio given to padding tokens: absurd on purpose, it must never count
CPU = {**CPU_ONLY, "augmentations": []}  # a configuration on GRPO†'s pipeline, on this machine's CPU


# --------------------------------------------------------------------------- a loss's inputs, by hand


def loss_args(**fields) -> SimpleNamespace:
    """The ``args`` a loss reads: the paper's clip settings, then ``fields`` (a row's own, or overrides)."""
    return SimpleNamespace(**{"epsilon": EPS_LOW, "epsilon_high": EPS_HIGH, "delta": C_DUAL, **fields})


# The built-in losses' settings (zppo_trl.losses), their defaults written out.
ARGS = loss_args(
    policy_objective="grpo",
    distillation=None,
    distill_beta=0.5,
    dispo_bounds=DispoBounds(0.2, 10.0, 1.0, 100.0),
    dispo_out_of_bounds="zero",
    gspo_settings="gspo_paper",
    cispo_weight_bound=5.0,
    distill_chunk_size=4,
)


def ratio_inputs(ratios, advantages, mask=None, normalizer=None) -> LossInputs:
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


def response_inputs(logps, old, teacher, advantages, mask, *, teacher_mask=None, step=0) -> LossInputs:
    """One response: its per-token log-probs (with gradient), the sampling policy's and the teacher's, its
    advantages and loss mask, normalized by its token count; ``teacher_mask`` marks the tokens that have a
    self-teacher, ``step`` is the optimizer steps taken (a coefficient's schedule)."""
    logps = torch.tensor([logps], dtype=torch.float64, requires_grad=True)
    mask_t = torch.tensor([mask], dtype=torch.float64)
    return LossInputs(
        mask=mask_t,
        normalizer=float(sum(mask)),
        logps=logps,
        old_logps=torch.tensor([old], dtype=torch.float64),
        teacher_logps=torch.tensor([teacher], dtype=torch.float64),
        teacher_mask=None if teacher_mask is None else torch.tensor([teacher_mask], dtype=torch.float64),
        advantages=torch.tensor([advantages], dtype=torch.float64),
        entropies=torch.zeros_like(mask_t),
        step=step,
    )


# --------------------------------------------------------------------------- the trainer's real loss


def _zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


def make_trainer(tmp_path, length: int, **overrides):
    """A trainer on the tiny model (GRPO† pipeline without replay) with ``overrides`` on the config.

    ``length`` is the completion length of the batches it will be given (:func:`make_batch`).
    """
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
    # Set by Trainer's training loop only (from the length of the current accumulation window); the
    # loss reads it, so a direct call has to provide it: one micro-batch per optimizer step here.
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer


def make_batch(trainer, ratios, advantages, padded_rows=()):
    """Rows of a prompt and a completion, each token at its ratio; ``padded_rows`` end in a padding token.

    Returns the model inputs (without old log-probs) and the float64 (B, T) target ratios (``PAD_RATIO`` on
    padding).
    """
    vocab = len(trainer.processing_class)
    g = torch.Generator().manual_seed(0)
    ratios = torch.tensor(ratios, dtype=torch.float64)
    rows, length = ratios.shape
    prompt_ids = torch.randint(len(SPECIAL_TOKENS), vocab, (rows, PROMPT_LEN), generator=g)
    completion_ids = torch.randint(len(SPECIAL_TOKENS), vocab, (rows, length), generator=g)
    completion_mask = torch.ones(rows, length, dtype=torch.long)
    for row in padded_rows:  # right padding
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
    """Per-token log-probs of the completion under the current model, through the trainer's own scorer."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    logps, _, _ = trainer._get_per_token_logps_and_entropies(
        trainer.model, input_ids, attention_mask, inputs["completion_ids"].size(1)
    )
    return logps


def grads(model):
    """Every parameter's gradient, cloned."""
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def run_real_loss(trainer, inputs, ratios, loss_fn=None):
    """The trainer's ``_compute_loss`` (or ``loss_fn(trainer, model, inputs)``), instrumented.

    ``old_per_token_logps = logp - log(ratio)`` puts every token at its ratio (a leaf requiring
    grad); a zero float64 probe added to the log-probs the trainer computes reads each token's
    d loss / d log pi. ``num_items_in_batch`` is the token count of the whole generation batch as TRL's
    sampler computes it: steps_per_generation mini-batches, each with this one's token count. Returns the
    loss, the parameter gradients, that per-token gradient and the gradient the old log-probs received (None
    when they got none).
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
    return loss.detach(), grads(trainer.model), probe.grad, old.grad


def run_real_loss_per_token(trainer, inputs, ratios):
    """One call of the trainer's ``_compute_loss``, instrumented to read each token's loss back.

    * ``old_per_token_logps = logp - log(ratio)`` (float64) puts every token at its target ratio;
      it is a leaf requiring grad, so its gradient is minus d loss / d log(rho) per token.
    * ``tool_mask`` (TRL multiplies it into the loss mask and nothing else) is an all-ones float
      leaf requiring grad: the loss is linear in it, so its gradient is each token's masked
      contribution per_token_loss / normalizer, for every token in the same call.
    * ``num_items_in_batch`` as in :func:`run_real_loss`.

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
    return loss.detach(), grads(trainer.model), tool_mask.grad * n_tokens, -old.grad


def run_reference(trainer, inputs, ratios, formula):
    """``formula(logp, old, adv, mask)`` from the same model, with the same old log-probs as the real loss's.

    Returns its loss, the parameter gradients, d loss / d log pi per token (which is d loss / d log(rho): the
    old log-probs are constants here) and the ratios the tokens sit at.
    """
    with torch.no_grad():
        old = current_logps(trainer, inputs).double() - ratios.log()
    trainer.model.zero_grad(set_to_none=True)
    logp = current_logps(trainer, inputs).double()
    logp.retain_grad()
    loss = formula(logp, old, inputs["advantages"].unsqueeze(1), inputs["completion_mask"].double())
    loss.backward()
    return loss.detach(), grads(trainer.model), logp.grad, torch.exp(logp.detach() - old)


def assert_same(real, ref):
    """:func:`run_real_loss` and :func:`run_reference` agree: the loss, every parameter gradient, each token's."""
    (real_loss, real_grads, real_tok, _), (ref_loss, ref_grads, ref_tok, _) = real, ref
    torch.testing.assert_close(real_loss, ref_loss, rtol=1e-12, atol=1e-12)
    assert real_grads.keys() == ref_grads.keys() and any(g.abs().max() > 0 for g in ref_grads.values())
    for name, grad in ref_grads.items():
        torch.testing.assert_close(real_grads[name], grad, rtol=1e-5, atol=1e-7, msg=lambda m, n=name: f"{n}: {m}")
    torch.testing.assert_close(real_tok, ref_tok, rtol=1e-12, atol=1e-15)
