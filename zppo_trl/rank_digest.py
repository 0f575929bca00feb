"""Each rank's fingerprint of the run after every optimizer update, for checking that the ranks agree.

Every rank of a ZPPO run must hold the same weights and make the same decisions (:mod:`zppo_trl.ranks`): the replay
draw, the hard-question ranking, the BCQ/NCQ plan, the buffer refresh. A run on many nodes can only be checked from
what each rank wrote. With the recipe's ``--rank_digests true``, every rank appends one JSON line per optimizer update
to ``<output_dir>/rank_digests/rank<R>.jsonl``::

    {"step": 4, "rank": 1, "host": "zn4", "params": "<sha256>", "state": "<sha256>", "buffer_size": 3,
     "counters": {"bcq_total": 2.0, ...}}

``params`` hashes every parameter's bytes in name order; ``state`` hashes the ZPPO state a checkpoint saves (the
replay buffer and its admissions, the counters, the decision RNG, the terms' state). Equal lines across ranks at a
step mean equal weights and equal decisions up to it. Where parameters are sharded (ZeRO-3, FSDP) ``params`` is the
rank's own shard and differs by design; ``state`` must still agree. On resume, lines past the resumed step are
dropped, as in ``metrics.jsonl``, so each file describes one continuous run.

Hashing costs one read of the weights per update (about 0.3 s for 135M float32 parameters on a CPU); it is off by
default.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from typing import Any

import torch
from transformers import TrainerCallback

from .appended_log import read_appended

__all__ = ["RankDigestCallback", "params_digest", "read_rank_digests", "state_digest"]

DIGEST_DIR = "rank_digests"


def params_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's bytes (in name order, with its name, dtype and shape)."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters()):
        tensor = param.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def state_digest(state: dict) -> str:
    """sha256 of a JSON-serialisable state (:meth:`zppo_trl.checkpoint_state.ZPPOState.state_dict`), keys sorted."""
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()


def read_rank_digests(output_dir: str | os.PathLike) -> dict[int, list[dict]]:
    """Every rank's digest lines in ``output_dir``, by rank."""
    folder = os.path.join(output_dir, DIGEST_DIR)
    ranks = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("rank") and name.endswith(".jsonl"):
            ranks[int(name[4:-6])] = [record for _, record in read_appended(os.path.join(folder, name))]
    return ranks


class RankDigestCallback(TrainerCallback):
    """Append this rank's digest line after every optimizer update (see the module's docstring).

    Args:
        state: the run's :class:`~zppo_trl.checkpoint_state.ZPPOState` (the trainer's ``zppo_state``).
        rank: this process's index among the training ranks.
    """

    def __init__(self, state: Any, rank: int):
        self.state = state
        self.rank = rank
        self.host = socket.gethostname()

    def _path(self, args) -> str:
        return os.path.join(args.output_dir, DIGEST_DIR, f"rank{self.rank}.jsonl")

    def on_train_begin(self, args, state, control, **kwargs):
        path = self._path(args)
        if os.path.exists(path):  # a resumed run: keep what led to the checkpoint it resumes from
            kept = [record for _, record in read_appended(path) if record.get("step", 0) <= state.global_step]
            with open(path, "w") as f:
                f.writelines(json.dumps(record) + "\n" for record in kept)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        saved = self.state.state_dict()
        record = {
            "step": state.global_step,
            "rank": self.rank,
            "host": self.host,
            "params": params_digest(model),
            "state": state_digest(saved),
            "buffer_size": len(self.state.replay_buffer),
            "counters": dict(sorted(saved["counters"].items())),
        }
        path = self._path(args)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
