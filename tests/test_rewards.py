import time

import pytest
from answer_corpus import realistic_pairs
from mathruler.grader import extract_boxed_content, grade_answer

from zppo_trl.rewards import (
    GuardedGrader,
    boxed_accuracy_reward,
    completion_text,
    extract_boxed,
    grade,
    strip_degree_percent,
)


@pytest.mark.parametrize(
    "text, span",
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{ 2 }", "2"),  # last box wins, stripped
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces
        ("\\boxed{3} and a truncated \\boxed{\\frac{1}{", None),  # last box unclosed: no span (mathruler)
        ("\\boxed{5} as the closer asks: \\boxed{}", None),  # last box empty: no span, earlier boxes ignored
        ("\\boxed{a \\{1, 2\\} b}", "a \\{1, 2\\} b"),  # escaped braces counted like mathruler counts them
        ("no box here", None),
        ("\\boxed{", None),
        ("", None),
        (None, None),
        ("\\boxed{\\boxed{7}}", "7"),
        ("}}}}\\boxed{8}{{{{", "8"),
    ],
)
def test_extract_boxed(text, span):
    assert extract_boxed(text) == span


def test_extract_boxed_is_linear_on_hostile_text():
    text = "\\boxed{" * 50_000 + "x"  # 350k characters, no box ever closes
    start = time.perf_counter()
    assert extract_boxed(text) is None
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    "response, gold, expected",
    [
        ("\\boxed{1/2}", "0.5", True),
        ("\\boxed{0.5}", "\\frac{1}{2}", True),
        ("\\boxed{\\frac12}", "1/2", True),
        ("\\boxed{30^\\circ}", "30", True),  # degrees, first pass already normalises
        ("\\boxed{30}", "30^{\\circ}", True),
        ("\\boxed{45\\%}", "45", True),  # percent stripped on the retry
        ("\\boxed{45}", "45%", True),
        ("\\boxed{0.45}", "45\\%", False),  # the retry strips signs, it does not rescale
        ("\\boxed{3} wait no \\boxed{4}", "4", True),  # last box wins
        ("\\boxed{4} wait no \\boxed{3}", "4", False),
        ("the answer is 4", "4", False),  # no box scores 0
        ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
        ("\\boxed{[1, 3)}", "[1,3)", True),
        ("\\boxed{\\begin{pmatrix}1 & 2\\end{pmatrix}}", "\\begin{pmatrix}1 & 2\\end{pmatrix}", True),
        ("\\boxed{B}", "b", True),
        ("\\boxed{7}", "8", False),
        ("\\boxed{2/4}", "1/2", False),  # unreduced fractions do not match (mathruler's rule)
    ],
)
def test_grader_table(response, gold, expected):
    assert grade(response, gold) is expected


def _plain_mathruler(response: str, gold: str) -> bool:
    """The paper's reward as a plain, unguarded mathruler call (the reference)."""
    span = extract_boxed_content(response)
    if grade_answer(span, gold):
        return True
    return grade_answer(strip_degree_percent(span), strip_degree_percent(gold))


def test_extraction_is_mathrulers_on_the_corpus():
    for response, _gold in realistic_pairs():
        theirs = extract_boxed_content(response)
        # mathruler marks "no closed last box" with the string "None"; an empty box gives "".
        assert extract_boxed(response) == (None if theirs in ("None", "") else theirs), response


def test_grade_equals_plain_mathruler_on_realistic_answers():
    pairs = realistic_pairs()
    assert len(pairs) >= 300
    expected = [_plain_mathruler(response, gold) for response, gold in pairs]
    grader = GuardedGrader(workers=2, timeout=30.0)  # generous: a verdict, not the guard, is under test
    try:
        got = grader.grade_batch([r for r, _ in pairs], [g for _, g in pairs])
        assert grader.stats["timeouts"] == 0
    finally:
        grader.close()
    mismatches = [(r, g, e) for (r, g), e, x in zip(pairs, expected, got) if e != x]
    assert not mismatches, mismatches[:10]
    # the corpus exercises both verdicts, truncated boxes included
    assert 0.2 < sum(expected) / len(expected) < 0.8
    cut_off = [r for r, _ in pairs if "\\boxed{" in r and extract_boxed_content(r) == "None"]
    assert len(cut_off) >= 30


