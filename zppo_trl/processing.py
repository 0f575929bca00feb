"""Loading the student's processor, also on machines without torchvision, and saving it so any machine loads it.

Qwen's VL processors declare a video processor, and transformers can only build the
processor with one where torchvision is installed. Training and the corpus builder only need
images, so where torchvision is missing we build an image-only variant: the same processor
class with the PIL image processor and no video processor. On a GPU cluster (torchvision
present) `load_processor` is plain `AutoProcessor.from_pretrained`.

A checkpoint saved from the image-only variant must load on either kind of machine, so it is
saved as the standard `Qwen3VLProcessor` would save it: that class name, and a video
processor configuration (the one the checkpoint came with, or the standard one at the image
processor's patch sizes). Otherwise `AutoProcessor` on a torchvision machine cannot resolve
the class and silently returns the tokenizer, and a VLM student then fails in TRL with
``KeyError: 'pixel_values'``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

from transformers import AutoConfig, AutoProcessor, AutoTokenizer, Qwen3VLProcessor

__all__ = ["STANDARD_PROCESSOR_CLASS", "ImageOnlyQwen3VLProcessor", "has_torchvision", "load_processor"]

# The class name every Qwen3-VL / Qwen3.5 checkpoint's processor is saved under.
STANDARD_PROCESSOR_CLASS = Qwen3VLProcessor.__name__
_QWEN_VL_MODEL_TYPES = {"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"}


def has_torchvision() -> bool:
    """Whether torchvision can be imported (transformers needs it for video processors)."""
    return importlib.util.find_spec("torchvision") is not None


def _standard_video_config(image_processor: Any) -> dict:
    """The standard Qwen3-VL video processor configuration at ``image_processor``'s patch sizes."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    sizes = {
        name: getattr(image_processor, name)
        for name in ("patch_size", "temporal_patch_size", "merge_size")
        if hasattr(image_processor, name)
    }
    # Building the configuration object needs no torchvision; only processing videos does.
    return json.loads(Qwen3VLVideoProcessor(**sizes).to_json_string())


class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
    """`Qwen3VLProcessor` (Qwen3-VL, Qwen3.5) without a video processor.

    Text and image processing are Qwen3VLProcessor's own; passing videos raises. It saves as a
    standard ``Qwen3VLProcessor`` (class name and video processor configuration included), so a
    checkpoint written here loads with `AutoProcessor` where torchvision is installed.

    Args:
        image_processor, tokenizer, chat_template: as for `Qwen3VLProcessor`.
        video_processor: the video processor *configuration* (a dict) to save with the
            processor; by default the standard one at the image processor's patch sizes.
    """

    @classmethod
    def get_attributes(cls):
        return ["image_processor", "tokenizer"]

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, video_processor=None, **kwargs):
        if video_processor is not None and not isinstance(video_processor, dict):
            raise ValueError(
                "ImageOnlyQwen3VLProcessor takes a video processor configuration (a dict), not a video processor"
            )
        # The parent passes (image, tokenizer, video) positionally; ProcessorMixin pairs them
        # with get_attributes(), so the missing video processor is never type-checked.
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)
        self.video_processor = None
        self.video_processor_config = video_processor or _standard_video_config(image_processor)

    def __call__(self, images=None, text=None, videos=None, **kwargs):
        if videos is not None:
            raise ValueError("this processor was built without a video processor (torchvision is not installed)")
        return super().__call__(images=images, text=text, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        output = super().to_dict()
        output.pop("video_processor_config", None)
        output["video_processor"] = dict(self.video_processor_config)
        output["processor_class"] = STANDARD_PROCESSOR_CLASS
        return output

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        """Save as a standard ``Qwen3VLProcessor``; upload the saved folder to push it (as `Trainer` does)."""
        if push_to_hub:
            raise ValueError("save the processor, then upload the folder (Trainer.push_to_hub does both)")
        saved = super().save_pretrained(save_directory, **kwargs)
        # ProcessorMixin stamps the tokenizer with this class's own name: stamp the standard one.
        self.tokenizer._set_processor_class(STANDARD_PROCESSOR_CLASS)
        self.tokenizer.save_pretrained(save_directory)
        return saved


def _video_config(name_or_path: str) -> dict | None:
    """The video processor configuration a local checkpoint carries (nested or in its own file)."""
    if not os.path.isdir(name_or_path):
        return None
    nested = os.path.join(name_or_path, "processor_config.json")
    if os.path.isfile(nested):
        with open(nested) as f:
            config = json.load(f).get("video_processor")
        if isinstance(config, dict):
            return config
    own = os.path.join(name_or_path, "video_preprocessor_config.json")
    if os.path.isfile(own):
        with open(own) as f:
            return json.load(f)
    return None


def load_processor(name_or_path: str, **kwargs):
    """The processor for a student checkpoint (local path or Hub id).

    Text-only checkpoints get their tokenizer. Qwen VL checkpoints get `AutoProcessor` when
    torchvision is installed and :class:`ImageOnlyQwen3VLProcessor` with
    `Qwen2VLImageProcessorPil` otherwise. Raises a clear error when a checkpoint with a vision
    config does not yield a processor with an image processor, instead of handing a VLM
    student a tokenizer.
    """
    config = AutoConfig.from_pretrained(name_or_path, **kwargs)
    if getattr(config, "vision_config", None) is None:
        return AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if has_torchvision():
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
        if getattr(processor, "image_processor", None) is None:
            raise RuntimeError(
                f"{name_or_path}: a vision-language checkpoint ({config.model_type}), but AutoProcessor returned a "
                f"{type(processor).__name__} without an image processor: its processor files name a class this "
                "machine cannot build (an older zppo-trl saved 'ImageOnlyQwen3VLProcessor' "
                "without a video processor). "
                "Copy the base model's processor files into the checkpoint, or re-save them with this zppo-trl "
                "where torchvision is not installed: load_processor(path).save_pretrained(path)"
            )
        return processor
    if config.model_type not in _QWEN_VL_MODEL_TYPES:
        raise RuntimeError(
            f"{name_or_path}: a {config.model_type!r} processor needs torchvision, which is not installed; "
            "install torchvision or pass the processor explicitly"
        )
    from transformers import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil.from_pretrained(name_or_path, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    return ImageOnlyQwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
        video_processor=_video_config(name_or_path),
    )
