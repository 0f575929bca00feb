"""Loading the student's processor, also on machines without torchvision.

Qwen's VL processors declare a video processor, and transformers can only build one with
torchvision installed. Training and the corpus builder only need images, so where
torchvision is missing we build an image-only variant: the same processor class with
the PIL image processor and no video processor. On a GPU cluster (torchvision present)
`load_processor` is plain `AutoProcessor.from_pretrained`.
"""

from __future__ import annotations

import importlib.util

from transformers import AutoConfig, AutoProcessor, AutoTokenizer, Qwen3VLProcessor

__all__ = ["ImageOnlyQwen3VLProcessor", "has_torchvision", "load_processor"]


def has_torchvision() -> bool:
    """Whether torchvision can be imported (transformers needs it for video processors)."""
    return importlib.util.find_spec("torchvision") is not None


class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
    """`Qwen3VLProcessor` (Qwen3-VL, Qwen3.5) without a video processor.

    Text and image processing are Qwen3VLProcessor's own; passing videos raises.
    """

    @classmethod
    def get_attributes(cls):
        return ["image_processor", "tokenizer"]

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # The parent passes (image, tokenizer, video) positionally; ProcessorMixin pairs them
        # with get_attributes(), so the missing video processor is never type-checked.
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)
        self.video_processor = None

    def __call__(self, images=None, text=None, videos=None, **kwargs):
        if videos is not None:
            raise ValueError("this processor was built without a video processor (torchvision is not installed)")
        return super().__call__(images=images, text=text, **kwargs)


def load_processor(name_or_path: str, **kwargs):
    """The processor for a student checkpoint (local path or Hub id).

    Text-only checkpoints get their tokenizer. Qwen VL checkpoints get
    `AutoProcessor` when torchvision is installed and :class:`ImageOnlyQwen3VLProcessor`
    with `Qwen2VLImageProcessorPil` otherwise.
    """
    config = AutoConfig.from_pretrained(name_or_path, **kwargs)
    if getattr(config, "vision_config", None) is None:
        return AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if has_torchvision():
        return AutoProcessor.from_pretrained(name_or_path, **kwargs)
    if config.model_type not in {"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"}:
        raise RuntimeError(
            f"{name_or_path}: a {config.model_type!r} processor needs torchvision, which is not installed; "
            "install torchvision or pass the processor explicitly"
        )
    from transformers import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil.from_pretrained(name_or_path, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    return ImageOnlyQwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=tokenizer.chat_template)
