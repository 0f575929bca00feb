"""What :class:`zppo_trl.ZPPOTrainer` keeps in a checkpoint beyond TRL's: :class:`ZPPOState`, written as
``zppo_state.json`` (the replay buffer, admission accuracies, counters, the shared RNG and every term's state) with
the copies of the student the row's terms keep; and which of a run's checkpoints is whole.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from transformers import TrainerCallback

from .replay import PromptReplayBuffer
from .step_metrics import admission_bins, bin_label

__all__ = [
    "ZPPO_STATE_NAME",
    "CheckpointWriteError",
    "RankTallyCallback",
    "ZPPOState",
    "checkpoint_written",
    "last_complete_checkpoint",
    "resume_checkpoint",
]

logger = logging.getLogger(__name__)

ZPPO_STATE_NAME = "zppo_state.json"
TRAINER_STATE_NAME = "trainer_state.json"  # transformers writes it last of a checkpoint's files
# A checkpoint's weights: a full model (one file or an index), a PEFT adapter, or DeepSpeed's own folder.
_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


def checkpoint_gaps(checkpoint: str) -> list[str]:
    """What a checkpoint folder lacks of a whole one (TRL's trainer state, the weights, the ZPPO state)."""
    names = set(os.listdir(checkpoint))
    gaps = [name for name in (TRAINER_STATE_NAME, ZPPO_STATE_NAME) if name not in names]
    if not names & set(_WEIGHTS) and not any(name.startswith("global_step") for name in names):
        gaps.append("weights")
    return gaps


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-N`` of ``output_dir`` that is whole (:func:`checkpoint_gaps`), or None; each newer one
    that is not (a run killed while saving it) is skipped with a warning naming what it lacks."""
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for name in os.listdir(output_dir):
        number = name.removeprefix("checkpoint-")
        if number != name and number.isdigit() and os.path.isdir(os.path.join(output_dir, name)):
            steps.append(int(number))
    for step in sorted(steps, reverse=True):
        checkpoint = os.path.join(output_dir, f"checkpoint-{step}")
        gaps = checkpoint_gaps(checkpoint)
        if not gaps:
            return checkpoint
        logger.warning("skipping %s: an incomplete checkpoint (no %s), left by a run stopped while saving it",
                       checkpoint, ", no ".join(gaps))  # fmt: skip
    return None


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, most often): its path, the errno, the last whole checkpoint."""


@contextlib.contextmanager
def checkpoint_written(checkpoint: str, main: bool) -> Iterator[None]:
    """Write ``checkpoint`` in the block; where that fails, raise one :class:`CheckpointWriteError` naming the path,
    the errno and the last whole checkpoint, the torn folder removed (on the ``main`` process) so that it neither
    holds the space nor looks like a checkpoint.

    The errno is the failed call's where an ``OSError`` carries one; torch's writer reports a full disk as a
    ``RuntimeError`` ("unexpected pos"), so a failure that leaves under 1 MiB free on the filesystem is named
    ``ENOSPC`` with the free space it left."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - every failure of the write is named, then raised
        code = next((e.errno for e in _chain(err) if isinstance(e, OSError) and e.errno), None)
        parent = os.path.dirname(checkpoint)
        free = shutil.disk_usage(parent).free if os.path.isdir(parent) else None
        if code is None and free is not None and free < 2**20:
            code = errno.ENOSPC
        if main and os.path.isdir(checkpoint):
            shutil.rmtree(checkpoint, ignore_errors=True)
        last = last_complete_checkpoint(parent)
        why = f"{os.strerror(code)} (errno {code}, {errno.errorcode.get(code, '?')})" if code else f"{err!r}"
        space = f"; {free / 2**20:.1f} MiB free on its filesystem" if free is not None else ""
        raise CheckpointWriteError(
            code or 0,
            f"checkpoint {checkpoint} could not be written: {why}{space}. The torn folder was removed; the last whole "
            f"checkpoint is {last or 'none'}. Free space (or set save_total_limit) and run again to resume from it",
        ) from err


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and the exceptions it was raised from or during."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def resume_checkpoint(output_dir: str, resume: str | bool | None) -> str | bool | None:
    """``resume_from_checkpoint`` as TRL takes it, with True resolved to ``output_dir``'s newest complete checkpoint
    (:func:`last_complete_checkpoint`); ValueError where there is none."""
    if resume is not True:
        return resume
    found = last_complete_checkpoint(output_dir)
    if found is None:
        raise ValueError(f"no complete checkpoint in output_dir {output_dir} to resume from")
    return found


class RankTallyCallback(TrainerCallback):
    """After every optimizer update, fold every rank's tally into the run's counters (:meth:`ZPPOState.fold`): one
    small object gather, on every rank, before any checkpoint of that update is written."""

    def __init__(self, state: ZPPOState, gather: Callable[[Any], list]):
        self.state, self.gather = state, gather

    def on_step_end(self, args, state, control, **kwargs):
        self.state.fold(self.gather(dict(self.state.rank_tally)))


class ZPPOState:
    """The run's state that Algorithm 1 carries from one rollout step to the next, beyond the weights and the
    optimizer: the replay buffer, each resident's plain accuracy at admission, the cumulative counters, the RNG every
    rank draws its decisions from, and the terms' state and student copies.

    ``counters``, ``admitted_at`` and ``rng`` are the very objects the trainer's collaborators were given: loading a
    checkpoint restores them in place.

    Args:
        capacity: the buffer's capacity (``replay_capacity``).
        threshold: its graduation threshold (``hard_threshold``).
        rng: the RNG every rank draws its decisions from (seeded with ``seed``, the same on every rank; the terms are
            built with it, so it exists before them).
        group_size: G_S, for the admission bins.
        terms: the row's terms (their ``state_dict``/``load_state_dict`` and ``copies``).
    """

    def __init__(
        self, capacity: int, threshold: float, rng: random.Random, group_size: int, terms: Sequence = ()
    ):  # fmt: skip
        self.replay_buffer = PromptReplayBuffer(capacity=capacity, threshold=threshold)
        self.rng = rng
        self.admitted_at: dict[Any, float] = {}  # resident -> plain accuracy at admission (for the bin metrics)
        self.counters: defaultdict[str, float] = defaultdict(float)
        # Counts of this rank's own work (its micro-batches' layouts), which differ by rank: summed over the ranks
        # into ``counters`` after every update (RankTallyCallback), so that every rank holds the same counters.
        self.rank_tally: defaultdict[str, float] = defaultdict(float)
        self.group_size = group_size
        self.terms = list(terms)

    def copies(self) -> list:
        """The run's copies of the student (the terms'), each ``(checkpoint file, EMAReference, what it is)``."""
        return [copy for term in self.terms for copy in term.copies]

    def refresh(self, accuracy: Mapping[Any, float]) -> dict[str, float]:
        """Step 7: the buffer refreshed from the plain accuracies; its events and admission bins as metrics (the
        bins' running totals counted)."""
        metrics: dict[str, float] = {}
        events = self.replay_buffer.update(accuracy)
        bins = admission_bins(self.group_size, self.replay_buffer.threshold)
        for key in events.admitted:
            self.admitted_at[key] = accuracy[key]
        for name in ("admitted", "graduated", "evicted", "retained"):
            metrics[name] = len(getattr(events, name))
        for name, keys in (("admitted", events.admitted), ("graduated", events.graduated)):
            counts = dict.fromkeys(bins, 0)
            for key in keys:
                label = bin_label(self.admitted_at.get(key, accuracy[key]), self.group_size)
                if label in counts:
                    counts[label] += 1
            for label, count in counts.items():
                metrics[f"{name}_bin_{label}"] = count
                self.counters[f"{name}_bin_{label}_total"] += count
        for key in events.graduated + events.evicted:
            self.admitted_at.pop(key, None)
        metrics["buffer_size"] = len(self.replay_buffer)
        return metrics

    def fold(self, tallies: Sequence[Mapping[str, float]]) -> None:
        """Add every rank's :attr:`rank_tally` (gathered: the same list on every rank) to the counters; this rank's
        starts again from zero."""
        for tally in tallies:
            for name, value in tally.items():
                self.counters[name] += value
        self.rank_tally.clear()

    def state_dict(self) -> dict:
        """The buffer, admission accuracies, counters, the RNG's state and the terms' (JSON-serialisable)."""
        version, internal, gauss = self.rng.getstate()
        return {
            "buffer": self.replay_buffer.state_dict(),
            "admitted_at": [[key, r] for key, r in self.admitted_at.items()],
            "counters": dict(self.counters),
            "rng": [version, list(internal), gauss],
            **{key: value for term in self.terms for key, value in term.state_dict().items()},
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`state_dict` exactly, in place."""
        self.replay_buffer.load_state_dict(state["buffer"])
        self.admitted_at.clear()
        self.admitted_at.update(dict(state["admitted_at"]))
        self.counters.clear()
        self.counters.update(state["counters"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        for term in self.terms:
            term.load_state_dict(state)

    def save(self, output_dir: str) -> None:
        """``zppo_state.json`` and the student copies' weights into ``output_dir``, before TRL's trainer state
        (written last): a checkpoint with its trainer state has them (:func:`last_complete_checkpoint`)."""
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, ZPPO_STATE_NAME), "w") as f:
            json.dump(self.state_dict(), f)
        for name, copy, _what in self.copies():  # EMA weights, for an exact resume
            torch.save(copy.state_dict(), os.path.join(output_dir, name))

    def load(self, checkpoint: str, device: Any, student_weights: Any) -> None:
        """Restore what :meth:`save` wrote to ``checkpoint``; a checkpoint without it (not ZPPO's) starts the buffer
        and counters empty, and a copy without its file restarts from ``student_weights()``, each said."""
        path = os.path.join(checkpoint, ZPPO_STATE_NAME)
        if os.path.exists(path):
            with open(path) as f:
                self.load_state_dict(json.load(f))
        else:
            logger.warning(
                "checkpoint %s has no %s: the replay buffer and ZPPO counters start empty", checkpoint, ZPPO_STATE_NAME
            )
        for name, copy, what in self.copies():
            path = os.path.join(checkpoint, name)
            if os.path.exists(path):
                copy.load_state_dict(torch.load(path, map_location=device))
            else:
                logger.warning("checkpoint %s has no %s: %s restarts from the resumed weights", checkpoint, name, what)
                copy.load_state_dict(student_weights())
