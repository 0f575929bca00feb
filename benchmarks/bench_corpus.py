"""Peak memory and throughput of the ZPPO-77K builder on a synthetic source.

    .venv/bin/python benchmarks/bench_corpus.py            # 100k rows, target peak RSS <= 2 GiB

Writes a MMFineReason-shaped source (every listed sub-dataset, ``pass_rate`` 0.25, a 2 KB
reasoning trace per row, small PNG images) in bounded chunks, then builds the corpus with
the paper's caps in a child process, so the peak RSS reported is the build's alone. The
student processor is the tiny offline Qwen3-VL-style processor of the tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import multiprocessing
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from zppo_trl import corpus  # noqa: E402

SOURCE_NAMES = {  # canonical name -> a raw MMFineReason source value
    "mmr1": "MMR1",
    "euclid": "Euclid30K",
    "geo170k": "FineVision-geo170k(qa)",
    "geo3k": "FineVision-geometry3k(mathv360k)",
    "mm-openr1": "mm-openr1",
    "wemath": "WeMath",
    "visualwebinstruct": "FineVision-visualwebinstruct(filtered)",
    "bmmr": "BMMR",
    "tqa": "FineVision-tqa",
    "ai2d": "FineVision-ai2d_merged",
    "scienceqa": "FineVision-scienceqa",
    "virl39k": "ViRL39K",
    "raven": "FineVision-raven",
    "visualsphinx": "VisualSphinx",
    "puzzleqa": "PuzzleQA",
    "llava-cot": "LLaVA-CoT",
    "zebra-cot": "Zebra-CoT",
}


def small_images(count: int, rng: random.Random) -> list[bytes]:
    from PIL import Image, ImageDraw

    images = []
    for _ in range(count):
        image = Image.new("RGB", (rng.randint(96, 320), rng.randint(96, 320)), (255, 255, 255))
        draw = ImageDraw.Draw(image)
        for _ in range(8):
            x, y = rng.randint(0, image.width), rng.randint(0, image.height)
            draw.rectangle([x, y, x + rng.randint(5, 60), y + rng.randint(5, 60)], fill=tuple(rng.randbytes(3)))
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        images.append(buffer.getvalue())
    return images


def write_source(directory: Path, rows: int, seed: int = 0, chunk: int = 5000) -> int:
    """A MMFineReason-shaped parquet source of ``rows`` rows; returns its size in bytes."""
    rng = random.Random(seed)
    images = small_images(256, rng)
    raws = list(SOURCE_NAMES.values())
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("question", pa.string()),
            ("answer", pa.string()),
            ("qwen3vl_235b_thinking_response", pa.string()),
            ("image", image_type),
            ("source", pa.string()),
            ("pass_rate", pa.float64()),
        ]
    )
    trace = "step " * 400
    (directory / "data").mkdir(parents=True, exist_ok=True)
    files = -(-rows // chunk)
    for index in range(files):
        start, stop = index * chunk, min(rows, (index + 1) * chunk)
        batch = [
            {
                "id": i,
                "question": "<image>\n" + f"Question {i}: what is the area of the shaded region? " * rng.randint(1, 6),
                "answer": str(rng.randint(0, 999)),
                "qwen3vl_235b_thinking_response": f"{i} {trace}",
                "image": {"bytes": images[i % len(images)], "path": None},
                "source": raws[i % len(raws)],
                "pass_rate": 0.25,
            }
            for i in range(start, stop)
        ]
        # Like the Hub's image parquet: every row stores its own bytes (no dictionary sharing).
        target = directory / "data" / f"train-{index:05d}-of-{files:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(batch, schema=schema), target, use_dictionary=False, compression="none")
    return sum(f.stat().st_size for f in (directory / "data").iterdir())


def _build(source: str, output: str, queue) -> None:
    from tiny_models import tiny_processor

    spec = dataclasses.replace(corpus.MMFINEREASON, path=source)
    start = time.perf_counter()
    config = corpus.CorpusConfig(output_dir=output, sources=[spec], progress=False)
    report = corpus.build_corpus(config, tiny_processor())
    queue.put({"seconds": time.perf_counter() - start, "totals": report.totals()})


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--workdir", help="where to write the source and the corpus (default: a temporary directory)")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-corpus-"))
    try:
        source_bytes = write_source(workdir / "source", args.rows)
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        child = context.Process(target=_build, args=(str(workdir / "source"), str(workdir / "corpus"), queue))
        child.start()
        result = queue.get()
        child.join()
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: KiB
        totals = result["totals"]
        numbers = {
            "source_rows": totals["read"],
            "source_mib": round(source_bytes / 2**20, 1),
            "rows_after_cap": totals["after_cap"],
            "rows_kept": totals["kept"],
            "seconds": round(result["seconds"], 1),
            "rows_per_second": round(totals["read"] / result["seconds"]),
            "peak_rss_mib": round(peak / 2**20),
            "peak_rss_target_mib": 2048,
        }
        print(json.dumps(numbers, indent=2))
        return numbers
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
