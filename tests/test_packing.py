"""Padding-free micro-batches (:mod:`zppo_trl.packing` and the trainer's log-prob passes).

The packed forward pass must give the padded one's numbers: per-token log-probs and entropies at every
completion position within ``ATOL`` (fp32 on CPU; the two passes differ only in float rounding, since
RoPE sees the same distances and attention the same tokens), zeros at padding, and the same gradients.
Models that packing would get wrong (Qwen3.5's linear attention in transformers' PyTorch path) are
refused, warned about once and counted.
"""

from __future__ import annotations

import logging

import pytest
import torch
from datasets import Dataset
from tiny_models import tiny_processor, tiny_text_model, tiny_tokenizer, tiny_vlm
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, Qwen3_5ForConditionalGeneration
from trl.trainer.utils import add_fused_lm_head

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.packing import batch_refusal, model_refusal, pack

ATOL = 1e-5  # log-probs and entropies (fp32), packed vs padded
GRAD_TOL = dict(rtol=1e-4, atol=1e-5)

# Rows of very different lengths: (prompt tokens, completion tokens); the third row's completion is all
# padding (a zero-weight row), the last has a one-token prompt.
ROWS = [(5, 7), (40, 3), (12, 0), (1, 25)]


def _batch(vocab: int, rows=ROWS, seed: int = 0):
    """TRL's layout: prompts left-padded, completions right-padded, random real tokens."""
    g = torch.Generator().manual_seed(seed)
    width_p, width_c = max(p for p, _ in rows), max(c for _, c in rows)
    ids = torch.zeros(len(rows), width_p + width_c, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(rows):
        ids[i, width_p - p : width_p + c] = torch.randint(10, vocab, (p + c,), generator=g)
        mask[i, width_p - p : width_p + c] = 1
    return ids, mask, width_c


def _qwen3(attention: str):
    model = tiny_text_model()
    model.set_attn_implementation(attention)
    return model


def _llama(attention: str):
    """A tiny `LlamaForCausalLM`, the architecture of SmolLM2 (the demo's student)."""
    config = LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        attn_implementation=attention,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _fused(model):
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    return model


def _padded(model, ids, mask, keep):
    """TRL's padded pass: labels on the real completion tokens, the last ``keep`` outputs."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def _packed(model, ids, mask, keep):
    assert batch_refusal(mask, keep) is None
    packed = pack(ids, mask, keep)
    out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, labels=packed.labels, fused_lm_head=True)
    return packed.unpack(out.log_probs), packed.unpack(out.entropy)


# ---------------------------------------------------------------------- pack / unpack


def test_pack_and_unpack_a_hand_made_batch():
    # logits_to_keep=2: columns 0-1 hold the prompts (left-padded), 2-3 the completions (right-padded).
    # Row 1 has no token at all, row 3 a prompt and no completion.
    ids = torch.tensor([[11, 12, 13, 0], [0, 0, 0, 0], [0, 14, 15, 16], [17, 18, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [0, 1, 1, 1], [1, 1, 0, 0]])
    assert batch_refusal(mask, 2) is None
    packed = pack(ids, mask, 2)
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 15, 16, 17, 18]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 0, 1]]
    assert packed.labels.tolist() == [[-100, -100, 13, -100, 15, 16, -100, -100]]
    assert packed.scored.tolist() == [[True, False], [False, False], [True, True], [False, False]]
    # The fused head's output p is about packed token p + 1; with output p = 10 * (p + 1), each completion
    # cell reads 10 x its token's packed index (13 is token 2, 15 and 16 tokens 4 and 5).
    outputs = torch.arange(1, 8, dtype=torch.float32)[None] * 10
    assert packed.unpack(outputs).tolist() == [[20.0, 0.0], [0.0, 0.0], [40.0, 50.0], [0.0, 0.0]]


def test_unpack_is_differentiable():
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 0]])
    mask = (ids != 0).long()
    packed = pack(ids, mask, 2)  # packed: 5 6 7 8 9 10; completions: 6 7 and 10
    outputs = torch.randn(1, packed.input_ids.size(1) - 1, requires_grad=True)
    packed.unpack(outputs).sum().backward()
    # exactly the outputs that predict a completion token receive a gradient (outputs 0, 1 and 4)
    assert outputs.grad.tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0]]


@pytest.mark.parametrize(
    ("mask", "reason"),
    [
        ([[1, 0, 1, 1]], "padding between its tokens"),  # a gap would shift RoPE's distances
        ([[0, 0, 1, 1]], "no prompt token before it"),  # its first token would be predicted from the row before
        ([[0, 0, 0, 0]], "no tokens"),
    ],
)
def test_batches_that_cannot_be_packed_say_why(mask, reason):
    assert reason in batch_refusal(torch.tensor(mask), 2)


# ---------------------------------------------------------------------- which models


@pytest.mark.parametrize(
    "build",
    [lambda: _qwen3("sdpa"), lambda: _qwen3("eager"), lambda: _llama("sdpa"), lambda: _llama("eager")],
    ids=["qwen3-sdpa", "qwen3-eager", "llama-sdpa", "llama-eager"],
)
def test_packed_log_probs_entropies_and_gradients_equal_the_padded_ones(build):
    padded_model, packed_model = _fused(build()), _fused(build())
    assert model_refusal(packed_model.config) is None
    ids, mask, keep = _batch(packed_model.config.vocab_size)
    scored = mask[:, -keep:].bool()
    logps, entropies = _padded(padded_model, ids, mask, keep)
    packed_logps, packed_entropies = _packed(packed_model, ids, mask, keep)
    torch.testing.assert_close(packed_logps[scored], logps[scored], rtol=0, atol=ATOL)
    torch.testing.assert_close(packed_entropies[scored], entropies[scored], rtol=0, atol=ATOL)
    assert not packed_logps[~scored].any() and not packed_entropies[~scored].any()
    assert scored[2].sum() == 0 and scored.sum() == sum(c for _, c in ROWS)
    # the gradients of a masked loss over the completions
    (logps * scored).sum().add((entropies * scored).sum() * 0.1).backward()
    (packed_logps * scored).sum().add((packed_entropies * scored).sum() * 0.1).backward()
    for (name, p), q in zip(padded_model.named_parameters(), packed_model.parameters(), strict=True):
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        torch.testing.assert_close(q.grad, p.grad, **GRAD_TOL, msg=name)


def test_which_models_are_packed():
    assert model_refusal(_qwen3("sdpa").config) is None
    assert model_refusal(_llama("eager").config) is None
    assert "Gated DeltaNet" in model_refusal(tiny_vlm().config)
    flash = _llama("sdpa").config
    flash._attn_implementation = "flash_attention_2"  # the config alone: flash-attn is not installed here
    assert "'flash_attention_2'" in model_refusal(flash)
    assert "'mistral'" in model_refusal(MistralConfig())


def test_qwen35_linear_attention_mixes_packed_sequences():
    # Why Qwen3.5 is refused, and a tripwire for the day transformers' PyTorch path separates packed
    # sequences: its full-attention layers and 1-D text positions pack exactly; its Gated DeltaNet
    # layers do not (their convolution and recurrent state run across the boundaries).
    def variant(layer_types):
        config = tiny_vlm().config
        config.text_config.layer_types = layer_types
        torch.manual_seed(0)
        return _fused(Qwen3_5ForConditionalGeneration(config).eval())

    ids, mask, keep = _batch(tiny_vlm().config.text_config.vocab_size)
    scored = mask[:, -keep:].bool()
    with torch.no_grad():
        full = variant(["full_attention", "full_attention"])
        torch.testing.assert_close(
            _packed(full, ids, mask, keep)[0][scored], _padded(full, ids, mask, keep)[0][scored], rtol=0, atol=ATOL
        )
        linear = variant(["linear_attention", "full_attention"])
        gap = (_packed(linear, ids, mask, keep)[0] - _padded(linear, ids, mask, keep)[0])[scored].abs().max()
    assert gap > 1e-3


# ---------------------------------------------------------------------- the trainer


QUESTIONS = [
    dict(id=f"q{i}", question=f"What is {i} + {i}?", images=[], answer=str(2 * i), source="toy", subdataset="sum")
    for i in range(8)
]


def _trainer(tmp_path, model, processing_class, padding_free=True) -> ZPPOTrainer:
    args = ZPPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=6,
        num_partitions=2,
        augmentations=[],
        padding_free=padding_free,
        disable_tqdm=True,
    )
    return ZPPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list(QUESTIONS),
        processing_class=processing_class,
    )


def test_the_trainers_packed_pass_equals_its_padded_pass_in_chunks(tmp_path):
    trainer = _trainer(tmp_path, tiny_text_model(), tiny_tokenizer())
    ids, mask, keep = _batch(trainer.model.config.vocab_size, ROWS + ROWS[::-1], seed=1)

    def run(padding_free):
        trainer.args.padding_free = padding_free
        return trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, keep, batch_size=3, compute_entropy=True
        )

    (logps, entropies, _), (packed_logps, packed_entropies, _) = run(False), run(True)
    torch.testing.assert_close(packed_logps, logps * mask[:, -keep:], rtol=0, atol=ATOL)
    torch.testing.assert_close(packed_entropies, entropies * mask[:, -keep:], rtol=0, atol=ATOL)
    assert trainer.counters["padded_micro_batches_total"] == 0


def test_a_model_that_cannot_be_packed_runs_padded_warned_once_and_counted(tmp_path, caplog):
    trainer = _trainer(tmp_path, tiny_vlm(), tiny_processor())
    ids, mask, keep = _batch(trainer.model.config.text_config.vocab_size)
    trainer.args.padding_free = False
    expected, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)
    trainer.args.padding_free = True
    with caplog.at_level(logging.WARNING, logger="zppo_trl.trainer"):
        for _ in range(3):
            logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, batch_size=2)
    warnings = [r.getMessage() for r in caplog.records if "padding_free" in r.getMessage()]
    assert len(warnings) == 1 and "qwen3_5_text" in warnings[0] and "Gated DeltaNet" in warnings[0]
    assert trainer.counters["padded_micro_batches_total"] == 3 * 2  # two chunks of 2 rows per call
    torch.testing.assert_close(logps, expected, rtol=0, atol=ATOL)


def test_batches_that_cannot_be_packed_run_padded_warned_once_per_reason(tmp_path, caplog):
    trainer = _trainer(tmp_path, tiny_text_model(), tiny_tokenizer())
    ids, mask, keep = _batch(trainer.model.config.vocab_size)
    holed = mask.clone()
    holed[1, 10] = 0  # padding inside row 1's prompt
    with caplog.at_level(logging.WARNING, logger="zppo_trl.trainer"):
        for _ in range(2):
            trainer._get_per_token_logps_and_entropies(trainer.model, ids, holed, keep, batch_size=2)
            types = torch.zeros_like(ids)
            trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, mm_token_type_ids=types)
    warnings = [r.getMessage() for r in caplog.records if "padding_free" in r.getMessage()]
    assert len(warnings) == 2
    assert "qwen3" in warnings[0] and "padding between its tokens" in warnings[0]
    assert "multimodal inputs (mm_token_type_ids)" in warnings[1]
    # per call: the holed chunk (rows 0-1; rows 2-3 are packed) and the multimodal batch's one chunk
    assert trainer.counters["padded_micro_batches_total"] == 2 * (1 + 1)
