"""RLKD's reasoning-structure reward: the teacher-side row that rewards a rollout for reasoning in the teacher's steps.

The paper's teacher-side table adds RLKD (Xu et al. 2025, "Distilling the Implicit Multi-Branch Structure in LLMs'
Reasoning via Reinforcement Learning", arXiv 2505.16142) to the GRPO† pipeline: "a teacher-dependent
reasoning-structure reward". As its official code (xsc1234/RLKD) computes it, per rollout:

1. A generative structure reward model (GSRM) decomposes a reasoning (the text before ``</think>``) into steps
   ``[sub-think k]`` (the meta-reasoning: why this step), ``[Query k]`` (the sub-problem) and ``[Answer k]``, with its
   system prompt (:data:`GSRM_SYSTEM`, word for word) and the question and reasoning as the user turn. The teacher's
   trace is decomposed the same way.
2. A judge compares the two decompositions step by step, with RLKD's three yes/no prompts (word for word): step k
   scores 1 while every meta-reasoning up to it is judged "devoted to solving the same problem" as the teacher's
   (the first "no" zeroes it and every later step); then a sub-problem judged different halves it, and an answer
   judged different halves it again. Steps beyond the shorter decomposition score nothing.
3. The reward is the sum over steps, unnormalised, in [0, min(teacher steps, rollout steps)]; it is added to the
   correctness reward with weight ``rlkd_reward_weight`` (RLKD's code weighs the two equally, 15 and 15), for every
   rollout, right or wrong.

Choices, where the official code leaves the row open (docs/comparison_rows.md says the same): the GSRM and the judge
are the run's judge endpoint (RLKD fine-tunes a 7B GSRM and judges with Qwen2.5-7B-Instruct), at temperature 0; the
user turn carries no few-shot examples, because RLKD's released examples label the steps ``[Meat-reasoning k]`` /
``[Sub-problem k]``, which its system prompt and parser do not read; the teacher's trace is its first reply to the
question graded correct, kept for the rest of the run (RLKD keeps one fixed trace per question); verdicts are read as
RLKD reads them ("yes" / "no" anywhere in the reply).

This module is pure: the judge is a client with ``sample`` (a :class:`~zppo_trl.teacher.TeacherClient`) or a
callable from prompts to replies.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import data
from ..checks import check_integer, check_number
from ..needs import Needs
from ..rollout import FILLER
from .base import (
    Contribution,
    Description,
    PlainStep,
    Term,
    TermContext,
    added_rewards,
    register_term,
    teacher_references,
)

__all__ = [
    "GSRM_MAX_TOKENS",
    "GSRM_SYSTEM",
    "RLKD",
    "RLKD_REWARD_WEIGHT",
    "RLKDSettings",
    "Decomposition",
    "decompose",
    "gsrm_conversation",
    "judge_replies",
    "parse_decomposition",
    "reasoning_of",
    "structure_rewards",
]

# RLKD's GSRM system prompt (its rewards.py), word for word.
GSRM_SYSTEM = """You are a helpful AI Assistant. Decompose the problem into multiple steps according to the thinking process for reasoning. Format the thinking content in the form of [sub-think]-[Query]-[Answer] for each step. When the [Answer] of a certain step gets the answer to the original question, stop reasoning, and the last answer should include a complete answer to the original question.
[sub-think] represents the thinking process. It is necessary to analyze the previous and next steps as detailed as possible, explain in detail why this step is done to lead to the following query, and do not mention the answer of this step.
[Query] represents the problem that needs to be solved in the current step, and analyze it as detailed as possible. Each query contains only one question.
[Answer] represents the answer to the Query. Give the answer to the [Query] directly and briefly without any reasoning steps and redundant statements.
You should split it into more [sub-think]-[Query]-[Answer] with finer granularity, but do not repeat the conditions given in the question."""  # noqa: E501
_GSRM_USER = "{question}\nYou should decompose this reasoning:\n{reasoning}"

# RLKD's three judge prompts (its rewards.py), word for word: meta-reasoning, sub-problem, answer.
_JUDGE_THINK = """
# Please judge whether the following two Think Contents are devoted to solving the same problem. Please only answer yes or no! Please only answer yes or no! Please only answer yes or no!
# Think Content 1: {} \nThink Content 2: {}
# Your Answer (yes or no):"""  # noqa: E501
_JUDGE_QUERY = """
# Please judge whether the following two Contents are devoted to solving the same problem. Please only answer yes or no! Please only answer yes or no! Please only answer yes or no!
# Content 1: {} \nContent 2: {}
# Your Answer (yes or no):"""  # noqa: E501
_JUDGE_ANSWER = """
# Please judge whether the following two Contents are equally. Please only answer yes or no! Please only answer yes or no! Please only answer yes or no!
# Content 1: {} \nContent 2: {}
# Your Answer (yes or no):"""  # noqa: E501

