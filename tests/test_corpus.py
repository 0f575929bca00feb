"""ZPPO-77K builder on synthetic parquet fixtures shaped like the two real sources."""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from tiny_models import save_tiny_vlm, tiny_processor

from zppo_trl import corpus, data
from zppo_trl.corpus import (
    MMFINEREASON,
    MMFINEREASON_SUBDATASETS,
    TIER_CAPS,
    VERO,
    VERO_SUBDATASETS,
    CorpusConfig,
    PromptTokenCounter,
    build_corpus,
    canonical_name,
)
from zppo_trl.processing import load_processor
from zppo_trl.prompts import compose_prompt

CAPS = {1: 20, 2: 5}  # small caps so a few dozen rows exercise them
ROOT = Path(__file__).resolve().parents[1]


def png(width=120, height=120, color=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, "PNG")
    return buffer.getvalue()


def truncated_png() -> bytes:
    """A PNG whose header parses but whose pixel data is cut in half."""
    noise = Image.frombytes("RGB", (150, 150), random.Random(0).randbytes(150 * 150 * 3))
    buffer = io.BytesIO()
    noise.save(buffer, "PNG")
    return buffer.getvalue()[: len(buffer.getvalue()) // 2]


PNG = png()
TRUNCATED = truncated_png()


def image(raw=PNG):
    return None if raw is None else {"bytes": raw, "path": None}


def write(path: Path, rows: list[dict], schema: pa.Schema) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
VERO_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("image", IMAGE),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
        ("extra_info", pa.struct([("question", pa.string()), ("answer", pa.string()), ("reward_type", pa.string())])),
    ]
)
MMF_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("question", pa.string()),
        ("answer", pa.string()),
        ("original_answer", pa.string()),
        ("qwen3vl_235b_thinking_response", pa.string()),
        ("image", IMAGE),
        ("source", pa.string()),
        ("pass_rate", pa.float64()),
    ]
)


def vero_row(key, question, answer="A", img=PNG, truth=None):
    return {
        "id": key,
        "data_source": "x",
        "prompt": [{"role": "system", "content": "Vero's format instructions"}, {"role": "user", "content": question}],
        "image": image(img),
        "ability": "stem",
        "reward_model": {"style": "rule", "ground_truth": truth if truth is not None else answer},
        "extra_info": {"question": question, "answer": answer, "reward_type": "multiple_choice"},
    }


def mmf_row(key, source, pass_rate=0.0, question=None, answer="5", img=PNG):
    return {
        "id": key,
        "question": f"<image>\n{question or f'mmf {source} question {key}'}",
        "answer": answer,
        "original_answer": f"<think>long trace {key}</think><answer>{answer}</answer>",
        "qwen3vl_235b_thinking_response": "TRACE " * 50,
        "image": image(img),
        "source": source,
        "pass_rate": pass_rate,
    }


