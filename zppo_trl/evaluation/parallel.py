"""Requests run in parallel, stopped at once when one of them fails or the user presses Ctrl-C.

The evaluation runner, the re-judging sweep and the trace-overlap audit all send many independent requests to a
server; :func:`run_all` is how each of them does it. This module is pure: no TRL, no trainer.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["run_all"]

T = TypeVar("T")


def run_all(
    work: Callable[[T], Any], items: Iterable[T], *, concurrency: int, abort: threading.Event, progress: Any = None
) -> None:
    """``work(item)`` for every item on ``concurrency`` threads, ``progress.update(1)`` as each finishes.

    On an exception from any item, or a KeyboardInterrupt, ``abort`` is set (each ``work`` checks it before its next
    request, so the running ones stop early), the items not yet started are cancelled, the running ones are waited
    for, and the exception is raised. ``work`` may also set ``abort`` itself (a dead endpoint): the queued items then
    return at once.
    """
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency)
    try:
        futures = [pool.submit(work, item) for item in items]
        for future in concurrent.futures.as_completed(futures):
            future.result()
            if progress is not None:
                progress.update(1)
    except BaseException:  # Ctrl-C or a bug: stop the queued work now, not after it all ran
        abort.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
