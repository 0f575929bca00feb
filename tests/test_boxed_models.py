"""The boxed toy models (see boxed_models.py) answer in the paper's format with a useful mix of right and wrong.

Trainer tests rely on these fixtures to see non-zero rewards, groups with both outcomes,
repeated wrong answers (NCQ) and a teacher who solves what the student cannot (BCQ). The
live checks sample the saved directories the way the trainer does: the model and its
tokenizer or processor both loaded from disk, prompts batched with left padding,
completions decoded without special tokens and graded by the reward's grader.
"""

from __future__ import annotations

import pytest
from boxed_models import STUDENT_ACCURACY, TOY_QUESTIONS, distractors, toy_conversation, toy_rows

from zppo_trl.data import validate_row
from zppo_trl.rewards import extract_boxed, grade_batch
from zppo_trl.teacher import TeacherClient

SAMPLES = 8
MAX_NEW_TOKENS = 32


# ---------------------------------------------------------------- pure: the toy data


def test_toy_rows_follow_the_schema():
    assert [row["id"] for row in TOY_QUESTIONS] == [f"toy-{i:02d}" for i in range(16)]
    for kind in ("text", "vlm"):
        rows = toy_rows(kind)
        for i, row in enumerate(rows):
            validate_row(row, i)
            assert len(row["images"]) == (kind == "vlm")
    a, b = toy_rows("vlm"), toy_rows("vlm")
    assert [x["images"][0].tobytes() for x in a] == [y["images"][0].tobytes() for y in b]  # deterministic
    assert len({x["images"][0].tobytes() for x in a}) == len(a)  # one picture per question


def test_answers_and_distractors():
    for row in TOY_QUESTIONS:
        a, op, b = row["question"].removeprefix("What is ").removesuffix("?").split()
        assert int(row["answer"]) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        wrong = distractors(row)
        assert len(set(wrong)) == len(wrong) and row["answer"] not in wrong
    accuracies = sorted(STUDENT_ACCURACY.values())
    assert accuracies[4] <= 0.15 and accuracies[-5] >= 0.85  # hard, middling and easy questions


# ---------------------------------------------------------------- live: sampling the trained models


def encode_prompts(processing, rows: list[dict]):
    """The trainer's prompts for ``rows``, tokenized (images included) and left-padded."""
    getattr(processing, "tokenizer", processing).padding_side = "left"
    prompts = [
        processing.apply_chat_template(toy_conversation(row), tokenize=False, add_generation_prompt=True)
        for row in rows
    ]
    if rows[0]["images"]:
        return processing(text=prompts, images=[row["images"] for row in rows], padding=True, return_tensors="pt")
    return processing(prompts, padding=True, add_special_tokens=False, return_tensors="pt")