def prompt_questions(limit: int) -> tuple[str, str]:
    """Questions whose prompt (with a 120x120 image) is exactly ``limit`` and ``limit + 1`` tokens."""
    count = PromptTokenCounter(tiny_processor())
    img = Image.open(io.BytesIO(PNG))
    base = count("Q", [img])
    found = {}
    for n in range(limit - base - 2, limit - base + 4):
        found.setdefault(count("Q" + " 7" * n, [img]), "Q" + " 7" * n)
    return found[limit], found[limit + 1]


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sources")
    vero, mmf = root / "vero", root / "mmf"

    def vero_file(config, rows, split="train"):
        write(vero / config / f"{split}-00000-of-00001.parquet", rows, VERO_SCHEMA)

    vero_file("stem-ai2d_merged", [vero_row(f"a{i}", f"shared ai2d question {i}") for i in range(6)])
    vero_file("stem-ai2d_merged", [vero_row(f"v{i}", f"val {i}") for i in range(5)], split="val")
    at_limit, over_limit = prompt_questions(4096)
    vero_file(
        "stem-geo170k",
        [
            vero_row("g0", "plain"),
            vero_row("g1", "answer at the limit", answer="x" * 512),
            vero_row("g2", "answer over the limit", answer="x" * 513),
            vero_row("g3", "image side at the limit", img=png(100, 300)),
            vero_row("g4", "image side under the limit", img=png(300, 99)),
            vero_row("g5", "not an image", img=b"definitely not a png"),
            vero_row("g6", "truncated image", img=TRUNCATED),
            vero_row("g7", at_limit),
            vero_row("g8", over_limit),
            vero_row("g9", "no answer anywhere", answer=None, truth=""),
            vero_row("g10", "no image", img=None),
            vero_row("g11", ""),
            vero_row("g12", "<image>"),
            vero_row("g13", "answer only in reward_model", answer=None, truth="7"),
            vero_row("g14", "aspect ratio the processor rejects", img=png(20100, 100)),
        ],
    )
    vero_file("chart_ocr-CoSyn_400k_chart", [vero_row(f"c{i}", f"chart {i}") for i in range(30)])
    vero_file("counting_grounding_search-pixmo", [vero_row(f"p{i}", f"count {i}") for i in range(12)])
    vero_file(
        "counting_grounding_search-tallyqa",
        [vero_row(f"t{i}", f"tally {i}", answer="y" * 600 if i % 2 else "3") for i in range(10)],
    )
    vero_file("captioning_IF-PixMo-Cap", [vero_row(f"cap{i}", "describe") for i in range(4)])
    vero_file("stem-wemath20_pro", [vero_row(f"wp{i}", f"we pro {i}") for i in range(3)])
    vero_file("stem-wemath20_standard", [vero_row(f"ws{i}", f"we std {i}") for i in range(4)])

    rates = [0.0, 0.25, 0.49, 0.5, 0.75, None]
    write(
        mmf / "data" / "train-00000-of-00003.parquet",
        [
            *[mmf_row(i, "FineVision-ai2d_merged", question=f"shared ai2d question {i}") for i in range(4)],
            *[mmf_row(10 + i, "MMR1", pass_rate=r) for i, r in enumerate(rates)],
            *[mmf_row(20 + i, "FineVision-tqa", pass_rate=0.25) for i in range(3)],
            *[mmf_row(30 + i, "GameQA-140K") for i in range(2)],
            *[mmf_row(40 + i, "Euclid30K") for i in range(2)],
        ],
        MMF_SCHEMA,
    )
    write(
        mmf / "data" / "train-00001-of-00003.parquet",
        [
            *[mmf_row(50 + i, "MMK12") for i in range(2)],
            *[mmf_row(60 + i, "FineVision-geo170k(qa)") for i in range(2)],
            *[mmf_row(42 + i, "Euclid30K") for i in range(2)],
        ],
        MMF_SCHEMA,
    )
    (mmf / "data" / "train-00002-of-00003.parquet").write_bytes(b"this is not parquet")
    return vero, mmf


def make_config(sources, out: Path, seed=0, **overrides) -> CorpusConfig:
    vero, mmf = sources
    specs = [dataclasses.replace(VERO, path=str(vero)), dataclasses.replace(MMFINEREASON, path=str(mmf))]
    return CorpusConfig(output_dir=str(out), sources=specs, seed=seed, tier_caps=CAPS, progress=False, **overrides)


def read_output(out: Path) -> pa.Table:
    return pq.read_table(out / "data" / "train-00000-of-00001.parquet")


