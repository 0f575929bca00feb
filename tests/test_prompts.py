import pytest

from zppo_trl import prompts
from zppo_trl.prompts import (
    BCQ_INSTRUCTION,
    RL_CLOSER,
    bcq_block,
    compose_prompt,
    fill,
    ncq_block,
    render_compression,
    render_judge,
)


def test_closer_and_instructions_are_the_papers_text():
    assert RL_CLOSER == (
        "You FIRST think about the reasoning process as an internal monologue and then provide the final answer. "
        "The reasoning process MUST BE enclosed within <think> </think> tags. "
        "The final answer MUST BE put in \\boxed{}."
    )
    assert BCQ_INSTRUCTION.endswith(
        "One is correct and another is wrong. Use these as references to help you solve the problem."
    )


def test_bcq_block_keeps_the_given_order():
    block = bcq_block(["second is wrong \\boxed{3}", "first \\boxed{4}"])
    assert block == (
        BCQ_INSTRUCTION
        + "\n<candidate>\nsecond is wrong \\boxed{3}\n</candidate>\n<candidate>\nfirst \\boxed{4}\n</candidate>"
    )


def test_ncq_block_lists_distinct_stripped_answers_in_first_seen_order():
    block = ncq_block([" 5", "3", "5 ", "x+1"], ["a", "b", "c", "d"])
    first_line, rest = block.split("\n", 1)
    assert first_line == (
        "The following answers are all WRONG: \\boxed{5}, \\boxed{3}, \\boxed{x+1}. "
        "Below are the incorrect reasoning processes in <candidate> </candidate> tags."
    )
    assert rest.count("<candidate>") == 4
    with pytest.raises(ValueError):
        ncq_block([], ["a"])


def test_compose_prompt_puts_the_closer_last():
    block = bcq_block(["a", "b"])
    assert compose_prompt("What is 2+2?\n", block) == f"What is 2+2?\n\n{block}\n\n{RL_CLOSER}"
    assert compose_prompt("Q") == f"Q\n\n{RL_CLOSER}"
    assert compose_prompt("Q", closer=None) == "Q"


def test_fill_is_single_pass_and_strict():
    # a response quoting a field name must not be substituted again
    text = render_compression("I think {{ response }} is \\boxed{2}")
    assert "<response>\nI think {{ response }} is \\boxed{2}\n</response>" in text
    with pytest.raises(KeyError, match="question"):
        fill("{{ question }}")
    with pytest.raises(ValueError, match="qestion"):
        fill("{{ question }}", question="x", qestion="y")


def test_judge_renders_options_only_when_present():
    without = render_judge("Q?", "\\boxed{B}", "B")
    assert "## Answer Options" not in without and "{{" not in without
    assert "## Question\nQ?\n\n## Model Response\n\\boxed{B}\n\n## Ground Truth Answer\nB\n\n" in without
    with_options = render_judge("Q?", "B", "B", options={"A": "one", "B": "two"})
    assert "## Answer Options\nA. one\nB. two\n\n## Model Response" in with_options
    assert with_options.endswith(
        '(no prose, no code fences, no trailing commentary): {"verdict": "correct" or "wrong"}'
    )


def test_baseline_templates_render():
    assert "<incorrect_attempt>\nwrong\n</incorrect_attempt>" in prompts.render_correction("Q", "wrong")
    reflection = prompts.render_reflection("Q", "draft", ["w1", "w2"])
    assert "<student_attempts>\nw1\n\nw2\n</student_attempts>" in reflection
    assert prompts.render_hint("solved").startswith("Read the solved response below")
