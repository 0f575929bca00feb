"""`TeacherSampler`, without a trainer: step 2's request (the new questions' replies taken from a prefetch that asked
for the same questions, asked again otherwise) and step 4's evidence (replies graded, wrong plain rollouts kept)."""

import concurrent.futures
from types import SimpleNamespace

import torch
from accelerate import Accelerator

from zppo_trl.ranks import Ranks
from zppo_trl.rollout import FILLER, Draw, Group, Round
from zppo_trl.teacher_sampling import TeacherSampler

Q1, Q2, Q3 = ({"id": f"q{i}", "question": f"question {i}"} for i in (1, 2, 3))


class _Teacher:
    """Answers every chat at once with a reply naming its question."""

    def __init__(self):
        self.asked: list[list[str]] = []

    def sample_async(self, chats, n, max_tokens, temperature, top_p, errors=None):
        self.asked.append(list(chats))
        future = concurrent.futures.Future()
        future.set_result([[f"{chat} says {k}" for k in range(n)] for chat in chats])
        return future


class _Grader:
    def grade(self, rows, texts):
        return [[reply.endswith("0") for reply in replies] for replies in texts]


def _sampler():
    teacher = _Teacher()
    questions = SimpleNamespace(teacher_chat=lambda row, text=None: row["question"])
    recorder = SimpleNamespace(metrics={})
    sampler = TeacherSampler(
        teacher, questions, _Grader(), Ranks(Accelerator(cpu=True)), 2, recorder,
        n=2, max_tokens=8, temperature=1.0, top_p=1.0,
    )  # fmt: skip
    return sampler, teacher, recorder.metrics


def test_a_prefetch_of_the_same_questions_is_used_and_only_replays_are_asked():
    sampler, teacher, metrics = _sampler()
    sampler.prefetch([Q1, Q2])
    future = sampler.start([Group("new", Q1), Group("new", Q2), Group("replay", Q3), Group(FILLER, Q1)])
    assert teacher.asked == [["question 1", "question 2"], ["question 3"]] and metrics["teacher_prefetched"] == 2
    assert [replies[0] for replies in future.result()] == [
        "question 1 says 0",
        "question 2 says 0",
        "question 3 says 0",
    ]


def test_a_prefetch_of_other_questions_is_asked_again(caplog):
    sampler, teacher, metrics = _sampler()
    sampler.prefetch([Q3])
    sampler.start([Group("new", Q1)])
    assert teacher.asked[-1] == ["question 1"] and metrics["teacher_prefetched"] == 0
    assert "asking again" in caplog.text


def test_evidence_keeps_graded_replies_and_wrong_rollouts_of_the_hard_questions():
    sampler, _, metrics = _sampler()
    draw = Draw(["q1", "q2"], [], [Group("new", Q1), Group("new", Q2)], 0)
    future = sampler.start(draw.plain)
    plain = Round(
        None, torch.tensor([0.0, 1.0, 0.0, 0.0]), ["w1", "r1", "w2", "w2b"], [[("new", "q1"), ("new", "q2")]]
    )
    evidence = sampler.evidence(future, draw, plain, ["q1"])
    assert evidence.teacher_correct == {"q1": ["question 1 says 0"]}  # the graded-correct reply only
    assert evidence.student_wrong == {"q1": ["w1"]}  # q2 is not hard: nothing of it
    assert "time/teacher_sample_wait_s" in metrics
