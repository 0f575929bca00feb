"""Dataset loading and validation (`zppo_trl.data`), and the demo's bundled questions."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import datasets
import pytest
from PIL import Image

from zppo_trl import data

REPO = Path(__file__).resolve().parent.parent
DEMO_FILE = REPO / "recipes" / "data" / "demo_math.jsonl"


def _row(i: int, **overrides) -> dict:
    row = {
        "id": f"q{i}",
        "question": f"What is {i} + 1?",
        "images": [],
        "answer": str(i + 1),
        "source": "unit",
        "subdataset": "add",
    }
    row.update(overrides)
    return row


def _write_jsonl(rows, path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---------------------------------------------------------------------- loading


def test_loads_jsonl_parquet_folders_and_save_to_disk(tmp_path):
    rows = [_row(i) for i in range(5)]
    jsonl = _write_jsonl(rows, tmp_path / "train.jsonl")
    parquet_dir = tmp_path / "parquet"
    parquet_dir.mkdir()
    datasets.Dataset.from_list(rows[:3]).to_parquet(str(parquet_dir / "part-0.parquet"))
    datasets.Dataset.from_list(rows[3:]).to_parquet(str(parquet_dir / "part-1.parquet"))
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(saved))

    for source in (jsonl, parquet_dir / "part-0.parquet", parquet_dir, saved):
        dataset, skipped = data.load_questions(str(source))
        expected = rows[:3] if source.name == "part-0.parquet" else rows
        assert skipped == []
        assert sorted(dataset["id"]) == [r["id"] for r in expected], source
        assert dataset[0]["answer"] == expected[[r["id"] for r in expected].index(dataset[0]["id"])]["answer"]


def test_image_paths_relative_to_the_file_are_decoded(tmp_path):
    Image.new("RGB", (12, 8), "red").save(tmp_path / "red.png")
    (tmp_path / "img").mkdir()
    Image.new("RGB", (5, 7), "blue").save(tmp_path / "img" / "blue.png")
    path = _write_jsonl(
        [_row(0, images=["red.png"]), _row(1, images=["img/blue.png", "red.png"])], tmp_path / "train.jsonl"
    )
    dataset, _ = data.load_questions(str(path))
    first, second = dataset[0]["images"], dataset[1]["images"]
    assert [im.size for im in first] == [(12, 8)]
    assert [im.size for im in second] == [(5, 7), (12, 8)]
    assert second[0].getpixel((0, 0)) == (0, 0, 255)


def test_a_bad_row_is_an_error_naming_row_and_field(tmp_path):
    rows = [_row(0), _row(1), _row(2, answer="  "), _row(3)]
    path = _write_jsonl(rows, tmp_path / "train.jsonl")
    with pytest.raises(ValueError, match=r"row 2: field 'answer' must be a non-empty string.*--skip_invalid"):
        data.load_questions(str(path))


def test_skip_invalid_drops_counts_and_logs(tmp_path, caplog):
    rows = [_row(0), _row(1, question=""), _row(2), _row(3, images=[""]), _row(0, answer="9")]
    path = _write_jsonl(rows, tmp_path / "train.jsonl")
    with caplog.at_level(logging.WARNING, logger="zppo_trl.data"):
        dataset, skipped = data.load_questions(str(path), skip_invalid=True)
    assert dataset["id"] == ["q0", "q2"]
    assert [index for index, _ in skipped] == [1, 3, 4]
    assert (
        "field 'question'" in skipped[0][1] and "field 'images'" in skipped[1][1] and "repeats row 0" in skipped[2][1]
    )
    assert "skipped 3 invalid row(s) of 5" in caplog.text


def test_repeated_ids_and_missing_columns_are_errors(tmp_path):
    with pytest.raises(ValueError, match=r"row 1: field 'id' repeats row 0"):
        data.load_questions(str(_write_jsonl([_row(0), _row(0)], tmp_path / "dup.jsonl")))
    no_answer = [{k: v for k, v in _row(0).items() if k != "answer"}]
    with pytest.raises(ValueError, match=r"missing column\(s\) \['answer'\]"):
        data.load_questions(str(_write_jsonl(no_answer, tmp_path / "cols.jsonl")), skip_invalid=True)


def test_missing_local_paths_are_not_mistaken_for_hub_ids(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        data.load_questions(str(tmp_path / "nope.jsonl"))
    with pytest.raises(FileNotFoundError, match="a Hub id reads org/name"):
        data.load_questions("recipes/data/nope.jsonl")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="expected a .parquet/.jsonl file"):
        data.load_questions(str(tmp_path / "notes.txt"))


# ---------------------------------------------------------------------- the demo's questions

_SOLVERS = {
    # each kind's answer recomputed from the question text alone
    "add": (r"has (\d+) \w+\. \w+ gets (\d+) more", lambda a, b: a + b),
    "sub": (r"had (\d+) \w+ and gave away (\d+)", lambda a, b: a - b),
    "mul": (r"There are (\d+) boxes with (\d+)", lambda a, b: a * b),
    "div": (r"(\d+) \w+ are shared equally among (\d+) friends", lambda a, b: a / b),
    "two_step": (r"has (\d+) \w+, gets (\d+) more and gives away (\d+)", lambda a, b, c: a + b - c),
}


def test_demo_questions_have_verified_integer_answers():
    rows = data.demo_questions(240, seed=0)
    assert len({r["id"] for r in rows}) == 240
    kinds = {r["subdataset"] for r in rows}
    assert kinds == set(_SOLVERS)
    for row in rows:
        data.validate_row(row, row["id"])
        assert row["question"].startswith(data.DEMO_EXAMPLE)
        pattern, solve = _SOLVERS[row["subdataset"]]
        numbers = [int(x) for x in re.search(pattern, row["question"][len(data.DEMO_EXAMPLE) :]).groups()]
        value = solve(*numbers)
        assert value == int(value) and value >= 0, row
        assert row["answer"] == str(int(value)), row
    assert data.demo_questions(240, seed=0) == rows
    assert data.demo_questions(240, seed=1) != rows


def test_bundled_demo_file_is_the_generator_output():
    bundled = [json.loads(line) for line in DEMO_FILE.read_text().splitlines()]
    assert bundled == data.demo_questions(len(bundled), seed=0)
    dataset, skipped = data.load_questions(str(DEMO_FILE))
    assert len(dataset) == len(bundled) and skipped == []


@pytest.mark.parametrize(
    "name, hub",
    [
        ("zppo-trl/ZPPO-77K", True),
        ("Qwen/Qwen3.5-2B", True),  # a dot inside a repo name is no file suffix
        ("recipes/data/nope.jsonl", False),  # three parts and a suffix
        ("data/train.parquet", False),  # a file suffix
        ("./data/zppo-77k", False),
        ("/abs/zppo-77k", False),
        ("~/zppo-77k", False),
        ("gsm8k", False),  # one part: a path here (Hub ids read org/name)
        ("org/", False),
        ("", False),
        (None, False),
    ],
)
def test_is_hub_id(name, hub):
    assert data.is_hub_id(name) is hub


def test_an_existing_folder_is_never_a_hub_id(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert data.is_hub_id("org/name") is False


# ---------------------------------------------------------------------- found before training


def test_numbers_given_as_answers_are_read_as_their_text(tmp_path):
    """One integer answer among strings: its row keeps it, as text, and no other row is blamed; a table whose whole
    answer column is numeric is read the same way."""
    rows = [_row(0), _row(1), _row(2, answer=16, id=7), _row(3, answer=2.5)]
    dataset, skipped = data.load_questions(str(_write_jsonl(rows, tmp_path / "mixed.jsonl")))
    assert skipped == [] and dataset["answer"] == ["1", "2", "16", "2.5"] and dataset["id"][2] == "7"
    numeric = tmp_path / "numeric.parquet"
    datasets.Dataset.from_list([_row(i, answer=i * 3) for i in range(3)]).to_parquet(str(numeric))
    assert data.load_questions(str(numeric))[0]["answer"] == ["0", "3", "6"]


def test_image_files_must_exist_and_decode(tmp_path):
    Image.new("RGB", (4, 4), "red").save(tmp_path / "red.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    rows = [_row(0, images=["red.png"]), _row(1, images=["missing.png"]), _row(2, images=["broken.png"])]
    path = _write_jsonl(rows, tmp_path / "train.jsonl")
    with pytest.raises(data.DatasetError, match=r"row 1: field 'images' item 0: no such image file .*missing.png"):
        data.load_questions(str(path))
    dataset, skipped = data.load_questions(str(path), skip_invalid=True)
    assert dataset["id"] == ["q0"] and [index for index, _ in skipped] == [1, 2]
    assert "broken.png' is not an image PIL can decode" in skipped[1][1]


def test_undecodable_bytes_are_named_by_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    lines = [json.dumps(_row(i)).encode() for i in range(3)]
    lines[1] = lines[1].replace(b"What", b"Wh\xe9t")  # Latin-1, not UTF-8
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(data.DatasetError, match=rf"{re.escape(str(path))}:2: not UTF-8 \(byte 0xe9 at column \d+\)"):
        data.load_questions(str(path))
    dataset, skipped = data.load_questions(str(path), skip_invalid=True)
    assert dataset["id"] == ["q0", "q2"] and len(skipped) == 1 and f"{path}:2:" in skipped[0][1]


def test_a_dataset_with_no_valid_row_left_is_refused(tmp_path):
    rows = [_row(0, images=["nope.png"]), _row(1, question=" ")]
    path = _write_jsonl(rows, tmp_path / "train.jsonl")
    with pytest.raises(data.DatasetError, match=r"no valid row left: all 2 rows are invalid.*no such image file"):
        data.load_questions(str(path), skip_invalid=True)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(data.DatasetError, match="the dataset has no rows"):
        data.load_questions(str(tmp_path / "empty.jsonl"))
