"""TRL's dataset formats and reward-function conventions in `ZPPOTrainer` (zppo_trl.dataset_formats).

Unit tests pin how a row of each format becomes a prompt, a question, images and a teacher chat, and what the
trainer refuses up front. The runs train the tiny random models in the GRPO row (no teacher): a standard dataset
streamed, its rewards strings; a conversational one with a system turn, resumed, its ids from the row index; the
tiny VLM with each format's images. The streamed run also meets a reward that cannot teach, warned about once.
"""

from __future__ import annotations

import json
import logging
import zlib

import pytest
import torch
from datasets import Dataset
from PIL import Image
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3_5ForConditionalGeneration

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.checkpoint_state import ZPPO_STATE_NAME
from zppo_trl.dataset_formats import (
    CONVERSATIONAL,
    STANDARD,
    ZPPO,
    DatasetFormat,
    dataset_format,
    prepare_train_dataset,
    reward_columns,
)
from zppo_trl.processing import load_processor
from zppo_trl.prompts import RL_CLOSER, ncq_block
from zppo_trl.reward_signal import RewardSignalWatch
from zppo_trl.rewards import boxed_accuracy_reward

SYSTEM = {"role": "system", "content": "You are a careful tutor."}


def _standard(n: int = 16) -> list[dict]:
    return [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)]


def _conversational(n: int = 16) -> list[dict]:
    return [
        {
            "prompt": [
                SYSTEM,
                {"role": "user", "content": "Warm up: what is 1 + 1?"},
                {"role": "assistant", "content": "2"},
                {"role": "user", "content": f"What is {i} + {i}?"},
            ],
            "answer": str(2 * i),
        }
        for i in range(n)
    ]


def _image(i: int) -> Image.Image:
    return Image.new("RGB", (32, 32), ((40 * i) % 256, 90, 200))


# ---------------------------------------------------------------------- a row of each format


def test_each_format_is_told_by_its_columns():
    assert dataset_format(Dataset.from_list(_standard())) == DatasetFormat(STANDARD, has_images=False)
    assert dataset_format(Dataset.from_list(_conversational())) == DatasetFormat(CONVERSATIONAL, has_images=False)
    with_image = [{**row, "image": _image(0)} for row in _standard(2)]
    assert dataset_format(Dataset.from_list(with_image)).has_images
    zppo = [{"id": "a", "question": "q", "images": [], "answer": "1"}]
    assert dataset_format(Dataset.from_list(zppo)).kind == ZPPO
    with pytest.raises(ValueError, match=r"neither a 'prompt' column .* nor a 'question' column .*\['text'\]"):
        dataset_format(Dataset.from_list([{"text": "hello"}]))


