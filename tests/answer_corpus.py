"""Realistic (response, gold) pairs for checking the grader against a plain mathruler call.

Each family pairs a gold answer with answers a model writes for it: equivalent forms,
near misses and plain wrong ones. Every answer is put in a response in several ways: a
clean box, a box after a long chain of thought, an earlier box revised by a later one,
a later box cut off by the token limit, an empty last box, and no box at all.
"""

from __future__ import annotations

# gold -> answers (equivalent or not; the reference decides)
FAMILIES: dict[str, list[str]] = {
    # integers, decimals, thousands separators
    "42": ["42", "42.0", "042", "41", "4.2", "42 cm", "\\text{42}", "x = 42", "42.", "forty-two"],
    "1000": ["1000", "1,000", "1{,}000", "10^3", "1000.0", "100", "1 000"],
    "-3": ["-3", "- 3", "−3", "3", "-3.0", "-\\frac{6}{2}"],
    "0.5": ["0.5", ".5", "\\frac{1}{2}", "1/2", "\\dfrac12", "0.50", "2/4", "0.05", "50\\%"],
    # fractions
    "\\frac{3}{4}": [
        "\\frac{3}{4}",
        "3/4",
        "\\tfrac{3}{4}",
        "0.75",
        "\\frac34",
        "6/8",
        "\\frac{4}{3}",
        "\\frac{3}{5}",
    ],
    "\\frac{1}{3}": ["1/3", "0.333", "\\frac{2}{6}", "\\frac{1}{3}", "0.\\overline{3}", "\\dfrac{1}{3}"],
    # LaTeX expressions
    "2\\sqrt{3}": [
        "2\\sqrt{3}",
        "\\sqrt{12}",
        "2\\sqrt3",
        "2 \\sqrt{3}",
        "3\\sqrt{2}",
        "\\sqrt{3}\\cdot 2",
        "2*sqrt(3)",
    ],
    "\\pi": ["\\pi", "pi", "3.14159", "180^\\circ", "2\\pi", "\\frac{2\\pi}{2}"],
    "x^2+2x+1": ["x^2+2x+1", "(x+1)^2", "x^{2}+2x+1", "x^2+1", "(x-1)^2", "1+2x+x^2"],
    "e^{2}": ["e^2", "e^{2}", "\\exp(2)", "2e", "e^{2.0}"],
    "\\log_2 8": ["3", "\\log_2 8", "\\log_{2}8", "log2(8)"],
    # intervals, tuples, sets, separators
    "[1, 3)": ["[1, 3)", "[1,3)", "(1, 3)", "[1, 3]", "[1,\\ 3)", "\\left[1, 3\\right)", "[1;3)"],
    "(1, 2)": ["(1, 2)", "(1,2)", "(2, 1)", "(1; 2)", "(1;2)", "1, 2", "(1,\\,2)", "\\left(1, 2\\right)"],
    "(1; 2)": ["(1; 2)", "(1;2)", "(1, 2)", "( 1 ; 2 )"],
    "\\{1, 2, 3\\}": ["\\{1, 2, 3\\}", "\\{1,2,3\\}", "1, 2, 3", "\\{3, 2, 1\\}", "{1,2,3}"],
    "(-\\infty, 0)": ["(-\\infty, 0)", "(-\\infty,0)", "(-inf, 0)", "x < 0", "(-\\infty, 0]"],
    "3, 5": ["3, 5", "3,5", "5, 3", "3 \\text{ and } 5", "3 and 5", "3 or 5", "x=3, x=5"],
    # units, degrees, percents
    "30^\\circ": ["30^\\circ", "30", "30^{\\circ}", "30°", "30 degrees", "\\frac{\\pi}{6}", "60^\\circ"],
    "45\\%": ["45\\%", "45%", "45", "0.45", "45 percent", "\\frac{9}{20}"],
    "12 \\text{ cm}": ["12", "12 cm", "12\\text{ cm}", "12 \\mathrm{cm}", "1.2 dm", "120 mm"],
    "5 \\text{ hours}": ["5", "5 hours", "5 h", "5\\text{ hours}", "300 minutes"],
    "\\$18.90": ["18.90", "\\$18.90", "$18.90", "18.9", "18.95"],
    # primes, quotes and other characters the old screen refused
    "f'(x)": ["f'(x)", "f ' (x)", "f''(x)", "f'"],
    "2x'": ["2x'", "2 x'", "x'"],
    "Newton's law": ["Newton's law", "newton's law", "Newtons law", "Newton’s law", "\\text{Newton's law}"],
    '"yes"': ['"yes"', "yes", '"Yes"', "no"],
    "a;b": ["a;b", "a; b", "b;a"],
    # text answers, multiple choice
    "B": ["B", "b", "(B)", "\\text{B}", "\\text{(B)}", "B.", "B. 5", "Option B", "C", "\\mathrm{B}"],
    "\\text{East}": ["East", "east", "\\text{East}", "EAST", "West", "\\textbf{East}"],
    "mitochondria": ["mitochondria", "Mitochondria", "the mitochondria", "mitochondrion"],
    "True": ["True", "true", "T", "\\text{True}", "False"],
    # matrices and vectors
    "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}": [
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
        "\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}",
        "\\begin{pmatrix} 1 & 3 \\\\ 2 & 4 \\end{pmatrix}",
    ],
    "\\begin{pmatrix} 2 \\\\ -1 \\end{pmatrix}": [
        "\\begin{pmatrix} 2 \\\\ -1 \\end{pmatrix}",
        "(2, -1)",
        "\\begin{pmatrix}2\\\\-1\\end{pmatrix}",
    ],
    # equations, inequalities, mixed numbers, scientific notation
    "y = 2x + 1": ["y = 2x + 1", "y=2x+1", "2x + 1", "y = 1 + 2x", "y = 2x - 1"],
    "x \\geq 2": ["x \\geq 2", "x\\ge 2", "[2, \\infty)", "x > 2"],
    "7 \\frac{3}{4}": ["7 \\frac{3}{4}", "7\\frac34", "7.75", "\\frac{31}{4}", "7 3/4"],
    "3 \\times 10^{8}": ["3 \\times 10^8", "3\\times10^{8}", "300000000", "3e8", "3 \\cdot 10^{8}"],
}

THOUGHT = (
    "Let me set up the problem carefully. Substituting the given values and simplifying step by step, "
    "the intermediate result checks out against the constraint. "
)


def responses_for(answer: str) -> list[str]:
    """One answer as a model writes it: clean, after reasoning, revised, truncated, emptied, unboxed."""
    return [
        f"\\boxed{{{answer}}}",
        f"<think>{THOUGHT * 6}</think>\nTherefore the answer is $\\boxed{{{answer}}}$.",
        f"First guess \\boxed{{0}}, but rechecking the sign: \\boxed{{{answer}}}",
        f"So \\boxed{{{answer}}}. Verifying once more, the final answer is \\boxed{{{answer}",  # cut off mid-box
        f"\\boxed{{{answer}}} as the closer asks: \\boxed{{}}",  # last box empty
        f"The answer is {answer}.",  # no box
    ]


def realistic_pairs() -> list[tuple[str, str]]:
    """Every (response, gold) pair of the corpus: a few hundred."""
    pairs = []
    for gold, answers in FAMILIES.items():
        for k, answer in enumerate(answers):
            shapes = responses_for(answer)
            # every answer clean; the other shapes rotate over the family's answers
            pairs.append((shapes[0], gold))
            pairs.append((shapes[1 + k % 5], gold))
            pairs.append((shapes[1 + (k + 2) % 5], gold))
    return pairs
