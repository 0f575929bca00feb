"""One run per ``output_dir``: a lock file naming the run that holds it.

Two runs writing one ``output_dir`` interleave their ``metrics.jsonl`` and leave whichever checkpoint, model and
card finished last. :func:`run_lock` holds ``<output_dir>/zppo.lock`` (host, PID, start time) for the length of
``ZPPOTrainer.train``, on the main process: a second run finds it and is refused, naming the first. A lock whose
process is gone (a crashed or killed run, on this host) is stale: it is taken over with a warning, so resuming a
crashed run just works; a finished run removed its lock. A lock from another host cannot be checked from here:
it is refused, saying how to remove it if that run is over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator

__all__ = ["LOCK_NAME", "RunLocked", "run_lock"]

logger = logging.getLogger(__name__)

LOCK_NAME = "zppo.lock"


class RunLocked(RuntimeError):
    """Another run holds the ``output_dir``."""


@contextlib.contextmanager
def run_lock(output_dir: str, active: bool = True) -> Iterator[None]:
    """Hold ``output_dir``'s lock while the block runs (nothing where ``active`` is False: ranks other than the
    main process); raise :class:`RunLocked` naming the run that holds it."""
    if not active:
        yield
        return
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_NAME)
    mine = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    while True:
        try:
            with open(path, "x") as f:  # atomic: exactly one run creates it
                json.dump(mine, f)
            break
        except FileExistsError:
            holder = _read(path)
            if holder is not None and not _stale(holder):
                raise RunLocked(_refusal(output_dir, path, holder)) from None
            logger.warning(
                "%s: taking over the lock of a run that is gone (%s); resuming from its last complete checkpoint",
                output_dir, _describe(holder) if holder else "unreadable lock",
            )  # fmt: skip
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    try:
        yield
    finally:
        if _read(path) == mine:  # never remove a lock another run has taken over since
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            holder = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return holder if isinstance(holder, dict) else None


def _stale(holder: dict) -> bool:
    """Whether the run that wrote ``holder`` is gone: on this host, its PID no longer runs."""
    if holder.get("host") != socket.gethostname():
        return False  # another host's process cannot be checked from here
    try:
        os.kill(int(holder["pid"]), 0)
    except (ProcessLookupError, KeyError, TypeError, ValueError):
        return True
    except PermissionError:  # it runs, as another user
        return False
    return False


def _describe(holder: dict) -> str:
    return f"PID {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"


def _refusal(output_dir: str, path: str, holder: dict) -> str:
    elsewhere = holder.get("host") != socket.gethostname()
    hint = (
        f"if that run is over, remove {path}"
        if elsewhere
        else "wait for it to finish or stop it, or give this run another output_dir"
    )
    return f"output_dir {output_dir} is in use by another run ({_describe(holder)}): {hint}"