def test_a_standard_row_is_its_text_then_block_then_closer():
    fmt, row = DatasetFormat(STANDARD), {"prompt": "What is 2 + 2?"}
    block = ncq_block(["5"], ["5"])
    assert fmt.question(row) == "What is 2 + 2?"
    assert fmt.prompt(row, None, RL_CLOSER) == f"What is 2 + 2?\n\n{RL_CLOSER}"
    assert fmt.prompt(row, block, "Box it.") == f"What is 2 + 2?\n\n{block.strip()}\n\nBox it."
    assert fmt.prompt(row, None, None) == fmt.prompt(row, None, "") == "What is 2 + 2?"  # no closer
    # with images in the dataset the text is one user turn (the processor places them); rewards still get text
    imaged = DatasetFormat(STANDARD, has_images=True)
    assert imaged.prompt(row, None, None) == [{"role": "user", "content": "What is 2 + 2?"}]
    prompts, completions = imaged.for_rewards(
        [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is 2 + 2?"}]}]],
        [[{"role": "assistant", "content": "4"}]],
    )
    assert prompts == ["What is 2 + 2?"] and completions == ["4"]


def test_a_conversational_row_keeps_its_turns_and_ends_its_last_user_turn_with_block_and_closer():
    fmt = DatasetFormat(CONVERSATIONAL)
    row = _conversational(4)[3]
    block = ncq_block(["5"], ["5"])
    prompt = fmt.prompt(row, block, RL_CLOSER)
    assert prompt[:3] == row["prompt"][:3]  # system and earlier turns as they were
    assert prompt[3] == {"role": "user", "content": f"What is 3 + 3?\n\n{block.strip()}\n\n{RL_CLOSER}"}
    assert fmt.question(row) == "What is 3 + 3?"
    # image parts stay where they were; the text part takes the block and closer
    parts = [{"type": "image"}, {"type": "text", "text": "What is shown?"}]
    imaged = {"prompt": [{"role": "user", "content": parts}], "image": _image(1)}
    turn = fmt.prompt(imaged, None, "Box it.")[0]["content"]
    assert turn == [{"type": "image"}, {"type": "text", "text": "What is shown?\n\nBox it."}]
    # the teacher's chat is the student's plain prompt with the image filled in
    chat = fmt.chat(imaged, None, "Box it.")
    assert chat[0]["content"][0]["image"] is imaged["image"]
    assert chat[0]["content"][1]["text"] == "What is shown?\n\nBox it."
    assert fmt.chat(row, None, RL_CLOSER)[0] == SYSTEM  # its system turn too
    assert fmt.for_rewards([prompt], [[{"role": "assistant", "content": "6"}]]) == (
        [prompt],
        [[{"role": "assistant", "content": "6"}]],
    )


def test_reward_functions_declare_the_columns_they_read():
    def needs_answer_and_source(completions, answer, source, **kwargs):
        return []

    def optional_answer(completions, answer=None, **kwargs):
        return []

    assert reward_columns(boxed_accuracy_reward) == ["answer"]
    assert reward_columns(needs_answer_and_source) == ["answer", "source"]
    assert reward_columns(optional_answer) == []
    assert reward_columns(lambda prompts, completions, completion_ids, trainer_state, **kw: []) == []


def test_the_training_set_is_refused_up_front_naming_row_and_column():
    standard = Dataset.from_list(_standard(3))
    prepared, fmt, index = prepare_train_dataset(standard, {}, lookups=None)
    assert fmt.kind == STANDARD and prepared["id"] == ["0", "1", "2"] and index == {"0": 0, "1": 1, "2": 2}
    without_answer = standard.remove_columns("answer")
    readers = {"answer": ["the reward function boxed_accuracy_reward (the default reward)"]}
    with pytest.raises(ValueError, match=r"no 'answer' column, which the reward function boxed_accuracy_reward"):
        prepare_train_dataset(without_answer, readers, lookups=None)
    prepare_train_dataset(without_answer, {}, lookups=None)  # nothing reads it: fine
    bad = Dataset.from_list([{"prompt": "ok"}, {"prompt": "  "}])
    with pytest.raises(ValueError, match="row 1: 'prompt' must be a non-empty text"):
        prepare_train_dataset(bad, {}, lookups=None)
    no_user = Dataset.from_list([{"prompt": [{"role": "system", "content": "s"}]}])
    with pytest.raises(ValueError, match=r"row 0: 'prompt' has no user turn .*\['system'\]"):
        prepare_train_dataset(no_user, {}, lookups=None)
    repeated = Dataset.from_list([{"prompt": "a", "id": 7}, {"prompt": "b", "id": 7}])
    with pytest.raises(ValueError, match="rows 0 and 1: duplicate id 7"):
        prepare_train_dataset(repeated, {}, lookups=None)
    with pytest.raises(
        ValueError, match=r"streaming IterableDataset, but the replay buffer needs .*\(replay_fraction: 0\)"
    ):
        prepare_train_dataset(standard.to_iterable_dataset(), {}, lookups="the replay buffer")
    streamed, _, index = prepare_train_dataset(standard.to_iterable_dataset(), {}, lookups=None)
    assert index is None and [row["id"] for row in streamed] == ["0", "1", "2"]


def test_args_none_builds_the_default_config_and_names_the_missing_teacher(tiny_text_model_dir):
    for model in (str(tiny_text_model_dir), AutoModelForCausalLM.from_pretrained(tiny_text_model_dir)):
        with pytest.raises(ValueError, match=r"need a teacher: set teacher_base_url and teacher_model"):
            ZPPOTrainer(model=model, args=None, train_dataset=Dataset.from_list(_standard()))
    assert ZPPOConfig("run", use_cpu=True, bf16=False, augmentations=[], replay_fraction=0).output_dir == "run"


def test_the_no_signal_warning_says_once_what_to_check(caplog):
    watch = RewardSignalWatch(["correct", "length"], "strings")
    per_func = torch.tensor([[1.0, 1.0], [0.0, 1.0], [float("nan"), 1.0]])
    with caplog.at_level(logging.WARNING, logger="zppo_trl.reward_signal"):
        said = watch.check(per_func, per_func.nansum(1), step=1)
        assert len(said) == 1 and "reward function 'length' gave all 3 rollouts of rollout step 1" in said[0]
        assert "receive completions as strings" in said[0]
        assert watch.check(per_func, per_func.nansum(1), step=2) == []  # once
        # after the first step an all-0 round is a genuinely all-wrong step: not warned about
        zeros = torch.zeros(4, 2)
        assert watch.check(zeros, zeros.sum(1), step=3) == []
    assert [r.message for r in caplog.records] == said
    first = RewardSignalWatch(["correct"], "lists of chat messages")
    zeros = torch.zeros(4, 1)
    assert "same reward (0)" in first.check(zeros, zeros[:, 0], step=1)[0]  # the first step: said whatever the value


# ---------------------------------------------------------------------- runs


def _args(tmp_path, **overrides) -> ZPPOConfig:
    settings = dict(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to=[], seed=0, data_seed=0,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=6, num_partitions=2,
        gradient_accumulation_steps=1, augmentations=[], replay_fraction=0.0, learning_rate=1e-2,
        logging_steps=1, save_strategy="no", disable_tqdm=True, max_steps=2,
    )  # fmt: skip
    settings.update(overrides)
    return ZPPOConfig(**settings)


class Recorder:
    """A TRL reward function that keeps what it was given and scores by a hash of the completion's text: a mix
    of 0 and 1 in most groups, the same for the same rollout (so a resumed run scores as the straight one)."""

    __name__ = "recorder"

    def __init__(self):
        self.prompts, self.completions, self.ids = [], [], []

    def __call__(self, prompts, completions, id, **kwargs):
        self.prompts += prompts
        self.completions += completions
        self.ids += id
        texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
        return [float(zlib.crc32(f"{key}|{t}".encode()) % 2) for key, t in zip(id, texts)]


def constant_length(completions, **kwargs):
    """Written for TRL's standard format: len() of a chat completion is 1 for every rollout."""
    return [float(len(c) > 0) for c in completions]


@pytest.mark.integration
def test_a_standard_dataset_streams_in_the_grpo_row_and_its_rewards_get_strings(tiny_text_model_dir, tmp_path, caplog):
    """TRL's standard format, streamed (no replay): ids from the stream's index, plain-text prompts with the
    closer the user set, string completions, and a constant reward function warned about in the first step."""
    recorder = Recorder()
    dataset = Dataset.from_list(_standard()).to_iterable_dataset()
    trainer = ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_text_model_dir),
        reward_funcs=[recorder, constant_length],
        args=_args(tmp_path, closer="Answer in one number."),
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(tiny_text_model_dir),
    )
    assert trainer.dataset_format == DatasetFormat(STANDARD)
    with caplog.at_level(logging.WARNING, logger="zppo_trl.reward_signal"):
        trainer.train()
    assert recorder.completions and all(isinstance(c, str) for c in recorder.completions)
    expected = {str(i): f"What is {i} + {i}?\n\nAnswer in one number." for i in range(16)}
    assert all(p == expected[key] for p, key in zip(recorder.prompts, recorder.ids))
    assert len(set(recorder.ids)) == 4  # one rollout step: 4 new questions of the stream
    warned = [r.message for r in caplog.records if "NO LEARNING SIGNAL" in r.message]
    assert len(warned) == 1 and "reward function 'constant_length'" in warned[0], warned


