"""RLKD† (the paper's teacher-side table): its reasoning-structure reward, step by step on hand-written
decompositions and a scripted judge, the GSRM's request, and the configuration that selects the row.

Written out from RLKD's official code: step k scores 1 while every meta-reasoning (``[sub-think j]``, j <= k) is
judged the same as the teacher's, else 0 from the first mismatch on; a surviving step is halved when its sub-problem
(``[Query k]``) is judged different, and halved again when its answer is; steps past the shorter decomposition
score nothing; the reward is the sum.
"""

from __future__ import annotations

import re

import pytest

from zppo_trl import ZPPOConfig
from zppo_trl.terms.rlkd import (
    GSRM_SYSTEM,
    Decomposition,
    gsrm_conversation,
    parse_decomposition,
    reasoning_of,
    structure_rewards,
)

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from settings import CPU as CPU_ONLY
except ImportError:
    from tests.settings import CPU as CPU_ONLY

CPU = {**CPU_ONLY, "augmentations": []}
TEACHER = dict(teacher_base_url="http://127.0.0.1:1/v1", teacher_model="teacher")


def _steps(*names: str) -> Decomposition:
    """A decomposition whose step k is ``name_k``: its meta-reasoning, sub-problem and answer all carry the name."""
    return Decomposition(
        tuple(f"[sub-think {k}]: {n}" for k, n in enumerate(names, 1)),
        tuple(f"[Query {k}]: {n}" for k, n in enumerate(names, 1)),
        tuple(f"[Answer {k}]: {n}" for k, n in enumerate(names, 1)),
    )


class ScriptedJudge:
    """Answers RLKD's yes/no prompts by whether the two contents' names agree, except the pairs listed as different
    for a kind ('Think', 'Content' for sub-problem and answer); keeps every round of prompts it was asked."""

    def __init__(self, different: dict[str, set[str]] | None = None, fail: str | None = None):
        self.different = different or {}
        self.fail = fail
        self.rounds: list[list[str]] = []

    def __call__(self, prompts: list[str]) -> list[str | None]:
        self.rounds.append(prompts)
        replies = []
        for prompt in prompts:
            pair = re.search(r"Content 1: (.*) \n(?:Think )?Content 2: (.*)\n#", prompt)
            first, second = (block.split("]: ", 1)[1] for block in pair.groups())
            if self.fail is not None and self.fail in prompt:
                replies.append(None)
                continue
            kind = "Query" if "[Query" in prompt else "Answer" if "[Answer" in prompt else "Think"
            same = first == second and second not in self.different.get(kind, set())
            replies.append("Yes." if same else "No, they differ.")
        return replies


def test_the_gsrm_reads_its_system_prompt_then_the_question_and_the_reasoning():
    messages = gsrm_conversation("What is 6 x 7?", "I multiply.")
    assert messages[0] == {"role": "system", "content": GSRM_SYSTEM}
    assert messages[1] == {
        "role": "user",
        "content": "What is 6 x 7?\nYou should decompose this reasoning:\nI multiply.",
    }
    assert GSRM_SYSTEM.startswith("You are a helpful AI Assistant. Decompose the problem into multiple steps")
    assert "[sub-think]-[Query]-[Answer]" in GSRM_SYSTEM
    assert reasoning_of("<think>\nplan</think>\nanswer") == "<think>\nplan"
    assert reasoning_of("no think block") == "no think block"


def test_a_decomposition_is_parsed_block_by_block_in_order():
    reply = (
        "Here you go.\n[sub-think 1]: why first\n[Query 1]: what is 6 x 7\n[Answer 1]: 42\n\n"
        "[sub-think 2]: check\n[Query 2]: is 42 even\n[Answer 2]: yes\nSo the final answer is: 42"
    )
    steps = parse_decomposition(reply)
    assert steps.sub_thinks == ("[sub-think 1]: why first", "[sub-think 2]: check")
    assert steps.queries == ("[Query 1]: what is 6 x 7", "[Query 2]: is 42 even")
    assert steps.answers == ("[Answer 1]: 42", "[Answer 2]: yes\nSo the final answer is: 42")
    assert len(steps) == 2
    assert parse_decomposition("[Query 1]: no meta-reasoning at all") is None
    assert parse_decomposition("plain prose") is None


def test_the_reward_is_a_prefix_of_matching_meta_reasoning_halved_per_differing_sub_problem_and_answer():
    teacher = _steps("a", "b", "c", "d")
    rollout = _steps("a", "b", "c", "x", "e")  # meta-reasoning matches for 3 steps, then differs
    judge = ScriptedJudge(different={"Query": {"b"}, "Answer": {"b", "c"}})
    (reward,) = structure_rewards([(teacher, rollout)], judge)
    # step 1: 1; step 2: sub-problem and answer differ, 1 x 0.5 x 0.5; step 3: answer differs, 0.5; step 4: 0
    assert reward == pytest.approx(1 + 0.25 + 0.5)
    thinks, queries, answers = judge.rounds[:4], judge.rounds[4], judge.rounds[5]
    assert [len(r) for r in thinks] == [1, 1, 1, 1]  # one meta-reasoning step per round, until the mismatch
    assert len(judge.rounds) == 6  # no step after the first mismatch is asked about
    assert len(queries) == len(answers) == 3  # the three surviving steps
    assert thinks[0][0].startswith("\n# Please judge whether the following two Think Contents are devoted")
    assert "# Think Content 1: [sub-think 1]: a \nThink Content 2: [sub-think 1]: a\n" in thinks[0][0]
    assert answers[0].startswith("\n# Please judge whether the following two Contents are equally.")


def test_steps_past_the_shorter_decomposition_and_missing_ones_score_nothing():
    judge = ScriptedJudge()
    rewards = structure_rewards(
        [
            (_steps("a", "b", "c"), _steps("a")),
            (_steps("a"), _steps("a", "b")),
            (None, _steps("a")),
            (_steps("a"), None),
        ],
        judge,
    )
    assert rewards == [1.0, 1.0, 0.0, 0.0]
    assert sum(len(r) for r in judge.rounds) == 2 * 3  # the two comparable pairs: one step each, three prompts


def test_a_failed_judge_request_leaves_the_rollout_without_a_reward():
    judge = ScriptedJudge(fail="[Query 2]")
    rewards = structure_rewards([(_steps("a", "b"), _steps("a", "b")), (_steps("a"), _steps("a"))], judge)
    assert rewards == [None, 1.0]


def test_rlkd_is_a_reward_term_named_as_the_papers_table():
    config = ZPPOConfig(reward_term="rlkd", **TEACHER, **CPU)
    assert config.variant == "RLKD\u2020" and config.rlkd_reward_weight == 1.0
    assert config.judge_base_url == TEACHER["teacher_base_url"]  # the judge defaults to the teacher's endpoint
    with pytest.raises(ValueError, match="reward_term='rlkd' compares each rollout's reasoning .* teacher_base_url"):
        ZPPOConfig(reward_term="rlkd", **CPU)
    with pytest.raises(ValueError, match="rlkd_reward_weight must be a finite number"):
        ZPPOConfig(reward_term="rlkd", rlkd_reward_weight=-1.0, **TEACHER, **CPU)
    with pytest.warns(UserWarning, match="rlkd_reward_weight=2.0 has no effect .*only reward_term: rlkd"):
        ZPPOConfig(rlkd_reward_weight=2.0, **CPU)
