"""The configuration's field checks, each refusing a bad value with a message that names the field."""

from __future__ import annotations

from typing import Any

__all__ = ["check_integer", "check_number", "check_positive"]


def check_number(name: str, value: Any, high: float | None = None) -> None:
    """Refuse a field that is not a finite number >= 0 (and <= ``high``), naming it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0.0 <= value < float("inf")
        or (high is not None and value > high)
    ):
        where = f"in [0.0, {high}]" if high is not None else ">= 0.0"
        raise ValueError(f"{name} must be a finite number {where}, got {value!r}")


def check_positive(name: str, value: Any) -> None:
    """Refuse a field that is not a finite number > 0, naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def check_integer(name: str, value: Any, minimum: int) -> None:
    """Refuse a field that is not an integer >= ``minimum``, naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