@pytest.mark.integration
def test_a_conversational_dataset_resumes_on_the_same_rows(tiny_text_model_dir, tmp_path):
    """TRL's conversational format with a system turn and replay: the student's prompts keep every turn with the
    closer in the last user turn, rewards get message lists, and a resumed run finds the buffer's rows by the ids
    the row index gave them, continuing as the straight run."""

    def run(out, max_steps, resume=False):
        recorder = Recorder()
        args = _args(tmp_path, output_dir=str(out), max_steps=max_steps, replay_fraction=0.5, save_strategy="steps",
                     save_steps=2)  # fmt: skip
        trainer = ZPPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(tiny_text_model_dir),
            reward_funcs=recorder,
            args=args,
            train_dataset=Dataset.from_list(_conversational()),
            processing_class=AutoTokenizer.from_pretrained(tiny_text_model_dir),
        )
        trainer.train(resume_from_checkpoint=resume or None)
        return trainer, recorder

    straight, seen = run(tmp_path / "straight", 4)
    assert all(p[:3] == _conversational()[0]["prompt"][:3] for p in seen.prompts)
    assert all(p[3]["content"] == f"What is {key} + {key}?\n\n{RL_CLOSER}" for p, key in zip(seen.prompts, seen.ids))
    assert all(c[0]["role"] == "assistant" for c in seen.completions)
    run(tmp_path / "resumed", 2)
    state = json.loads((tmp_path / "resumed" / "checkpoint-2" / ZPPO_STATE_NAME).read_text())
    assert state["buffer"]["residents"]  # ids of the row index, looked up again after the resume
    resumed, _ = run(tmp_path / "resumed", 4, resume=True)
    assert len(straight.replay_buffer) > 0
    assert sum(h.get("zppo/replayed", 0) for h in resumed.state.log_history) > 0  # replayed rows were looked up
    assert resumed.replay_buffer.residents() == straight.replay_buffer.residents()
    for name, p in straight.model.named_parameters():
        torch.testing.assert_close(resumed.model.get_parameter(name), p, rtol=0, atol=0)


