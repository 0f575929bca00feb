"""VLMs-are-Blind (BlindTest): seven low-level visual tasks; Exact; the score is the mean of the
seven task accuracies."""

from __future__ import annotations

import re

from ..spec import TaskSpec

_I = re.IGNORECASE

# XAI/vlmsareblind `prompt` column: the BlindTest prompts end in an answer-format sentence
# (xai-org/vlmsareblind task notebooks; e.g. "How many times do the blue and red lines touch
# each other? Answer with a number in curly brackets, e.g., {5}.").
DIRECTIVES = (
    # "Answer with a number in curly brackets, e.g., {5}.", "Put your answer in curly brackets,
    # e.g., {2}.", "Answer with only the number in numerical format in curly brackets e.g. {3}.",
    # "Please answer with a number in curly brackets e.g., {10}.", subway maps' "... e.g. {3}".
    (re.compile(r"\s*(?:Please\s+)?(?:Answer|Put\s+your\s+answer)\b[^.?!\n]*?\bin\s+curly\s+brackets,?\s*"
                r"(?:e\.g\.,?|for\s+example,?)\s*\{[^{}\n]*\}\s*\.?", _I), ""),
    # Counting Grid: "Count the number of rows and columns and answer with numbers in curly
    # brackets. For example, rows={5} columns={6}" -> "Count the number of rows and columns."
    (re.compile(r"\s+and\s+answer\s+with\s+numbers\s+in\s+curly\s+brackets\.\s*For\s+example,\s*"
                r"rows=\{\d+\}\s*columns=\{\d+\}\s*\.?", _I), "."),
    # Counting Grid: "How many rows and columns are in the table? Answer with only the numbers
    # in a pair (row, column), e.g., (5,6)"
    (re.compile(r"\s*Answer\s+with\s+only\s+the\s+numbers\s+in\s+a\s+pair\s+\(row,\s*column\),?\s*"
                r"e\.g\.,?\s*\(\d+,\s*\d+\)\s*\.?", _I), ""),
    # Olympic Counting: "How many circles are in the image? Answer with only the number in numerical format."
    (re.compile(r"\s*Answer\s+with\s+only\s+the\s+number\s+in\s+numerical\s+format\s*\.?", _I), ""),
    # Touching Circles: "Are the two circles touching each other? Answer with Yes/No."
    (re.compile(r"\s*Answer\s+with\s+Yes\s*/\s*No\s*\.?", _I), ""),
)  # fmt: skip

VBLIND = TaskSpec(
    "VBlind", "vlm", "VLMs-are-Blind", "exact+judge", "XAI/vlmsareblind", "valid",  # upstream
    "prompt", "groundtruth", image_field="image",  # upstream
    aggregation="mean_of_tasks", group_field="task",  # upstream: the 7 BlindTest task names
    directives=DIRECTIVES,
)  # fmt: skip

SPECS = (VBLIND,)
