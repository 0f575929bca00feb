"""Reading back the JSON Lines files a run appends to: ``metrics.jsonl``, ``groups.jsonl``, ``audit_traces.jsonl``.

A run killed while writing leaves its last line cut short: that line is dropped, with a warning. Any other line
that is not JSON is an error naming the file and the line. What each record must hold is its reader's to check.

This module is pure: no TRL, no trainer.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

__all__ = ["read_appended"]

logger = logging.getLogger(__name__)


def read_appended(path: str | os.PathLike) -> list[tuple[int, Any]]:
    """``(line number, record)`` of every non-blank line of ``path``, in order (see the module's docstring)."""
    with open(path, "rb") as f:
        lines = [(number, line) for number, line in enumerate(f, start=1) if line.strip()]
    records = []
    for position, (number, line) in enumerate(lines):
        try:
            records.append((number, json.loads(line)))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            if position < len(lines) - 1:
                raise ValueError(f"{path}:{number}: not a JSON line ({err})") from None
            logger.warning("%s:%d: dropped a torn last line (a run stopped while writing it)", path, number)
    return records
