"""The dataset schema the trainer consumes, and its row validation.

One row is one training question: the image(s), the question text (no closer: the
trainer appends the RL closer), the reference answer the reward grader scores against,
and where the row came from. The ZPPO-77K builder (`zppo_trl.corpus`) writes exactly
these columns; recipes and the trainer read them.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ID", "QUESTION", "IMAGES", "ANSWER", "SOURCE", "SUBDATASET", "COLUMNS", "validate_row"]

ID = "id"  # unique, stable row key (the replay buffer stores these)
QUESTION = "question"  # question text without the RL closer
IMAGES = "images"  # list of images (PIL images, encoded bytes, {"bytes", "path"} dicts or paths)
ANSWER = "answer"  # reference answer a* for the grader
SOURCE = "source"  # upstream dataset, e.g. "vero" or "mmfinereason"
SUBDATASET = "subdataset"  # canonical sub-dataset name, e.g. "ai2d"

COLUMNS = (ID, QUESTION, IMAGES, ANSWER, SOURCE, SUBDATASET)

_TEXT_FIELDS = (ID, QUESTION, ANSWER, SOURCE, SUBDATASET)


def _is_image(value) -> bool:
    if isinstance(value, (bytes, str)):
        return bool(value)
    if isinstance(value, Mapping):
        return bool(value.get("bytes") or value.get("path"))
    return hasattr(value, "size") and hasattr(value, "mode")  # a PIL image, without importing PIL


def validate_row(row: Mapping, index) -> None:
    """Raise ``ValueError`` naming ``index`` and the field when ``row`` breaks the schema.

    Every column of :data:`COLUMNS` must be present; the text fields must be non-empty
    strings; ``images`` must be a list (empty for text-only rows) of images.
    """
    if not isinstance(row, Mapping):
        raise ValueError(f"row {index}: expected a mapping, got {type(row).__name__}")
    for field in COLUMNS:
        if field not in row:
            raise ValueError(f"row {index}: missing field {field!r}")
    for field in _TEXT_FIELDS:
        value = row[field]
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"row {index}: field {field!r} must be a non-empty string, got {value!r:.80}")
    images = row[IMAGES]
    if not isinstance(images, list):
        raise ValueError(f"row {index}: field {IMAGES!r} must be a list, got {type(images).__name__}")
    for position, image in enumerate(images):
        if not _is_image(image):
            raise ValueError(f"row {index}: field {IMAGES!r} item {position} is not an image ({type(image).__name__})")
