"""Loading the student's processor, also on machines without torchvision, and saving it so any machine loads it.

Qwen's VL processors (Qwen3-VL, Qwen3.5) and InternVL's declare a video processor, and
transformers can only build those processors with one where torchvision is installed.
Training and the corpus builder only need images, so where torchvision is missing we build an
image-only variant: the same processor class with the family's PIL image processor and no video
processor. Ovis2's processor has no video processor; it loads as
:class:`GridsAsListsOvis2Processor` on every machine (a transformers 5.23 bug, see there). On a GPU
cluster (torchvision present) `load_processor` is otherwise plain `AutoProcessor.from_pretrained`.

A checkpoint saved from an image-only variant must load on either kind of machine, so it is
saved as the standard processor would save it: the standard class name, and a video
processor configuration (the one the checkpoint came with, or the standard one at the image
processor's settings). Otherwise `AutoProcessor` on a torchvision machine cannot resolve
the class and silently returns the tokenizer, and a VLM student then fails in TRL with
``KeyError: 'pixel_values'``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

import torch
from transformers import AutoConfig, AutoProcessor, AutoTokenizer, InternVLProcessor, Ovis2Processor, Qwen3VLProcessor

__all__ = [
    "STANDARD_PROCESSOR_CLASS",
    "ImageOnlyInternVLProcessor",
    "ImageOnlyQwen3VLProcessor",
    "GridsAsListsOvis2Processor",
    "has_torchvision",
    "load_processor",
]

# The class name every Qwen3-VL / Qwen3.5 checkpoint's processor is saved under.
STANDARD_PROCESSOR_CLASS = Qwen3VLProcessor.__name__
_QWEN_VL_MODEL_TYPES = {"qwen3_vl", "qwen3_vl_moe", "qwen3_5", "qwen3_5_moe"}
_INTERNVL_MODEL_TYPES = {"internvl"}
_OVIS2_MODEL_TYPES = {"ovis2"}


def has_torchvision() -> bool:
    """Whether torchvision can be imported (transformers needs it for video processors)."""
    return importlib.util.find_spec("torchvision") is not None


def _standard_qwen_video_config(image_processor: Any) -> dict:
    """The standard Qwen3-VL video processor configuration at ``image_processor``'s patch sizes."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    sizes = {
        name: getattr(image_processor, name)
        for name in ("patch_size", "temporal_patch_size", "merge_size")
        if hasattr(image_processor, name)
    }
    # Building the configuration object needs no torchvision; only processing videos does.
    return json.loads(Qwen3VLVideoProcessor(**sizes).to_json_string())


def _standard_internvl_video_config(image_processor: Any) -> dict:
    """The InternVL video processor configuration matching ``image_processor`` (frames are resized and
    normalised as images are). Written as data: InternVL's video processor module imports torchvision."""
    saved = image_processor.to_dict()  # JSON-ready (sizes as plain dicts)
    names = ("size", "image_mean", "image_std", "do_resize", "do_rescale", "do_normalize", "rescale_factor")
    return {"video_processor_type": "InternVLVideoProcessor", **{k: saved[k] for k in names if k in saved}}


class _SavesAsStandard:
    """Saves under the standard processor class ``_standard`` (mixed in before it), so `AutoProcessor` on
    any machine builds the standard class from the saved files."""

    _standard: type

    def to_dict(self) -> dict[str, Any]:
        output = super().to_dict()
        output["processor_class"] = self._standard.__name__
        return output

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        """Save as the standard processor; upload the saved folder to push it (as `Trainer` does)."""
        if push_to_hub:
            raise ValueError("save the processor, then upload the folder (Trainer.push_to_hub does both)")
        saved = super().save_pretrained(save_directory, **kwargs)
        # ProcessorMixin stamps the tokenizer with this class's own name: stamp the standard one.
        self.tokenizer._set_processor_class(self._standard.__name__)
        self.tokenizer.save_pretrained(save_directory)
        return saved


