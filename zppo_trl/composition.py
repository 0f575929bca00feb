"""What one rollout step of a configuration holds: :class:`StepComposition`, printed by the dry run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .reformulate import augment_limit
from .replay import replay_count

__all__ = ["StepComposition", "step_composition"]


@dataclass(frozen=True)
class StepComposition:
    """What one rollout step of a :class:`zppo_trl.ZPPOConfig` holds on ``world_size`` ranks.

    ``str()`` gives the one-line summary the recipe's dry run prints, e.g. "per rollout
    step: 384 new + <=96 replayed + <=96 reformulated prompts x 8 rollouts; 4 optimizer
    updates of 96 new prompts; teacher G_T=4".
    """

    world_size: int
    new_prompts: int  # |X_new| per rollout step, over all ranks
    max_replayed: int  # floor(rho_replay * |X_new|), reached once the buffer is that full
    max_reformulated: int  # floor(rho_aug * |X_new|) augmented instances (BCQ + NCQ for ZPPO; 0 without augmentations)
    rollouts: int  # G_S
    updates: int  # I
    new_prompts_per_update: float
    teacher_rollouts: int  # G_T (0 where step 2 samples no teacher rollouts)
    rows_per_micro_batch: int  # per rank, for the new prompts; replayed and reformulated groups add to it
    micro_batches_per_update: int
    rollout_steps: int | None  # from max_steps; None when training by epochs
    uses_teacher: bool = False  # a teacher takes part (sampled, asked, or scoring), with or without rollouts

    @property
    def max_prompts(self) -> int:
        return self.new_prompts + self.max_replayed + self.max_reformulated

    def __str__(self) -> str:
        per_update = f"{self.new_prompts_per_update:g}"
        if self.teacher_rollouts:
            teacher = f"teacher G_T={self.teacher_rollouts}"
        else:
            teacher = "teacher (no G_T rollouts)" if self.uses_teacher else "no teacher"
        return (
            f"per rollout step: {self.new_prompts} new + <={self.max_replayed} replayed + <={self.max_reformulated} "
            f"reformulated prompts x {self.rollouts} rollouts; {self.updates} optimizer updates of {per_update} new "
            f"prompts; {teacher}"
        )


def step_composition(args: Any, world_size: int) -> StepComposition:
    """The rollout step configuration ``args`` makes on ``world_size`` ranks."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    G = args.num_generations
    rows = args.per_device_train_batch_size * args.steps_per_generation * world_size
    if (args.per_device_train_batch_size * args.steps_per_generation) % G:
        raise ValueError(
            f"per_device_train_batch_size x steps_per_generation ({args.per_device_train_batch_size} x "
            f"{args.steps_per_generation}) must be a multiple of num_generations ({G}) so that every rank holds "
            "whole groups"
        )
    new = rows // G
    row = args.row
    return StepComposition(
        world_size=world_size,
        new_prompts=new,
        max_replayed=replay_count(new, args.replay_fraction, new),
        max_reformulated=augment_limit(new, args.augment_fraction) if args.augmentations else 0,
        rollouts=G,
        updates=args.num_partitions,
        new_prompts_per_update=new / args.num_partitions,
        teacher_rollouts=args.teacher_num_generations if row.needs.teacher_samples else 0,
        rows_per_micro_batch=args.per_device_train_batch_size,
        micro_batches_per_update=args.gradient_accumulation_steps,
        rollout_steps=args.max_steps // args.num_partitions if args.max_steps and args.max_steps > 0 else None,
        uses_teacher=row.uses_teacher,
    )
