"""`Questions` and `Grader`, built without a trainer: rows by key (map-style and streamed), prompts in the dataset's
format, and grading with sync and async reward functions, weighted, in one call per function."""

import asyncio
import threading

import pytest
from datasets import Dataset

from zppo_trl import ZPPOConfig
from zppo_trl.dataset_formats import prepare_datasets
from zppo_trl.questions import Grader, Questions
from zppo_trl.rewards import boxed_accuracy_reward

ROWS = [
    {"id": "q1", "question": "What is 2 + 2?", "answer": "4", "images": []},
    {"id": "q2", "question": "What is 3 + 3?", "answer": "6", "images": []},
]


def _questions():
    args = ZPPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to=[], augmentations=[])
    dataset, fmt, row_of = prepare_datasets(Dataset.from_list(ROWS), None, [boxed_accuracy_reward], args)
    return Questions(dataset, row_of, fmt, args.closer)


def test_rows_by_key_and_prompts_with_block_and_closer():
    questions = _questions()
    assert not questions.streamed and questions.row("q2")["answer"] == "6"
    prompt = questions.with_prompt(questions.row("q1"), "BLOCK")["prompt"]
    text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
    text = text if isinstance(text, str) else " ".join(part.get("text", "") for part in text)
    assert text.index("What is 2 + 2?") < text.index("BLOCK") < text.index(questions.closer)
    assert questions.question(questions.row("q1")) == "What is 2 + 2?"


def test_a_stream_looks_up_only_the_step_it_was_handed():
    questions = _questions()
    stream = Questions(None, None, questions.format, questions.closer)
    stream.take_stream([ROWS[0]])
    assert stream.streamed and stream.row("q1") is ROWS[0]
    with pytest.raises(KeyError):
        stream.row("q2")


def test_grader_weighs_sync_and_async_functions_in_one_call_each():
    questions = _questions()
    calls = []

    def boxed(prompts, completions, **columns):
        calls.append(len(completions))
        return boxed_accuracy_reward(prompts=prompts, completions=completions, **columns)

    async def never(prompts, completions, **columns):
        return [0.0] * len(completions)

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    try:
        grader = Grader(questions, [boxed, never], [1.0, 1.0], lambda: None, lambda: loop)
        verdicts = grader.grade_keys(["q1", "q2"], [["so \\boxed{4}", "\\boxed{5}"], ["\\boxed{6}"]])
    finally:
        loop.call_soon_threadsafe(loop.stop)
    assert verdicts == [[True, False], [True]] and calls == [3]  # every reply in one call
    half = Grader(questions, [boxed], [0.5], lambda: None, lambda: None)  # 0.5 is not above CORRECT
    assert half.grade_keys(["q1"], [["\\boxed{4}"]]) == [[False]]
    assert grader.grade_keys(["q1"], [[]]) == [[]] and calls == [3, 1]  # nothing to grade: no call
