"""The paper's two students outside Qwen3.5 (its backbone appendix): InternVL and Ovis.

Tiny random students of both families (``tiny_families.py``) go through the project's processor
path (load, save as the standard class, reload), a checkpoint that reloads with the same logits,
the trainer's image batches, a GRPO† training run with images and a checkpoint, and a ZPPO step
against the VLM teacher server the Qwen tests use. The rows are named by their backbone.
"""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset
from tiny_families import FAMILIES, save_tiny_family_vlm, tiny_family_processor, tiny_family_vlm
from transformers import InternVLProcessor, Ovis2Processor
from transformers.models.auto.processing_auto import processor_class_from_name
from trl import ModelConfig

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.backbones import backbone_family, unsupported_reason
from zppo_trl.batches import concat_batches, select_rows
from zppo_trl.processing import GridsAsListsOvis2Processor, ImageOnlyInternVLProcessor, load_processor
from zppo_trl.recipe import RecipeError, load_student

try:
    from boxed_models import completion, toy_conversation, toy_image, toy_rows
except ImportError:
    from tests.boxed_models import completion, toy_conversation, toy_image, toy_rows

STANDARD = {"internvl": InternVLProcessor, "ovis2": Ovis2Processor}
LOADED = {"internvl": ImageOnlyInternVLProcessor, "ovis2": GridsAsListsOvis2Processor}
IMAGE_TOKEN = {"internvl": "<IMG_CONTEXT>", "ovis2": "<IMG_ATOM>"}


def _inputs(processor, rows):
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is 6 * 7?"}]}]
    text = processor.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    return processor(images=[[toy_image(r)] for r in rows], text=[text] * len(rows), padding=True, return_tensors="pt")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_processor_saves_as_the_standard_class_and_reloads_the_same(family, tmp_path):
    directory = save_tiny_family_vlm(family, tmp_path / "model")
    config = json.loads((directory / "processor_config.json").read_text())
    assert config["processor_class"] == STANDARD[family].__name__
    assert processor_class_from_name(config["processor_class"]) is STANDARD[family]  # what AutoProcessor builds
    assert config["image_seq_length"] == 4  # the family's setting survives (not the class default 256)
    if family == "internvl":  # the video processor a torchvision machine builds
        assert config["video_processor"]["video_processor_type"] == "InternVLVideoProcessor"
    reloaded = load_processor(str(directory))
    assert type(reloaded) is LOADED[family]
    rows = toy_rows("vlm")[:2]
    before, after = _inputs(tiny_family_processor(family), rows), _inputs(reloaded, rows)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    tokens = reloaded.tokenizer.convert_ids_to_tokens(after["input_ids"][0])
    assert tokens.count(IMAGE_TOKEN[family]) == 4  # the image reached the prompt as the family's tokens


def test_ovis2_renders_a_tokenized_chat_template_with_an_image():
    # transformers 5.23's Ovis2Processor fails here (a list grid has no .tolist()); TRL tokenizes prompts so.
    conversation = [{"role": "user", "content": [{"type": "image", "image": toy_image(toy_rows()[0])}]}]
    out = tiny_family_processor("ovis2").apply_chat_template([conversation], tokenize=True, return_dict=True)
    assert out["input_ids"][0].count(tiny_family_processor("ovis2").tokenizer.convert_tokens_to_ids("<IMG_ATOM>")) == 4


@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_student_reloads_through_the_recipe_with_the_same_logits(family, tmp_path):
    directory = save_tiny_family_vlm(family, tmp_path / "model", seed=3)
    model, processor = load_student(ModelConfig(model_name_or_path=str(directory), dtype="float32"))
    assert type(model) is type(tiny_family_vlm(family)) and type(processor) is LOADED[family]
    inputs = _inputs(processor, toy_rows("vlm")[:2])
    with torch.no_grad():
        expected = tiny_family_vlm(family, seed=3)(**inputs).logits
        assert torch.equal(model.eval()(**inputs).logits, expected)
        # ... and the image changes them: the pixels reach the language model
        other = {**inputs, "pixel_values": torch.zeros_like(inputs["pixel_values"])}
        assert not torch.allclose(model(**other).logits, expected)


def test_the_backbone_names_the_row_and_qwen_rows_keep_their_names():
    assert backbone_family("OpenGVLab/InternVL3_5-2B-HF") == "InternVL3.5-2B"
    assert backbone_family("AIDC-AI/Ovis2.5-2B") == "Ovis2.5-2B"
    assert backbone_family("outputs/run/checkpoint-40", "internvl") == "InternVL"
    assert backbone_family("Qwen/Qwen3.5-2B", "qwen3_5") is None and backbone_family("x", "llama") is None
    settings = dict(
        output_dir="/tmp/unused", use_cpu=True, report_to=[], teacher_base_url="http://t", teacher_model="t"
    )
    assert ZPPOConfig(**settings, student_family="InternVL3.5-2B").variant == "ZPPO (InternVL3.5-2B)"
    assert ZPPOConfig(**settings, student_family="Ovis2.5-2B", augmentations=[]).variant == "GRPO\u2020 (Ovis2.5-2B)"
    assert (
        ZPPOConfig(**settings, student_family="InternVL", policy_objective="gspo").variant == "ZPPO (GSPO, InternVL)"
    )
    assert ZPPOConfig(**settings).variant == "ZPPO"
    assert unsupported_reason("ovis2_5") and unsupported_reason("ovis2") is None


