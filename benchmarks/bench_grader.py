"""Grader throughput on rollouts shaped like real ones: plain mathruler loop vs ZPPO's grader.

576 groups x 8 responses of 1-4k characters; answers repeat within a group as real groups
do; ~20% of responses have no parsable box; golds span integers, fractions, decimals,
degrees, percents, intervals, matrices and expressions. Both graders run in the same
process on the same corpus. The plain loop is the naive implementation of the paper's
rule (mathruler's extract + grade_answer, then the degree/percent retry), sequential
and unguarded. Target: ZPPO's grader (guard on) >= 4x the plain loop on 2 cores.

    python benchmarks/bench_grader.py [--groups 576] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import time

from mathruler.grader import extract_boxed_content

from zppo_trl.rewards import GuardedGrader, _grade_span, boxed_accuracy_reward, default_grader

# (gold, equivalent forms, plausible wrong answers)
ANSWER_KINDS = [
    lambda r: (str(n := r.randint(2, 999)), [str(n), f"{n}.0"], [str(n + d) for d in (-2, -1, 1, 10)]),
    lambda r: (
        f"\\frac{{{(a := r.randint(1, 9))}}}"
        f"{{{(b := r.choice([i for i in range(a + 1, 13) if __import__('math').gcd(a, i) == 1] or [a + 1]))}}}",
        [f"\\frac{{{a}}}{{{b}}}", f"{a}/{b}", f"\\dfrac{{{a}}}{{{b}}}"],
        [f"\\frac{{{a + 1}}}{{{b}}}", f"{b}/{a}", f"\\frac{{{a}}}{{{b + 1}}}"],
    ),
    lambda r: ("0.25", ["0.25", "\\frac{1}{4}", "1/4"], ["0.5", "\\frac{1}{2}", "0.2"]),
    lambda r: (
        f"{(d := r.choice([30, 45, 60, 120]))}^\\circ",
        [f"{d}^\\circ", f"{d}", f"{d}^{{\\circ}}"],
        [f"{d + 15}^\\circ", f"{180 - d}"],
    ),
    lambda r: (f"{(p := r.randint(5, 95))}\\%", [f"{p}\\%", f"{p}", f"{p}%"], [f"{p + 5}\\%", f"{p / 100}"]),
    lambda r: ("[1, 3)", ["[1, 3)", "[1,3)"], ["(1, 3)", "[1, 3]", "(-\\infty, 3)"]),
    lambda r: (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        ["\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}"],
        ["\\begin{pmatrix} 1 & 3 \\\\ 2 & 4 \\end{pmatrix}", "\\begin{pmatrix} 4 & 2 \\\\ 3 & 1 \\end{pmatrix}"],
    ),
    lambda r: ("2\\sqrt{3}", ["2\\sqrt{3}", "\\sqrt{12}"], ["3\\sqrt{2}", "4\\sqrt{3}", "\\sqrt{3}"]),
    lambda r: ("x^2+2x+1", ["x^2+2x+1", "(x+1)^2"], ["x^2+1", "(x-1)^2", "x^2+2x"]),
]

FILLER = (
    "First, recall the definition and rewrite the expression. Substituting the given values, we get a simpler form. "
    "Hmm, wait, let me double-check the arithmetic in the previous line. Expanding carefully gives the same result. "
)


def make_corpus(groups: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    responses, golds = [], []
    for _ in range(groups):
        gold, correct_forms, wrong_forms = rng.choice(ANSWER_KINDS)(rng)
        # a group converges on a few answers: one or two correct forms, one or two wrong ones
        pool = rng.sample(correct_forms, min(len(correct_forms), rng.randint(1, 2))) + rng.sample(
            wrong_forms, min(len(wrong_forms), rng.randint(1, 2))
        )
        for _ in range(8):
            body = FILLER * rng.randint(5, 18)  # ~1-4k characters
            roll = rng.random()
            if roll < 0.1:
                text = f"<think>{body}</think> So the answer is {rng.choice(pool)}."  # no box
            elif roll < 0.2:
                text = f"<think>{body}</think> \\boxed{{{rng.choice(pool)}"  # truncated box
            else:
                text = f"<think>{body}</think> The final answer is \\boxed{{{rng.choice(pool)}}}."
            responses.append(text)
            golds.append(gold)
    return responses, golds


def plain_loop(responses: list[str], golds: list[str]) -> list[bool]:
    out = []
    for response, gold in zip(responses, golds):
        span = extract_boxed_content(response)
        out.append(span != "None" and _grade_span(span, gold))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=576)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    responses, golds = make_corpus(args.groups, args.seed)
    n = len(responses)
    chars = sum(map(len, responses)) / n
    print(f"corpus: {args.groups} groups x 8 = {n} responses, mean {chars:.0f} chars")

    plain_loop(responses[:16], golds[:16])  # import sympy/pylatexenc outside the timing
    start = time.perf_counter()
    plain = plain_loop(responses, golds)
    t_plain = time.perf_counter() - start

    grader = GuardedGrader()
    grader.grade_batch(["\\boxed{1}"], ["2"])  # start the workers (once per training run)
    grader._cache.clear()
    start = time.perf_counter()
    guarded = grader.grade_batch(responses, golds)
    t_guarded = time.perf_counter() - start
    stats = dict(grader.stats)
    grader.close()

    shared = default_grader()
    shared.grade_batch(["\\boxed{1}"], ["2"])
    shared._cache.clear()
    start = time.perf_counter()
    rewards = []
    for i in range(0, n, 64):  # per-device reward calls, as TRL makes them
        rewards += boxed_accuracy_reward(responses[i : i + 64], golds[i : i + 64])
    t_reward = time.perf_counter() - start

    agree = sum(a == b for a, b in zip(plain, guarded))
    print(f"accuracy {sum(guarded) / n:.3f}; plain and guarded agree on {agree}/{n}")
    assert [float(x) for x in guarded] == rewards
    print(f"{'grader':<42}{'responses/s':>12}{'speed-up':>10}")
    for name, t in [
        ("plain sequential mathruler loop", t_plain),
        (f"GuardedGrader.grade_batch ({grader.num_workers} workers)", t_guarded),
        ("boxed_accuracy_reward (64 per call)", t_reward),
    ]:
        print(f"{name:<42}{n / t:>12.0f}{t_plain / t:>9.1f}x")
    print(f"answers served from the cache: {stats['cache_hits']} of {n}; timeouts {stats['timeouts']}")


if __name__ == "__main__":
    main()
