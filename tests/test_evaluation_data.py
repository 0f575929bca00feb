"""zppo_trl.evaluation.data.load_setting on local fixtures of all 31 settings (tests/eval_fixtures.py).

The fixtures are written in each benchmark's upstream schema, so these tests also check that the
loader's output is what the scorers and judges read: a response built from each row's gold
scores 1 on the setting's deterministic path, and every benchmark judge prompt renders.
"""

from __future__ import annotations

import logging
import shutil
import sys
from pathlib import Path

import datasets
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # eval_fixtures, however pytest imports this file
from eval_fixtures import CONFIGS, OCR_TYPES, expected_rows, fixture_dirs, write_fixture, write_suite

from zppo_trl.evaluation.data import load_setting, spec_columns
from zppo_trl.evaluation.judges import render_bench_judge
from zppo_trl.evaluation.scorers import PRESENTED_OPTIONS, score_deterministic
from zppo_trl.evaluation.tasks import SUITE

# No fixture setting may need more: the OCR rows cycle through OCR_TYPES.
ROWS = 3


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> dict[str, Path]:
    return write_suite(tmp_path_factory.mktemp("suite"), rows=ROWS)


@pytest.fixture(scope="module")
def loaded(suite) -> dict[str, list[dict]]:
    """Each setting's rows, loaded once for the module (lazily, by `_rows`)."""
    return {}


def _rows(name: str, suite, loaded) -> list[dict]:
    if name not in loaded:
        loaded[name] = load_setting(name, suite[name], **fixture_dirs(suite[name]))
    return loaded[name]


def _is_image(value) -> bool:
    """An image left encoded by the loader that decodes in full (media.load_image)."""
    from zppo_trl.evaluation.media import load_image

    return value is not None and load_image(value, "test").size == (32, 32)


# ---------------------------------------------------------------------- every setting


@pytest.mark.parametrize("name", list(SUITE))
def test_every_setting_loads_its_named_fields(name, suite, loaded):
    spec = SUITE[name]
    rows = _rows(name, suite, loaded)
    assert len(rows) == expected_rows(name, ROWS)
    required, any_images = spec_columns(spec)
    for row in rows:
        missing = [column for column in [*required, *any_images] if column not in row]
        assert not missing, f"{name}: row {row['_id']} lacks {missing}"
        prefix = f"{row['_config']}/{row['_split']}/" if spec.subset is not None else f"{row['_split']}/"
        assert row["_id"].startswith(prefix) and row["_id"][len(prefix) :].isdigit()
        assert "#" not in row["_id"]  # the runner's item keys split on it
    assert len({row["_id"] for row in rows}) == len(rows)
    if spec.video_field is not None:
        assert all(row["_video_path"] and Path(row["_video_path"]).is_file() for row in rows)
    if spec.subtitles:
        assert all(row["_subtitle_path"] and Path(row["_subtitle_path"]).read_text().startswith("1\n") for row in rows)


@pytest.mark.parametrize(
    "name", [name for name, spec in SUITE.items() if isinstance(spec.image_field, str) and name != "HLE"]
)
def test_image_columns_come_back_as_pil_images(name, suite, loaded):
    rows = _rows(name, suite, loaded)
    column = SUITE[name].image_field
    if name == "VMMMU":  # upstream keeps an image column that is empty on these rows
        assert all(row[column] is None for row in rows)
        return
    assert all(_is_image(row[column]) for row in rows), name


def test_hle_data_uri_images_are_readable_and_empty_ones_are_none(suite, loaded):
    rows = _rows("HLE", suite, loaded)
    assert _is_image(rows[0]["image"])
    assert rows[1]["image"] is None  # upstream's "" on a text-only row


def test_mmmu_pro_configs_fill_the_columns_they_lack_by_design(suite, loaded):
    rows = _rows("MMMU-Pro", suite, loaded)
    assert [row["_config"] for row in rows[::ROWS]] == ["standard (4 options)", "standard (10 options)", "vision"]
    vision = [row for row in rows if row["_config"] == "vision"]
    standard = [row for row in rows if row["_config"] != "vision"]
    assert all(row["question"] is None and _is_image(row["image"]) and row["image_1"] is None for row in vision)
    assert all(
        isinstance(row["question"], str) and _is_image(row["image_1"]) and row["image"] is None for row in standard
    )


def _correct_response(name: str, row: dict) -> str:
    """A response that must score 1: the row's gold in a box."""
    if name in ("OCR-EN", "OCR-ZH"):
        answers = row["answers"]
        if row["type"] == "text grounding en":
            return "\\boxed{(" + ", ".join(answers) + ")}"
        return "\\boxed{" + answers[0] + "}"
    if name == "InfoVQA":
        return "\\boxed{" + row["answers"][0] + "}"
    return "\\boxed{" + score_deterministic(name, None, row).gold + "}"


