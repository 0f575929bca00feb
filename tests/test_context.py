"""Server context sizing: the bounds hold for real BCQ/NCQ prompts at the recipe's lengths."""

import pytest
from tiny_models import tiny_tokenizer

from zppo_trl.context import context_lengths
from zppo_trl.prompts import RL_CLOSER, bcq_block, compose_prompt, ncq_block, render_compression, render_judge

PAPER = dict(
    max_prompt_length=4096,
    max_completion_length=12288,
    num_generations=8,
    compression_max_tokens=512,
    teacher_max_tokens=12288,
)


def _text_of(tokenizer, tokens: int) -> tuple[str, int]:
    """A text of about ``tokens`` tokens, and its exact token count."""
    ids = tokenizer("Let me work this out step by step, checking each line. " * tokens, add_special_tokens=False)[
        "input_ids"
    ]
    text = tokenizer.decode(ids[:tokens])
    return text, len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_the_papers_recipe_sizes_both_servers_past_the_old_defaults():
    lengths = context_lengths(augmentations=("bcq", "ncq"), **PAPER)
    # launch scripts used to serve the student at 16,384 = 4,096 + 12,288: an NCQ prompt had no room
    assert lengths.student == 21504 and lengths.student > 16384 + 8 * 512
    assert lengths.teacher == 19456 and lengths.judge > lengths.teacher_sampling == 16384
    assert lengths.student % 1024 == lengths.teacher % 1024 == 0
    assert str(lengths).startswith("student --max-model-len 21,504 (prompt 4,096 + BCQ/NCQ block <= ")
    # without augmentations there is no block; with BCQ alone it is two candidates
    assert context_lengths(augmentations=(), **PAPER).block == 0
    bcq = context_lengths(augmentations=("bcq",), **PAPER).block
    assert 2 * 512 < bcq < context_lengths(augmentations=("ncq",), **PAPER).block
    with pytest.raises(ValueError, match="max_completion_length"):
        context_lengths(augmentations=(), **{**PAPER, "max_completion_length": None})


def test_the_block_bound_holds_for_the_longest_real_blocks():
    # Real blocks at their maximum: every candidate a full 512 tokens, all 8 NCQ answers distinct.
    tokenizer = tiny_tokenizer()
    G, cap = 8, 64
    lengths = context_lengths(
        augmentations=("bcq", "ncq"), **{**PAPER, "num_generations": G, "compression_max_tokens": cap}
    )
    candidate, n = _text_of(tokenizer, cap)
    assert n <= cap
    question = "What is 6 x 7?"
    plain = len(tokenizer(compose_prompt(question, None, RL_CLOSER))["input_ids"])
    for block in (bcq_block([candidate, candidate]), ncq_block([f"{n}/{n + 1}" for n in range(G)], [candidate] * G)):
        with_block = len(tokenizer(compose_prompt(question, block, RL_CLOSER))["input_ids"])
        assert with_block - plain <= lengths.block, (with_block - plain, lengths.block)


def test_uncompressed_candidates_are_bounded_by_whole_rollouts():
    # compress_candidates off: each candidate is a whole student or teacher rollout, not a capped summary
    tokenizer = tiny_tokenizer()
    G, completion, teacher = 4, 96, 160
    lengths = context_lengths(
        augmentations=("bcq", "ncq"),
        compress_candidates=False,
        **{
            **PAPER,
            "num_generations": G,
            "max_completion_length": completion,
            "teacher_max_tokens": teacher,
            "compression_max_tokens": 32,
        },
    )
    compressed = context_lengths(
        augmentations=("bcq", "ncq"),
        **{
            **PAPER,
            "num_generations": G,
            "max_completion_length": completion,
            "teacher_max_tokens": teacher,
            "compression_max_tokens": 32,
        },
    )
    assert lengths.block > compressed.block
    teacher_text, _ = _text_of(tokenizer, teacher)
    student_text, _ = _text_of(tokenizer, completion)
    question = "What is 6 x 7?"
    plain = len(tokenizer(compose_prompt(question, None, RL_CLOSER))["input_ids"])
    for block in (
        bcq_block([teacher_text, student_text]),
        ncq_block([f"{n}/{n + 1}" for n in range(G)], [student_text] * G),
    ):
        with_block = len(tokenizer(compose_prompt(question, block, RL_CLOSER))["input_ids"])
        assert with_block - plain <= lengths.block, (with_block - plain, lengths.block)


def test_the_teacher_bound_holds_for_compression_and_judge_prompts():
    tokenizer = tiny_tokenizer()
    rollout, n = _text_of(tokenizer, 300)
    question, q = _text_of(tokenizer, 40)
    lengths = context_lengths(
        augmentations=("bcq", "ncq"),
        **{**PAPER, "max_prompt_length": q, "max_completion_length": n, "teacher_max_tokens": n},
    )
    compression = len(tokenizer(render_compression(rollout))["input_ids"]) + 512
    judge = len(tokenizer(render_judge(question, rollout, "42", ["A. 41", "B. 42"]))["input_ids"]) + 512
    assert compression <= lengths.compression and judge <= lengths.judge
