"""The learning benchmark's parts (benchmarks/bench_learning.py, benchmarks/learning_task.py): the task and its models'
fine-tuning data as the trainer renders prompts, the analysis of the runs, and one smoke run of every part.

The benchmark itself is not a test (docs/learning.md): it takes most of an hour. Here its task is checked against
the trainer's own prompt rendering and the grader, its analysis against hand-made group logs and scores, and the
smallest setting (two rollout steps of GRPO† and of ZPPO) runs through the script's processes, evaluation, summary,
figure and console on the suite's boxed student and boxed teacher server.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest

from zppo_trl.prompts import RL_CLOSER, bcq_block, compose_prompt, ncq_block, render_compression
from zppo_trl.rewards import extract_boxed, grade
from zppo_trl.teacher import TeacherClient, extract_summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_learning as bench  # noqa: E402
import learning_task as task  # noqa: E402


def test_the_splits_are_fixed_and_disjoint():
    first, second = task.splits(), task.splits()
    assert [q.id for q in first["heldout"]] == [q.id for q in second["heldout"]]
    sizes = {name: len(questions) for name, questions in first.items()}
    assert sizes == {"heldout": 400, "train": 1000, "pool": 8100 - 1400}
    ids = [{q.id for q in questions} for questions in first.values()]
    assert sum(len(s) for s in ids) == len(set().union(*ids)) == 8100
    assert 0.35 < sum(q.carry for q in first["heldout"]) / 400 < 0.55


def test_a_solution_works_the_columns_and_the_grader_reads_its_box():
    q = task.Question(47, 38)
    assert task.working(q) == ("7 + 8 = 15 . 4 + 3 + 1 = 8 .", "85")
    assert task.working(q, slip=True) == ("7 + 8 = 15 . 4 + 3 = 7 .", "75")
    assert task.working(q, box_error=True)[1] == "86"
    assert task.working(task.Question(99, 99)) == ("9 + 9 = 18 . 9 + 9 + 1 = 19 .", "198")
    assert task.working(task.Question(21, 34), slip=True) == ("1 + 4 = 5 . 2 + 3 = 5 .", "55")  # no carry to forget
    for a, b in [(47, 38), (10, 10), (99, 91), (55, 45)]:
        q = task.Question(a, b)
        assert grade(task.completion(*task.working(q)), q.answer)
        assert not grade(task.completion(*task.working(q, box_error=True)), q.answer)
        assert extract_summary(task.summary(*task.working(q)))[0] == task.candidate(*task.working(q))


def test_the_behaviours_are_the_documented_distributions():
    student, carry, plain = task.STUDENT, task.Question(47, 38), task.Question(21, 34)
    for q in (carry, plain):
        assert sum(p for _, p in task.plain_outcomes(q, student.slip, student.box_error)) == pytest.approx(1)
    assert task.accuracy(carry, student) == pytest.approx((1 - student.slip) * 0.75) == 0  # never alone
    assert task.accuracy(plain, student) == pytest.approx(0.75)
    assert task.accuracy(carry, task.TEACHER) == pytest.approx(0.9 * 0.95)
    # BCQ: a candidate followed at random, right or wrong, else the plain answer
    shown = [task.working(carry, slip=True), task.working(carry)]
    outcomes = dict(task.bcq_outcomes(carry, shown, student))
    assert sum(outcomes.values()) == pytest.approx(1)
    right = task.completion(*task.working(carry))
    assert outcomes[right] == pytest.approx(0.7 / 2 + 0.3 * task.accuracy(carry, student))
    # NCQ: a listed mistake is avoided with probability 0.3; an unlisted one is not
    slip_answer = task.working(carry, slip=True)[1]
    listed = dict(task.ncq_outcomes(carry, [slip_answer], student))
    unlisted = dict(task.ncq_outcomes(carry, ["1"], student))
    assert listed[right] == pytest.approx((1 - student.slip * 0.7) * 0.75)
    assert unlisted.get(right, 0.0) == pytest.approx(task.accuracy(carry, student))


def test_the_fine_tuning_prompts_are_the_trainers():
    """What the student is fine-tuned to read is what the trainer will show it: compose_prompt of the question,
    the paper's block over the teacher's compressions, and the RL closer."""
    rng = random.Random(0)
    pool = task.splits()["pool"]
    by_text = {q.text: q for q in pool}
    for _ in range(20):
        example = task.student_example(rng, pool, "bcq")
        q = by_text[example.prompt.split("\n\n")[0]]
        candidates = re.findall(r"<candidate>\n(.*?)\n</candidate>", example.prompt)
        assert example.prompt == compose_prompt(q.text, bcq_block(candidates), RL_CLOSER)
        assert task.candidate(*task.working(q)) in candidates
        assert sum(grade(c, q.answer) for c in candidates) == 1  # one right, one wrong
        assert extract_boxed(example.target) is not None
        example = task.student_example(rng, pool, "ncq")
        q = by_text[example.prompt.split("\n\n")[0]]
        candidates = re.findall(r"<candidate>\n(.*?)\n</candidate>", example.prompt)
        wrong = [extract_boxed(c) for c in candidates]
        assert example.prompt == compose_prompt(q.text, ncq_block(wrong, candidates), RL_CLOSER)
        assert q.answer not in wrong
        example = task.teacher_example(rng, pool, "compression")
        response = re.search(r"<response>\n(.*)\n</response>", example.prompt, flags=re.DOTALL).group(1)
        assert example.prompt == render_compression(response)
        assert extract_boxed(extract_summary(example.target)[0]) == extract_boxed(response)
        example = task.student_example(rng, pool, "plain")
        q = by_text[example.prompt.split("\n\n")[0]]
        assert example.prompt == compose_prompt(q.text, None, RL_CLOSER)
        student = task.STUDENT
        assert example.target in {
            task.completion(*s) for s, _ in task.plain_outcomes(q, student.slip, student.box_error)
        }


def test_the_rows_are_their_recipes():
    assert bench.row_fields("ZPPO") == {}
    assert bench.row_fields("GRPO\u2020") == {"augmentations": []}
    assert bench.row_fields("GRPO\u2020+BCQ") == {"augmentations": ["bcq"]}
    assert bench.row_fields("GRPO\u2020+NCQ") == {"augmentations": ["ncq"]}


def test_the_mechanism_is_read_per_question_from_the_group_log():
    steps = {
        1: [
            {"kind": "new", "id": "a", "rewards": [0.0] * 8},
            {"kind": "new", "id": "b", "rewards": [1.0] * 2 + [0.0] * 6},
            {"kind": "new", "id": "c", "rewards": [1.0] * 6 + [0.0] * 2},
            {"kind": "bcq", "id": "a", "rewards": [1.0] * 4 + [0.0] * 4},
            {"kind": "ncq", "id": "a", "rewards": [0.0] * 8},
        ],
        2: [
            {"kind": "replay", "id": "a", "rewards": [1.0] + [0.0] * 7},
            {"kind": "new", "id": "d", "rewards": [0.0] * 8},
            {"kind": "bcq", "id": "d", "rewards": [0.0] * 8},
        ],
    }
    m = bench.mechanism(steps)
    # hard visits: a and b in step 1, a and d in step 2; with a signal: a (its BCQ group), b, a; not d
    assert (m["hard_groups"], m["hard_with_signal"]) == (4, 3)
    # two steps: the first quarter is step 1, the last step 2
    assert m["bcq"] == {
        "groups": 2, "in_prompt": 0.5, "plain": 0.0,
        "first_quarter": 0.5, "first_quarter_groups": 1, "last_quarter": 0.0, "last_quarter_groups": 1,
    }  # fmt: skip
    assert m["ncq"]["groups"] == 1 and m["ncq"]["in_prompt"] == m["ncq"]["plain"] == 0.0
    assert (m["ncq"]["first_quarter_groups"], m["ncq"]["last_quarter_groups"]) == (1, 0)


def test_the_interval_draws_seeds_then_questions():
    indices = bench.cluster_indices(n_seeds=3, n_questions=5, resamples=200)
    assert indices.shape == (200, 15)
    blocks = indices.reshape(200, 3, 5) // 5  # the seed each drawn question belongs to
    assert (blocks == blocks[:, :, :1]).all()  # a drawn seed brings its own questions only
    assert len({tuple(row) for row in blocks[:, :, 0]}) > 5
    same = {seed: {f"q{i}": 0.5 for i in range(5)} for seed in (1, 2, 3)}
    better = {seed: {k: v + 0.1 for k, v in scores.items()} for seed, scores in same.items()}
    result = bench.effect(better, same, resamples=500)
    assert result["delta_pp"] == pytest.approx(10) and result["ci95_pp"] == pytest.approx([10, 10])
    # one seed without the effect: the interval reaches down to it, the question-only spread would not
    mixed = {**better, 3: same[3]}
    result = bench.effect(mixed, same, resamples=2_000)
    assert result["delta_pp"] == pytest.approx(20 / 3) and result["ci95_pp"][0] == pytest.approx(0)
    assert result["per_seed_pp"] == pytest.approx({1: 10, 2: 10, 3: 0})


@pytest.mark.integration
def test_the_smallest_setting_runs_every_part(boxed_text_student_dir, vllm_boxed_teacher_server, tmp_path):
    """Two rollout steps of GRPO† and ZPPO through the script's own processes, on the suite's boxed student (which
    boxes wrong answers to these questions: NCQ prompts get built) and the session's vLLM boxed teacher."""
    design, server = bench.SMOKE, vllm_boxed_teacher_server
    client = TeacherClient(server.base_url, server.model)
    regime = bench.measure_regime(boxed_text_student_dir, client, design, seed=0)
    client.close()
    assert regime["training_questions"] == design.regime_questions
    assert len(regime["probe"]) == design.probe_size
    out = tmp_path / "bench"
    runs = [(row, 0) for row in bench.HEADLINE]
    bench.run_all(runs, out, design, {"student": boxed_text_student_dir}, server, regime["probe"], 2, True)
    for row, seed in runs:
        run = bench.read_run(bench.run_dir(out, row, seed))
        assert list(run["eval"]) == [0, 2]  # at the start and the end
        assert all(len(e["heldout"]) == design.heldout_size and len(e["probe"]) == design.probe_size
                   for e in run["eval"].values())  # fmt: skip
        assert list(run["groups"]) == [1, 2] and len(run["metrics"]) == 2
        kinds = {g["kind"] for groups in run["groups"].values() for g in groups}
        assert kinds <= ({"new", "replay", "bcq", "ncq"} if row == "ZPPO" else {"new", "replay"})
        if row == "ZPPO":
            assert kinds & {"bcq", "ncq"}
        assert all(m["zppo/generated_tokens"] > 0 for m in run["metrics"])
    summary = bench.summarize(out, bench.HEADLINE, [0], design, regime)
    assert set(summary) >= {"regime", "mechanism", "effect", "cost", "curves"}
    assert set(summary["effect"]["heldout_accuracy"]) == set(bench.HEADLINE)
    assert summary["cost"]["ZPPO"]["teacher_requests"] > 0 == summary["cost"]["GRPO\u2020"]["teacher_requests"]
    json.dumps(summary)
    bench.plot(summary, tmp_path / "learning.png")
    assert (tmp_path / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = bench.console(summary)
    assert text.splitlines()[-1].startswith("verdict: no verdict, the regime is not met")
