"""The CPU demo's precision, measured: one forward and backward pass of the demo's student in float32 and under
bf16 autocast (what ``bf16: true`` runs on a CPU), with and without gradient checkpointing.

    python benchmarks/bench_cpu_precision.py [--model .cache/demo/SmolLM2-135M-Instruct] [--rows 4]
        [--tokens 400] [--repeats 3]

The micro-batch is ``--rows`` sequences of ``--tokens`` random token ids (the demo's micro-batch is one group of
4 rollouts; its BCQ/NCQ prompts run to a few hundred tokens), scored with the model's own cross-entropy over
every position. Each setting runs ``--repeats`` times on one process's threads; the fastest run is reported.
Whether autocast pays depends on the CPU: it casts every weight at every matmul, and only a CPU whose bf16
matrix units (AMX) outrun its float32 ones wins that back. ``make demo-env`` materializes the model.

Last line: ``bf16 autocast / float32: <R>x (gradient checkpointing on), <S>x (off)``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]


def update_seconds(model, ids: torch.Tensor, bf16: bool, repeats: int) -> float:
    """The fastest of ``repeats`` forward and backward passes over ``ids``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / ".cache/demo/SmolLM2-135M-Instruct")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not (args.model / "config.json").exists():
        raise SystemExit(f"no model at {args.model}: run `make demo-env` or pass --model")

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.config.use_cache = False
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (args.rows, args.tokens))
    print(f"{args.model.name}: {args.rows} x {args.tokens} tokens, {torch.get_num_threads()} threads", flush=True)
    ratios = {}
    for checkpointing in (True, False):
        if checkpointing:
            model.gradient_checkpointing_enable()
        else:
            model.gradient_checkpointing_disable()
        fp32 = update_seconds(model, ids, bf16=False, repeats=args.repeats)
        bf16 = update_seconds(model, ids, bf16=True, repeats=args.repeats)
        ratios[checkpointing] = bf16 / fp32
        print(
            f"gradient checkpointing {'on ' if checkpointing else 'off'}: float32 {fp32:.2f} s, "
            f"bf16 autocast {bf16:.2f} s",
            flush=True,
        )
    print(f"bf16 autocast / float32: {ratios[True]:.2f}x (gradient checkpointing on), {ratios[False]:.2f}x (off)")


if __name__ == "__main__":
    main()
