"""The evaluation run's memory on disk: the JSONL records a run resumes from, and the guard on resuming.

In a run directory (see `zppo_trl.evaluation.runner`) this module owns::

    run.json                 what was asked; its `RESUME_KEYS` must match for the directory to be resumed
    records/<setting>.jsonl  one line per finished generation, judgment, audit or skip (`RecordStore`)

An item is keyed by `item_key` (pass, row, question part); a judgment carries the `fingerprint` of the
response and judge prompt it scored, so a resumed run reuses it only while both are unchanged.
`write_json` writes any of the run's JSON files so that a killed run never leaves half a file.
Standard library only: the re-judging sweep and the trace-overlap audit use it too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "RESUME_KEYS",
    "RUN_FILE",
    "EvaluationError",
    "RecordStore",
    "RunDirectoryMismatch",
    "check_resume",
    "fingerprint",
    "item_key",
    "parse_key",
    "write_json",
]

RUN_FILE = "run.json"

# run.json fields that must match for a directory to be resumed (the rest may change: concurrency,
# endpoints' URLs, the settings to run).
RESUME_KEYS = (
    "model",
    "passes",
    "decoding",
    "sampling_fields",
    "max_samples",
    "seed",
    "max_frames",
    "condition",
    "judge_model",
)


class EvaluationError(RuntimeError):
    """The run could not finish (endpoint down, failed requests, a directory of another run)."""


class RunDirectoryMismatch(ValueError):
    """The output directory holds records of a run with another configuration."""


class RecordStore:
    """Append-only JSONL of one setting's finished generations and judgments (thread-safe).

    A line is ``{"kind": "generation" | "judgment" | "audit" | "skip", "key": ..., ...}``; a later line for
    a key replaces an earlier one. A torn last line (the process killed mid-write) is cut off on
    load, so that item is simply requested again. Skips are kept in the file as history but not
    loaded: each run decides them afresh (data may have been fixed, videos added), which costs
    no request.
    """

    def __init__(self, path: Path):
        self.path = path
        self.generations: dict[str, dict] = {}
        self.judgments: dict[str, dict] = {}
        self.audits: dict[str, dict] = {}
        self.skips: dict[str, dict] = {}
        self._tables = {"generation": self.generations, "judgment": self.judgments, "audit": self.audits,
                        "skip": self.skips}  # fmt: skip
        self._lock = threading.Lock()
        if path.exists():
            self._load()

    def _load(self) -> None:
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):  # killed mid-write: drop the partial line
            data = data[: data.rfind(b"\n") + 1]
            self.path.write_bytes(data)
            logger.warning("%s: cut off a partial last line (a run killed mid-write); that item is redone", self.path)
        for number, line in enumerate(data.decode("utf-8").splitlines(), 1):
            try:
                record = json.loads(line)
                if record["kind"] in self._tables and record["kind"] != "skip":  # skips are decided afresh
                    self._tables[record["kind"]][record["key"]] = record
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise EvaluationError(f"{self.path}:{number} is not a record this harness wrote ({err})") from None

    def add(self, record: dict) -> None:
        """Append one record and flush it to disk before returning."""
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self._lock:
            self._tables[record["kind"]][record["key"]] = record
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(line)


def fingerprint(*parts: Any) -> str:
    """A short fingerprint tying a judgment to the exact response and judge prompt it scored."""
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()[:16]


def item_key(pass_index: int, row_id: str, part: str | None) -> str:
    """The stable key of one generation: pass, row and (CharXiv) question part."""
    return f"p{pass_index}/{row_id}" + (f"#{part}" if part else "")


def parse_key(key: str) -> tuple[int, str, str]:
    """(pass, row id, part) of an `item_key`."""
    head, rest = key.split("/", 1)
    row_id, _, part = rest.partition("#")
    return int(head[1:]), row_id, part


def check_resume(run_dir: Path, manifest: dict) -> None:
    """Refuse a directory whose recorded items came from another configuration (`RunDirectoryMismatch`).

    `manifest` is the run.json the new run would write; its `RESUME_KEYS` must equal the recorded ones.
    A directory without records yet (say a first attempt that stopped at a mistyped model name)
    takes the new configuration.
    """
    path = run_dir / RUN_FILE
    records = run_dir / "records"
    if not path.exists() or not any(f.stat().st_size for f in records.glob("*.jsonl")):
        return
    previous = json.loads(path.read_text())
    for name in RESUME_KEYS:
        if previous.get(name) != manifest.get(name):
            raise RunDirectoryMismatch(
                f"{run_dir} holds a run with {name}={previous.get(name)!r}, not {manifest.get(name)!r}; "
                "use a new output directory (a run directory never mixes configurations)"
            )


def write_json(path: Path, payload: Any) -> None:
    """Write through a temporary file and a rename: a killed run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    tmp.replace(path)
