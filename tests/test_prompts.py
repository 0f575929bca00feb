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

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from test_evaluation_judges import figure_text, squeeze
except ImportError:
    from tests.test_evaluation_judges import figure_text, squeeze


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


# Each figure's math placeholders, as the figure prints them, and what stands in for them on both sides.
_BASELINE_FIGURES = {
    "fig:prompt-hint": (
        {"$y_{\\rm T}^{(+)}$": "RESPONSE"},
        lambda: prompts.render_hint("RESPONSE"),
    ),
    "fig:prompt-correction": (
        {"$x$": "QUESTION", "$y_{\\rm S}^{(-)}$": "ATTEMPT"},
        lambda: prompts.render_correction("QUESTION", "ATTEMPT"),
    ),
    "fig:prompt-reflection": (
        {
            "$x$": "QUESTION",
            "$y_{\\rm T}^{\\rm draft}$": "DRAFT",
            "$y_{\\rm S}^{(-,1)}$, $\\dots$, $y_{\\rm S}^{(-,K_x)}$": "ATTEMPTS",
        },
        lambda: prompts.render_reflection("QUESTION", "DRAFT", ["ATTEMPTS"]),
    ),
}


@pytest.mark.parametrize("label", sorted(_BASELINE_FIGURES))
def test_the_baselines_teacher_requests_are_the_papers_figures(paper_tex, label):
    """Pins the text the Hint generator, the Correction-SFT corrector and the Error-reflection-SFT refiner receive:
    each request is the paper's figure (fig:prompt-hint, fig:prompt-correction, fig:prompt-reflection) with its
    placeholders filled, compared without whitespace (line breaks are not recoverable from a typeset figure).

    Fails if a template's instruction drifts from the figure by a word (e.g. the hint prompt losing "do NOT
    reveal the final answer"), if a tag is renamed, or if a request gains a field the figure does not show
    (e.g. the question or a student rollout in the hint request: the generator reads only the solved response).
    """
    placeholders, render = _BASELINE_FIGURES[label]
    tex = paper_tex
    for math, word in placeholders.items():
        assert math in tex, math
        tex = tex.replace(math, word)
    assert squeeze(render()) == squeeze(figure_text(tex, label))