@pytest.fixture(scope="module")
def built(sources, tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    report = build_corpus(make_config(sources, out), tiny_processor())
    return out, report


def counts(report, source, name):
    (row,) = [c for c in report.subdatasets if (c.source, c.subdataset) == (source, name)]
    return row


def test_recipe_constants_match_the_paper():
    assert len(VERO_SUBDATASETS) == 29
    assert sorted(VERO_SUBDATASETS.values()).count(1) == 14
    assert sorted(MMFINEREASON_SUBDATASETS.values()).count(1) == 12
    assert len(MMFINEREASON_SUBDATASETS) == 17
    assert TIER_CAPS == {1: 2800, 2: 1400}
    assert (corpus.MAX_ANSWER_CHARS, corpus.MIN_IMAGE_SIDE, corpus.MAX_PROMPT_TOKENS) == (512, 100, 4096)
    assert set(VERO_SUBDATASETS) & set(MMFINEREASON_SUBDATASETS) == {
        "ai2d",
        "geo170k",
        "wemath",
        "visualwebinstruct",
        "tqa",
        "raven",
    }
    # A shared name has one tier.
    assert all(VERO_SUBDATASETS[n] == MMFINEREASON_SUBDATASETS[n] for n in ("ai2d", "raven", "tqa"))


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("stem-ai2d_merged", "ai2d"),
        ("FineVision-ai2d_merged", "ai2d"),
        ("chart_ocr-CoSyn_400k_table", "cosyn_table"),
        ("FineVision-geo170k(qa)", "geo170k"),
        ("FineVision-geometry3k(mathv360k)", "geo3k"),
        ("FineVision-visualwebinstruct(filtered)", "visualwebinstruct"),
        ("Euclid30K", "euclid"),
        ("stem-wemath20_standard", "wemath"),
        ("counting_grounding_search-multihop", "multihop"),
        ("LLaVA-CoT", "llava-cot"),
    ],
)
def test_canonical_names(raw, name):
    assert canonical_name(raw) == name


def test_excluded_categories_are_not_listed():
    assert canonical_name("captioning_IF-PixMo-Cap") not in VERO_SUBDATASETS
    assert canonical_name("spatial_action-game_QA") not in VERO_SUBDATASETS
    assert canonical_name("GameQA-140K") not in MMFINEREASON_SUBDATASETS


def test_counts_per_subdataset(built):
    _, report = built
    geo = counts(report, "vero", "geo170k")
    assert (geo.read, geo.invalid, geo.before_cap, geo.after_cap) == (15, 4, 11, 11)
    filters = (geo.answer_too_long, geo.corrupt_image, geo.image_too_small, geo.prompt_too_long)
    assert (*filters, geo.kept) == (1, 3, 1, 1, 5)
    assert geo.reasons == {
        "missing:answer": 1,
        "missing:image": 1,
        "missing:question": 2,
        "corrupt_image:UnidentifiedImageError": 1,
        "corrupt_image:OSError": 1,
        "unprocessable_image:ValueError": 1,
    }
    mmr1 = counts(report, "mmfinereason", "mmr1")  # pass_rate < 0.5 is strict; a missing rate is invalid
    assert (mmr1.read, mmr1.invalid, mmr1.pass_rate, mmr1.before_cap, mmr1.kept) == (6, 1, 2, 3, 3)
    wemath = counts(report, "vero", "wemath")  # both WeMath configs are one sub-dataset
    assert (wemath.read, wemath.kept, wemath.cap) == (7, 7, 20)
    assert wemath.raw_names == {"stem-wemath20_pro": 3, "stem-wemath20_standard": 4}
    assert counts(report, "mmfinereason", "euclid").kept == 4  # spread over two shards
    for row in report.subdatasets:  # the report's identities hold everywhere
        assert row.read - row.duplicate - row.invalid - row.pass_rate == row.before_cap
        assert row.after_cap == min(row.before_cap, row.cap)
        filtered = row.answer_too_long + row.corrupt_image + row.image_too_small + row.prompt_too_long
        assert row.after_cap - filtered == row.kept


def test_caps_apply_before_filters(built):
    _, report = built
    chart, pixmo = counts(report, "vero", "cosyn_chart"), counts(report, "vero", "pixmo")
    assert (chart.before_cap, chart.after_cap, chart.kept) == (30, 20, 20)
    assert (pixmo.tier, pixmo.before_cap, pixmo.after_cap, pixmo.kept) == (2, 12, 5, 5)
    tally = counts(report, "vero", "tallyqa")  # half its rows have 600-character answers
    assert (tally.before_cap, tally.after_cap) == (10, 5)
    assert tally.answer_too_long >= 1 and tally.kept == 5 - tally.answer_too_long


