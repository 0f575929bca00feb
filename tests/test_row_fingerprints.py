"""tools/row_fingerprints.py's bookkeeping (the tool itself trains every row: minutes, not part of the suite)."""

from __future__ import annotations

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import row_fingerprints as tool  # noqa: E402


def test_every_recipe_is_a_row_and_a_row_is_what_its_file_changes():
    rows = tool.rows()
    files = sorted((TOOLS.parent / "recipes" / "rows").rglob("*.yaml"))
    assert len(rows) == 1 + len(files) and rows["zppo"] == tool.PAPER
    assert "budget/grpo_dagger_g16_p1" in rows
    assert tool.row_fields(rows["zppo"]) == {}
    assert tool.row_fields(rows["grpo_dagger"]) == {"augmentations": []}
    # where it writes and which Hub checkpoint it loads are not the row; that it loads a teacher is
    assert tool.row_fields(rows["on_distill"])["distill_teacher"] is True
    budget = tool.row_fields(rows["budget/grpo_dagger_g16_p1"])
    assert budget["num_generations"] == 16
    shape = tool.tiny_shape({**tool.TINY, **budget})
    assert shape["per_device_train_batch_size"] == 4 * 16 and shape["max_steps"] == 2 * tool.TINY["num_partitions"]


def test_a_check_names_each_row_and_part_that_differs_and_rows_trained_alike():
    print_ = {"weights": "a", "buffer": "b", "logged": "c", "teacher_requests": 3, "loss": [0.1]}
    recorded = {"x": print_, "y": print_}
    measured = {"x": print_, "y": {**print_, "weights": "z", "teacher_requests": 4, "loss": [0.2]}, "new": print_}
    assert tool.compare(recorded, measured) == [
        "y: weights, teacher_requests differ (loss [0.1] -> [0.2])",
        "new: no recorded fingerprint (record main's with --save)",
    ]
    assert tool.alike(measured) == [["x", "new"]]
