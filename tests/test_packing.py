"""Padding-free micro-batches (:mod:`zppo_trl.packing` and the trainer's log-prob passes).

The packed forward pass must give the padded one's numbers: per-token log-probs and entropies at every
completion position within ``ATOL`` (fp32 on CPU; the two passes differ only in float rounding, since
RoPE sees the same distances and attention the same tokens), zeros at padding, and the same gradients.
Hybrid models (Qwen3.5, the paper's students; Qwen3.5-MoE, Qwen3-Next) pack once their Gated DeltaNet layers
are segmented: packed, each sequence gives what it gives alone, with the fused LM head and without, with and
without images; unsegmented, they mix the sequences (the tripwire below). Models packing was not checked on
are refused, warned about once and counted.
"""

from __future__ import annotations

import logging

import pytest
import torch
from datasets import Dataset
from PIL import Image
from tiny_models import tiny_processor, tiny_text_model, tiny_tokenizer, tiny_vlm
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeTextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)
from trl.trainer.utils import add_fused_lm_head

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.packing import batch_refusal, model_refusal, pack, segment_packed_sequences

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
    """The trainer's packed pass: sdpa's attention layers segmented (each sequence alone, causal), eager's through
    the block-diagonal mask the position ids give."""
    assert batch_refusal(mask, keep) is None
    segmented = segment_packed_sequences(model)
    assert segmented == (model.config.num_hidden_layers if model.config._attn_implementation == "sdpa" else 0)
    packed = pack(ids, mask, keep)
    out = model(**packed.model_inputs(), fused_lm_head=True)
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
    assert model_refusal(tiny_vlm().config) is None  # Qwen3.5: its linear attention segmented
    assert model_refusal(_hybrid("qwen3_next").config) is None
    flash = _llama("sdpa").config
    flash._attn_implementation = "flash_attention_2"  # the config alone: flash-attn is not installed here
    assert "'flash_attention_2'" in model_refusal(flash)
    assert "'mistral'" in model_refusal(MistralConfig())
    mamba = tiny_vlm().config
    mamba.text_config.layer_types = ["mamba", "full_attention"]
    assert "['mamba']" in model_refusal(mamba)


# ---------------------------------------------------------------------- hybrid (linear-attention) models


def _hybrid(kind: str, seed: int = 0):
    """A tiny hybrid causal LM: a Gated DeltaNet layer, then a full-attention layer (the tiny VLM's text dims)."""
    text = tiny_vlm().config.text_config
    torch.manual_seed(seed)
    if kind == "qwen3_5":
        return Qwen3_5ForCausalLM(text).eval()
    dims = {
        name: getattr(text, name)
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "linear_conv_kernel_dim",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "layer_types",
        )
    }
    experts = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    if kind == "qwen3_5_moe":
        return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**dims, **experts)).eval()
    return Qwen3NextForCausalLM(Qwen3NextConfig(**dims, **experts, intermediate_size=64)).eval()


def _per_position(model, fused: bool, **inputs):
    """Log-probs and entropies of every next token of the one row of ``inputs`` (``(1, T - 1)`` each): from the
    fused LM head (``labels`` given), or from the full logits."""
    if fused:
        out = model(**inputs, fused_lm_head=True)
        return out.log_probs, out.entropy
    inputs.pop("labels", None)
    logits = model(**inputs).logits[:, :-1].float()
    logps = logits.log_softmax(-1)
    chosen = logps.gather(-1, inputs["input_ids"][:, 1:, None]).squeeze(-1)
    return chosen, -(logps.exp() * logps).sum(-1)


def _alone(model, ids, mask, keep, fused: bool, images=None):
    """Each row of the padded batch run alone (its real tokens, a batch of one, no padding, its own images):
    log-probs and entropies in TRL's ``(B, keep)`` grid, zeros at padding."""
    logps, entropies = [], []
    for i in range(ids.size(0)):
        real = mask[i].bool()
        n = int(real[-keep:].sum())  # the completion is right-padded: its tokens are the first n columns
        row_logps, row_entropies = torch.zeros(keep), torch.zeros(keep)
        if n:
            tokens = ids[i, real][None]
            inputs = dict(input_ids=tokens, labels=tokens.clone(), **(images(i, real) if images else {}))
            lp, ent = _per_position(model, fused, **inputs)
            row_logps = torch.cat([lp[0, -n:], row_logps[n:]])
            row_entropies = torch.cat([ent[0, -n:], row_entropies[n:]])
        logps.append(row_logps)
        entropies.append(row_entropies)
    return torch.stack(logps), torch.stack(entropies)


def _packed_pass(model, ids, mask, keep, fused: bool, **extra):
    packed = pack(ids, mask, keep)
    lp, ent = _per_position(model, fused, **{**packed.model_inputs(), **extra})
    return packed.unpack(lp), packed.unpack(ent)


