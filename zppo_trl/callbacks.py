"""What a run reports outside TRL's own loggers: a metrics file and a readable console.

`JsonlMetricsCallback`: TensorBoard and W&B are for looking; a plain ``metrics.jsonl`` is for
scripts (the demo's figure, quick ``jq`` checks, comparing runs). One object per TRL log
call, with ``step`` (the optimizer step) first. On resume, lines past the resumed step are
dropped so the file describes one continuous run.

`RolloutSummaryCallback` and `QuietProgressCallback`: TRL prints its whole metrics dict (about
80 keys) on every logging step. ZPPOTrainer keeps the progress bar, takes that dict off the
console (``full_console_logs`` brings it back) and prints one line per rollout step with the
numbers a researcher watches, the process's resident memory among them. Loggers (TensorBoard, W&B,
``metrics.jsonl``) get everything.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from .appended_log import read_appended
from .augmentations import AUGMENTATION_KINDS

__all__ = [
    "EMAReferenceCallback",
    "console_callbacks",
    "JsonlMetricsCallback",
    "QuietProgressCallback",
    "RolloutSummaryCallback",
    "read_metrics",
    "rollout_summary",
]

logger = logging.getLogger(__name__)


class JsonlMetricsCallback(TrainerCallback):
    """Append each ``on_log`` dict to ``path`` (default ``<output_dir>/metrics.jsonl``) on the main process,
    with the global step and the run's ``variant`` (the paper's name of its row)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = None if path is None else os.fspath(path)

    def _path(self, args) -> str:
        return self.path or os.path.join(args.output_dir, "metrics.jsonl")

    def on_train_begin(self, args, state, control, **kwargs):
        path = self._path(args)
        if not state.is_world_process_zero or not os.path.exists(path):
            return
        kept = [row for row in read_metrics(path) if row.get("step", 0) <= state.global_step]
        with open(path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in kept)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        row = {
            "step": state.global_step,
            "variant": getattr(args, "variant", None),
        }  # which of the paper's rows this run is
        for key, value in logs.items():
            if isinstance(value, float) and not math.isfinite(value):
                value = None  # JSON has no NaN/inf
            row[key] = value
        os.makedirs(os.path.dirname(self._path(args)) or ".", exist_ok=True)
        with open(self._path(args), "a") as f:
            f.write(json.dumps(row, default=str) + "\n")


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The rows of a ``metrics.jsonl`` file, in order. A last line cut short (a run killed while writing it) is
    dropped with a warning; a bad line before it is an error naming the file and line."""
    return [row for _, row in read_appended(path)]


def _kind(logs: dict, kind: str) -> str:
    groups = int(logs.get(f"zppo/{kind}_trained", 0))
    if not groups:
        return f"{kind.upper()} 0"
    if f"zppo/{kind}_accuracy" not in logs:  # a supervised control: verified targets, nothing sampled
        return f"{kind.upper()} {groups} verified ({int(logs.get(f'zppo/{kind}_rejected', 0))} rejected)"
    accuracy = logs.get(f"zppo/{kind}_accuracy", 0.0)
    signal = int(logs.get(f"zppo/{kind}_signal", 0))
    return f"{kind.upper()} {groups} (in-prompt acc {accuracy:.2f}, {signal}/{groups} with signal)"


def rollout_summary(
    logs: dict, total_rollout_steps: int | None = None, updates_per_step: int | None = None
) -> str | None:
    """The console line of one rollout step, from the log dict that carries its ``zppo/`` metrics (else None)."""
    if "zppo/rollout_steps" not in logs:
        return None
    step = int(logs["zppo/rollout_steps"])
    of = f"/{total_rollout_steps}" if total_rollout_steps else ""
    questions = int(logs.get("zppo/new", 0) + logs.get("zppo/replayed", 0))
    parts = [
        f"rollout {step}{of}",
        f"plain acc {logs.get('zppo/plain_accuracy', 0.0):.2f} on {questions} questions",
        f"buffer {int(logs.get('zppo/buffer_size', 0))} (+{int(logs.get('zppo/admitted', 0))} admitted, "
        f"{int(logs.get('zppo/graduated', 0))} graduated)",
        *(_kind(logs, kind) for kind in AUGMENTATION_KINDS if f"zppo/{kind}_trained" in logs),
    ]
    if logs.get("zppo/skipped_partitions"):
        of = f"/{updates_per_step}" if updates_per_step else ""
        parts.append(f"{int(logs['zppo/skipped_partitions'])}{of} updates skipped (no signal)")
    if logs.get("zppo/unscored_groups"):
        parts.append(f"{int(logs['zppo/unscored_groups'])} groups unscored (left out)")
    if logs.get("zppo/judge/failures"):
        parts.append(f"judge {int(logs['zppo/judge/failures'])}/{int(logs.get('zppo/judge/requests', 0))} failed")
    wait, took = logs.get("zppo/time/teacher_wait_s", 0.0), logs.get("zppo/time/rollout_step_s", 0.0)
    parts.append(f"teacher wait {wait:.1f} s of {took:.1f} s" if wait else f"{took:.1f} s")
    if "zppo/rss_gb" in logs:  # the trainer process's host memory (the largest rank's)
        parts.append(f"RSS {logs['zppo/rss_gb']:.1f} GB (peak {logs.get('zppo/rss_peak_gb', 0.0):.1f} GB)")
    return " | ".join(parts)


def _write(line: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(line)  # above any progress bar, which stays at the bottom


class RolloutSummaryCallback(TrainerCallback):
    """Print one line per rollout step (:func:`rollout_summary`) and one when training ends."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        partitions = getattr(args, "num_partitions", 1) or 1
        line = rollout_summary(logs, state.max_steps // partitions if state.max_steps > 0 else None, partitions)
        if line:
            _write(line)
        if "train_runtime" in logs:
            minutes, seconds = divmod(int(logs["train_runtime"]), 60)
            _write(f"training done: {state.global_step} optimizer updates in {minutes} min {seconds} s")


class QuietProgressCallback(ProgressCallback):
    """transformers' progress bar, without TRL's metrics dict printed under it at every log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return


class EMAReferenceCallback(TrainerCallback):
    """Move an EMA copy of the student (:class:`zppo_trl.student_copy.EMAReference`: GRPO-CARE's reference, SDPO's
    self-teacher) towards the student after each optimizer step whose count is a multiple of its ``every``."""

    def __init__(self, reference):
        self.reference = reference

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is not None:
            self.reference.after_step(getattr(model, "module", model), state.global_step)


def console_callbacks(handler: Any, full_console_logs: bool) -> None:
    """Set a trainer's ``handler`` (its ``callback_handler``) to print one line per rollout step
    (:class:`RolloutSummaryCallback`); TRL's metrics dict and the bare printer only with ``full_console_logs``."""
    if not full_console_logs:
        if handler.pop_callback(ProgressCallback) is not None:
            handler.add_callback(QuietProgressCallback)
        handler.pop_callback(PrinterCallback)
    handler.add_callback(RolloutSummaryCallback)