def _scored(family, n_rows: int, n_completion: int, seed: int) -> dict:
    """A scored round as TRL returns one for ``family``: images as one pixel_values entry per image."""
    g = torch.Generator().manual_seed(seed)
    pixels = _inputs(tiny_family_processor(family), toy_rows("vlm")[:n_rows])["pixel_values"]
    return {
        "prompt_ids": torch.randint(5, 50, (n_rows, 7), generator=g),
        "prompt_mask": torch.ones(n_rows, 7, dtype=torch.long),
        "completion_ids": torch.randint(5, 50, (n_rows, n_completion), generator=g),
        "completion_mask": torch.ones(n_rows, n_completion, dtype=torch.long),
        "advantages": torch.randn(n_rows, generator=g),
        "pixel_values": pixels,
        "num_images": [1] * n_rows,
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_image_batches_regroup_rows_with_their_own_pixels(family):
    first, second = _scored(family, 3, 4, 0), _scored(family, 2, 6, 1)
    merged = concat_batches([first, second], pad_token_id=0)
    picked = select_rows(merged, [4, 0])
    assert picked["num_images"] == [1, 1]
    assert torch.equal(picked["pixel_values"], torch.cat([second["pixel_values"][1:2], first["pixel_values"][0:1]]))
    # InternVL with tiles: each row's tiles travel with it
    tiled = {**first, "pixel_values": torch.cat([first["pixel_values"]] * 2), "num_tiles": [1, 2, 3]}
    picked = select_rows(concat_batches([tiled], pad_token_id=0), [2])
    assert picked["num_tiles"] == [3] and torch.equal(picked["pixel_values"], tiled["pixel_values"][3:6])
    with pytest.raises(ValueError, match="neither image_grid_thw nor num_tiles"):
        concat_batches([{**first, "num_images": [1, 1, 2]}], pad_token_id=0)


def test_a_family_this_project_cannot_train_is_refused_with_the_reason(tmp_path, monkeypatch):
    directory = save_tiny_family_vlm("ovis2", tmp_path / "model")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "ovis2_5"}))
    monkeypatch.setattr("zppo_trl.recipe.student_config", lambda *a, **k: type("C", (), {"model_type": "ovis2_5"}))
    with pytest.raises(RecipeError, match="Ovis2.5 has no transformers code"):
        load_student(ModelConfig(model_name_or_path=str(directory)))


# ---------------------------------------------------------------------- training (integration)


def _coin(prompts, completions, id, **kwargs):
    """A pseudo-random 0/1 reward of the completion text, so groups mix right and wrong."""
    return [float(sum(map(ord, str(c))) % 2) for c in completions]


def _config(tmp_path, **overrides) -> ZPPOConfig:
    settings = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=6,
        num_partitions=2,
        gradient_accumulation_steps=1,
        augmentations=[],
        replay_fraction=0.25,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        max_steps=2,
        seed=0,
        disable_tqdm=True,
    )
    settings.update(overrides)
    return ZPPOConfig(**settings)


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_grpo_dagger_trains_with_images_and_its_checkpoint_reloads(family, tmp_path):
    model = tiny_family_vlm(family)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = ZPPOTrainer(
        model=model,
        reward_funcs=_coin,
        args=_config(tmp_path),
        train_dataset=Dataset.from_list(toy_rows("vlm")[:8]),
        processing_class=tiny_family_processor(family),
    )
    assert trainer.args.variant == {"internvl": "GRPO\u2020 (InternVL)", "ovis2": "GRPO\u2020 (Ovis2)"}[family]
    seen = []
    original = trainer._get_per_token_logps_and_entropies

    def spy(model, input_ids, *args, **kwargs):  # what the loss's forward receives
        seen.append((input_ids, kwargs.get("pixel_values"), kwargs.get("num_images")))
        return original(model, input_ids, *args, **kwargs)

    trainer._get_per_token_logps_and_entropies = spy
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not torch.equal(start[k], v) for k, v in trainer.model.state_dict().items())
    image_id = trainer.processing_class.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN[family])
    assert seen and all(p is not None and n and p.size(0) == sum(n) for _, p, n in seen)
    assert all(int((ids == image_id).sum()) == 4 * sum(n) for ids, _, n in seen)  # 4 tokens per image, every row

    checkpoint = tmp_path / "out" / "checkpoint-2"
    model, processor = load_student(ModelConfig(model_name_or_path=str(checkpoint), dtype="float32"))
    assert type(processor) is LOADED[family]
    inputs = _inputs(processor, toy_rows("vlm")[:2])
    with torch.no_grad():
        assert torch.equal(model.eval()(**inputs).logits, trainer.model.eval()(**inputs).logits)


