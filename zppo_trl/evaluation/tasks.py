"""The paper's 31-setting evaluation suite and its shared decoding configuration, as data.

Source of truth: the paper's benchmark appendix (its VLM, LLM and Video benchmark tables, and
the "Decoding configuration" paragraph). Name, family, scoring path, Hugging Face id, the
splits and subsets the tables name, the stated sizes and the three official aggregation rules
are the paper's. The paper does not give the upstream column names or the splits it leaves
unnamed; those follow the upstream datasets' published schemas and are marked ``# upstream``
(schema known) or ``# assumption`` (a choice the paper leaves open) where each benchmark module
of `zppo_trl.evaluation.benchmarks` defines its spec. This module builds the suite from that
registry.
"""

from __future__ import annotations

from .benchmarks import SPECS as _SPECS
from .spec import (
    AGGREGATIONS,
    ALL_CONFIGS,
    FAMILY_NAMES,
    JUDGE_DECODING,
    PAPER_DECODING,
    SCORINGS,
    DecodingConfig,
    Fields,
    TaskSpec,
)

__all__ = [
    "AGGREGATIONS",
    "ALL_CONFIGS",
    "FAMILIES",
    "FAMILY_NAMES",
    "JUDGE_DECODING",
    "PAPER_DECODING",
    "SCORINGS",
    "SUITE",
    "DecodingConfig",
    "Fields",
    "TaskSpec",
    "select",
]

SUITE: dict[str, TaskSpec] = {spec.name: spec for spec in _SPECS}
"""Setting name -> spec, in the order of the paper's tables (VLM, then LLM, then Video)."""

FAMILIES: dict[str, tuple[str, ...]] = {
    family: tuple(spec.name for spec in _SPECS if spec.family == family) for family in FAMILY_NAMES
}
"""Family -> its setting names in table order: 16 VLM, 10 LLM, 5 Video."""


def select(spec: str) -> list[str]:
    """Resolve a comma-separated selection of families and settings to setting names.

    Entries are family names (``vlm``, ``llm``, ``video``), setting names, or ``all``, matched
    case-insensitively and freely mixed (``"vlm,GPQA-D"``). The result is in suite order
    without repeats, so a report's columns do not depend on how the selection was typed.
    """
    by_lower = {name.lower(): name for name in SUITE}
    chosen: set[str] = set()
    entries = [entry.strip() for entry in spec.split(",") if entry.strip()]
    if not entries:
        raise ValueError(f"empty benchmark selection {spec!r}")
    for entry in entries:
        key = entry.lower()
        if key == "all":
            chosen.update(SUITE)
        elif key in FAMILIES:
            chosen.update(FAMILIES[key])
        elif key in by_lower:
            chosen.add(by_lower[key])
        else:
            raise ValueError(
                f"unknown benchmark or family {entry!r}; families: all, {', '.join(FAMILY_NAMES)}; "
                f"settings: {', '.join(SUITE)}"
            )
    return [name for name in SUITE if name in chosen]