# RLKD's code weighs accuracy and the structure reward 15 and 15.
RLKD_REWARD_WEIGHT = 1.0
# Token caps: the GSRM's, as RLKD's code sets it; a yes/no verdict's (room for a judge that reasons first).
GSRM_MAX_TOKENS = 10_000
VERDICT_MAX_TOKENS = 512

_STEP_TAG = re.compile(r"\[(sub-think|Query|Answer)\s+\d+\]")


@dataclass(frozen=True)
class Decomposition:
    """A reasoning's steps as the GSRM wrote them, each block with its tag (``[sub-think 1]: ...``)."""

    sub_thinks: tuple[str, ...]
    queries: tuple[str, ...]
    answers: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.sub_thinks)


def reasoning_of(text: str) -> str:
    """What the GSRM decomposes: the text before the first ``</think>`` (all of it when there is none)."""
    return text.split("</think>")[0]


def gsrm_conversation(question: str, reasoning: str) -> list[dict]:
    """The GSRM's request: its system prompt, then the question and the reasoning to decompose."""
    return [
        {"role": "system", "content": GSRM_SYSTEM},
        {"role": "user", "content": _GSRM_USER.format(question=question, reasoning=reasoning)},
    ]


def parse_decomposition(reply: str) -> Decomposition | None:
    """The GSRM ``reply``'s tagged blocks, in order (each from its tag to the next tag, stripped), grouped by kind;
    None when it has no ``[sub-think k]`` block."""
    starts = [m.start() for m in _STEP_TAG.finditer(reply)] + [len(reply)]
    blocks: dict[str, list[str]] = {"sub-think": [], "Query": [], "Answer": []}
    for start, end in zip(starts, starts[1:]):
        block = reply[start:end].strip()
        blocks[_STEP_TAG.match(block).group(1)].append(block)
    if not blocks["sub-think"]:
        return None
    return Decomposition(tuple(blocks["sub-think"]), tuple(blocks["Query"]), tuple(blocks["Answer"]))


def structure_rewards(
    pairs: Sequence[tuple[Decomposition | None, Decomposition | None]],
    judge: Callable[[list[str]], list[str | None]],
) -> list[float | None]:
    """RLKD's structure reward of each ``(teacher, rollout)`` decomposition pair (0 when either is missing).

    ``judge`` answers a batch of prompts (None: a failed request; the pair's reward is then None, where RLKD's code
    gives 0 to a rollout whose reward raised). The judging runs in rounds: meta-reasoning step k of every pair still
    matching at k, at once; then every surviving step's sub-problem, then its answer."""
    steps = [[] if t is None or s is None else [1.0] * min(len(t), len(s)) for t, s in pairs]
    failed = [False] * len(pairs)
    depth = max((len(scores) for scores in steps), default=0)
    alive = [bool(scores) for scores in steps]
    for k in range(depth):  # the meta-reasoning: a prefix until the first mismatch
        asked = [i for i, scores in enumerate(steps) if alive[i] and k < len(scores)]
        replies = judge([_JUDGE_THINK.format(pairs[i][0].sub_thinks[k], pairs[i][1].sub_thinks[k]) for i in asked])
        for i, reply in zip(asked, replies, strict=True):
            failed[i] = failed[i] or reply is None
            if reply is None or "yes" not in reply.lower():
                steps[i][k:] = [0.0] * (len(steps[i]) - k)
                alive[i] = False
    for template, part in ((_JUDGE_QUERY, "queries"), (_JUDGE_ANSWER, "answers")):
        asked = [
            (i, k)
            for i, scores in enumerate(steps)
            for k, score in enumerate(scores)
            if score > 0 and k < min(len(getattr(pairs[i][0], part)), len(getattr(pairs[i][1], part)))
        ]
        prompts = [template.format(getattr(pairs[i][0], part)[k], getattr(pairs[i][1], part)[k]) for i, k in asked]
        for (i, k), reply in zip(asked, judge(prompts) if asked else [], strict=True):
            failed[i] = failed[i] or reply is None
            if reply is not None and "no" in reply.lower():
                steps[i][k] *= 0.5
    return [None if bad else sum(scores) for scores, bad in zip(steps, failed)]