def _boxing_student(family: str, rows: list[dict], steps: int = 120):
    """A tiny ``family`` student fine-tuned (seconds) to answer each of ``rows`` (toy image questions) in the paper's
    format with ``\\boxed{42}`` or ``\\boxed{0}``, one time in two each: a random student never boxes an answer,
    and a BCQ or NCQ instance needs a wrong student answer whose box parses. Two toy questions have the answer 42,
    so their plain groups are right about half the time (a signal to train on); the others are all wrong, and
    hard. Fitted on the rows the test trains on only, since it samples on no others (the cost is per row). All
    of them in one right-padded batch, the loss on each sequence's answer tokens; 120 steps reach the mixture's
    entropy."""
    import torch.nn.functional as F

    model, processor = tiny_family_vlm(family), tiny_family_processor(family)
    texts, images, answer_lengths = [], [], []
    for row in rows:
        prompt = processor.apply_chat_template(toy_conversation(row), tokenize=False, add_generation_prompt=True)
        for answer in ("42", "0"):
            target = completion(answer)
            texts.append(prompt + target)
            images.append(row["images"])
            answer_lengths.append(len(processor.tokenizer(target, add_special_tokens=False)["input_ids"]))
    side, processor.tokenizer.padding_side = processor.tokenizer.padding_side, "right"
    inputs = dict(processor(text=texts, images=images, padding=True, return_tensors="pt"))
    processor.tokenizer.padding_side = side  # the trainer is given the processor as it was
    labels = torch.full_like(inputs["input_ids"], -100)
    for i, (length, n) in enumerate(zip(inputs["attention_mask"].sum(1).tolist(), answer_lengths)):
        labels[i, length - n : length] = inputs["input_ids"][i, length - n : length]
    labels = labels[:, 1:]
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        logits = model(**inputs).logits[:, :-1]
        loss = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=-100, reduction="sum"
        )
        (0.5 * loss / len(texts)).backward()
        # clipped: unclipped, lr 1e-2 spiked the loss near its floor on one CPU (an AMD EPYC) and the InternVL
        # student ended far from the mixture, boxing neither answer
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return model.eval(), processor


@pytest.mark.integration
@pytest.mark.parametrize("family", FAMILIES)
def test_a_zppo_step_trains_bcq_and_ncq_groups_with_images_for_the_family(family, boxed_vlm_teacher_server, tmp_path):
    """GRPO+Both with a student of ``family`` that boxes its answers, and the Qwen VLM teacher of the Qwen tests (the
    same teacher, as in the paper), one rollout step over six image questions: the hard ones get BCQ and NCQ
    instances, the student samples a group on each reformulated prompt with the question's image in it, and the
    step's partitions (BCQ/NCQ groups dealt in with the plain ones) train the weights."""
    from zppo_trl.rewards import boxed_accuracy_reward

    calls = []

    def reward(prompts, completions, answer, **kwargs):
        calls.append(prompts)
        return boxed_accuracy_reward(completions, answer)

    rows = toy_rows("vlm")[:6]  # all six drawn in each rollout step; toy-00 and toy-02 have the answer 42
    assert [row["answer"] for row in rows].count("42") == 2
    model, processor = _boxing_student(family, rows)
    trainer = ZPPOTrainer(
        model=model,
        reward_funcs=reward,
        args=_config(
            tmp_path,
            augmentations=["bcq", "ncq"],
            per_device_train_batch_size=12,
            max_completion_length=32,
            augment_fraction=1.0,
            replay_fraction=0.0,
            teacher_base_url=boxed_vlm_teacher_server.base_url,
            teacher_model=boxed_vlm_teacher_server.model,
            teacher_max_tokens=32,
            compression_max_tokens=48,
            save_strategy="no",
            max_steps=2,  # one rollout step: its two partitions
        ),
        train_dataset=Dataset.from_list(rows),
        processing_class=processor,
    )
    assert trainer.args.variant.startswith("GRPO+Both (")  # BCQ and NCQ without the buffer, and the family
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "zppo/hard" in h]
    assert len(logs) == 1 and all(h["zppo/hard"] > 0 for h in logs), logs
    assert sum(h["zppo/hard_bcq_possible"] + h["zppo/hard_ncq_only"] for h in logs) > 0, logs  # boxed wrong answers
    trained = sum(h.get("zppo/bcq_trained", 0) + h.get("zppo/ncq_trained", 0) for h in logs)
    assert trained > 0 and sum(h.get("zppo/bcq", 0) for h in logs) > 0, logs
    reformulated = [p for prompts in calls for p in prompts if "<candidate>" in str(p[-1]["content"])]
    assert len(reformulated) == trained * trainer.num_generations
    for prompt in reformulated:  # the question's image goes with its BCQ/NCQ prompt
        parts = prompt[-1]["content"]
        assert any(part.get("type") == "image" for part in parts), parts
        assert any(part.get("type") == "text" and "<candidate>" in part["text"] for part in parts), parts
    assert sum(h["zppo/skipped_partitions"] for h in logs) < 2, logs  # at least one update had a signal
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
