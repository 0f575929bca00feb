"""Perception-R1's visual perception reward: the multimodal-reward row that rewards a rollout for stating what the
image shows.

The paper's table of multimodal rewards adds Perception-R1 (Xiao et al., "Perception-R1: Advancing Multimodal
Reasoning Capabilities of MLLMs via Visual Perception Reward", arXiv 2506.07218) to the GRPO† pipeline: "a
visual-perception reward, judged by an LLM against textual visual annotations of the image, beside the correctness
reward". As its official code computes it, for every rollout of a question that has annotations (correct or not):

1. A text-only judge LLM reads the question's K visual annotations (short facts about the image, e.g. "AB is a
   diameter of the circle") and the whole rollout (its reasoning included), and answers one ``<infoK>1</infoK>`` or
   ``<infoK>0</infoK>`` per annotation: whether the rollout states that fact (present, not whether it is relevant).
   Temperature 0, 512 tokens.
2. ``r_v`` is the fraction of the annotations judged present.
3. ``gamma * r_v`` (gamma 0.7, its released training script) is added to the rollout's reward before the
   advantages.

Choices where the paper and its code leave room (docs/comparison_rows.md says the same):

- **The judge's instructions** are this project's own words for the protocol above, zero-shot: the code's
  few-shot examples are geometry problems from its own corpus.
- **An item the judge leaves out** counts as not present, and ``r_v`` is over the K annotations of the row (the
  code divides by the items it could parse, so a judge that stops early scores higher).
- **A failed judge request** gives ``r_v = 0`` for that rollout, counted, as the house rule wants a failing judge to
  degrade a step and never end it (the code's own fallback is 0 too).
- **The other terms of its reward** (a 0.9/0.1 split between accuracy and a ``<think>/<answer>`` format reward, and
  an n-gram repetition penalty) are not part of the row: the ZPPO paper adds the perception reward beside the same
  correctness reward every row uses.

The annotations are a dataset column, :data:`ANNOTATIONS` (a list of strings per row; Perception-R1 extracts them
with an LLM from teacher reasoning traces). The ZPPO-77K corpus does not carry them: a row without annotations
gets no perception reward, and its rollouts are counted (``zppo/perception_unannotated``).

This module is pure: no torch, no TRL, no trainer; the judge is any :class:`zppo_trl.teacher.TeacherClient`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import data
from ..checks import check_number
from ..needs import Needs
from ..rollout import FILLER
from ..teacher import strip_thinking
from .base import Contribution, Description, PlainStep, Term, TermContext, added_rewards, register_term

logger = logging.getLogger(__name__)

__all__ = [
    "ANNOTATIONS",
    "PERCEPTION_JUDGE_MAX_TOKENS",
    "PERCEPTION_JUDGE_TEMPLATE",
    "PERCEPTION_REWARD_WEIGHT",
    "PerceptionR1",
    "PerceptionSettings",
    "judge_perception",
    "parse_perception_verdicts",
    "perception_reward",
    "render_perception_judge",
    "row_annotations",
]

ANNOTATIONS = "visual_annotations"  # the dataset column: the visual facts a rollout should state, one string each
PERCEPTION_REWARD_WEIGHT = 0.7  # gamma, as Perception-R1's released training script sets visual_reward_factor
PERCEPTION_JUDGE_MAX_TOKENS = 512  # its judge's completion cap (at temperature 0)

PERCEPTION_JUDGE_TEMPLATE = """You check whether a response to a question about an image states given facts about \
that image. Below are numbered pieces of visual information, then the response.

For each piece, answer 1 if the response clearly states that information (in any words), otherwise 0. Judge only \
whether the information is present in the response, not whether it is relevant or whether the response's answer is \
right. Reply with one tag per piece and nothing else, in this form: <info1>1</info1> <info2>0</info2>

Visual information:
{annotations}

Response:
{response}"""


def row_annotations(value: Any, row_id: Any) -> list[str]:
    """A dataset row's ``ANNOTATIONS`` value as a list of non-empty strings, stripped; an empty list where the row
    has none (None or an empty list). Anything else raises ``ValueError`` naming the row by ``row_id``."""
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(
            f"row {row_id!r}: field {ANNOTATIONS!r} must be a list of strings, got {type(value).__name__}"
        )
    annotations = []
    for position, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"row {row_id!r}: field {ANNOTATIONS!r} item {position} must be a non-empty string")
        annotations.append(item.strip())
    return annotations


def render_perception_judge(annotations: Sequence[str], response: str) -> str:
    """The judge's prompt for one rollout: the annotations as ``<info1>...</info1>`` lines, then the response."""
    if not annotations:
        raise ValueError("a perception judgement needs at least one visual annotation")
    listed = "\n".join(f"<info{k}>{text}</info{k}>" for k, text in enumerate(annotations, 1))
    return PERCEPTION_JUDGE_TEMPLATE.format(annotations=listed, response=response)


def parse_perception_verdicts(reply: str, count: int) -> list[bool]:
    """Whether the judge's ``reply`` marks each of the ``count`` annotations present: the last ``<infoK>`` tag of
    each index K after the reply's reasoning, whose content is 1 (``1``, ``1.0``); any other content, or no tag, is
    not present."""
    reply = strip_thinking(reply)
    verdicts = []
    for k in range(1, count + 1):
        tags = re.findall(rf"<info{k}>\s*(.*?)\s*</info{k}>", reply, flags=re.DOTALL)
        try:
            verdicts.append(bool(tags) and float(tags[-1]) == 1.0)
        except ValueError:
            verdicts.append(False)
    return verdicts


