"""VLM processors: saved as the standard Qwen3VLProcessor, loaded on either kind of machine."""

import json

import pytest
from tiny_models import save_tiny_vlm, tiny_processor
from transformers import Qwen3VLProcessor
from transformers.models.auto.processing_auto import processor_class_from_name
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

from zppo_trl import processing
from zppo_trl.processing import ImageOnlyQwen3VLProcessor, load_processor


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")


def _files(directory):
    return {path.name: path.read_text() for path in directory.iterdir() if path.suffix in (".json", ".jinja")}


def test_a_saved_processor_is_a_standard_qwen3vl_processor(tmp_path):
    tiny_processor().save_pretrained(tmp_path)
    files = _files(tmp_path)
    assert not any("ImageOnly" in text for text in files.values()), "no file may name the image-only class"
    config = json.loads(files["processor_config.json"])
    assert config["processor_class"] == "Qwen3VLProcessor"
    assert json.loads(files["tokenizer_config.json"])["processor_class"] == "Qwen3VLProcessor"
    # what AutoProcessor resolves that name to where torchvision is installed
    assert processor_class_from_name(config["processor_class"]) is Qwen3VLProcessor
    # ... and the video processor it then builds: the standard one at the image processor's patch sizes
    video = config["video_processor"]
    assert video["video_processor_type"] == "Qwen3VLVideoProcessor"
    assert (video["patch_size"], video["temporal_patch_size"], video["merge_size"]) == (16, 2, 2)
    assert Qwen3VLVideoProcessor(**{k: v for k, v in video.items() if k != "video_processor_type"}).patch_size == 16


def test_load_and_save_keep_the_checkpoints_video_config(vlm_dir, tmp_path):
    config_path = vlm_dir / "processor_config.json"
    config = json.loads(config_path.read_text())
    config["video_processor"]["fps"] = 3  # a setting of the checkpoint's own, not the default
    config_path.write_text(json.dumps(config))
    processor = load_processor(str(vlm_dir))
    assert isinstance(processor, ImageOnlyQwen3VLProcessor) and processor.image_processor is not None
    processor.save_pretrained(tmp_path)
    resaved = json.loads((tmp_path / "processor_config.json").read_text())
    assert resaved["video_processor"]["fps"] == 3 and resaved["processor_class"] == "Qwen3VLProcessor"
    with pytest.raises(ValueError, match="upload the folder"):
        processor.save_pretrained(tmp_path, push_to_hub=True)


def test_a_vision_checkpoint_that_yields_a_tokenizer_is_an_error(vlm_dir, tmp_path, monkeypatch):
    # A checkpoint written by an older zppo-trl names its processor "ImageOnlyQwen3VLProcessor".
    # Where torchvision is installed, AutoProcessor cannot resolve that name and falls back to the
    # tokenizer (seen on an H100). This machine has no torchvision, so take that branch explicitly:
    # the AutoProcessor call and its fallback below are the real ones.
    old = tmp_path / "old"
    old.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (old / name).write_bytes((vlm_dir / name).read_bytes())
    config = json.loads((vlm_dir / "processor_config.json").read_text())
    del config["video_processor"]
    config["processor_class"] = "ImageOnlyQwen3VLProcessor"
    (old / "processor_config.json").write_text(json.dumps(config))
    monkeypatch.setattr(processing, "has_torchvision", lambda: True)
    with pytest.raises(RuntimeError, match=r"without an image processor.*save_pretrained"):
        load_processor(str(old))
