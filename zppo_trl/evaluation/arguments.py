"""What the ``zppo-eval`` subcommands share on their command lines: argument types, and the directory name a
judge's label becomes."""

from __future__ import annotations

import argparse
import json
import re

__all__ = ["json_object", "label_slug", "positive_int"]


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def json_object(text: str) -> dict:
    """An argparse type: a JSON object (e.g. ``--judge-extra-body``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def label_slug(text: str) -> str:
    """A judge's label as a directory name (``judges/<slug>/``)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return slug or "judge"