@pytest.mark.parametrize("name", [name for name, spec in SUITE.items() if spec.scoring != "benchjudge"])
def test_the_gold_of_every_fixture_row_scores_one(name, suite, loaded):
    for row in _rows(name, suite, loaded):
        row = dict(row)
        if name == "GPQA-D":  # the harness shuffles the options at prompt time; here they keep column order
            row[PRESENTED_OPTIONS] = [row[column] for column in SUITE[name].options_field]
        verdict = score_deterministic(name, _correct_response(name, row), row)
        assert verdict.score == 1.0, (name, row["_id"], verdict)
        wrong = score_deterministic(name, "\\boxed{zzz}", row)
        assert wrong.score == 0.0, (name, row["_id"], wrong)


@pytest.mark.parametrize("name", [name for name, spec in SUITE.items() if spec.scoring == "benchjudge"])
def test_every_benchmark_judge_prompt_renders_from_fixture_rows(name, suite, loaded):
    spec = SUITE[name]
    for row in _rows(name, suite, loaded):
        if name == "CharXiv":  # one reasoning and four descriptive questions per row, each with its gold
            parts = {"reasoning": row["reasoning_a"], **{k: row[f"descriptive_a{k}"] for k in range(1, 5)}}
        elif name == "MultiCh":  # the judge sees the criterion, not a gold answer
            parts = {None: row["target_question"]}
        else:
            parts = {None: str(row[spec.answer_field]).split("<")[0]}  # MM-Vet's <OR> gets spaced out
        for part, expected in parts.items():
            prompt = render_bench_judge(name, row, "my answer", part)
            assert "my answer" in prompt and expected in prompt, (name, row["_id"], part)


# ---------------------------------------------------------------------- concatenation, filters, ids


def test_row_filter_splits_ocrbench_into_english_and_chinese(suite, loaded):
    english, chinese = _rows("OCR-EN", suite, loaded), _rows("OCR-ZH", suite, loaded)
    assert english and all(row["type"].endswith(" en") for row in english)
    assert chinese and all(row["type"].endswith(" cn") for row in chinese)
    # _id indexes the file before filtering: the two filters split one table without overlap
    indices = sorted(int(row["_id"].rsplit("/", 1)[1]) for row in english + chinese)
    assert indices == list(range(2 * ROWS))
    assert {row["type"] for row in english} <= {kind for kind, _, _ in OCR_TYPES["en"]}


def test_all_configs_concatenates_every_config_folder_in_sorted_order(suite, loaded):
    rows = _rows("CEval", suite, loaded)
    assert [row["_config"] for row in rows] == [config for config in CONFIGS["CEval"] for _ in range(ROWS)]
    # videos/ next to MVBench's config folders holds no split file, so it is not a config
    assert {row["_config"] for row in _rows("MVBench", suite, loaded)} == set(CONFIGS["MVBench"])


def test_dynamath_concatenates_its_ten_variant_splits(suite, loaded):
    rows = _rows("DynaM", suite, loaded)
    assert [row["_split"] for row in rows[::ROWS]] == [f"sample_variant{i}" for i in range(1, 11)]
    assert sorted({row["id"] for row in rows}) == [str(i) for i in range(1, ROWS + 1)]


def test_ids_are_stable_across_loads(suite, loaded):
    again = load_setting("AIME25", suite["AIME25"])
    assert [row["_id"] for row in again] == [row["_id"] for row in _rows("AIME25", suite, loaded)]
    assert again[0]["_id"] == "AIME2025-I/test/0" and again[-1]["_id"] == f"AIME2025-II/test/{ROWS - 1}"


# ---------------------------------------------------------------------- max_samples


def test_max_samples_takes_the_first_rows_across_configs(suite, loaded):
    rows = load_setting("CEval", suite["CEval"], max_samples=ROWS + 1)
    assert [row["_id"] for row in rows] == [row["_id"] for row in _rows("CEval", suite, loaded)[: ROWS + 1]]
    assert rows[-1]["_config"] == CONFIGS["CEval"][1]


def test_max_samples_applies_after_the_row_filter(suite):
    rows = load_setting("OCR-ZH", suite["OCR-ZH"], max_samples=2)
    assert [row["_id"] for row in rows] == ["test/1", "test/3"]


def test_max_samples_keeps_whole_dynamath_groups(suite):
    rows = load_setting("DynaM", suite["DynaM"], max_samples=2)
    assert len(rows) == 2 * 10
    groups = {}
    for row in rows:
        groups.setdefault(row["id"], set()).add(row["_split"])
    assert set(groups) == {"1", "2"}
    assert all(len(splits) == 10 for splits in groups.values())


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_max_samples_must_be_a_positive_integer(bad, suite):
    with pytest.raises(ValueError, match="AI2D: max_samples"):
        load_setting("AI2D", suite["AI2D"], max_samples=bad)


# ---------------------------------------------------------------------- errors


def _drop_column(path: Path, column: str) -> None:
    table = datasets.Dataset.from_parquet(str(path)).remove_columns(column)
    path.unlink()
    table.to_parquet(str(path))


