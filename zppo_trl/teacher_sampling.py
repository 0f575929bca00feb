"""Steps 2 and 4 of Algorithm 1 (:class:`TeacherSampler`): the teacher's G_T replies to every question of the step,
asked when the step starts or, with ``prefetch_teacher_samples``, during the previous step's updates
(:mod:`zppo_trl.prefetch`); and the evidence on the hard questions (the replies graded, with the student's wrong
rollouts).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from . import data
from .augmentations import Evidence, teacher_results
from .prefetch import PrefetchedSampling, joined_futures
from .rollout import CORRECT, FILLER, Draw, Group, Round, merge_lists

__all__ = ["TeacherSampler"]

logger = logging.getLogger(__name__)


class TeacherSampler:
    """Asks the teacher's server for its replies to a step's questions and grades them into step 4's evidence.

    Args:
        teacher: the teacher server's client (:class:`zppo_trl.teacher.TeacherClient`), or None where the row samples
            no teacher.
        questions: the :class:`zppo_trl.questions.Questions` (the teacher's chats).
        grader: the :class:`zppo_trl.questions.Grader` (the trainer's reward functions).
        ranks: :class:`zppo_trl.ranks.Ranks`; ``group_size``: G_S.
        recorder: the :class:`zppo_trl.step_records.StepRecorder` its stages record to.
        n, max_tokens, temperature, top_p: the teacher's sampling settings (``teacher_num_generations``, ...).
    """

    def __init__(
        self,
        teacher: Any,
        questions: Any,
        grader: Any,
        ranks: Any,
        group_size: int,
        recorder: Any,
        *,
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
    ):
        self.teacher, self.questions, self.grader, self.ranks = teacher, questions, grader, ranks
        self.group_size, self.recorder = group_size, recorder
        self.sampling = dict(n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p)
        self._prefetched: PrefetchedSampling | None = None

    def start(self, plain: Sequence[Group]) -> Any:
        """Step 2: a Future of the teacher's G_T replies to every real question of this rank, in order. The new
        questions' replies were asked for during the previous step's updates where it could read this step's
        batch ahead (:meth:`prefetch`); then only the replayed ones are asked for now."""
        real = [g for g in plain if g.kind != FILLER]  # new questions first, then replayed ones
        new_keys = [g.row[data.ID] for g in real if g.kind == "new"]
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched.keys != new_keys:
            logger.warning(
                "the teacher samples asked for ahead were for questions %s, this step draws %s: asking again",
                prefetched.keys,
                new_keys,
            )
            prefetched = None
        if prefetched is not None and prefetched.failed():
            logger.warning("the teacher samples asked for ahead failed (%s): asking again", prefetched.errors)
            prefetched = None
        self.recorder.metrics["teacher_prefetched"] = len(new_keys) if prefetched is not None else 0
        if prefetched is None:
            return self.sample([g.row for g in real])
        rest = [g.row for g in real[len(new_keys) :]]
        return joined_futures([prefetched.future] + ([self.sample(rest)] if rest else []))

    def prefetch(self, rows: Sequence[Mapping]) -> None:
        """Ask for the replies to the next rollout step's new questions on this rank (its dataloader batch's rows, one
        per question), read ahead; :meth:`start` takes them when that step draws the same questions."""
        errors: list = []
        future = self.sample(rows, errors)
        self._prefetched = PrefetchedSampling([row[data.ID] for row in rows], future, errors)

    def sample(self, rows: Sequence[Mapping], errors: list | None = None) -> Any:
        """A Future of the teacher's G_T replies to each row's plain question (``errors``: as ``sample_async``'s)."""
        chats = [self.questions.teacher_chat(row) for row in rows]
        return self.teacher.sample_async(chats, **self.sampling, errors=errors)

    def evidence(self, teacher_future: Any, draw: Draw, plain_round: Round, hard: Sequence) -> Evidence:
        """Step 4: the teacher's replies graded, and the wrong plain rollouts, of the ``hard`` questions (all ranks);
        the wait for the replies is ``time/teacher_sample_wait_s``."""
        G = self.group_size
        t0 = time.perf_counter()
        questions = len(draw.plain) - draw.fillers
        no_replies = [[] for _ in range(questions)]
        replies = teacher_results(teacher_future, no_replies) if teacher_future is not None else no_replies
        self.recorder.metrics["time/teacher_sample_wait_s"] = time.perf_counter() - t0
        wanted = set(hard)
        local_wrong: dict[Any, list[str]] = defaultdict(list)
        local_teacher: dict[Any, list[str]] = defaultdict(list)
        rank_rewards = plain_round.rewards.view(self.ranks.world, -1)[self.ranks.rank]
        graded = [(g, group) for g, group in enumerate(draw.plain) if group.kind != FILLER]
        graded = [(g, group) for g, group in graded if group.row[data.ID] in wanted]
        grades = self.grader.grade([group.row for _, group in graded], [replies[g] for g, _ in graded])
        for (g, group), ok in zip(graded, grades):
            key = group.row[data.ID]
            local_wrong[key] += [plain_round.texts[i] for i in range(g * G, (g + 1) * G) if rank_rewards[i] <= CORRECT]
            local_teacher[key] += [text for text, right in zip(replies[g], ok) if right]
        teacher_correct = merge_lists(self.ranks.gather(dict(local_teacher)))
        student_wrong = merge_lists(self.ranks.gather(dict(local_wrong)))
        return Evidence(hard, teacher_correct, student_wrong)