def test_vero_priority_and_fallback(built):
    out, report = built
    table = read_output(out).to_pydict()
    sources = {(s, n) for s, n in zip(table["source"], table["subdataset"])}
    assert ("vero", "ai2d") in sources and ("mmfinereason", "ai2d") not in sources
    assert counts(report, "mmfinereason", "ai2d").duplicate == 4
    assert counts(report, "mmfinereason", "geo170k").duplicate == 2
    assert counts(report, "vero", "ai2d").read == 6  # the val split is never read
    assert counts(report, "mmfinereason", "tqa").kept == 3  # Vero has no tqa: MMFineReason's is used


def test_output_schema_and_content(built):
    out, report = built
    table = read_output(out)
    assert tuple(table.column_names) == data.COLUMNS
    rows = table.to_pylist()
    assert len(rows) == report.totals()["kept"] == sum(c.kept for c in report.subdatasets)
    assert len({row["id"] for row in rows}) == len(rows)
    for index, row in enumerate(rows):
        data.validate_row(row, index)
        assert "<image>" not in row["question"] and "TRACE" not in json.dumps(row, default=str)
    by_id = {row["id"]: row for row in rows}
    assert by_id["vero/geo170k/g13"]["answer"] == "7"
    assert by_id["mmfinereason/mmr1/10"]["question"] == "mmf MMR1 question 10"
    assert set(by_id) >= {"vero/geo170k/g1", "vero/geo170k/g3", "vero/geo170k/g7"}  # at the limits: kept
    assert not set(by_id) & {"vero/geo170k/g2", "vero/geo170k/g4", "vero/geo170k/g8"}  # over them: dropped
    import datasets

    loaded = datasets.load_dataset("parquet", data_files=str(out / "data" / "*.parquet"), split="train")
    assert isinstance(loaded.features["images"].feature, datasets.Image)
    assert loaded[0]["images"][0].size == (120, 120)


def test_report_files_and_drops(built):
    out, report = built
    saved = json.loads((out / "report.json").read_text())
    assert saved["totals"]["kept"] == report.totals()["kept"]
    assert saved["settings"]["seed"] == 0 and saved["settings"]["tier_caps"] == {"1": 20, "2": 5}
    assert saved["excluded"]["vero"] == {"captioning_IF-PixMo-Cap": 4}
    assert saved["excluded"]["mmfinereason"] == {"GameQA-140K": 2, "MMK12": 2}
    assert len(saved["errors"]) == 1 and "train-00002-of-00003" in saved["errors"][0]["where"]
    geo = next(r for r in saved["subdatasets"] if r["subdataset"] == "geo170k" and r["source"] == "vero")
    assert geo["reasons"]["missing:question"] == 2 and geo["raw_names"] == {"stem-geo170k": 15}
    table = (out / "report.txt").read_text()
    assert table == report.format_table() + "\n"
    lines = table.splitlines()
    assert lines[0].split()[:5] == ["source", "subdataset", "tier", "cap", "read"]
    assert any(line.split()[:2] == ["vero", "geo170k"] and line.split()[-1] == "5" for line in lines)
    assert any(line.startswith("total") and line.split()[-1] == str(report.totals()["kept"]) for line in lines)
    assert "captioning_IF-PixMo-Cap (4)" in table


def test_same_seed_same_corpus_other_seed_differs(built, sources, tmp_path):
    out, _ = built
    again = tmp_path / "again"
    build_corpus(make_config(sources, again), tiny_processor())
    assert read_output(again).equals(read_output(out))
    other = tmp_path / "other"
    build_corpus(make_config(sources, other, seed=1), tiny_processor())
    chart = lambda path: {i for i in read_output(path).column("id").to_pylist() if "/cosyn_chart/" in i}  # noqa: E731
    assert len(chart(other)) == len(chart(out)) == 20 and chart(other) != chart(out)