def test_a_missing_column_names_the_setting_the_column_and_the_file(tmp_path):
    root = write_fixture("CEval", tmp_path, rows=2)
    bad = root / CONFIGS["CEval"][1] / "val.parquet"
    _drop_column(bad, "C")
    with pytest.raises(ValueError, match=r"CEval: column 'C' is missing from .*high_school_physics/val\.parquet"):
        load_setting("CEval", root)


def test_a_missing_extra_field_is_an_error_too(tmp_path):
    root = write_fixture("DynaM", tmp_path, rows=1)
    _drop_column(root / "sample_variant7.parquet", "answer_type")
    with pytest.raises(ValueError, match=r"DynaM: column 'answer_type' is missing from .*sample_variant7\.parquet"):
        load_setting("DynaM", root)


def test_mmmu_pro_needs_one_of_its_image_columns(tmp_path):
    root = write_fixture("MMMU-Pro", tmp_path, rows=1)
    _drop_column(root / "vision" / "test.parquet", "image")
    with pytest.raises(ValueError, match=r"MMMU-Pro: none of the image columns .* is in .*vision/test\.parquet"):
        load_setting("MMMU-Pro", root)


def test_missing_local_sources_are_clear_errors(tmp_path, suite):
    with pytest.raises(FileNotFoundError, match="AI2D: data source .*nope.* does not exist"):
        load_setting("AI2D", tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_setting("AI2D", "data/ai2d.parquet")  # path-like, not an org/name Hub id
    with pytest.raises(ValueError, match="is a file; expected a folder"):
        load_setting("AI2D", suite["AI2D"] / "test.parquet")
    with pytest.raises(
        FileNotFoundError, match=r"AI2D: no data file for config None, split 'test': expected .*test\.parquet"
    ):
        load_setting("AI2D", tmp_path)  # exists, but holds no split file
    with pytest.raises(FileNotFoundError, match="CEval: .* has no config folder holding val"):
        load_setting("CEval", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"AIME25: no data file for config 'AIME2025-I'"):
        load_setting("AIME25", suite["CEval"])
    with pytest.raises(ValueError, match="unknown setting 'AI3D'"):
        load_setting("AI3D", suite["AI2D"])


def test_hub_ids_go_through_datasets_load_dataset(monkeypatch, suite):
    """The Hub branch, with `datasets` answering from the fixture (the Hub is not reachable here)."""
    real_load = datasets.load_dataset
    calls = []

    def fake_load(path, name=None, split=None, **kwargs):
        if path in ("parquet", "json"):
            return real_load(path, name=name, split=split, **kwargs)
        calls.append((path, name, split))
        return real_load("parquet", data_files=str(suite["CEval"] / name / f"{split}.parquet"), split="train")

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.setattr(
        datasets, "get_dataset_config_names", lambda path, **kwargs: ["high_school_physics", "computer_network"]
    )
    rows = load_setting("CEval", max_samples=ROWS + 1)
    assert calls == [
        ("ceval/ceval-exam", "high_school_physics", "val"),
        ("ceval/ceval-exam", "computer_network", "val"),
    ]
    assert [row["_id"] for row in rows] == [f"high_school_physics/val/{i}" for i in range(ROWS)] + [
        "computer_network/val/0"
    ]
    calls.clear()
    load_setting("CEval", "someone/ceval-mirror")
    assert {path for path, _, _ in calls} == {"someone/ceval-mirror"}


# ---------------------------------------------------------------------- video and subtitles


def test_a_video_row_gets_a_readable_mp4(suite, loaded):
    import av

    for name in ("VMME", "MVBench", "MMVU", "VMMMU"):
        path = _rows(name, suite, loaded)[0]["_video_path"]
        with av.open(path) as container:
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
        assert len(frames) == 8 and frames[0].shape == (64, 64, 3), name


def test_a_missing_video_is_none_with_one_warning(tmp_path, caplog):
    root = write_fixture("VMME-S", tmp_path, rows=3)
    dirs = fixture_dirs(root)
    (dirs["video_dir"] / "vid00001.mp4").unlink()
    (dirs["subtitle_dir"] / "vid00002.srt").unlink()
    with caplog.at_level(logging.WARNING, logger="zppo_trl.evaluation.data"):
        rows = load_setting("VMME-S", root, **dirs)
    assert [row["_video_path"] is None for row in rows] == [False, True, False]
    assert [row["_subtitle_path"] is None for row in rows] == [False, False, True]
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "VMME-S: 1 of 3 rows have no video file" in warnings[0]
    assert "VMME-S: 1 of 3 rows have no subtitle file" in warnings[1]


def test_without_a_video_dir_every_video_is_missing(tmp_path, caplog):
    root = write_fixture("MVBench", tmp_path, rows=1)
    shutil.rmtree(fixture_dirs(root)["video_dir"])
    with caplog.at_level(logging.WARNING, logger="zppo_trl.evaluation.data"):
        rows = load_setting("MVBench", root)
    assert [row["_video_path"] for row in rows] == [None, None]
    assert "2 of 2 rows have no video file (no video_dir given)" in caplog.text
