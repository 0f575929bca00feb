"""Steps 2 and 4 of Algorithm 1 for :class:`zppo_trl.ZPPOTrainer`, as a mixin: the teacher's G_T replies to every
question of the step, asked when the step starts or, with ``prefetch_teacher_samples``, during the previous step's
updates (:mod:`zppo_trl.prefetch`); and the evidence on the hard questions (the replies graded, with the student's
wrong rollouts).
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

__all__ = ["TeacherSampling"]

logger = logging.getLogger(__name__)


class TeacherSampling:
    """A mixin of :class:`zppo_trl.ZPPOTrainer` (see the module's docstring)."""

    def _start_teacher_sampling(self, plain: Sequence[Group], metrics: dict) -> Any:
        """Step 2: a Future of the teacher's G_T replies to every real question of this rank, in order. The new
        questions' replies were asked for during the previous step's updates where it could read this step's
        batch ahead (:meth:`_prefetch_teacher_sampling`); then only the replayed ones are asked for now."""
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
        metrics["teacher_prefetched"] = len(new_keys) if prefetched is not None else 0
        if prefetched is None:
            return self._sample_teacher([g.row for g in real])
        rest = [g.row for g in real[len(new_keys) :]]
        return joined_futures([prefetched.future] + ([self._sample_teacher(rest)] if rest else []))

    def _prefetch_teacher_sampling(self) -> None:
        """Ask the teacher for the next rollout step's new questions on this rank: the dataloader's batch after
        this step's ``steps_per_generation`` (this update's are taken already), read ahead. Nothing is asked past
        ``max_steps`` or the epoch's end, nor in a step a resumed run entered in its middle."""
        args, steps = self.args, self.args.steps_per_generation
        if self._step % steps or self.state.global_step + args.num_partitions >= self.state.max_steps:
            return
        batch = self._lookahead.peek(steps - self.current_gradient_accumulation_steps)
        if batch is None:
            return
        rows = [batch[i] for i in range(0, len(batch), self.num_generations)]
        errors: list = []
        future = self._sample_teacher(rows, errors)
        self._prefetched = PrefetchedSampling([row[data.ID] for row in rows], future, errors)

    def _sample_teacher(self, rows: Sequence[Mapping], errors: list | None = None) -> Any:
        """A Future of the teacher's G_T replies to each row's plain question (``errors``: as ``sample_async``'s)."""
        args = self.args
        return self.teacher.sample_async(
            [self._teacher_conversation(row) for row in rows],
            n=args.teacher_num_generations,
            max_tokens=args.teacher_max_tokens,
            temperature=args.teacher_temperature,
            top_p=args.teacher_top_p,
            errors=errors,
        )

    def _gather_evidence(
        self, teacher_future: Any, draw: Draw, plain_round: Round, hard: Sequence, metrics: dict
    ) -> Evidence:
        """Step 4: the teacher's replies graded, and the wrong plain rollouts, of the hard questions (all ranks)."""
        G = self.num_generations
        t0 = time.perf_counter()
        questions = len(draw.plain) - draw.fillers
        no_replies = [[] for _ in range(questions)]
        replies = teacher_results(teacher_future, no_replies) if teacher_future is not None else no_replies
        metrics["time/teacher_sample_wait_s"] = time.perf_counter() - t0
        wanted = set(hard)
        local_wrong: dict[Any, list[str]] = defaultdict(list)
        local_teacher: dict[Any, list[str]] = defaultdict(list)
        rank_rewards = plain_round.rewards.view(self.ranks.world, -1)[self.ranks.rank]
        graded = [(g, group) for g, group in enumerate(draw.plain) if group.kind != FILLER]
        graded = [(g, group) for g, group in graded if group.row[data.ID] in wanted]
        grades = self._grade_many([group.row for _, group in graded], [replies[g] for g, _ in graded])
        for (g, group), ok in zip(graded, grades):
            key = group.row[data.ID]
            local_wrong[key] += [plain_round.texts[i] for i in range(g * G, (g + 1) * G) if rank_rewards[i] <= CORRECT]
            local_teacher[key] += [text for text, right in zip(replies[g], ok) if right]
        teacher_correct = merge_lists(self.ranks.gather(dict(local_teacher)))
        student_wrong = merge_lists(self.ranks.gather(dict(local_wrong)))
        return Evidence(hard, teacher_correct, student_wrong)
