"""What a run's checkpoints take on disk, said by the dry run before a byte is written.

A checkpoint holds the student's weights in the dtype it is loaded in (``dtype`` in the recipe), the optimizer's
state in its own precision (AdamW's two float32 moments; AnyPrecisionAdamW's bf16 ones:
:func:`zppo_trl.memory_plan.optimizer_state`, as the memory plan counts it), for a 16-bit student the float32
master weights mixed precision keeps (DeepSpeed's bf16 optimizer writes them with its state; FSDP's sharded
parameters are float32: counted once, so the figure is an upper bound for a run that trains 16-bit weights
directly), each copy of the student the row keeps (float32: GRPO-CARE's and
SDPO's EMA, OPSD's frozen copy) and the ZPPO state (the replay buffer and counters, a few hundred bytes per
resident), plus a few small files (RNG states, scheduler, trainer state, tokenizer). ``save_only_model`` leaves the
optimizer out. The run keeps every checkpoint it writes, or the last ``save_total_limit``.

:func:`storage_lines` prints that, the free space of ``output_dir``'s filesystem and a verdict. The estimate is
checked against a real checkpoint in tests/test_run_safety.py.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

from .memory_plan import GiB, optimizer_state

__all__ = ["CheckpointSize", "checkpoint_size", "checkpoints_kept", "free_bytes", "storage_lines"]

# bytes per parameter of the weights a checkpoint writes, by the dtype the student is loaded in
_WEIGHT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# the ZPPO state: the shared RNG and counters (about 8 KB), and per replay-buffer slot its key, admission accuracy and
# step in JSON (under 100 bytes on the tiny runs), with margin
STATE_BASE_BYTES = 16 * 1024
STATE_BYTES_PER_SLOT = 256


@dataclass(frozen=True)
class CheckpointSize:
    """One checkpoint's bytes, by what holds them."""

    weights: int
    master: int
    optimizer: int
    copies: int
    state: int

    @property
    def total(self) -> int:
        return self.weights + self.master + self.optimizer + self.copies + self.state


def checkpoint_size(parameters: int, args: Any, dtype: str | None) -> CheckpointSize:
    """A checkpoint of a student of ``parameters`` loaded in ``dtype`` (None or ``"auto"``: float32) under
    configuration ``args`` (a :class:`~zppo_trl.ZPPOConfig`)."""
    width = _WEIGHT_BYTES.get(str(dtype), 4)
    master = 0 if args.save_only_model or width == 4 else 4 * parameters
    optimizer = 0 if args.save_only_model else parameters * optimizer_state(args)
    copies = 4 * parameters * len(args.row.needs.student_copies)
    state = STATE_BASE_BYTES + STATE_BYTES_PER_SLOT * args.replay_capacity
    return CheckpointSize(parameters * width, master, optimizer, copies, state)


def checkpoints_kept(args: Any) -> int | None:
    """How many checkpoints the run holds at most: those it writes (every ``save_steps`` of ``max_steps``), or the
    last ``save_total_limit``; None where it cannot be told (a step count from the epochs, or an epoch strategy)."""
    strategy = str(getattr(args.save_strategy, "value", args.save_strategy))
    if strategy == "no":
        return 0
    if strategy != "steps" or args.max_steps <= 0:
        return args.save_total_limit
    every = args.save_steps if args.save_steps >= 1 else max(1, int(args.save_steps * args.max_steps))
    written = args.max_steps // int(every)
    return min(written, args.save_total_limit) if args.save_total_limit else written


def free_bytes(path: str) -> tuple[int, str]:
    """The free bytes of the filesystem ``path`` is (or will be) on, and the existing folder asked."""
    folder = os.path.abspath(path)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return shutil.disk_usage(folder).free, folder


def storage_lines(size: CheckpointSize, kept: int | None, args: Any) -> list[str]:
    """The dry run's storage lines: one checkpoint's size by part, how many the settings keep, the free space on
    ``output_dir``'s filesystem, and whether they fit."""

    def gib(value: int) -> str:
        return f"{value / GiB:.1f} GiB" if value >= GiB / 10 else f"{value / 2**20:.1f} MiB"

    parts = [f"weights {gib(size.weights)}"]
    if size.master:
        parts.append(f"float32 master weights {gib(size.master)}")
    parts.append(f"optimizer state {gib(size.optimizer)}")
    if size.copies:
        parts.append(f"copies of the student {gib(size.copies)}")
    parts.append(f"ZPPO state {gib(size.state)}")
    only_model = " (save_only_model: no optimizer state)" if args.save_only_model else ""
    lines = [f"\nstorage: each checkpoint about {gib(size.total)}{only_model}: {', '.join(parts)}"]
    free, folder = free_bytes(args.output_dir)
    if kept is None:
        lines.append(
            f"  checkpoints kept: unknown (set max_steps and save_total_limit); free on {folder}: {gib(free)}"
        )
        return lines
    limit = f"save_total_limit {args.save_total_limit}" if args.save_total_limit else "no save_total_limit"
    needed = kept * size.total
    verdict = "fits" if needed <= free else "WOULD NOT FIT"
    lines.append(f"  kept: {kept} checkpoint(s) ({limit}), {gib(needed)}; free on {folder}: {gib(free)}: {verdict}")
    return lines
