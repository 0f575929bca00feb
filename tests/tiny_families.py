"""Tiny random students of the two non-Qwen families of the paper's backbone appendix, built in-process.

The paper's appendix (`sec:appendix:backbone_families`) trains InternVL3.5-2B and Ovis2.5-2B
with the Qwen3.5-2B recipe. Here each family is a random `InternVLForConditionalGeneration` /
`Ovis2ForConditionalGeneration` (text hidden 64 on a two-layer Qwen3 language model, as both
released students build on Qwen3-1.7B, one vision layer) with that family's processor: the
PIL image processor (torchvision is not installable here), a byte-level BPE tokenizer trained
on the same corpus as :mod:`tiny_models` with the family's image tokens, and a chat template
that writes the family's image placeholder for an image part. transformers has no Ovis2.5
code (only the remote code on the Hub), so the Ovis student is transformers' Ovis2, which
shares Ovis2.5's visual embedding table and processor placeholders.

Images are 32x32 and the vision towers see one 28x28 tile (InternVL: 4 tokens after the
pixel shuffle; Ovis2: 4 visual tokens), so a prompt with one image stays short.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from tiny_models import _CORPUS, _text_dims
except ImportError:
    from tests.tiny_models import _CORPUS, _text_dims

FAMILIES = ("internvl", "ovis2")

_QWEN_CHAT = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# InternVL: an image is <img> + <IMG_CONTEXT> x tokens + </img>; the chat template writes <IMG_CONTEXT>.
_INTERNVL_TOKENS = {
    "start_image_token": "<img>",
    "end_image_token": "</img>",
    "context_image_token": "<IMG_CONTEXT>",
    "video_token": "<video>",
}
# Ovis2: the chat template writes <image>; the processor expands it into atoms between indicator tokens.
_OVIS_INDICATORS = ["<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>"]
_OVIS_TOKENS = ["<image>", "<IMG_ATOM>", *_OVIS_INDICATORS]

_PLACEHOLDER = {"internvl": "<IMG_CONTEXT>", "ovis2": "<image>"}


def chat_template(family: str) -> str:
    """A Qwen-style chat template (both families' language models are Qwen3) writing ``family``'s image placeholder."""
    placeholder = _PLACEHOLDER[_check(family)]
    return (
        "{%- for message in messages -%}"
        "{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for part in message['content'] -%}"
        "{%- if part['type'] in ('image', 'image_url') -%}" + placeholder + "{{ '\\n' }}"
        "{%- elif part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
        "{{ '<|im_end|>\\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
    )


def _check(family: str) -> str:
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    return family


def tiny_family_tokenizer(family: str):
    """A byte-level BPE tokenizer with Qwen's chat tokens and ``family``'s image tokens (a fresh copy per call)."""
    return copy.deepcopy(_trained_tokenizer(_check(family)))


@functools.cache
def _trained_tokenizer(family: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    image_tokens = list(_INTERNVL_TOKENS.values()) if family == "internvl" else _OVIS_TOKENS
    special = [*_QWEN_CHAT, *image_tokens]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_CORPUS * 4, trainer=trainer)
    # InternVLProcessor reads its image tokens as tokenizer attributes (start_image_token, ...).
    named = dict(_INTERNVL_TOKENS) if family == "internvl" else {}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=special[3:],
        extra_special_tokens=named,
    )
    tokenizer.chat_template = chat_template(family)
    return tokenizer


def tiny_family_processor(family: str):
    """``family``'s processor (PIL image processor, no video processor) over :func:`tiny_family_tokenizer`."""
    tokenizer = tiny_family_tokenizer(family)
    if _check(family) == "internvl":
        from transformers import GotOcr2ImageProcessorPil

        from zppo_trl.processing import ImageOnlyInternVLProcessor

        image_processor = GotOcr2ImageProcessorPil(size={"height": 28, "width": 28}, crop_to_patches=False)
        return ImageOnlyInternVLProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            image_seq_length=4,
            chat_template=chat_template(family),
        )
    from transformers import Ovis2ImageProcessorPil

    from zppo_trl.processing import GridsAsListsOvis2Processor

    image_processor = Ovis2ImageProcessorPil(size={"height": 28, "width": 28}, crop_to_patches=False)
    return GridsAsListsOvis2Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_length=4, chat_template=chat_template(family)
    )


def tiny_family_vlm(family: str, seed: int = 0):
    """A random student of ``family`` matching :func:`tiny_family_processor`."""
    import torch

    tokenizer = tiny_family_tokenizer(family)
    text_config = dict(
        _text_dims(len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id),
        model_type="qwen3",
        bos_token_id=None,
    )
    if _check(family) == "internvl":
        from transformers import InternVLConfig, InternVLForConditionalGeneration

        config = InternVLConfig(
            text_config=text_config,
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                patch_size=7,  # 4x4 patches, 2x2 after the pixel shuffle: image_seq_length 4
            ),
            image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
            image_seq_length=4,
            tie_word_embeddings=True,
        )
        cls = InternVLForConditionalGeneration
    else:
        from transformers import Ovis2Config, Ovis2ForConditionalGeneration

        config = Ovis2Config(
            text_config=text_config,
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                patch_size=14,  # 2x2 patches: 4 visual tokens per image
                vocab_size=32,
                hidden_stride=1,
            ),
            image_token_id=tokenizer.convert_tokens_to_ids("<IMG_ATOM>"),
            visual_indicator_token_ids=tokenizer.convert_tokens_to_ids(_OVIS_INDICATORS),
            vocab_size=len(tokenizer),
            hidden_size=64,
            tie_word_embeddings=True,
        )
        cls = Ovis2ForConditionalGeneration
    torch.manual_seed(seed)
    return cls(config).eval()


def save_tiny_family_vlm(family: str, directory: str | Path, seed: int = 0) -> Path:
    """Write ``family``'s tiny student and its processor to ``directory``."""
    directory = Path(directory)
    tiny_family_vlm(family, seed).save_pretrained(directory)
    tiny_family_processor(family).save_pretrained(directory)
    return directory
