"""Video-MME, without (VMME) and with subtitles (VMME-S): multiple choice on short to long videos;
Rule: Video-MME's own letter extraction on the boxed span.

VMME-S puts the subtitles before the question under the line `SUBTITLES_HEADER`
(`zppo_trl.evaluation.prompting`, our wording); a video without a subtitle file gets
`NO_SUBTITLES` (some Video-MME videos have none).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..metrics import require
from ..spec import TaskSpec

# lmms-eval `lmms_eval/tasks/videomme/utils.py` (`extract_characters_regex`, as of c7eaef37,
# 2026-01-24; the same rule as Video-MME's own eval script). Upstream's list misses two commas,
# so two entries are concatenations ("...option isThe correct...") that never occur; kept.
# Upstream 9ca4445d (2026-04-11) replaced this with lmms-eval's generic `mcq_extract`; we follow
# the benchmark's own rule.
_VMME_PREFIXES = (
    "The best answer is",
    "The correct answer is",
    "The answer is",
    "The answer",
    "The best option isThe correct option is",
    "Best answer:Best option:",
)


def _videomme_letter(text: str) -> str:
    text = text.strip()
    for prefix in _VMME_PREFIXES:
        text = text.replace(prefix, "")
    # Quirk kept: the first upper-case A-D anywhere wins, so "Answer: D" reads as "A".
    match = re.search(r"[ABCD]", text)
    if match is None:  # covers upstream's "> 10 words and no letter" early exit too
        return ""
    return match.group(0)


def videomme_rule(extraction: str, row: Mapping[str, Any], spec: TaskSpec | None = None) -> tuple[bool, str]:
    """Video-MME: the extracted letter equals the gold letter, case-insensitively (VMME and VMME-S)."""
    spec = spec or VMME
    gold = str(require(spec, row, "answer")).strip()
    letter = _videomme_letter(extraction)
    return bool(letter) and letter.lower() == gold.lower(), "videomme:letter"


VMME = TaskSpec(
    "VMME", "video", "Video-MME", "rule+judge", "lmms-lab/Video-MME", "test",  # upstream
    "question", "answer", options_field="options", video_field="videoID",  # upstream: file stem of video and subtitles
    rule=videomme_rule,
)  # fmt: skip

VMME_S = TaskSpec(
    "VMME-S", "video", "Video-MME", "rule+judge", "lmms-lab/Video-MME", "test",  # upstream
    "question", "answer", options_field="options", video_field="videoID", subtitles=True,
    rule=videomme_rule,
)  # fmt: skip

SPECS = (VMME, VMME_S)
