"""`JsonlMetricsCallback`: every log line of a run, appended to a JSON-lines file.

TensorBoard and W&B are for looking; a plain ``metrics.jsonl`` is for scripts (the
demo's figure, quick ``jq`` checks, comparing runs). One object per TRL log call, with
``step`` (the optimizer step) first. On resume, lines past the resumed step are dropped so
the file describes one continuous run.
"""

from __future__ import annotations

import json
import math
import os

from transformers import TrainerCallback

__all__ = ["JsonlMetricsCallback", "read_metrics"]


class JsonlMetricsCallback(TrainerCallback):
    """Append each ``on_log`` dict to ``path`` (default ``<output_dir>/metrics.jsonl``) on the main process."""

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
        row = {"step": state.global_step}
        for key, value in logs.items():
            if isinstance(value, float) and not math.isfinite(value):
                value = None  # JSON has no NaN/inf
            row[key] = value
        os.makedirs(os.path.dirname(self._path(args)) or ".", exist_ok=True)
        with open(self._path(args), "a") as f:
            f.write(json.dumps(row, default=str) + "\n")


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The rows of a ``metrics.jsonl`` file, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