def decompose(
    judge: Any, items: Sequence[tuple[str, str]], max_tokens: int = GSRM_MAX_TOKENS
) -> list[tuple[bool, Decomposition | None]]:
    """The GSRM's decomposition of each ``(question, reasoning)`` item, every request sent at once to ``judge`` at
    temperature 0 with ``max_tokens``: ``(answered, decomposition)``, ``answered`` False where the request failed after
    its retries and the decomposition None where the reply has no step."""
    if not items:
        return []
    conversations = [gsrm_conversation(question, reasoning) for question, reasoning in items]
    replies = judge.sample(conversations, n=1, max_tokens=max_tokens, temperature=0.0, reasoning=False)
    return [(bool(texts), parse_decomposition(texts[0]) if texts else None) for texts in replies]


def judge_replies(judge: Any) -> Callable[[list[str]], list[str | None]]:
    """:func:`structure_rewards`' judge from a client: each prompt asked once at temperature 0, every request of a
    round at once; its reply's content, or None where the request failed."""

    def ask(prompts: list[str]) -> list[str | None]:
        if not prompts:
            return []
        replies = judge.sample(prompts, n=1, max_tokens=VERDICT_MAX_TOKENS, temperature=0.0, reasoning=False)
        return [texts[0] if texts else None for texts in replies]

    return ask


# ---------------------------------------------------------------------- the term


@dataclass(kw_only=True)  # after GRPOConfig's positional output_dir in ZPPOConfig
class RLKDSettings:
    """RLKD's fields of :class:`zppo_trl.ZPPOConfig` (``reward_term: rlkd`` reads them)."""

    rlkd_reward_weight: float = field(
        default=RLKD_REWARD_WEIGHT,
        metadata={
            "help": "RLKD: the weight of its reasoning-structure reward beside the correctness reward (its code "
            "weighs them equally). Only reward_term: rlkd reads it."
        },
    )
    rlkd_gsrm_max_tokens: int = field(
        default=GSRM_MAX_TOKENS,
        metadata={
            "help": "RLKD: the cap on a decomposition the GSRM (the judge endpoint) writes (its code's 10,000); the "
            "judge server's --max-model-len must hold a whole rollout or teacher reply plus this. Only "
            "reward_term: rlkd reads it."
        },
    )


# zppo_state.json's key for the teacher traces (the name checkpoints have always used)
TRACES_KEY = "structure_traces"


