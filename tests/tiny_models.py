"""Tiny random models built locally, for tests that must never touch the Hub.

One byte-level BPE tokenizer (trained in-process on a small corpus) serves both the
text student (`Qwen3ForCausalLM`) and the vision-language student
(`Qwen3_5ForConditionalGeneration` with a `Qwen3VLProcessor`). torchvision is not
installable here, so the processor uses `Qwen2VLImageProcessorPil` and no video processor.
Everything is cached per process; `save_*` writes a directory that `from_pretrained` and
`transformers serve` load offline.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
]

# A Qwen-style chat template that renders string content and lists of text/image parts.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ('image', 'image_url') -%}<|vision_start|><|image_pad|><|vision_end|>"
    "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

_CORPUS = [
    "You FIRST think about the reasoning process as an internal monologue and then provide the final answer.",
    "The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE put in \\boxed{}.",
    "What is 12 + 30? <think> 12 plus 30 is 42. </think> The answer is \\boxed{42}.",
    "Compute 7 * 6. The product is \\boxed{42}. Simplify 1/2 + 1/4 = \\boxed{3/4}.",
    "Here are two candidate responses in <candidate> </candidate> tags to the question above.",
    "The following answers are all WRONG: \\boxed{3}, \\boxed{5}. Below are the incorrect reasoning processes.",
    "Compress the response below into a summary. <summary> x = 5 </summary>",
    '{"verdict": "correct"} {"verdict": "wrong"} the angle is 30^\\circ and 45%.',
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 50 100 1000",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?()[]{}+-*/=<>'\"\\_^%$#@&|~`",
]


def tiny_tokenizer():
    """A byte-level BPE `PreTrainedTokenizerFast` with Qwen's special tokens and chat template.

    Trained once per process; every call returns a fresh copy, because saving a processor
    writes into its tokenizer (``processor_class``) and must not leak into the next model.
    """
    return copy.deepcopy(_trained_tokenizer())


@functools.cache
def _trained_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _text_dims(vocab_size: int, **overrides) -> dict:
    dims = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        # head_dim 64: vLLM's CPU attention rejects 16 (the vLLM-served tests use these models)
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    dims.update(overrides)
    return dims


def tiny_text_model(seed: int = 0):
    """A random `Qwen3ForCausalLM` (hidden size 64) matching :func:`tiny_tokenizer`."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = tiny_tokenizer()
    config = Qwen3Config(
        **_text_dims(len(tokenizer)),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config).eval()


def tiny_processor():
    """An image-only `Qwen3VLProcessor` over :func:`tiny_tokenizer` (PIL image processor, no video)."""
    from transformers import Qwen2VLImageProcessorPil

    from zppo_trl.processing import ImageOnlyQwen3VLProcessor

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, min_pixels=32 * 32, max_pixels=64 * 64
    )
    return ImageOnlyQwen3VLProcessor(
        image_processor=image_processor, tokenizer=tiny_tokenizer(), chat_template=CHAT_TEMPLATE
    )


def tiny_vlm(seed: int = 0):
    """A random `Qwen3_5ForConditionalGeneration` (text hidden 64, one vision block)."""
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    tokenizer = tiny_tokenizer()
    text_config = _text_dims(
        len(tokenizer),
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention", "full_attention"],
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    vision_config = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=64,
        num_position_embeddings=64,
    )
    config = Qwen3_5Config(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|vision_end|>"),
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return Qwen3_5ForConditionalGeneration(config).eval()


def save_tiny_text_model(directory: str | Path, seed: int = 0) -> Path:
    """Write the tiny text model and its tokenizer to ``directory`` (for `transformers serve`)."""
    directory = Path(directory)
    tiny_text_model(seed).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def save_tiny_hybrid_text_model(directory: str | Path, seed: int = 0) -> Path:
    """Write a random `Qwen3_5ForCausalLM` (the tiny VLM's text stack: a Gated DeltaNet layer and a full-attention
    layer, the hybrid architecture of the paper's students) and its tokenizer to ``directory``."""
    import torch
    from transformers import Qwen3_5ForCausalLM

    directory = Path(directory)
    torch.manual_seed(seed)
    Qwen3_5ForCausalLM(tiny_vlm(seed).config.text_config).save_pretrained(directory)
    tiny_tokenizer().save_pretrained(directory)
    return directory


def save_tiny_vlm(directory: str | Path, seed: int = 0) -> Path:
    """Write the tiny VLM and its processor to ``directory``."""
    directory = Path(directory)
    tiny_vlm(seed).save_pretrained(directory)
    tiny_processor().save_pretrained(directory)
    return directory
