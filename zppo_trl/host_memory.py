"""The trainer process's host memory: how much it holds, and glibc's heap kept from hoarding freed tensors.

PyTorch allocates CPU tensors with ``posix_memalign``. glibc serves every request under its mmap threshold
from its heap, which it hands back to the system only from the top, and the threshold is dynamic: it
starts at 128 KiB and rises to the size of each mapped block that is freed, up to 32 MiB. After the first
large tensors are freed, every activation of a forward and backward pass (a few MiB each on the CPU demo)
lands in the heap, and an update with a new mix of shapes (a longer BCQ/NCQ prompt, a micro-batch of more
rows) leaves the heap larger, full of free holes the process keeps. Measured on the CPU demo
(``benchmarks/bench_memory.py --part rss``, docs/memory.md): by the second rollout step glibc's heaps
held 7.2 GB, 1.3 GB of it in use, and the trainer sat at 8 GB between steps while the tensors alive
were 1.5 GB.

:func:`keep_heap_small` fixes the threshold at 1 MiB for the whole process, so that every large tensor of a
forward or backward pass (the updates', and the scoring passes' of a rollout step) gets pages of its own
that go back to the system when it is freed. Decoding is the opposite case: each new token allocates and
frees a few small tensors per layer (the growing KV cache), where fresh pages for each cost more than the
token's arithmetic: the demo model decoding 48 tokens for 16 prompts of 250 tokens took 17.1 and 17.3 s at
1 MiB, 13.2 and 12.9 s from the heap (alternating; peak 0.49 against 0.59 GB above the start). So the
trainer decodes inside :func:`generation_heap`, which serves it from the heap and afterwards hands the
heap's free pages back (:func:`release_free_heap`, ``malloc_trim``). The threshold decides only what the
heap cannot serve: a large tensor fits in the free chunks decoding leaves, and freed there it stays resident,
so the trainer also trims after each update's micro-batch. All of it is a no-op off glibc, and a threshold set
with ``MALLOC_MMAP_THRESHOLD_`` is left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import sys
from collections.abc import Iterator

import psutil  # a dependency of accelerate (and of TRL and PEFT)

try:
    import resource
except ImportError:  # Windows
    resource = None

__all__ = [
    "GENERATION_THRESHOLD",
    "UPDATE_THRESHOLD",
    "generation_heap",
    "keep_heap_small",
    "process_memory_gb",
    "release_free_heap",
]

# During the updates, allocations of at least 1 MiB get pages of their own: the activations (a few MiB
# each at the demo's sizes) stay out of the heap, the many small tensors (norms, biases, per-row values)
# in it. A forward and backward of the demo's micro-batch took the same time as with the heap (38.8 s
# against 38.6 s, the median of four alternations each).
UPDATE_THRESHOLD = 1 << 20
# While generating: glibc's own ceiling for its dynamic threshold (64-bit), where it ends up anyway.
GENERATION_THRESHOLD = 32 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
_GIB = 1024**3


@functools.cache  # platform.libc_ver() reads the interpreter's binary: once, not around every decoding call
def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (whose ``mallopt`` and ``malloc_trim`` these calls use)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(None)


def _set_mmap_threshold(threshold: int) -> bool:
    libc = _glibc()
    if libc is None or "MALLOC_MMAP_THRESHOLD_" in os.environ:  # glibc read the user's own choice at start-up
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(threshold)))


def keep_heap_small(threshold: int = UPDATE_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for the whole process (which also stops it rising).

    Returns whether it was set: not off glibc, nor when ``MALLOC_MMAP_THRESHOLD_`` is in the environment.
    """
    return _set_mmap_threshold(threshold)


def release_free_heap() -> bool:
    """Give the free pages inside glibc's heaps back to the system (``malloc_trim(0)``); False off glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(ctypes.c_size_t(0))
    return True


@contextlib.contextmanager
def generation_heap() -> Iterator[None]:
    """Serve allocations under 32 MiB from glibc's heap inside the block (decoding), then fix the
    threshold at :data:`UPDATE_THRESHOLD` again; the heap's free pages are handed back on entry and on exit."""
    release_free_heap()
    changed = _set_mmap_threshold(GENERATION_THRESHOLD)
    try:
        yield
    finally:
        if changed:
            _set_mmap_threshold(UPDATE_THRESHOLD)
        release_free_heap()


def process_memory_gb() -> tuple[float, float]:
    """This process's resident memory (RSS) now and its peak so far, in GiB."""
    info = psutil.Process().memory_info()
    if resource is not None:  # ru_maxrss: KiB on Linux, bytes on macOS
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    else:
        peak = getattr(info, "peak_wset", info.rss)
    return info.rss / _GIB, max(peak, info.rss) / _GIB
