"""MMMU-Pro: multi-discipline multiple choice, in its standard (4 and 10 options) and vision configs; Exact.

The vision config has no question column: the question and its options are rendered inside the
one screenshot, so those rows are asked "Answer the question shown in the image." without
option lines (the scorer still reads the options column). The standard configs' ``<image k>``
placeholders stay in the text as references; the images are sent first in ``image_1``..``image_7``
order, so the k-th image is ``<image k>``.
"""

from __future__ import annotations

from ..spec import TaskSpec

_IMAGES = ("image",) + tuple(f"image_{i}" for i in range(1, 8))  # upstream: vision config / standard configs

MMMU_PRO = TaskSpec(
    "MMMU-Pro", "vlm", "MMMU-Pro", "exact+judge", "MMMU/MMMU_Pro", "test",  # upstream
    "question", "answer", subset=("standard (4 options)", "standard (10 options)", "vision"),  # upstream config names
    options_field="options", image_field=_IMAGES,
    image_only_configs=frozenset({"vision"}),
    question_may_be_image_only=True,
    gold_form="letter",
)  # fmt: skip

SPECS = (MMMU_PRO,)