class _ImageOnly(_SavesAsStandard):
    """The image-only behaviour shared by :class:`ImageOnlyQwen3VLProcessor` and
    :class:`ImageOnlyInternVLProcessor`; mixed in before the standard processor class.

    Subclasses set ``_standard`` (the processor class they save as) and ``_standard_video_config``
    (the video processor configuration to save when the checkpoint carried none).
    """

    _standard_video_config: Any

    @classmethod
    def get_attributes(cls):
        return ["image_processor", "tokenizer"]

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, video_processor=None, **kwargs):
        if video_processor is not None and not isinstance(video_processor, dict):
            raise ValueError(
                f"{type(self).__name__} takes a video processor configuration (a dict), not a video processor"
            )
        # The parents take (image, tokenizer, video) positionally; ProcessorMixin pairs them with
        # get_attributes(), so the missing video processor is never type-checked.
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)
        self.video_processor = None
        self.video_processor_config = video_processor or type(self)._standard_video_config(image_processor)

    def __call__(self, images=None, text=None, videos=None, **kwargs):
        if videos is not None:
            raise ValueError("this processor was built without a video processor (torchvision is not installed)")
        return super().__call__(images=images, text=text, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        output = super().to_dict()
        output.pop("video_processor_config", None)
        output["video_processor"] = dict(self.video_processor_config)
        return output


class ImageOnlyQwen3VLProcessor(_ImageOnly, Qwen3VLProcessor):
    """`Qwen3VLProcessor` (Qwen3-VL, Qwen3.5) without a video processor.

    Text and image processing are Qwen3VLProcessor's own; passing videos raises. It saves as a
    standard ``Qwen3VLProcessor`` (class name and video processor configuration included), so a
    checkpoint written here loads with `AutoProcessor` where torchvision is installed.

    Args:
        image_processor, tokenizer, chat_template: as for `Qwen3VLProcessor`.
        video_processor: the video processor *configuration* (a dict) to save with the
            processor; by default the standard one at the image processor's patch sizes.
    """

    _standard = Qwen3VLProcessor
    _standard_video_config = staticmethod(_standard_qwen_video_config)


class ImageOnlyInternVLProcessor(_ImageOnly, InternVLProcessor):
    """`InternVLProcessor` (InternVL3, InternVL3.5) without a video processor.

    Text and image processing are InternVLProcessor's own; passing videos raises. It saves as a
    standard ``InternVLProcessor`` (class name and video processor configuration included).

    Args:
        image_processor, tokenizer, chat_template: as for `InternVLProcessor`.
        video_processor: the video processor *configuration* (a dict) to save with the
            processor; by default InternVL's, at the image processor's size and normalisation.
        image_seq_length: as for `InternVLProcessor` (tokens per image tile).
    """

    _standard = InternVLProcessor
    _standard_video_config = staticmethod(_standard_internvl_video_config)

    def __init__(
        self, image_processor=None, tokenizer=None, chat_template=None, video_processor=None, image_seq_length=256
    ):
        # Spelled out: ProcessorMixin saves the settings it finds in __init__'s signature.
        super().__init__(
            image_processor,
            tokenizer,
            chat_template,
            video_processor=video_processor,
            image_seq_length=image_seq_length,
        )


class GridsAsListsOvis2Processor(_SavesAsStandard, Ovis2Processor):
    """`Ovis2Processor` that also renders a chat template with ``tokenize=True`` and no tensors.

    transformers 5.23's ``Ovis2Processor.replace_image_token`` calls ``.tolist()`` on each image's
    grid, which is a list when no ``return_tensors`` is asked for, as TRL's prompt tokenization
    (``apply_chat_template(tokenize=True)``) asks: ``AttributeError: 'list' object has no attribute
    'tolist'`` (transformers/models/ovis2/processing_ovis2.py, line 44). Here the grids reach it as
    tensors; everything else is Ovis2Processor's own, and it saves as a standard ``Ovis2Processor``.
    """

    _standard = Ovis2Processor

    def replace_image_token(self, image_inputs: dict, image_idx: int, **kwargs) -> str:
        grids = image_inputs["grids"]
        if not hasattr(grids[image_idx], "tolist"):
            image_inputs = {**image_inputs, "grids": [torch.as_tensor(grid) for grid in grids]}
        return super().replace_image_token(image_inputs, image_idx, **kwargs)


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


def _processor_settings(name_or_path: str, **kwargs) -> dict:
    """The processor's own settings a checkpoint saved (e.g. InternVL's ``image_seq_length``)."""
    from transformers.utils import cached_file

    path = cached_file(name_or_path, "processor_config.json", _raise_exceptions_for_missing_entries=False, **kwargs)
    if path is None:
        return {}
    with open(path) as f:
        config = json.load(f)
    return {k: v for k, v in config.items() if k not in ("processor_class", "image_processor", "video_processor")}


def _image_only(name_or_path: str, model_type: str, **kwargs):
    """The image-only processor of a Qwen VL or InternVL checkpoint, built from its PIL image processor."""
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    video = _video_config(name_or_path)
    if model_type in _QWEN_VL_MODEL_TYPES:
        from transformers import Qwen2VLImageProcessorPil

        image_processor = Qwen2VLImageProcessorPil.from_pretrained(name_or_path, **kwargs)
        return ImageOnlyQwen3VLProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
            video_processor=video,
        )
    from transformers import GotOcr2ImageProcessorPil

    image_processor = GotOcr2ImageProcessorPil.from_pretrained(name_or_path, **kwargs)
    settings = _processor_settings(name_or_path, **kwargs)
    return ImageOnlyInternVLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
        video_processor=video,
        **({"image_seq_length": settings["image_seq_length"]} if "image_seq_length" in settings else {}),
    )


def load_processor(name_or_path: str, **kwargs):
    """The processor for a student checkpoint (local path or Hub id).

    Text-only checkpoints get their tokenizer. Vision-language checkpoints get `AutoProcessor`
    when torchvision is installed; without it, Qwen VL checkpoints get
    :class:`ImageOnlyQwen3VLProcessor` with `Qwen2VLImageProcessorPil` and InternVL checkpoints
    :class:`ImageOnlyInternVLProcessor` with `GotOcr2ImageProcessorPil`. Ovis2 checkpoints get
    :class:`GridsAsListsOvis2Processor` on either kind of machine. Raises a clear error when a
    checkpoint with a vision config does not yield a processor with an image processor, instead
    of handing a VLM student a tokenizer.
    """
    config = AutoConfig.from_pretrained(name_or_path, **kwargs)
    if getattr(config, "vision_config", None) is None:
        return AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if not has_torchvision() and config.model_type in _QWEN_VL_MODEL_TYPES | _INTERNVL_MODEL_TYPES:
        return _image_only(name_or_path, config.model_type, **kwargs)
    if config.model_type in _OVIS2_MODEL_TYPES:
        return GridsAsListsOvis2Processor.from_pretrained(name_or_path, **kwargs)
    try:
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except (ImportError, AttributeError) as error:  # a video processor needs torchvision (AttributeError in 5.2x)
        raise RuntimeError(
            f"{name_or_path}: a {config.model_type!r} processor needs torchvision, which is not installed "
            f"({type(error).__name__}: {error}); install torchvision or pass the processor explicitly"
        ) from error
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