@register_term
class RLKD(Term):
    """RLKD† (``reward_term: rlkd``): ``rlkd_reward_weight`` times the structure reward added to the plain rewards for
    the advantages (never the plain accuracy or the buffer). A question's teacher trace is the teacher's first
    graded-correct reply, held (and checkpointed) from the step it appears by every rank."""

    selector = "reward_term"
    name = "rlkd"
    printed = "RLKD"
    needs = Needs(teacher_samples=True, judge=True, plain_pipeline_only=True)
    settings = RLKDSettings
    reads = ("rlkd_reward_weight", "rlkd_gsrm_max_tokens")

    @classmethod
    def check_settings(cls, args: Any) -> None:
        check_number("rlkd_reward_weight", args.rlkd_reward_weight)
        check_integer("rlkd_gsrm_max_tokens", args.rlkd_gsrm_max_tokens, 1)

    @classmethod
    def validate(cls, args: Any) -> None:
        if not (args.teacher_base_url and args.teacher_model):
            raise ValueError(
                "reward_term='rlkd' compares each rollout's reasoning with the teacher's graded-correct reply: set "
                "teacher_base_url and teacher_model (the judge, judge_base_url and judge_model, defaults to it)"
            )

    @classmethod
    def describe(cls, args: Any) -> Description:
        return Description(
            plan=(
                f"  reward term: RLKD's structure reward ({args.rlkd_reward_weight:g} x the teacher's reasoning steps "
                f"the rollout follows), a question keeping the teacher's first reply graded correct; "
                f"{args.judge_model} at {args.judge_base_url} decomposes (replies <= {args.rlkd_gsrm_max_tokens:,} "
                "tokens: its --max-model-len must hold a reply plus that) and judges",
            ),
            card=(
                "A judge decomposes each rollout's reasoning and the teacher's first graded-correct reply into "
                f"steps; the steps the rollout shares with the teacher's are added to its reward (weight "
                f"{args.rlkd_reward_weight:g}; RLKD), in the advantages only."
            ),
            teacher_use=("a question's first graded-correct answer is its reasoning reference",),
        )

    def __init__(self, args: Any, ctx: TermContext):
        super().__init__(args, ctx)
        self.judge = ctx.judge()  # RLKD's GSRM and judge
        self.traces: dict[Any, str] = {}  # key -> the teacher's trace (checkpointed)
        self.steps: dict[Any, Any] = {}  # key -> its decomposition (found again after a resume: the GSRM is greedy)

    @property
    def clients(self) -> list[tuple[str, Any]]:
        return [("judge", self.judge)]

    def after_plain(self, step: PlainStep) -> Contribution:
        """Each rank decomposes its own rollouts of questions whose teacher trace has a decomposition and has them
        judged against it; the rewards are gathered, so every rank adds the same. Fillers, rollouts of questions
        without one and rollouts whose requests failed (counted) get none."""
        ctx, plain_round, plain = self.ctx, step.round, step.draw.plain
        G, judge = ctx.group_size, self.judge
        real = [group for group in plain if group.kind != FILLER]
        held = lambda group: group.row[data.ID] in self.traces  # noqa: E731
        found: dict[Any, str] = {}
        for group, reference in zip(real, teacher_references(ctx, step.teacher_future, real, skip=held)):
            if reference is not None:
                found.setdefault(group.row[data.ID], reference)
        for part in ctx.ranks.gather(found):  # every rank keeps the same traces (and checkpoints them all)
            for key, trace in part.items():
                self.traces.setdefault(key, trace)
        keys = list(dict.fromkeys(group.row[data.ID] for group in real))
        new = [key for key in keys if key in self.traces and key not in self.steps]
        traces = [(ctx.question(ctx.row(key)), reasoning_of(self.traces[key])) for key in new]
        cap = self.args.rlkd_gsrm_max_tokens
        for key, (answered, steps) in zip(new, decompose(judge, traces, cap)):
            if answered:  # a failed request is asked again next time
                self.steps[key] = steps
        positions, teacher_steps = [], []
        for g, group in enumerate(plain):
            steps = self.steps.get(group.row[data.ID]) if group.kind != FILLER else None
            if steps is not None:
                positions += range(g * G, (g + 1) * G)
                teacher_steps += [steps] * G
        items = [(ctx.question(plain[i // G].row), reasoning_of(plain_round.texts[i])) for i in positions]
        rollouts = decompose(judge, items, cap)
        scores = structure_rewards(
            [(t, steps) for t, (_, steps) in zip(teacher_steps, rollouts)], judge_replies(judge)
        )
        scores = [score if answered else None for score, (answered, _) in zip(scores, rollouts)]
        judged = [score for score in scores if score is not None]
        metrics = {
            "rlkd_judged": ctx.ranks.total(len(judged)),
            "rlkd_failed": ctx.ranks.total(len(scores) - len(judged)),
            "rlkd_without_trace": ctx.ranks.total(len(real) * G - len(positions)),
            "rlkd_reward_mean": sum(judged) / max(len(judged), 1),
            "rlkd_traces": len(self.traces),
        }
        added = added_rewards(ctx, plain_round, positions, scores, self.args.rlkd_reward_weight)
        return Contribution(rewards=added, metrics=metrics)

    def state_dict(self) -> dict:
        return {TRACES_KEY: [[key, trace] for key, trace in self.traces.items()]}

    def load_state_dict(self, state: Any) -> None:
        self.traces = dict(state.get(TRACES_KEY, []))
