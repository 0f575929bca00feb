"""One run per ``output_dir``: a lock file naming the run that holds it.

Two runs writing one ``output_dir`` interleave their ``metrics.jsonl`` and leave whichever checkpoint, model and
card finished last. :func:`run_lock` holds ``<output_dir>/zppo.lock`` (host, PID, start time) for the length of
``ZPPOTrainer.train``, on the main process: a second run finds it and is refused, naming the first. A finished or
preempted run removes its lock. A lock is taken over, with a warning, when its holder is provably gone:

- on this host, its process no longer runs (a crashed or killed run): resuming a crashed run just works;
- it was written by an earlier incarnation of this run's own scheduler job (``SLURM_JOB_ID``, or ``ZPPO_JOB_ID``
  for another scheduler): a job runs one incarnation at a time, so a requeued job that lands on another node
  resumes without help. The lock records the job and its restart count (``SLURM_RESTART_COUNT``); a lock of the
  same job with a restart count not below this one's is a live sibling (two launches in one allocation), refused.

Any other lock from another host cannot be checked from here: it is refused, saying how to remove it if that run is
over. A run whose node died leaves its lock behind; the job that launched it knows the run is over once its training
step has ended, and :func:`release_job_lock` (called by ``recipes/launch/slurm_zppo.sbatch``) removes the lock this
incarnation of the job wrote, so that a resubmission, on other nodes, resumes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator

__all__ = ["LOCK_NAME", "RunLocked", "release_job_lock", "run_lock"]

logger = logging.getLogger(__name__)

LOCK_NAME = "zppo.lock"
# The scheduler's job of this process, as the lock records it: Slurm's, or another scheduler's through ZPPO_JOB_ID.
JOB_ENV = ("ZPPO_JOB_ID", "SLURM_JOB_ID")
RESTART_ENV = "SLURM_RESTART_COUNT"


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
    job = _job()
    if job is not None:
        mine.update(job)
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
                "%s: taking over the lock of a run that is gone (%s%s); resuming from its last complete checkpoint",
                output_dir, _describe(holder) if holder else "unreadable lock",
                ", an earlier incarnation of this job" if holder and _earlier_incarnation(holder) else "",
            )  # fmt: skip
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    try:
        yield
    finally:
        if _read(path) == mine:  # never remove a lock another run has taken over since
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def release_job_lock(output_dir: str) -> str | None:
    """Remove ``output_dir``'s lock where this very incarnation of this process's scheduler job wrote it (its job id
    and restart count), for a job whose training step has ended without releasing it (a node lost); the removed
    holder's description, or None where the lock is absent or another run's."""
    path = os.path.join(output_dir, LOCK_NAME)
    holder, job = _read(path), _job()
    if holder is None or job is None or holder.get("job") != job["job"]:
        return None
    if int(holder.get("restart", 0)) != job["restart"]:
        return None
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
    return _describe(holder)


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            holder = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return holder if isinstance(holder, dict) else None


def _job() -> dict | None:
    """This process's scheduler job and restart count (None outside a scheduler)."""
    job = next((os.environ[name] for name in JOB_ENV if os.environ.get(name)), None)
    if job is None:
        return None
    try:
        restart = int(os.environ.get(RESTART_ENV, "0"))
    except ValueError:
        restart = 0
    return {"job": job, "restart": restart}


def _earlier_incarnation(holder: dict) -> bool:
    """Whether ``holder`` was written by an earlier incarnation of this process's own job (a requeued job's)."""
    job = _job()
    if job is None or holder.get("job") != job["job"]:
        return False
    try:
        return int(holder.get("restart", 0)) < job["restart"]
    except (TypeError, ValueError):
        return False


def _stale(holder: dict) -> bool:
    """Whether the run that wrote ``holder`` is gone: an earlier incarnation of this job, or on this host a PID that
    no longer runs."""
    if _earlier_incarnation(holder):
        return True
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
    job = f", job {holder['job']} restart {holder.get('restart', 0)}" if holder.get("job") else ""
    return f"PID {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}{job}"


def _refusal(output_dir: str, path: str, holder: dict) -> str:
    elsewhere = holder.get("host") != socket.gethostname()
    hint = (
        f"if that run is over, remove {path}"
        if elsewhere
        else "wait for it to finish or stop it, or give this run another output_dir"
    )
    return f"output_dir {output_dir} is in use by another run ({_describe(holder)}): {hint}"