def _assert_packed_is_alone(build, ids, mask, keep, fused, packed_extra=lambda m: {}, images=None):
    """Packed vs each row alone, on two copies of the same weights: log-probs and entropies within ATOL, and
    the gradients of a masked loss within 1e-4 relative (of each tensor's largest entry)."""
    alone_model, packed_model = build(), build()
    if fused:
        _fused(alone_model), _fused(packed_model)
    assert segment_packed_sequences(packed_model) >= 1
    scored = mask[:, -ids.size(1) + (ids.size(1) - keep) :].bool()
    logps, entropies = _alone(alone_model, ids, mask, keep, fused, images)
    packed_logps, packed_entropies = _packed_pass(packed_model, ids, mask, keep, fused, **packed_extra(packed_model))
    torch.testing.assert_close(packed_logps[scored], logps[scored], rtol=0, atol=ATOL)
    torch.testing.assert_close(packed_entropies[scored], entropies[scored], rtol=0, atol=ATOL)
    assert not packed_logps[~scored].any()
    (logps * scored).sum().add((entropies * scored).sum() * 0.1).backward()
    (packed_logps * scored).sum().add((packed_entropies * scored).sum() * 0.1).backward()
    for (name, p), q in zip(alone_model.named_parameters(), packed_model.parameters(), strict=True):
        if p.grad is None:  # e.g. the vision tower of a text batch
            assert q.grad is None, name
            continue
        assert p.grad.abs().sum() > 0, name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-4 * float(p.grad.abs().max()), msg=name)


@pytest.mark.parametrize("fused", [True, False], ids=["fused-head", "full-logits"])
@pytest.mark.parametrize("kind", ["qwen3_5", "qwen3_5_moe", "qwen3_next"])
def test_hybrid_models_pack_each_sequence_as_alone(kind, fused):
    ids, mask, keep = _batch(_hybrid(kind).config.vocab_size)
    _assert_packed_is_alone(lambda: _hybrid(kind), ids, mask, keep, fused)


def test_the_qwen35_vlm_packs_a_text_batch_as_alone():
    ids, mask, keep = _batch(tiny_vlm().config.text_config.vocab_size)
    _assert_packed_is_alone(tiny_vlm, ids, mask, keep, fused=True)


def _image_batch():
    """A padded Qwen3.5 VLM batch as TRL builds it: rows with one, none and two images of different sizes (so
    different numbers of image tokens), prompts left-padded, random completions right-padded; with the
    processor's ``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids``, and ``num_images``."""
    processor = tiny_processor()
    g = torch.Generator().manual_seed(3)
    sizes = [[(32, 32)], [], [(64, 32), (32, 64)], [(64, 64)]]
    completions = [7, 3, 12, 5]
    rows = []
    for images, n in zip(sizes, completions, strict=True):
        text = "<|im_start|>user\n" + "<|vision_start|><|image_pad|><|vision_end|>" * len(images) + "Which colour?"
        pictures = [Image.new("RGB", size, (40 * len(images), 90, 200)) for size in images]
        rows.append(processor(text=[text], images=pictures or None, return_tensors="pt"))
        rows[-1]["completion"] = torch.randint(20, 200, (n,), generator=g)
    width_p, width_c = max(r["input_ids"].size(1) for r in rows), max(completions)
    ids = torch.zeros(len(rows), width_p + width_c, dtype=torch.long)
    mask, types = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, r in enumerate(rows):
        p, n = r["input_ids"].size(1), r["completion"].numel()
        ids[i, width_p - p : width_p] = r["input_ids"][0]
        ids[i, width_p : width_p + n] = r["completion"]
        mask[i, width_p - p : width_p + n] = 1
        types[i, width_p - p : width_p] = r["mm_token_type_ids"][0]
    multimodal = dict(
        pixel_values=torch.cat([r["pixel_values"] for r in rows if "pixel_values" in r]),
        image_grid_thw=torch.cat([r["image_grid_thw"] for r in rows if "image_grid_thw" in r]),
        num_images=[len(images) for images in sizes],
        mm_token_type_ids=types,
    )
    return ids, mask, width_c, multimodal, rows


@pytest.mark.parametrize("fused", [True, False], ids=["fused-head", "full-logits"])
def test_the_qwen35_vlm_packs_rows_with_images_as_alone(fused):
    ids, mask, keep, multimodal, rows = _image_batch()
    assert multimodal["image_grid_thw"].prod(-1).unique().numel() > 1  # images of different sizes

    def packed_extra(model):  # what the trainer's packed pass adds for images
        inputs = pack(ids, mask, keep).model_inputs(model, ids, multimodal)
        return {name: inputs[name] for name in ("pixel_values", "image_grid_thw", "position_ids")}

    def images(i, real):  # row i alone: its own images, and the model computes its positions
        row = rows[i]
        alone = dict(mm_token_type_ids=multimodal["mm_token_type_ids"][i, real][None])
        if "pixel_values" in row:
            alone.update(pixel_values=row["pixel_values"], image_grid_thw=row["image_grid_thw"])
        return alone

    _assert_packed_is_alone(tiny_vlm, ids, mask, keep, fused, packed_extra, images)


