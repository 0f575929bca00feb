"""The trainer process's host memory (zppo_trl.host_memory): what it reads, and that glibc hands freed
activations back to the system once the trainer has set it up, where by default it keeps them, and that
generation's heap is handed back when generation ends.

The heap test runs in a fresh interpreter: glibc's mmap threshold is per process and only rises, so the
test process's own history (every tensor pytest's earlier tests freed) would decide the outcome.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zppo_trl.callbacks import rollout_summary
from zppo_trl.host_memory import process_memory_gb
from zppo_trl.step_metrics import memory_metrics

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20

# 4 MiB activations freed below small tensors that stay (as a forward and backward leave them), and the
# resident memory the process still holds for them.
_HEAP = """
import json, sys
import torch
from zppo_trl import host_memory

def rss_mib():
    return host_memory.process_memory_gb()[0] * 1024

def freed_activations():
    big, small = [], []
    for _ in range(100):
        big.append(torch.ones(1 << 20))  # 4 MiB, written
        small.append(torch.ones(16 << 10))  # 64 KiB, stays: a live block above each big one
    return small  # 400 MiB freed, 6.25 MiB live

mode = sys.argv[1]
if mode in ("fixed", "generation"):
    assert host_memory.keep_heap_small()
torch.ones(8 << 20, dtype=torch.uint8)  # a freed 8 MiB block: glibc's dynamic threshold rises past 4 MiB
held, kept, start = {}, [], rss_mib()
if mode == "generation":
    with host_memory.generation_heap():
        kept.append(freed_activations())
        held["inside"] = rss_mib() - start
    held["after"] = rss_mib() - start
    kept.append(freed_activations())  # may reuse the heap's free chunks: glibc maps only what they cannot hold
    assert host_memory.release_free_heap()  # as ZPPOTrainer does after every update's micro-batch
    held["next"] = rss_mib() - start - held["after"]
else:
    kept.append(freed_activations())
    if mode == "trim":
        assert host_memory.release_free_heap()
    held[mode] = rss_mib() - start
print(json.dumps(held))
"""


def _held_mib(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", _HEAP, mode], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's allocator only"
)
def test_freed_activations_leave_the_process_once_the_heap_is_kept_small():
    assert _held_mib("default")["default"] > 300  # of the 400 MiB freed: glibc's heap keeps them
    assert _held_mib("fixed")["fixed"] < 40  # keep_heap_small: each 4 MiB tensor had pages of its own
    assert _held_mib("trim")["trim"] < 40  # release_free_heap: the heap's free pages handed back
    generation = _held_mib("generation")
    assert generation["inside"] > 300  # generation_heap: the heap serves them, and keeps them ...
    assert generation["after"] < 40  # ... until the block ends
    assert generation["next"] < 40  # and what the next pass frees into the heap's holes is handed back too


def test_process_memory_follows_what_the_process_holds():
    before, _ = process_memory_gb()
    block = torch.ones(64 * MIB)  # 256 MiB, written
    during, peak = process_memory_gb()
    assert during - before > 0.2
    assert peak >= during
    del block
    _, peak_after = process_memory_gb()
    assert peak_after - before > 0.2  # the peak remembers the freed block


def test_memory_metrics_report_the_largest_rank():
    per_rank = torch.tensor([[2.0, 3.5], [2.5, 3.0]], dtype=torch.float64)
    assert memory_metrics(per_rank) == {"rss_gb": 2.5, "rss_peak_gb": 3.5}


def test_the_console_line_shows_the_process_memory():
    logs = {"zppo/rollout_steps": 3, "zppo/time/rollout_step_s": 12.0, "zppo/rss_gb": 2.345, "zppo/rss_peak_gb": 3.61}
    line = rollout_summary(logs, 6)
    assert line.startswith("rollout 3/6 |")
    assert line.endswith("| 12.0 s | RSS 2.3 GB (peak 3.6 GB)")
    del logs["zppo/rss_gb"]  # a log without it (an older run's metrics) prints no memory
    assert "RSS" not in rollout_summary(logs, 6)
