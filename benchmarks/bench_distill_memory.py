"""Peak memory of one distillation loss step (forward and backward) against the completion length, on CPU.

    .venv/bin/python benchmarks/bench_distill_memory.py [--lengths 1024 4096] [--vocab 49152] [--top-k 20]

A small Llama-style student (2 layers, hidden 64) with a real vocabulary size (SmolLM2's 49,152 by default),
so that the LM head's ``[tokens, vocab]`` logits dominate as they do at the paper's scale (Qwen3.5: about 248k
tokens, 12,288-token completions). Each configuration runs in a fresh process and reports that process's peak
resident memory (``ru_maxrss``) above its baseline after building the model and inputs:

- ``chunked, server top-k``: the distillation rows' default (``zppo_trl.distill.chunked_jsd`` on the student's
  last hidden states, the teacher's top-k log-probs as the server sends them);
- ``unchunked, full logits``: what the rows did before, the student's completion logits materialised at full
  length with a full-vocabulary fp32 log-softmax, against a teacher's full logits (GKD's JSD).

The chunked peak should stay flat as the completion length grows; the unchunked one grows with it.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys


def one(mode: str, length: int, vocab: int, top_k: int, chunk: int) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from zppo_trl.distill import DistillInputs, TeacherTopK, chunked_jsd, completion_states

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, max_position_embeddings=length + 64, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config).train()
    prompt = torch.randint(0, vocab, (1, 32))
    completion = torch.randint(0, vocab, (1, length))
    inputs = dict(
        prompt_ids=prompt,
        prompt_mask=torch.ones_like(prompt),
        completion_ids=completion,
        completion_mask=torch.ones_like(completion),
    )
    topk = TeacherTopK(
        torch.randint(0, vocab, (1, length, top_k)), torch.log_softmax(torch.randn(1, length, top_k), -1) - 1.0
    )
    teacher_logits = torch.randn(1, length, vocab) if mode == "unchunked" else None
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if mode == "chunked":
        states, head = completion_states(model, inputs, vocab)
        loss = chunked_jsd(DistillInputs(states, head, vocab, topk=topk), inputs["completion_mask"], 0.5, chunk)
    else:
        from zppo_trl.distill import generalized_jsd_per_token

        ids = torch.cat([prompt, completion], dim=1)
        logits = model(input_ids=ids, logits_to_keep=length + 1).logits[:, :-1]
        student = torch.log_softmax(logits.float(), -1)
        loss = generalized_jsd_per_token(student, torch.log_softmax(teacher_logits, -1), 0.5).sum()
    loss.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mode": mode, "length": length, "peak_above_baseline_gb": (peak - base) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        mode, length = args.one.split(":")
        print(json.dumps(one(mode, int(length), args.vocab, args.top_k, args.chunk)))
        return
    print(f"vocabulary {args.vocab}, top-k {args.top_k}, chunk {args.chunk} tokens; peak RSS above baseline (GB)")
    for mode in ("chunked", "unchunked"):
        for length in args.lengths:
            out = subprocess.run(
                [sys.executable, __file__, "--one", f"{mode}:{length}", "--vocab", str(args.vocab),
                 "--top-k", str(args.top_k), "--chunk", str(args.chunk)],
                capture_output=True, text=True,
            )  # fmt: skip
            label = "chunked, server top-k" if mode == "chunked" else "unchunked, full logits"
            if out.returncode:
                print(f"{label:24s} {length:6d} tokens: failed (exit {out.returncode}; -9: killed, out of memory)")
                continue
            result = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{label:24s} {length:6d} tokens: {result['peak_above_baseline_gb']:.2f} GB")


if __name__ == "__main__":
    main()
