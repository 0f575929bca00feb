"""WeMath: multiple-choice visual math; Exact on the option letter.

The options are one string (``"A: ...; B: ..."``), split into one line per lettered option.
"""

from __future__ import annotations

from ..spec import TaskSpec

WEMATH = TaskSpec(
    "WeMath", "vlm", "WeMath", "exact+judge", "We-Math/We-Math", "testmini",
    "question", "answer", options_field="option", image_field="image_path",  # upstream: image_path holds the image
    gold_form="letter",
)  # fmt: skip

SPECS = (WEMATH,)
