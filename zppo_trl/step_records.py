"""What :class:`zppo_trl.ZPPOTrainer` records of a rollout step, as a mixin: the trained advantages in TRL's
completions log, the per-kind and supervised metrics, the trace-overlap audit's file, and every ``zppo/`` metric with
the step's times, server requests and memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from . import data, host_memory
from .augmentations import BuiltGroups
from .rollout import FILLER, Draw, Round
from .step_metrics import accumulate_totals, kind_metrics, memory_metrics, service_metrics, timing_metrics

__all__ = ["StepRecords"]

logger = logging.getLogger(__name__)


class StepRecords:
    """A mixin of :class:`zppo_trl.ZPPOTrainer` (see the module's docstring)."""

    def _log_trained_advantages(self, trained: Mapping[tuple[int, int], float], rows_per_round: Sequence[int]) -> None:
        """Put the trained advantages in TRL's completions log in place of TRL's own.

        TRL logs its group-scaled advantages per scoring round (gathered, rank-major); ZPPO trains
        others (two-step, per partition). Rows that were not trained (fillers, partitions without a
        learning signal) get 0.
        """
        ours, offset = [], 0
        for rows in rows_per_round:
            ours += [trained.get((r, offset + i), 0.0) for r in range(self.ranks.world) for i in range(rows)]
            offset += rows
        logged = self._logs["advantages"]
        keep = min(len(ours), len(logged))
        for _ in range(keep):
            logged.pop()
        logged.extend(ours[len(ours) - keep :])

    def _check_reward_signal(self, plain_round: Round) -> None:
        """Warn, once per function, about reward functions whose plain rewards carry no signal this step
        (:class:`zppo_trl.reward_signal.RewardSignalWatch`; fillers left out); on the main process."""
        if plain_round.rewards_per_func is None or not self.accelerator.is_main_process:
            return
        kinds = [kind for groups in plain_round.groups_per_rank for kind, _ in groups]
        real = torch.tensor([kind != FILLER for kind in kinds], dtype=torch.bool).repeat_interleave(
            self.num_generations
        )
        step = self.state.global_step // self.args.num_partitions + 1
        self.reward_signal.check(plain_round.rewards_per_func[real], plain_round.rewards[real], step)

    def _in_zero_bin(self, key: Any, accuracy: Mapping) -> bool:
        """Admitted at plain accuracy 0 (a resident), or about to be (a non-resident at 0 this step)."""
        return self._admitted_at.get(key, accuracy.get(key)) == 0.0

    def _log_references(self, built: BuiltGroups, accuracy: Mapping) -> None:
        """The teacher candidate each of this step's BCQ prompts showed, for questions of the 0% bin, over
        all ranks; the file keeps a question's first (its fixed reference)."""
        local = [
            (inst.key, self.dataset_format.question(self._row(inst.key)), shown[inst.teacher_position])
            for inst, shown in zip(built.instances, built.shown)
            if inst.kind == "bcq" and self._in_zero_bin(inst.key, accuracy)
        ]
        items = [item for rank_items in self.ranks.gather(local) for item in rank_items]
        if self.is_world_process_zero():
            self.trace_log.references(self.state.global_step, items)

    def _log_graduations(self, draw: Draw, plain_round: Round, accuracy: Mapping) -> None:
        """The plain rollouts and rewards of the questions graduating from the 0% bin this step (residents
        admitted at 0 whose plain group reaches the threshold), over all ranks."""
        G = self.num_generations
        rewards = plain_round.rewards.view(self.ranks.world, -1)[self.ranks.rank].tolist()
        local = [
            (
                key,
                self.dataset_format.question(g.row),
                plain_round.texts[i * G : (i + 1) * G],
                rewards[i * G : (i + 1) * G],
            )
            for i, g in enumerate(draw.plain)
            if g.kind != FILLER
            and (key := g.row[data.ID]) in self.replay_buffer
            and self._admitted_at.get(key) == 0.0
            and accuracy[key] >= self.replay_buffer.threshold
        ]
        items = {item[0]: item for rank_items in self.ranks.gather(local) for item in rank_items}
        if self.is_world_process_zero():
            self.trace_log.graduations(self.state.global_step, items.values())

    def _log_groups(self, rounds: Sequence[Round]) -> None:
        """Every real group of the step's ``rounds`` with its rewards, over all ranks, into the group log (main
        process; :mod:`zppo_trl.group_log`)."""
        if not self.is_world_process_zero():
            return
        G = self.num_generations
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
        self.group_log.write(self.state.global_step // self.args.num_partitions + 1, groups)

    def _augmentation_metrics(self, plan: Sequence, built: BuiltGroups, augmented_round: Round) -> dict:
        """Per kind: instances planned and trained, in-prompt accuracy and groups with signal (all ranks);
        then the augmentation's own audit (e.g. BCQ's candidate match), summed over ranks."""
        G = self.num_generations
        out = kind_metrics(
            self.augmentation.kinds,
            [inst.kind for inst in plan],
            augmented_round.groups_per_rank,
            augmented_round.rewards,
            G,
        )
        counts = self.augmentation.audit_counts(built.instances, augmented_round.texts, G)
        if counts and self.ranks.world > 1:
            totals = torch.tensor(list(counts.values()), dtype=torch.float64, device=self.accelerator.device)
            counts = dict(zip(counts, self.ranks.reduce_sum(totals).cpu().tolist()))
        out.update(self.augmentation.audit_metrics(counts))
        return out

    def _target_metrics(self, plan: Sequence, built: BuiltGroups) -> dict:
        """Per supervised kind: instances planned, instances with a verified target, and targets (all ranks)."""
        trained, targets = self.ranks.total(len(built.instances)), self.ranks.total(len(built.groups))
        kind = self.augmentation.kinds[0]
        return {kind: len(plan), f"{kind}_trained": trained, f"{kind}_targets": targets}

    def _record_step(self, metrics: dict, start: float) -> None:
        """Times and teacher counters over all ranks, the running totals, and every metric into TRL's log."""
        teacher_wait = metrics.get("time/teacher_sample_wait_s", 0.0) + metrics.get("time/compression_s", 0.0)
        step_time = time.perf_counter() - start
        # a judge of the row's own (Perception-R1, RLKD) or of a reward function (judged_accuracy_reward's)
        parts = [*(term.clients for term in self.terms), *(getattr(f, "clients", ()) for f in self.reward_funcs)]
        judges = [client for clients in parts for role, client in clients if role == "judge"]
        clients = {"teacher": self.teacher, "judge": judges[0] if judges else None}
        services = []
        for client in clients.values():
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
        metrics.update(timing_metrics(per_rank[:, :5], clients["teacher"] is not None))
        if clients["judge"] is not None:  # counted like the teacher
            metrics.update(service_metrics("judge", per_rank[:, 5:8]))
        metrics.update(memory_metrics(per_rank[:, 8:]))
        for role, client in clients.items():
            if client is not None and metrics[f"{role}/failures"]:
                logger.warning(
                    "%s: %d of %d requests failed this step; the step continues with what came back",
                    role,
                    metrics[f"{role}/failures"],
                    metrics[f"{role}/requests"],
                )
        self.counters["rollout_steps"] += 1
        accumulate_totals(self.counters, metrics, self.augmentation.kinds if self.augmentation is not None else ())
        metrics.update(self.counters)
        for name, value in metrics.items():
            self._metrics["train"][f"zppo/{name}"].append(float(value))
