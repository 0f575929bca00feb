"""Shared-prompt micro-batches (:mod:`zppo_trl.shared_prompts` and the trainer's log-prob passes).

Laid out with each distinct prompt once, a micro-batch must give the padded pass's numbers: per-token log-probs
and entropies at every completion position within ``ATOL`` (fp32 on CPU: the passes differ only in float
rounding), zeros at padding, and the same gradients, on Llama (SmolLM2, the demo's student) and Qwen3. Models and
batches it was not checked on run as without it, warned once per reason and counted.
"""

from __future__ import annotations

import logging

import pytest
import torch
from test_packing import ATOL, GRAD_TOL, _llama, _qwen3
from test_packing import _trainer as _packing_trainer
from tiny_models import tiny_tokenizer, tiny_vlm
from trl.trainer.utils import add_fused_lm_head

from zppo_trl.shared_prompts import share_prompts, shared_refusal


def _groups(vocab: int, seed: int = 0):
    """TRL's layout for two groups of three rollouts (prompts of 9 and 30 tokens; completions of different
    lengths, one of them empty: a zero-weight row) and a row whose prompt no other row shares, rows interleaved."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(10, vocab, (n,), generator=g) for n in (9, 30, 4)]
    rows = [(0, 5), (1, 12), (0, 0), (2, 7), (1, 3), (0, 12), (1, 1)]  # (prompt, completion tokens)
    width_p, width_c = 30, 12
    ids = torch.zeros(len(rows), width_p + width_c, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(rows):
        prompt = prompts[p]
        ids[i, width_p - len(prompt) : width_p] = prompt
        ids[i, width_p : width_p + c] = torch.randint(10, vocab, (c,), generator=g)
        mask[i, width_p - len(prompt) : width_p + c] = 1
    return ids, mask, width_c


def test_the_layout_holds_each_prompt_once_and_each_completion_after_it():
    ids, mask, keep = _groups(100)
    shared = share_prompts(ids, mask, keep)
    assert (shared.prompts, shared.rows) == (3, 6)  # the empty row is left out
    # each prompt but its last token once; then per rollout that token and its completion
    assert shared.input_ids.size(1) == (8 + 29 + 3) + (1 + 5) + (1 + 12) + (1 + 12) + (1 + 3) + (1 + 1) + (1 + 7)
    # the first group: prompt 0 at positions 0-7, its rollouts' segments each from position 8
    assert shared.position_ids[0, :8].tolist() == list(range(8))
    assert shared.position_ids[0, 8:14].tolist() == list(range(8, 14))
    assert shared.position_ids[0, 14:27].tolist() == list(range(8, 21))
    m = shared.attention_mask[0, 0]
    # a completion sees its prompt and itself causally, not the other rollout of its prompt nor another prompt
    assert m[20, :8].all() and m[20, 14:21].all() and not m[20, 21:].any() and not m[20, 8:14].any()
    assert not m[:8, 8:].any() and not m[30, :8].any()
    # labels: the completion tokens only; the outputs that predict them are the tokens just before
    scored = shared.labels[0] != -100
    assert int(scored.sum()) == int(mask[:, -keep:].sum())
    # read in TRL's row-major order, the outputs' next tokens are the micro-batch's completion tokens
    assert torch.equal(shared.labels[0, shared.sources + 1], ids[:, -keep:][mask[:, -keep:].bool()])
    assert torch.equal(shared.input_ids[0, shared.sources + 1], ids[:, -keep:][mask[:, -keep:].bool()])


@pytest.mark.parametrize("build", [_llama, _qwen3], ids=["llama", "qwen3"])
def test_the_shared_pass_equals_the_padded_pass_with_its_gradients(tmp_path, build):
    model = build("sdpa")
    trainer = _packing_trainer(tmp_path, model, tiny_tokenizer(), padding_free=False)
    model, vocab = trainer.model, trainer.model.config.vocab_size
    ids, mask, keep = _groups(min(vocab, 300))

    def run(shared):
        trainer.args.shared_prompt_forward = shared
        model.zero_grad(set_to_none=True)
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            model, ids, mask, keep, batch_size=5, compute_entropy=True
        )
        (logps * mask[:, -keep:]).sum().backward()
        return (
            logps.detach(),
            entropies,
            {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        )

    (logps, entropies, grads), (s_logps, s_entropies, s_grads) = run(False), run(True)
    torch.testing.assert_close(s_logps, logps * mask[:, -keep:], rtol=0, atol=ATOL)
    torch.testing.assert_close(s_entropies, entropies * mask[:, -keep:], rtol=0, atol=ATOL)
    assert grads.keys() == s_grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(s_grads[name], grads[name], **GRAD_TOL, msg=name)
    assert trainer.zppo_state.rank_tally["unshared_micro_batches_total"] == 0


def test_models_and_batches_it_was_not_checked_on_run_unshared_warned_once_and_counted(tmp_path, caplog, monkeypatch):
    assert "not sdpa" in shared_refusal(_llama("eager").config)
    assert "qwen3_5" in shared_refusal(tiny_vlm().config)
    trainer = _packing_trainer(tmp_path, _llama("eager"), tiny_tokenizer(), padding_free=False)
    ids, mask, keep = _groups(300)
    expected, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, batch_size=4)
    trainer.args.shared_prompt_forward = True
    with caplog.at_level(logging.WARNING, logger="zppo_trl.logp_paths"):
        for _ in range(2):
            logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, batch_size=4)
    torch.testing.assert_close(logps, expected, rtol=0, atol=0)
    warnings = [r.getMessage() for r in caplog.records if "shared_prompt_forward" in r.getMessage()]
    assert len(warnings) == 1 and "llama" in warnings[0] and "not sdpa" in warnings[0]
    tally = trainer.zppo_state.rank_tally
    assert tally["unshared_micro_batches_total"] == 2 * 2  # two chunks of 4 and 3 rows per call

    trainer = _packing_trainer(tmp_path, _llama("sdpa"), tiny_tokenizer(), padding_free=False)
    trainer.args.shared_prompt_forward = True
    holed = mask.clone()
    holed[1, 20] = 0  # padding inside row 1's prompt: its chunk runs padded, the other is shared
    trainer._get_per_token_logps_and_entropies(trainer.model, ids, holed, keep, batch_size=4)
    assert trainer.zppo_state.rank_tally["unshared_micro_batches_total"] == 1
    # a micro-batch of zero-weight rows only (a rank's share with every rollout empty) runs padded: all zeros
    bare = mask.clone()
    bare[:, -keep:] = 0
    logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, bare, keep, batch_size=4)
    assert logps.shape == (ids.size(0), keep)
    assert trainer.zppo_state.rank_tally["unshared_micro_batches_total"] == 1 + 2  # both chunks

    # a micro-batch whose shared row would pass the cap runs packed with padding_free (the same numbers)
    monkeypatch.setattr("zppo_trl.shared_prompts.MAX_SHARED_TOKENS", 60)
    trainer.args.padding_free = True
    with caplog.at_level(logging.WARNING, logger="zppo_trl.logp_paths"):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, batch_size=4)
    tally = trainer.zppo_state.rank_tally
    assert tally["unshared_micro_batches_total"] == 3 + 1  # rows 0-3 (67 tokens shared), not 4-6 (56)
    assert trainer.zppo_state.rank_tally["padded_micro_batches_total"] == 0
    assert any("more than 60 tokens" in r.getMessage() for r in caplog.records)
    trainer.args.shared_prompt_forward = trainer.args.padding_free = False
    expected, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, batch_size=4)
    torch.testing.assert_close(logps, expected * mask[:, -keep:], rtol=0, atol=ATOL)


def test_the_fused_head_scores_only_completion_positions():
    # The layout's labels reach TRL's fused head as a packed row's: only completion positions are scored.
    model = _llama("sdpa")
    add_fused_lm_head(model)
    ids, mask, keep = _groups(300)
    shared = share_prompts(ids, mask, keep)
    out = model(**shared.model_inputs(), fused_lm_head=True)
    assert out.log_probs.shape == (1, shared.input_ids.size(1) - 1)
    assert shared.unpack(out.log_probs).shape == mask[:, -keep:].shape
