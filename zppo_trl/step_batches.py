"""Step 6 of Algorithm 1 (:class:`StepBatches`): every rank's groups of a rollout step dealt, intact, into
``num_partitions`` optimizer mini-batches with two-step advantages per partition (:func:`zppo_trl.partitioning.
policy_partitions`), or the target rows' teacher-forced sequences each in its question's partition
(:func:`zppo_trl.partitioning.deal_targets`); this rank's micro-batches out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .batches import concat_batches
from .partitioning import deal_targets, generated_tokens, policy_partitions
from .rollout import FILLER, Draw, Round
from .step_metrics import advantage_stats

__all__ = ["StepBatches"]


class StepBatches:
    """Deals a step's rounds into this rank's optimizer micro-batches.

    Args:
        args: the :class:`zppo_trl.ZPPOConfig` (partitions, micro-batch sizes, the advantage settings).
        ranks: :class:`zppo_trl.ranks.Ranks`; ``group_size``: G_S; ``pad_token_id``: the student tokenizer's.
        terms: the row's terms (their partition signals and what those read of each rollout).
        dense: whether a partition without a group of mixed rewards still trains (``Needs.trains_zero_advantage``).
        rng: the run's shared RNG (each step's dealing seed is drawn from it, the same on every rank).
        recorder: the :class:`zppo_trl.step_records.StepRecorder`.
    """

    def __init__(
        self,
        args: Any,
        ranks: Any,
        group_size: int,
        pad_token_id: int,
        *,
        terms: Sequence[Any],
        dense: bool,
        rng: Any,
        recorder: Any,
    ):
        self.args, self.ranks, self.group_size, self.pad_token_id = args, ranks, group_size, pad_token_id
        self.terms, self.dense, self.rng, self.recorder = list(terms), dense, rng, recorder

    def _partition_signal(self, rewards, group_ids, confidences):
        """One partition's ``(marked rows, extra advantages)`` from the terms' signals (None: none has one)."""
        for term in self.terms:
            signal = term.partition_signal(rewards, group_ids, confidences)
            if signal is not None:
                return signal
        return None

    def policy(self, plain_round: Round, augmented_round: Round, targets: Round | None = None) -> list[dict]:
        """Step 6 for the RL rows: every rank's plain and augmented groups dealt into partitions, two-step
        advantages per partition, this rank's micro-batches; ReLIFT's ``targets`` rows, after them, each in its
        question's partition. The trained advantages replace TRL's in its completions log."""
        world, G, metrics = self.ranks.world, self.group_size, self.recorder.metrics
        rounds = [r for r in (plain_round, augmented_round) if r.batch is not None]
        extra = [targets.batch] if targets is not None and targets.batch is not None else []
        batch = concat_batches([r.batch for r in rounds] + extra, self.pad_token_id)
        kinds_per_rank = [[kind for r in rounds for kind, _key in r.groups_per_rank[rank]] for rank in range(world)]
        rewards_per_rank = [
            [x for r in rounds for x in r.rewards.view(world, -1)[rank].tolist()] for rank in range(world)
        ]
        # what a term's partition signal reads of each rollout (LENS: its sampling log-prob), gathered like the rewards
        reads = [values for term in self.terms if (values := term.partition_reads(batch)) is not None]
        confidences = self.ranks.gather(reads[0]) if reads else None
        targets_per_rank = None
        if extra:  # each target row anchored to its question's plain group (rank, group)
            anchor = {
                key: (r, g)
                for r, groups in enumerate(plain_round.groups_per_rank)
                for g, (kind, key) in enumerate(groups)
                if kind != FILLER
            }
            targets_per_rank = [
                [(len(kinds) * G + i, anchor[key]) for i, (kind, key) in enumerate(rows) if kind != FILLER]
                for kinds, rows in zip(kinds_per_rank, targets.groups_per_rank)
            ]
        result = policy_partitions(
            batch,
            kinds_per_rank,
            rewards_per_rank,
            G,
            self.args,
            self.ranks,
            self.rng.getrandbits(32),
            confidences,
            targets_per_rank,
            signal=self._partition_signal if self.terms else None,
            dense=self.dense,
        )
        metrics["skipped_partitions"] = result.skipped
        # what the step cost in student tokens: every response it sampled, and those its updates trained on
        metrics["generated_tokens"] = self.ranks.total(generated_tokens(batch, kinds_per_rank[self.ranks.rank], G))
        metrics["trained_tokens"] = result.trained_tokens
        metrics.update(advantage_stats(list(result.trained.values())))
        rows_per_round = [len(r.groups_per_rank[0]) * G for r in (plain_round, augmented_round)]
        self.recorder.trained_advantages(result.trained, rows_per_round)
        return result.micro_batches

    def targets(self, targets: Round, draw: Draw) -> list[dict]:
        """Step 6 for the target rows: each target in its question's partition (:func:`deal_targets`)."""
        seed = self.rng.getrandbits(32)
        micro_batches, skipped_count, trained = deal_targets(
            targets.batch, targets.groups_per_rank, draw.new_keys, draw.replay_keys, self.args, self.ranks, seed
        )
        self.recorder.metrics["skipped_partitions"], self.recorder.metrics["targets_trained"] = skipped_count, trained
        return micro_batches
