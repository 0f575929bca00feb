"""The fused LM head (the paper's "Fused LM-head kernel: on") is exact: on every loss path the trainer has, the
loss and every parameter gradient equal those of the full-logits reference (``fused_lm_head=False``), in float32.

The tolerance is float32 rounding of a vocabulary-tiled log-sum-exp against a one-shot one: rtol 1e-4 and
atol 1e-6 on losses and gradients (measured differences are around 1e-7 relative). A wrong tile merge, a
missed temperature or an entropy without gradient would each be off by far more.
"""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.logp_paths import completion_logps
from zppo_trl.losses import LOSSES

try:  # tests/ is on sys.path under pytest's default (rootdir-less, prepend) import mode
    from tiny_models import SPECIAL_TOKENS, tiny_text_model, tiny_tokenizer
except ImportError:  # tests/ imported as a package
    from tests.tiny_models import SPECIAL_TOKENS, tiny_text_model, tiny_tokenizer

ROWS, PROMPT, COMPLETION = 4, 7, 11
RTOL, ATOL = 1e-4, 1e-6


def _reward(completions, **kwargs):
    return [0.0] * len(completions)


def _trainer(tmp_path, fused: bool, temperature: float = 0.7, distill_teacher_model=None, **settings):
    args = ZPPOConfig(
        output_dir=str(tmp_path / f"out-{fused}"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=COMPLETION,
        augmentations=[],
        replay_fraction=0.0,
        temperature=temperature,
        fused_lm_head=fused,
        **settings,
    )
    trainer = ZPPOTrainer(
        model=tiny_text_model(seed=0),
        reward_funcs=_reward,
        args=args,
        train_dataset=Dataset.from_list(
            [dict(id="q0", question="What is 12 + 30?", images=[], answer="42", source="toy", subdataset="toy")]
        ),
        processing_class=tiny_tokenizer(),
        distill_teacher_model=distill_teacher_model,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
    return trainer


def _batch(trainer):
    """Left-padded prompts, right-padded completions (one row all padding), old log-probs off the current
    ones by up to +-0.5 nats (so every clipping regime is visited) and advantages of both signs."""
    vocab = len(trainer.processing_class)
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(len(SPECIAL_TOKENS), vocab, (ROWS, PROMPT), generator=g)
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[1, :3] = 0
    completion_ids = torch.randint(len(SPECIAL_TOKENS), vocab, (ROWS, COMPLETION), generator=g)
    completion_mask = torch.ones_like(completion_ids)
    completion_mask[2, 5:] = 0
    completion_mask[3, :] = 0
    inputs = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": torch.tensor([1.0, -1.5, 0.5, 0.0]),
        "num_items_in_batch": completion_mask.sum() * trainer.args.steps_per_generation,
    }
    with torch.no_grad():
        logps, _, _ = completion_logps(trainer._get_per_token_logps_and_entropies, trainer.model, inputs)
    inputs["old_per_token_logps"] = logps + (torch.rand(logps.shape, generator=g) - 0.5)
    return inputs


def _loss_and_grads(trainer, inputs):
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def _assert_same(fused, full):
    (loss_f, grads_f), (loss_u, grads_u) = fused, full
    assert loss_f.item() != 0
    torch.testing.assert_close(loss_f, loss_u, rtol=RTOL, atol=ATOL)
    assert grads_f.keys() == grads_u.keys() and grads_f
    for name in grads_f:
        torch.testing.assert_close(grads_f[name], grads_u[name], rtol=RTOL, atol=ATOL, msg=name)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lm_head")
    return _trainer(tmp, fused=True), _trainer(tmp, fused=False)


def test_the_log_probs_and_entropies_are_the_full_logits_ones(pair):
    fused, full = pair
    inputs = _batch(fused)
    logps_f, entropy_f, _ = completion_logps(fused._get_per_token_logps_and_entropies, fused.model, inputs)
    logps_u, entropy_u, _ = completion_logps(full._get_per_token_logps_and_entropies, full.model, inputs)
    torch.testing.assert_close(logps_f, logps_u, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(entropy_f, entropy_u, rtol=RTOL, atol=ATOL)
    # the reference itself: the model's own logits at temperature 0.7, log-softmaxed, at the completion tokens
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    with torch.no_grad():
        logits = full.model(input_ids=ids, attention_mask=mask).logits[:, PROMPT - 1 : -1] / 0.7
    expected = logits.log_softmax(-1).gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    real = inputs["completion_mask"].bool()
    torch.testing.assert_close(logps_u[real], expected[real], rtol=RTOL, atol=ATOL)
    assert torch.all(logps_u[~real] == 0)


@pytest.mark.parametrize("loss_name", ["dapo", "gspo", "cispo", "dispo", "sft"])
def test_every_log_prob_loss_trains_the_same_fused_and_unfused(pair, loss_name):
    fused, full = pair
    inputs = _batch(fused)
    for trainer in pair:
        trainer.objective_loss = LOSSES[loss_name]
    try:
        _assert_same(_loss_and_grads(fused, inputs), _loss_and_grads(full, inputs))
    finally:
        for trainer in pair:
            trainer.objective_loss = LOSSES["dapo"]


def test_the_distillation_jsd_is_the_same_chunked_and_from_full_logits(tmp_path):
    settings = dict(distillation="on", distill_chunk_size=4, teacher_base_url=None, distill_teacher="tiny-teacher")
    fused = _trainer(tmp_path / "f", True, 1.0, tiny_text_model(seed=1), **settings)
    full = _trainer(tmp_path / "u", False, 1.0, tiny_text_model(seed=1), **settings)
    inputs = _batch(fused)
    _assert_same(_loss_and_grads(fused, inputs), _loss_and_grads(full, inputs))


def test_generation_is_untouched_by_the_reference_path(pair):
    fused, full = pair
    ids = torch.tensor([[len(SPECIAL_TOKENS) + 5, len(SPECIAL_TOKENS) + 9]])
    with torch.no_grad():
        torch.testing.assert_close(fused.model(input_ids=ids).logits, full.model(input_ids=ids).logits)


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_fused_head_scores_the_loss_positions_only_with_the_same_outputs(monkeypatch, layout):
    # TRL's PyTorch tiles score every position handed to them; score_loss_positions hands them only the states
    # predicting a loss position and gives back the same per-token outputs and gradients. Padded, those run from
    # the first completion column on; in a packed row each sequence's completion sits between prompts, which a
    # cut from the first loss position on would all have scored.
    import trl.trainer.utils as trl_utils

    from zppo_trl.lm_head import score_loss_positions

    g = torch.Generator().manual_seed(0)
    vocab = len(tiny_tokenizer())
    ids = torch.randint(len(SPECIAL_TOKENS), vocab, (ROWS, PROMPT + COMPLETION), generator=g)
    mask = torch.ones_like(ids)
    if layout == "padded":
        mask[1, :3] = 0  # a left-padded prompt
        labels = ids.masked_fill(mask == 0, -100)
        labels[:, :PROMPT] = -100
        labels[2, PROMPT + 5 :] = -100  # a short completion
        scored = ROWS * COMPLETION
    else:  # one row of three sequences: prompt, completion, prompt, completion, prompt, completion (of 11, 5, 11)
        ids, mask = ids.reshape(1, -1)[:, :54], mask.reshape(1, -1)[:, :54]
        labels = ids.clone()
        for start, end in ((0, PROMPT), (18, 18 + PROMPT + 6), (36, 36 + PROMPT)):
            labels[:, start:end] = -100  # the second sequence has a longer prompt, a shorter completion
        scored = int((labels[:, 1:] != -100).sum())
        assert scored == 11 + 5 + 11
    scored_rows = []
    tiles = trl_utils._ChunkedLogProbFunction

    class Spy(tiles):
        @staticmethod
        def forward(ctx, hidden, *args):
            scored_rows.append(hidden.size(0))
            return tiles.forward(ctx, hidden, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Spy)
    outputs = {}
    for trimmed in (False, True):
        model = tiny_text_model(seed=0).train()
        trl_utils.add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
        if trimmed:
            score_loss_positions(model)
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
        (out.log_probs.sum() + out.entropy.sum()).backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        outputs[trimmed] = out, grads
    assert scored_rows == [ids.numel() - ids.size(0), scored]  # only the states predicting a loss position
    (full, full_grads), (trimmed, trimmed_grads) = outputs[False], outputs[True]
    for name in ("log_probs", "entropy", "label_mask"):
        assert getattr(trimmed, name).shape == getattr(full, name).shape
        torch.testing.assert_close(getattr(trimmed, name), getattr(full, name), rtol=RTOL, atol=ATOL, msg=name)
    assert full_grads.keys() == trimmed_grads.keys() and full_grads
    for name in full_grads:
        torch.testing.assert_close(trimmed_grads[name], full_grads[name], rtol=RTOL, atol=ATOL, msg=name)


def test_the_patched_heads_keep_the_models_signature_for_generate():
    # generate() checks its keyword arguments (a VLM's pixel_values) against model.forward's parameters: a
    # wrapper that showed only (*args, **kwargs) made every image rollout fail.
    import inspect

    import trl.trainer.utils as trl_utils

    from zppo_trl.lm_head import score_loss_positions, use_full_logits

    for patch in (score_loss_positions, lambda m: use_full_logits(m, 0.7)):
        model = tiny_text_model(seed=0)
        expected = list(inspect.signature(model.forward).parameters)
        trl_utils.add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
        patch(model)
        assert list(inspect.signature(model.forward).parameters) == expected
        assert "input_ids" in expected and "self" not in expected


def test_scoring_on_a_second_thread_leaves_the_main_threads_generation_alone(tmp_path):
    # overlap_old_logps scores the plain rollouts on a second thread (OldLogProbs.rollouts) while the
    # main thread goes on; a test runs its own generation meanwhile. The scoring pass cuts the hidden states the
    # fused head sees to the loss positions, and must cut its own call only: here the scorer is held inside the
    # model, its cut in place, while the main thread generates as TRL does (checkpointing off around it). A cut
    # registered on the shared backbone for the call's duration once handed that generation no hidden state at
    # all, and checkpointing switched off and on from both threads left hooks behind on the embeddings.
    import threading

    from trl.models.utils import unwrap_model_for_generation

    trainer = _trainer(tmp_path, fused=True)
    model = trainer.model
    checkpointing = {"use_reentrant": False}
    model.gradient_checkpointing_enable(checkpointing)
    g = torch.Generator().manual_seed(1)
    vocab = len(tiny_tokenizer())
    prompt = torch.randint(len(SPECIAL_TOKENS), vocab, (2, PROMPT), generator=g)
    completion = torch.randint(len(SPECIAL_TOKENS), vocab, (1, COMPLETION), generator=g)
    row = dict(
        prompt_ids=prompt[:1],
        prompt_mask=torch.ones_like(prompt[:1]),
        completion_ids=completion,
        completion_mask=torch.ones_like(completion),
    )

    def generate() -> torch.Tensor:
        with unwrap_model_for_generation(model, trainer.accelerator, gradient_checkpointing_kwargs=checkpointing) as m:
            return m.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=False,
                max_new_tokens=COMPLETION,
                min_new_tokens=COMPLETION,
                pad_token_id=0,
            )

    alone_logps, alone_generated = trainer.old_logps.rollouts([(0, row)])[0], generate()
    inside, release = threading.Event(), threading.Event()

    def hold(module, args):
        if threading.current_thread().name == "scorer":
            inside.set()
            assert release.wait(60)

    def score_on_a_thread() -> dict:
        scored = {}
        scorer = threading.Thread(target=lambda: scored.update(trainer.old_logps.rollouts([(0, row)])), name="scorer")
        scorer.start()
        try:
            assert inside.wait(60)
            scored["generated"] = generate()  # while the scorer's cut is in place
        finally:
            release.set()
            scorer.join(60)
        return scored

    held = model.model.layers[-1].register_forward_pre_hook(hold)
    try:
        scored = score_on_a_thread()
    finally:
        held.remove()
    assert scored["generated"].shape == (2, PROMPT + COMPLETION)
    assert torch.equal(scored["generated"], alone_generated)
    assert torch.equal(scored[0], alone_logps) and alone_logps.shape == (COMPLETION,)
    assert model.is_gradient_checkpointing
    # the scorer changes nothing on the model: no hook left behind, none added or removed
    hooks = {name: (len(m._forward_hooks), len(m._forward_pre_hooks)) for name, m in model.named_modules()}
    scorer = threading.Thread(target=lambda: trainer.old_logps.rollouts([(0, row)]))
    scorer.start()
    scorer.join(60)
    assert {name: (len(m._forward_hooks), len(m._forward_pre_hooks)) for name, m in model.named_modules()} == hooks