def test_unsegmented_linear_attention_mixes_packed_sequences():
    # Why segment_packed_sequences exists, and a tripwire for the day transformers' PyTorch path separates
    # packed sequences itself: without it, the Gated DeltaNet layer's convolution and recurrent state run
    # across the boundaries, and every sequence after the first is scored wrongly.
    model = _fused(_hybrid("qwen3_5"))
    ids, mask, keep = _batch(model.config.vocab_size)
    scored = mask[:, -keep:].bool()
    packed = pack(ids, mask, keep)
    with torch.no_grad():
        alone, _ = _alone(model, ids, mask, keep, fused=True)
        # the position ids alone (what transformers reads to keep softmax attention apart)
        out = model(
            input_ids=packed.input_ids, position_ids=packed.position_ids, labels=packed.labels, fused_lm_head=True
        )
        mixed = packed.unpack(out.log_probs)
        gap = (mixed - alone)[scored].abs().max()
        segment_packed_sequences(model)
        exact, _ = _packed_pass(model, ids, mask, keep, fused=True)
    assert gap > 1e-3
    torch.testing.assert_close(exact[scored], alone[scored], rtol=0, atol=ATOL)


def test_segmenting_leaves_the_layer_alone_outside_packed_passes():
    # Generation (a cache) and padded batches reach the layers' own forward: same outputs, bit for bit.
    plain, segmented = _hybrid("qwen3_5"), _hybrid("qwen3_5")
    assert segment_packed_sequences(segmented) == 2 and segment_packed_sequences(segmented) == 2  # idempotent
    ids, mask, _ = _batch(plain.config.vocab_size)
    with torch.no_grad():
        assert torch.equal(
            plain(input_ids=ids, attention_mask=mask).logits, segmented(input_ids=ids, attention_mask=mask).logits
        )
        prompt = ids[:1, -10:]
        kwargs = dict(max_new_tokens=4, do_sample=False)
        assert torch.equal(plain.generate(prompt, **kwargs), segmented.generate(prompt, **kwargs))


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
    assert trainer.zppo_state.rank_tally["padded_micro_batches_total"] == 0


def test_the_trainers_packed_pass_with_images_equals_its_padded_pass(tmp_path):
    # The tiny Qwen3.5 VLM (the paper's students' architecture): its linear attention segmented by the trainer,
    # rows with one, no and two images sliced into chunks of 3 and 1 rows as TRL slices them, every chunk packed.
    trainer = _trainer(tmp_path, tiny_vlm(), tiny_processor())
    ids, mask, keep, multimodal, _ = _image_batch()

    def run(padding_free):
        trainer.args.padding_free = padding_free
        return trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, keep, batch_size=3, compute_entropy=True, **multimodal
        )

    (logps, entropies, _), (packed_logps, packed_entropies, _) = run(False), run(True)
    torch.testing.assert_close(packed_logps, logps * mask[:, -keep:], rtol=0, atol=ATOL)
    torch.testing.assert_close(packed_entropies, entropies * mask[:, -keep:], rtol=0, atol=ATOL)
    assert trainer.zppo_state.rank_tally["padded_micro_batches_total"] == 0


def test_a_model_that_cannot_be_packed_runs_padded_warned_once_and_counted(tmp_path, caplog):
    config = MistralConfig(
        vocab_size=len(tiny_tokenizer()), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    trainer = _trainer(tmp_path, MistralForCausalLM(config).eval(), tiny_tokenizer())
    ids, mask, keep = _batch(config.vocab_size)
    trainer.args.padding_free = False
    expected, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)
    trainer.args.padding_free = True
    with caplog.at_level(logging.WARNING, logger="zppo_trl.trainer"):
        for _ in range(3):
            logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, batch_size=2)
    warnings = [r.getMessage() for r in caplog.records if "padding_free" in r.getMessage()]
    assert len(warnings) == 1 and "mistral" in warnings[0] and "not one packing was checked on" in warnings[0]
    assert trainer.zppo_state.rank_tally["padded_micro_batches_total"] == 3 * 2  # two chunks of 2 rows per call
    torch.testing.assert_close(logps, expected, rtol=0, atol=ATOL)


def test_batches_that_cannot_be_packed_run_padded_warned_once_per_reason(tmp_path, caplog):
    trainer = _trainer(tmp_path, tiny_text_model(), tiny_tokenizer())
    ids, mask, keep = _batch(trainer.model.config.vocab_size)
    holed = mask.clone()
    holed[1, 10] = 0  # padding inside row 1's prompt
    with caplog.at_level(logging.WARNING, logger="zppo_trl.trainer"):
        for _ in range(2):
            trainer._get_per_token_logps_and_entropies(trainer.model, ids, holed, keep, batch_size=2)
            types = torch.zeros_like(ids)  # multimodal inputs to a text model: only Qwen3.5 VLMs pack them
            trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, mm_token_type_ids=types)
    warnings = [r.getMessage() for r in caplog.records if "padding_free" in r.getMessage()]
    assert len(warnings) == 2
    assert "qwen3" in warnings[0] and "padding between its tokens" in warnings[0]
    assert "multimodal inputs (mm_token_type_ids)" in warnings[1]
    # per call: the holed chunk (rows 0-1; rows 2-3 are packed) and the multimodal batch's one chunk
    assert trainer.zppo_state.rank_tally["padded_micro_batches_total"] == 2 * (1 + 1)