def test_sample_does_not_depend_on_row_order(built, sources, tmp_path):
    out, _ = built
    vero, mmf = sources
    shuffled = tmp_path / "vero"
    for file in vero.rglob("*.parquet"):
        target = shuffled / file.relative_to(vero)
        target.parent.mkdir(parents=True, exist_ok=True)
        table = pq.read_table(file)
        pq.write_table(table.take(list(reversed(range(table.num_rows)))), target)
    build_corpus(make_config((shuffled, mmf), tmp_path / "out"), tiny_processor())
    picked = [
        sorted(i for i in read_output(path).column("id").to_pylist() if "/cosyn_chart/" in i)
        for path in (tmp_path / "out", out)
    ]
    assert picked[0] == picked[1]


def test_prompt_counter_matches_the_processor():
    processor = tiny_processor()
    count = PromptTokenCounter(processor)
    for sizes in ([(120, 120)], [(640, 480)], [(30, 1000), (200, 100)]):
        images = [Image.new("RGB", size) for size in sizes]
        messages = [
            {
                "role": "user",
                "content": [{"type": "image"}] * len(images)
                + [{"type": "text", "text": compose_prompt("What is 2+2?")}],
            }
        ]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert count("What is 2+2?", images) == len(processor(text=[text], images=images)["input_ids"][0])
    assert count("What is 2+2?", [images[0]]) < count("What is 2+2?", images)


def test_validate_row_names_row_and_field():
    row = {"id": "a", "question": "q", "images": [PNG], "answer": "1", "source": "vero", "subdataset": "ai2d"}
    data.validate_row(row, 0)
    with pytest.raises(ValueError, match=r"row 7: missing field 'answer'"):
        data.validate_row({k: v for k, v in row.items() if k != "answer"}, 7)
    with pytest.raises(ValueError, match=r"row 3: field 'images' must be a list"):
        data.validate_row({**row, "images": PNG}, 3)
    with pytest.raises(ValueError, match=r"row x: field 'question' must be a non-empty string"):
        data.validate_row({**row, "question": "  "}, "x")
    with pytest.raises(ValueError, match=r"row 1: field 'images' item 0 is not an image"):
        data.validate_row({**row, "images": [42]}, 1)


def test_hub_path_skips_unlisted_configs(sources, tmp_path, monkeypatch):
    import datasets

    vero, _ = sources
    real_load = datasets.load_dataset
    loaded = []

    def fake_load(path, name=None, split=None, streaming=False):
        loaded.append(name)
        assert (path, split, streaming) == ("zlab-princeton/Vero-600k", "train", True)
        return real_load("parquet", data_files=str(vero / name / "train-*.parquet"), split="train", streaming=True)

    monkeypatch.setattr(datasets, "get_dataset_config_names", lambda path: sorted(p.name for p in vero.iterdir()))
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    config = CorpusConfig(output_dir=str(tmp_path), sources=[VERO], tier_caps=CAPS, progress=False)
    report = build_corpus(config, tiny_processor())
    assert "captioning_IF-PixMo-Cap" not in loaded and report.skipped_configs == {"vero": ["captioning_IF-PixMo-Cap"]}
    assert counts(report, "vero", "geo170k").kept == 5 and counts(report, "vero", "cosyn_chart").after_cap == 20


def test_cli_builds_and_pushes(sources, tmp_path, monkeypatch):
    vero, mmf = sources
    model = save_tiny_vlm(tmp_path / "student")
    library = tmp_path / "library"
    build_corpus(make_config(sources, library), load_processor(str(model)))
    spec = importlib.util.spec_from_file_location("build_corpus_cli", ROOT / "recipes" / "build_corpus.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    pushed = []
    monkeypatch.setattr(corpus, "push_corpus_to_hub", lambda path, repo, private: pushed.append((str(path), repo)))
    target = tmp_path / "cli"
    cli.main(
        [
            "--vero",
            str(vero),
            "--mmfinereason",
            str(mmf),
            "--output_dir",
            str(target),
            "--processor",
            str(model),
            "--tier1_cap",
            "20",
            "--tier2_cap",
            "5",
            "--no_progress",
            "--push_to_hub",
            "me/zppo-77k",
        ]
    )
    assert read_output(target).equals(read_output(library))
    assert (target / "report.txt").read_text() == (library / "report.txt").read_text()
    assert pushed == [(str(target), "me/zppo-77k")]
