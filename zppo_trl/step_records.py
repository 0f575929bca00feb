"""What a rollout step records (:class:`StepRecorder`): its ``zppo/`` metrics with the step's times, server requests
and memory over every rank, the trained advantages in TRL's completions log, the per-kind and supervised metrics, the
reward-signal check, the trace-overlap audit's file and the group log.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import torch

from . import data, host_memory
from .augmentations import BuiltGroups
from .rollout import FILLER, Draw, Round
from .step_metrics import accumulate_totals, kind_metrics, memory_metrics, service_metrics, timing_metrics

__all__ = ["StepRecorder"]

logger = logging.getLogger(__name__)


class StepRecorder:
    """Collects one rollout step's numbers and writes them where TRL logs.

    A step opens with :meth:`begin`; the collaborators the recorder was given to write :attr:`metrics` (or
    :meth:`add` to it) as their stages run; :meth:`finish` adds the step's times, server counters and memory over
    every rank and the running totals, and appends every metric under ``zppo/`` to TRL's metrics.

    Args:
        ranks: :class:`zppo_trl.ranks.Ranks`.
        group_size: G_S.
        num_partitions: optimizer updates per rollout step (a rollout step's number is
            ``global_step // num_partitions + 1``).
        main_process: whether this process writes the files (rank 0).
        state: the run's :class:`zppo_trl.checkpoint_state.ZPPOState` (counters, buffer, admission accuracies).
        trl_metrics: TRL's ``_metrics`` (mode -> name -> values); ``trl_logs``: TRL's completions log.
        clients: role (``teacher``, ``judge``) -> the server client whose request counts a step logs, or None.
        kinds: the augmentation's kinds (their counts keep running totals).
        questions: the :class:`zppo_trl.questions.Questions` (question texts for the trace audit).
        reward_signal: the :class:`zppo_trl.reward_signal.RewardSignalWatch`.
        trace_log / group_log: the trace-overlap audit's and the group log's writers, or None.
    """

    def __init__(
        self,
        *,
        ranks: Any,
        group_size: int,
        num_partitions: int,
        main_process: bool,
        state: Any,
        trl_metrics: Mapping[str, MutableMapping[str, list]],
        trl_logs: Mapping[str, Any],
        clients: Mapping[str, Any],
        kinds: Sequence[str],
        questions: Any,
        reward_signal: Any,
        trace_log: Any = None,
        group_log: Any = None,
    ):
        self.ranks, self.group_size, self.num_partitions, self.main_process = (
            ranks,
            group_size,
            num_partitions,
            main_process,
        )
        self.state, self.trl_metrics, self.trl_logs = state, trl_metrics, trl_logs
        self.clients, self.kinds, self.questions, self.reward_signal = (
            dict(clients),
            tuple(kinds),
            questions,
            reward_signal,
        )
        self.trace_log, self.group_log = trace_log, group_log
        self.metrics: dict[str, float] = {}
        self.global_step = 0
        self._start = time.perf_counter()

    def begin(self, global_step: int) -> dict[str, float]:
        """Open a rollout step at TRL's ``global_step``: its metrics start empty and its time runs from now."""
        self.metrics, self.global_step, self._start = {}, global_step, time.perf_counter()
        return self.metrics

    @property
    def rollout_step(self) -> int:
        """The step's number, from 1."""
        return self.global_step // self.num_partitions + 1

    def add(self, name: str, value: float) -> None:
        """Add ``value`` to the step's metric ``name`` (counted over a step's rounds)."""
        self.metrics[name] = self.metrics.get(name, 0) + value

    def trained_advantages(self, trained: Mapping[tuple[int, int], float], rows_per_round: Sequence[int]) -> None:
        """Put the trained advantages in TRL's completions log in place of TRL's own.

        TRL logs its group-scaled advantages per scoring round (gathered, rank-major); ZPPO trains
        others (two-step, per partition). Rows that were not trained (fillers, partitions without a
        learning signal) get 0.
        """
        ours, offset = [], 0
        for rows in rows_per_round:
            ours += [trained.get((r, offset + i), 0.0) for r in range(self.ranks.world) for i in range(rows)]
            offset += rows
        logged = self.trl_logs["advantages"]
        keep = min(len(ours), len(logged))
        for _ in range(keep):
            logged.pop()
        logged.extend(ours[len(ours) - keep :])

    def reward_signal_check(self, plain_round: Round) -> None:
        """Warn, once per function, about reward functions whose plain rewards carry no signal this step
        (:class:`zppo_trl.reward_signal.RewardSignalWatch`; fillers left out); on the main process."""
        if plain_round.rewards_per_func is None or not self.main_process:
            return
        kinds = [kind for groups in plain_round.groups_per_rank for kind, _ in groups]
        real = torch.tensor([kind != FILLER for kind in kinds], dtype=torch.bool).repeat_interleave(self.group_size)
        self.reward_signal.check(plain_round.rewards_per_func[real], plain_round.rewards[real], self.rollout_step)

    def references(self, built: BuiltGroups, accuracy: Mapping) -> None:
        """The teacher candidate each of this step's BCQ prompts showed, for questions of the 0% bin (admitted at 0,
        or about to be), over all ranks; the trace log keeps a question's first (its fixed reference)."""
        admitted_at = self.state.admitted_at
        local = [
            (inst.key, self.questions.question(self.questions.row(inst.key)), shown[inst.teacher_position])
            for inst, shown in zip(built.instances, built.shown)
            # an instance that showed a teacher candidate (BCQ's), of a question in the 0% bin
            if getattr(inst, "teacher_position", None) is not None
            and admitted_at.get(inst.key, accuracy.get(inst.key)) == 0.0
        ]
        items = [item for rank_items in self.ranks.gather(local) for item in rank_items]
        if self.main_process:
            self.trace_log.references(self.global_step, items)

    def graduations(self, draw: Draw, plain_round: Round, accuracy: Mapping) -> None:
        """The plain rollouts and rewards of the questions graduating from the 0% bin this step (residents
        admitted at 0 whose plain group reaches the threshold), over all ranks."""
        G, buffer = self.group_size, self.state.replay_buffer
        rewards = plain_round.rewards.view(self.ranks.world, -1)[self.ranks.rank].tolist()
        local = [
            (
                key,
                self.questions.question(g.row),
                plain_round.texts[i * G : (i + 1) * G],
                rewards[i * G : (i + 1) * G],
            )
            for i, g in enumerate(draw.plain)
            if g.kind != FILLER
            and (key := g.row[data.ID]) in buffer
            and self.state.admitted_at.get(key) == 0.0
            and accuracy[key] >= buffer.threshold
        ]
        items = {item[0]: item for rank_items in self.ranks.gather(local) for item in rank_items}
        if self.main_process:
            self.trace_log.graduations(self.global_step, items.values())

    def groups(self, rounds: Sequence[Round]) -> None:
        """Every real group of the step's ``rounds`` with its rewards, over all ranks, into the group log (main
        process; :mod:`zppo_trl.group_log`)."""
        if self.group_log is None or not self.main_process:
            return
        G = self.group_size
        groups = []
        for played in rounds:
            if played.rewards is None:
                continue
            per_rank = played.rewards.view(self.ranks.world, -1)
            for rank, rank_groups in enumerate(played.groups_per_rank):
                groups += [
                    (kind, key, per_rank[rank, g * G : (g + 1) * G].tolist())
                    for g, (kind, key) in enumerate(rank_groups)
                    if kind != FILLER
                ]
        self.group_log.write(self.rollout_step, groups)

    def augmentation(self, augmentation: Any, plan: Sequence, built: BuiltGroups, augmented_round: Round) -> None:
        """Per kind: instances planned and trained, in-prompt accuracy and groups with signal (all ranks);
        then the augmentation's own audit (e.g. BCQ's candidate match), summed over ranks."""
        G = self.group_size
        out = kind_metrics(
            augmentation.kinds,
            [inst.kind for inst in plan],
            augmented_round.groups_per_rank,
            augmented_round.rewards,
            G,
        )
        counts = augmentation.audit_counts(built.instances, augmented_round.texts, G)
        if counts and self.ranks.world > 1:
            totals = torch.tensor(list(counts.values()), dtype=torch.float64, device=self.ranks.device)
            counts = dict(zip(counts, self.ranks.reduce_sum(totals).cpu().tolist()))
        out.update(augmentation.audit_metrics(counts))
        self.metrics.update(out)

    def targets(self, kind: str, plan: Sequence, built: BuiltGroups) -> None:
        """Per supervised kind: instances planned, instances with a verified target, and targets (all ranks)."""
        trained, targets = self.ranks.total(len(built.instances)), self.ranks.total(len(built.groups))
        self.metrics.update({kind: len(plan), f"{kind}_trained": trained, f"{kind}_targets": targets})

    def finish(self) -> None:
        """Times and server counters over all ranks, the running totals, and every metric into TRL's log."""
        metrics = self.metrics
        teacher_wait = metrics.get("time/teacher_sample_wait_s", 0.0) + metrics.get("time/compression_s", 0.0)
        step_time = time.perf_counter() - self._start
        services = []
        for role in ("teacher", "judge"):
            client = self.clients.get(role)
            stats = client.stats(reset=True) if client is not None else {"requests": 0, "failed": 0}
            services += [stats["requests"], stats["failed"], stats.get("latency_mean_s", 0.0)]
        local = torch.tensor(
            [step_time, teacher_wait, *services] + list(host_memory.process_memory_gb()), dtype=torch.float64
        )
        per_rank = (
            torch.stack([torch.as_tensor(x) for x in self.ranks.gather(local)])
            if self.ranks.world > 1
            else local[None]
        )
        metrics.update(timing_metrics(per_rank[:, :5], self.clients.get("teacher") is not None))
        if self.clients.get("judge") is not None:  # counted like the teacher
            metrics.update(service_metrics("judge", per_rank[:, 5:8]))
        metrics.update(memory_metrics(per_rank[:, 8:]))
        for role in ("teacher", "judge"):
            if self.clients.get(role) is not None and metrics[f"{role}/failures"]:
                logger.warning(
                    "%s: %d of %d requests failed this step; the step continues with what came back",
                    role,
                    metrics[f"{role}/failures"],
                    metrics[f"{role}/requests"],
                )
        counters = self.state.counters
        counters["rollout_steps"] += 1
        accumulate_totals(counters, metrics, self.kinds)
        metrics.update(counters)
        for name, value in metrics.items():
            self.trl_metrics["train"][f"zppo/{name}"].append(float(value))