def perception_reward(verdicts: Sequence[bool]) -> float:
    """``r_v``: the fraction of the annotations judged present (0 for none)."""
    return sum(map(bool, verdicts)) / len(verdicts) if verdicts else 0.0


def judge_perception(
    judge: Any, items: Sequence[tuple[Sequence[str], str]], max_tokens: int = PERCEPTION_JUDGE_MAX_TOKENS
) -> list[float | None]:
    """``r_v`` of each ``(annotations, response)`` item, every request sent at once to ``judge`` (a
    :class:`~zppo_trl.teacher.TeacherClient`) at temperature 0; None where the request failed after its retries.
    The verdict is read from the reply's content (a reasoning trace the server split out is left out)."""
    if not items:
        return []
    prompts = [render_perception_judge(annotations, response) for annotations, response in items]
    replies = judge.sample(prompts, n=1, max_tokens=max_tokens, temperature=0.0, reasoning=False)
    return [
        perception_reward(parse_perception_verdicts(texts[0], len(annotations))) if texts else None
        for (annotations, _), texts in zip(items, replies, strict=True)
    ]


# ---------------------------------------------------------------------- the term


@dataclass(kw_only=True)  # after GRPOConfig's positional output_dir in ZPPOConfig
class PerceptionSettings:
    """Perception-R1's field of :class:`zppo_trl.ZPPOConfig` (``reward_term: perception_r1`` reads it)."""

    perception_reward_weight: float = field(
        default=PERCEPTION_REWARD_WEIGHT,
        metadata={
            "help": "Perception-R1: the weight of its perception reward beside the correctness reward (its released "
            "script: 0.7). Only reward_term: perception_r1 reads it."
        },
    )


@register_term
class PerceptionR1(Term):
    """Perception-R1† (``reward_term: perception_r1``): ``perception_reward_weight`` times ``r_v`` added to the plain
    rewards for the advantages (never the plain accuracy or the buffer), judged by the run's judge."""

    selector = "reward_term"
    name = "perception_r1"
    printed = "Perception-R1"
    needs = Needs(judge=True, plain_pipeline_only=True)
    settings = PerceptionSettings
    reads = ("perception_reward_weight",)

    @classmethod
    def check_settings(cls, args: Any) -> None:
        check_number("perception_reward_weight", args.perception_reward_weight)

    @classmethod
    def validate(cls, args: Any) -> None:
        if not ((args.judge_base_url or args.teacher_base_url) and (args.judge_model or args.teacher_model)):
            raise ValueError(
                "reward_term='perception_r1' asks a judge whether each rollout states the question's visual "
                "annotations: set judge_base_url and judge_model (or teacher_base_url and teacher_model)"
            )

    @classmethod
    def describe(cls, args: Any) -> Description:
        return Description(
            plan=(
                f"  reward term: Perception-R1's perception reward ({args.perception_reward_weight:g} x the fraction "
                f"of a question's visual_annotations stated), judged by {args.judge_model} at {args.judge_base_url}",
            ),
            card=(
                f"A judge's fraction of each question's visual annotations a rollout states is added to its reward "
                f"(weight {args.perception_reward_weight:g}; Perception-R1), in the advantages only."
            ),
        )

    def __init__(self, args: Any, ctx: TermContext):
        """Every row's annotations are checked now (a malformed one raises, naming its row) and how many rows carry
        any is logged: a row without them trains as GRPO\u2020's."""
        super().__init__(args, ctx)
        dataset = ctx.dataset
        self.judge = ctx.judge()
        if not hasattr(dataset, "__len__"):  # a stream: each row's annotations are checked as the row is trained
            logger.info("Perception-R1: a streamed training set's annotations are read as its rows come")
            return
        annotated = 0
        if ANNOTATIONS in (dataset.column_names or []):
            column, ids = dataset[ANNOTATIONS], dataset[data.ID]
            annotated = sum(1 for key, value in zip(ids, column) if row_annotations(value, key))
        (logger.info if annotated else logger.warning)(
            "Perception-R1: %d of %d training rows carry visual annotations; the others get no perception reward",
            annotated,
            len(dataset),
        )

    @property
    def clients(self) -> list[tuple[str, Any]]:
        return [("judge", self.judge)]

    def after_plain(self, step: PlainStep) -> Contribution:
        """Each rank asks the judge about its own rollouts of annotated questions; the rewards are gathered, so every
        rank adds the same. Fillers, questions without annotations and rollouts whose request failed (counted) get
        none."""
        ctx, plain_round = self.ctx, step.round
        G = ctx.group_size
        items, positions, unannotated = [], [], 0
        for g, group in enumerate(step.draw.plain):
            if group.kind == FILLER:
                continue
            key = group.row[data.ID]
            annotations = row_annotations(ctx.row(key).get(ANNOTATIONS), key)
            if not annotations:
                unannotated += G
                continue
            for i in range(g * G, (g + 1) * G):
                items.append((annotations, plain_round.texts[i]))
                positions.append(i)
        scores = judge_perception(self.judge, items)
        judged = [score for score in scores if score is not None]
        count, total = ctx.ranks.total(len(judged)), ctx.ranks.total(sum(judged))  # over every rank, as RLKD's
        metrics = {
            "perception_judged": count,
            "perception_judge_failed": ctx.ranks.total(len(scores) - len(judged)),
            "perception_unannotated": ctx.ranks.total(unannotated),
            "perception_reward_mean": total / max(count, 1),
        }
        added = added_rewards(ctx, plain_round, positions, scores, self.args.perception_reward_weight)
        return Contribution(rewards=added, metrics=metrics)