def sample(model, processing, rows: list[dict], n: int = SAMPLES) -> list[list[tuple[str, bool]]]:
    """``n`` ``(text, ended with EOS)`` completions per row at temperature 1, decoded as TRL does."""
    import torch

    tokenizer = getattr(processing, "tokenizer", processing)
    inputs = encode_prompts(processing, rows)
    torch.manual_seed(0)
    with torch.no_grad():
        output = model.generate(
            **inputs,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=MAX_NEW_TOKENS,
            num_return_sequences=n,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    completions = output[:, inputs["input_ids"].shape[1] :]
    ended = (completions == tokenizer.eos_token_id).any(1).tolist()
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    return [list(zip(texts[i * n : (i + 1) * n], ended[i * n : (i + 1) * n])) for i in range(len(rows))]


def summarize(rows: list[dict], replies: list[list[str]]) -> dict:
    """Per-question accuracy and wrong answers, plus the fraction of replies with a parseable box."""
    flat = [text for group in replies for text in group]
    golds = [row["answer"] for row, group in zip(rows, replies) for _ in group]
    correct = grade_batch(flat, golds)
    accuracy, wrong, start = {}, {}, 0
    answers = [extract_boxed(text) for text in flat]
    for row, group in zip(rows, replies):
        span = slice(start, start + len(group))
        start += len(group)
        accuracy[row["id"]] = sum(correct[span]) / max(len(group), 1)
        wrong[row["id"]] = [a for a, ok in zip(answers[span], correct[span]) if not ok and a is not None]
    boxed = sum(a is not None for a in answers) / len(flat)
    return {"accuracy": accuracy, "wrong": wrong, "boxed": boxed}


def assert_student_mix(rows: list[dict], samples: list[list[tuple[str, bool]]]) -> None:
    """What trainer tests need of a student.

    At least 90% of completions have a parseable box and 80% end with EOS; at least three
    questions are mostly answered wrong (with a parseable wrong answer, for NCQ) and three
    mostly right; some wrong answer repeats within a question.
    """
    ended = [e for group in samples for _, e in group]
    summary = summarize(rows, [[t for t, _ in group] for group in samples])
    accuracy, wrong = summary["accuracy"], summary["wrong"]
    report = f"accuracy {accuracy}, wrong answers {wrong}"
    assert summary["boxed"] >= 0.9, report
    assert sum(ended) / len(ended) >= 0.8, report
    hard = [q for q, acc in accuracy.items() if acc < 0.5 and wrong[q]]
    easy = [q for q, acc in accuracy.items() if acc >= 0.5]
    assert len(hard) >= 3 and len(easy) >= 3, report
    assert any(len(set(w)) < len(w) for w in wrong.values()), report  # wrong answers repeat


def assert_teacher_solves_hard_questions(
    server, rows: list[dict], replies: list[list[str]], prompt_tokens: int
) -> None:
    """What trainer tests need of a served teacher.

    The server saw exactly the trainer's prompts (same token count, image tokens
    included); 90% of replies have a parseable box; at least one in 4 is right on 60% of
    the questions the student mostly gets wrong.
    """
    from zppo_trl.processing import load_processor

    assert [len(group) for group in replies] == [4] * len(rows)
    # transformers serve ignores n, so each conversation went out as 4 requests
    assert prompt_tokens == 4 * int(encode_prompts(load_processor(server.model), rows)["attention_mask"].sum())
    summary = summarize(rows, replies)
    assert summary["boxed"] >= 0.9, summary
    hard = [row["id"] for row in rows if STUDENT_ACCURACY[row["id"]] < 0.5]
    solved = [q for q in hard if summary["accuracy"][q] > 0]
    assert len(solved) >= 0.6 * len(hard), summary


@pytest.mark.integration
def test_text_student_answers_with_a_mix(boxed_text_student_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(boxed_text_student_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(boxed_text_student_dir)
    rows = toy_rows("text")
    assert_student_mix(rows, sample(model, tokenizer, rows))


@pytest.mark.integration
def test_vlm_student_answers_with_a_mix(boxed_vlm_student_dir):
    from transformers import Qwen3_5ForConditionalGeneration

    from zppo_trl.processing import load_processor

    model = Qwen3_5ForConditionalGeneration.from_pretrained(boxed_vlm_student_dir).eval()
    processor = load_processor(str(boxed_vlm_student_dir))
    rows = toy_rows("vlm")
    assert_student_mix(rows, sample(model, processor, rows))


@pytest.mark.integration
def test_served_text_teacher_solves_the_hard_questions(boxed_teacher_server):
    rows = toy_rows("text")
    with TeacherClient(boxed_teacher_server.base_url, boxed_teacher_server.model) as client:
        replies = client.sample([toy_conversation(row) for row in rows], n=4, max_tokens=MAX_NEW_TOKENS)
        prompt_tokens = client.stats()["prompt_tokens"]
    assert_teacher_solves_hard_questions(boxed_teacher_server, rows, replies, prompt_tokens)


@pytest.mark.integration
def test_served_vlm_teacher_solves_the_hard_questions_from_images(boxed_vlm_teacher_server):
    rows = toy_rows("vlm")
    conversations = [toy_conversation(row, {"type": "image", "image": row["images"][0]}) for row in rows]
    with TeacherClient(boxed_vlm_teacher_server.base_url, boxed_vlm_teacher_server.model) as client:
        replies = client.sample(conversations, n=4, max_tokens=MAX_NEW_TOKENS)
        prompt_tokens = client.stats()["prompt_tokens"]
    assert_teacher_solves_hard_questions(
        boxed_vlm_teacher_server, rows, replies, prompt_tokens
    )  # image tokens included