@pytest.mark.integration
@pytest.mark.parametrize("kind", [STANDARD, CONVERSATIONAL])
def test_a_vlm_trains_on_each_formats_images(kind, tiny_vlm_dir, tmp_path):
    """The tiny Qwen3.5 VLM on TRL's ``image`` column (conversational, an image placeholder in the user turn)
    and ``images`` column (standard: a chat for the processor, strings for the rewards)."""
    if kind == STANDARD:
        rows = [{**row, "images": [_image(i)]} for i, row in enumerate(_standard(8))]
    else:
        rows = [
            {
                "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Colour {i}?"}]}],
                "image": _image(i),
                "answer": str(i),
            }
            for i in range(8)
        ]
    recorder = Recorder()
    trainer = ZPPOTrainer(
        model=Qwen3_5ForConditionalGeneration.from_pretrained(tiny_vlm_dir),
        reward_funcs=recorder,
        args=_args(tmp_path, max_steps=2, closer=None, padding_free=True),
        train_dataset=Dataset.from_list(rows),
        processing_class=load_processor(tiny_vlm_dir),
    )
    trainer.train()
    assert trainer.state.global_step == 2 and recorder.completions
    # The paper's padding-free training on the paper's students' architecture: every pass packed, images and
    # all (the packed passes' exactness: tests/test_packing.py), and the updates trained.
    assert trainer.counters["padded_micro_batches_total"] == 0
    start = Qwen3_5ForConditionalGeneration.from_pretrained(tiny_vlm_dir)
    assert any(not torch.equal(p, start.get_parameter(name)) for name, p in trainer.model.named_parameters())
    if kind == STANDARD:
        assert all(isinstance(c, str) for c in recorder.completions)
        assert set(recorder.prompts) <= {row["prompt"] for row in rows}  # closer None: the text alone
    else:
        turn = recorder.prompts[0][-1]["content"]
        assert [part["type"] for part in turn] == ["image", "text"]
        assert turn[1]["text"] in {f"Colour {i}?" for i in range(8)}


def test_a_recipe_turns_the_closer_off_with_null(tmp_path):
    from zppo_trl.recipe import parse_recipe_args

    recipe = tmp_path / "grpo.yaml"
    recipe.write_text(
        "model_name_or_path: org/model\naugmentations: []\nreplay_fraction: 0.0\ncloser: null\n"
        f"use_cpu: true\nbf16: false\noutput_dir: {tmp_path / 'out'}\n"
    )
    _, args, _ = parse_recipe_args(["--config", str(recipe)])
    assert args.closer is None and DatasetFormat(STANDARD).prompt({"prompt": "Q?"}, None, args.closer) == "Q?"
    _, args, _ = parse_recipe_args(["--config", str(recipe), "--closer", "Box it."])
    assert args.closer == "Box it."
