"""Reading ahead to the next rollout step, so that the teacher samples its new questions early.

Algorithm 1 asks the teacher for G_T replies to every question of a rollout step (step 2). The new
questions of step t+1 are fixed before step t's optimizer updates start: they are the dataloader's
next generation batch. The trainer reads that batch ahead through :class:`BatchLookahead` (the
training loop still gets every batch, in order, when it asks) and sends the teacher those questions
while step t's updates run (:class:`PrefetchedSampling`); step t+1 asks only for its replayed
questions, which step t's buffer refresh decides. The teacher is frozen, so its replies do not depend
on when they are asked for: the overlapped and the serial schedule train the same numbers.

This module is pure: it imports neither TRL nor the trainer.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BatchLookahead", "PrefetchedSampling", "joined_futures"]


class BatchLookahead:
    """An iterator over ``source`` that can look ahead: what it looked at is kept and served in order.

    ``source`` is the training loop's epoch iterator (None until the loop starts one).
    """

    def __init__(self, source: Iterator | None = None):
        self.source = source
        self._ahead: deque = deque()

    def __iter__(self) -> BatchLookahead:
        return self

    def __next__(self) -> Any:
        if self._ahead:
            return self._ahead.popleft()
        if self.source is None:
            raise StopIteration
        return next(self.source)

    def peek(self, offset: int) -> Any:
        """The item ``offset`` places ahead (0: the one ``next`` returns), or None past the end."""
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        while len(self._ahead) <= offset:
            if self.source is None:
                return None
            try:
                self._ahead.append(next(self.source))
            except StopIteration:
                return None
        return self._ahead[offset]


@dataclass(frozen=True)
class PrefetchedSampling:
    """The teacher's replies to the next rollout step's new questions on this rank (``keys``, in the
    dataloader's order), asked for during the previous step: a Future of one reply list per key, and the
    per-key errors :meth:`zppo_trl.teacher.TeacherClient.sample_async` fills in."""

    keys: list
    future: concurrent.futures.Future
    errors: list

    def failed(self) -> bool:
        """Whether the server failed some of these requests: they were sent during an outage, and the step asks
        again. A request the server refused as a client error (``"rejected: "``) would be refused again."""
        return self.future.done() and any(e is not None and not e.startswith("rejected: ") for e in self.errors)


def joined_futures(futures: Sequence[concurrent.futures.Future]) -> concurrent.futures.Future:
    """One Future of the ``futures``' list results concatenated in order; it fails as the first failing one does."""
    joined: concurrent.futures.Future = concurrent.futures.Future()
    pending = len(futures)
    lock = threading.Lock()  # done-callbacks of different futures may run on different threads
    if not pending:
        joined.set_result([])
        return joined

    def on_done(_: concurrent.futures.Future) -> None:
        nonlocal pending
        with lock:
            pending -= 1
            if pending:
                return
        try:
            joined.set_result([item for future in futures for item in future.result()])
        except Exception as err:  # noqa: BLE001 - handed to whoever reads the joined Future
            joined.set_exception(err)

    for future in futures:
        future.add_done_callback(on_done)
    return joined
