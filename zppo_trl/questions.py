"""The training questions as a rollout step reads them: a question's dataset row by key, its student prompt
(question, block, closer) and teacher chat in the dataset's format (:class:`Questions`); and the teacher's replies
graded with the trainer's own reward functions (:class:`Grader`).

Both are objects :class:`zppo_trl.ZPPOTrainer` builds once and hands to the collaborators that read questions; neither
knows the trainer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from trl.trainer.utils import is_async_callable

from . import data
from .rollout import CORRECT

__all__ = ["Grader", "Questions"]


class Questions:
    """The training questions by key, and their prompts.

    Args:
        dataset: the training dataset (a map-style one), or None for a stream.
        row_of: question id -> the dataset's row index; None for a stream, whose rows of the step being trained are
            handed over by :meth:`take_stream`.
        dataset_format: the dataset's :class:`zppo_trl.dataset_formats.DatasetFormat`.
        closer: the prompt's closer (``ZPPOConfig.closer``).
    """

    def __init__(self, dataset: Any, row_of: Mapping[Any, int] | None, dataset_format: Any, closer: str | None):
        self.dataset, self.row_of, self.format, self.closer = dataset, row_of, dataset_format, closer
        self._streamed: dict[Any, Mapping] = {}  # a stream's rows of the step, by id

    @property
    def streamed(self) -> bool:
        """Whether the questions come from a stream (no lookup by key beyond the step's own)."""
        return self.row_of is None

    def take_stream(self, rows: Sequence[Mapping]) -> None:
        """A stream's questions of this step, from every rank: the only ones :meth:`row` can look up until the next."""
        self._streamed = {row[data.ID]: row for row in rows}

    def row(self, key: Any) -> Mapping:
        """The training dataset's row of question ``key`` (a stream's: of the step being trained)."""
        if self.row_of is None:
            return self._streamed[key]
        return self.dataset[self.row_of[key]]

    def with_prompt(self, row: Mapping, block: str | None = None) -> dict:
        """The row with TRL's ``prompt`` in the dataset's format: question, block, closer (images added by TRL)."""
        return {**row, "prompt": self.format.prompt(row, block, self.closer)}

    def teacher_chat(self, row: Mapping, text: str | None = None) -> list[dict]:
        """A chat for the teacher's server: the row's images, then ``text`` (default: the student's plain prompt)."""
        return self.format.chat(row, text, self.closer)

    def question(self, row: Mapping) -> str:
        """The row's question text, without block or closer, whatever the dataset's format."""
        return self.format.question(row)


class Grader:
    """Grades replies with the trainer's reward functions, called as TRL calls them (sync or async).

    Args:
        questions: the :class:`Questions` the replies answer.
        reward_funcs: the trainer's reward functions; ``reward_weights`` their weights (a sequence of floats).
        trainer_state: () -> TRL's current ``TrainerState`` (what a reward function receives as ``trainer_state``).
        event_loop: () -> TRL's event loop for async reward functions (None where none is async).
    """

    def __init__(
        self,
        questions: Questions,
        reward_funcs: Sequence[Callable],
        reward_weights: Sequence[float],
        trainer_state: Callable[[], Any],
        event_loop: Callable[[], Any],
    ):
        self.questions = questions
        self.reward_funcs, self.reward_weights = list(reward_funcs), [float(w) for w in reward_weights]
        self.trainer_state, self.event_loop = trainer_state, event_loop

    def grade(self, rows: Sequence[Mapping], texts: Sequence[Sequence[str]]) -> list[list[bool]]:
        """``texts[i]`` are replies to ``rows[i]``'s question: each one's verdict (weighted reward above
        :data:`zppo_trl.rollout.CORRECT`). Every reply goes in one call per function, as TRL scores a round, so that a
        judge answers them all concurrently rather than one question at a time."""
        reply_rows = [row for row, replies in zip(rows, texts, strict=True) for _ in replies]
        if not reply_rows:
            return [[] for _ in rows]
        fmt = self.questions.format
        prompts = [self.questions.with_prompt(row)["prompt"] for row in rows]
        completions = [[{"role": "assistant", "content": t}] for replies in texts for t in replies]
        prompts, completions = fmt.for_rewards(prompts, completions)  # as TRL would give them
        names = dict.fromkeys(name for row in rows for name in row if name != "prompt")
        columns = {name: [row.get(name) for row in reply_rows] for name in names}
        total = torch.zeros(len(reply_rows), dtype=torch.float64)
        for func, weight in zip(self.reward_funcs, self.reward_weights):
            scores = func(
                prompts=[prompt for prompt, replies in zip(prompts, texts) for _ in replies],
                completions=completions,
                completion_ids=None,
                trainer_state=self.trainer_state(),
                log_extra=lambda *a, **k: None,
                log_metric=lambda *a, **k: None,
                **columns,
            )
            if is_async_callable(func):  # TRL runs async reward functions on its own event-loop thread
                scores = asyncio.run_coroutine_threadsafe(scores, self.event_loop()).result()
            total += weight * torch.tensor([0.0 if s is None else float(s) for s in scores], dtype=torch.float64)
        correct = iter(bool(score > CORRECT) for score in total)
        return [[next(correct) for _ in replies] for replies in texts]

    def grade_keys(self, keys: Sequence[Any], texts: Sequence[Sequence[str]]) -> list[list[bool]]:
        """:meth:`grade` with the questions named by key."""
        return self.grade([self.questions.row(key) for key in keys], texts)