def test_no_span_scores_zero_where_mathruler_would_grade_its_marker():
    # mathruler returns the string "None" for a cut-off last box and grades it; the paper
    # scores a response without a span 0, so a gold answer "None" is not matched by a truncation.
    truncated = "\\boxed{None} wait, recheck: \\boxed{\\frac{1}{"
    assert grade_answer(extract_boxed_content(truncated), "none")
    assert grade(truncated, "none") is False
    assert grade("\\boxed{None}", "none") is True


def test_strip_degree_percent():
    assert strip_degree_percent("30^{\\circ}") == "30"
    assert strip_degree_percent("30°") == "30"
    assert strip_degree_percent("12.5\\%") == "12.5"


HOSTILE = [
    "\\boxed{9**9**9}",  # hangs raw mathruler (sympy evaluates the tower)
    "\\boxed{(9**9)**(9**9)}",
    "\\boxed{2**2**2**2**2**2}",
    "\\boxed{" + "9" * 100_000 + "}",  # 10^5-character span
    "\\boxed{" + "{" * 20_000 + "1" + "}" * 20_000 + "}",  # deep nesting
    "\\boxed{1\x002}",  # NUL byte
    "\\boxed{3" + "}" * 7,  # unbalanced braces
    "\\boxed{__import__('os').system('touch /tmp/zppo_pwned')}",
    "\\boxed{().__class__.__bases__[0].__subclasses__()}",
    "\\boxed{\ud800}",  # lone surrogate
]


def test_hostile_answers_score_zero_in_bounded_time_and_the_grader_keeps_working(tmp_path):
    grader = GuardedGrader(workers=2, timeout=1.0)
    try:
        start = time.perf_counter()
        results = grader.grade_batch(HOSTILE, ["\\sqrt{2}"] * len(HOSTILE))
        elapsed = time.perf_counter() - start
        assert results == [False] * len(HOSTILE)
        # three towers time out in parallel on 2 workers: two rounds of the 1 s guard + restarts
        assert elapsed < 15, elapsed
        assert grader.stats["timeouts"] >= 3 and grader.stats["worker_restarts"] >= 3
        # the injection attempts, the NUL byte and the 10^5-digit span never reach sympy
        assert grader.stats["screened"] >= 4, grader.stats
        assert not __import__("os").path.exists("/tmp/zppo_pwned")
        # still grades correctly after its workers were killed
        assert grader.grade_batch(["\\boxed{0.5}", "\\boxed{2}"], ["1/2", "3"]) == [True, False]
    finally:
        grader.close()


def test_cache_deduplicates_repeated_answers():
    grader = GuardedGrader(workers=1, timeout=5.0)
    try:
        group = ["\\boxed{0.5}"] * 6 + ["\\boxed{1/3}"] * 2
        assert grader.grade_batch(group, ["1/2"] * 8) == [True] * 6 + [False] * 2
        assert grader.stats["cache_hits"] == 6  # two distinct answers graded, six served from cache
        grader.grade_batch(group, ["1/2"] * 8)
        assert grader.stats["cache_hits"] == 14
    finally:
        grader.close()


def test_completion_text_reads_trl_formats():
    assert completion_text("plain") == "plain"
    assert completion_text([{"role": "assistant", "content": "msg \\boxed{1}"}]) == "msg \\boxed{1}"
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert completion_text(parts) == "ab"
    with pytest.raises(TypeError):
        completion_text(3.5)


def test_boxed_accuracy_reward_is_a_trl_reward_function():
    completions = [
        [{"role": "assistant", "content": "<think>..</think> \\boxed{42}"}],
        [{"role": "assistant", "content": "\\boxed{41}"}],
        "\\boxed{42.0}",
        "no answer",
    ]
    rewards = boxed_accuracy_reward(completions, answer=["42", "42", "42", "42"], prompts=["p"] * 4)
    assert rewards == [1.0, 0.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="gold answer"):
        boxed_accuracy_reward(["\\boxed{1}"], answer=[None])
    with pytest.raises(ValueError, match="2 responses but 1"):
        boxed_accuracy_reward(["a", "b"], answer=["1"])
