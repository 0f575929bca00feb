"""Memory at the paper's scale, measured on this machine: (a) the fused LM head against the full logits, one
optimizer update at growing completion lengths with Qwen3.5's vocabulary, next to the dry run's memory plan.

    python benchmarks/bench_memory.py [--part lmhead] [--lengths 1024 4096 8192] [--workdir /tmp/zppo-bench-memory]

Each update runs in a fresh process (so that its peak resident memory, ``ru_maxrss``, is its own) and is
reported above that process's memory before the model was built. An update whose planned memory exceeds what
this machine has free is not run; its line says so and gives the plan's figure. The plan
(:mod:`zppo_trl.memory_plan`, ``layout="single"``: one float32 process) is also checked on a model whose
activations, not its LM head, dominate, with and without gradient checkpointing.

Last line: ``fused LM-head: peak <X> GB at <N> tokens (unfused <Y> GB)``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

# ---------------------------------------------------------------- (a) the LM head: fused vs unfused

PROMPT_TOKENS = 64
QWEN35_VOCAB = 248_320  # Qwen3.5's vocabulary (zppo_trl.memory_plan.KNOWN_STUDENTS)
GB = 2**30


def _rss_gb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) * 1024 / GB


def _available_gb() -> float:
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:")) * 1024 / GB


def _update_model(dims: dict):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=dims["vocab"], hidden_size=dims["hidden"], intermediate_size=2 * dims["hidden"],
        num_hidden_layers=dims["layers"], num_attention_heads=max(1, dims["hidden"] // 64), num_key_value_heads=1,
        head_dim=64, max_position_embeddings=dims["tokens"] + PROMPT_TOKENS, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen3ForCausalLM(config)


def one_update(dims: dict) -> dict:
    """One optimizer update (the trainer's own loss, backward, AdamW step) of a one-sequence micro-batch, in
    float32 on this CPU; the process's peak RSS above its RSS before the model was built, and the plan's
    estimate of the same update (zppo_trl.memory_plan, ``layout="single"``)."""
    import resource

    import torch
    from datasets import Dataset
    from tiny_models import tiny_tokenizer

    from zppo_trl import ZPPOConfig, ZPPOTrainer
    from zppo_trl.memory_plan import UpdateShape, architecture, plan_memory

    torch.manual_seed(0)
    tokenizer = tiny_tokenizer()
    base = _rss_gb()
    model = _update_model(dims)
    tokens = dims["tokens"]
    args = ZPPOConfig(
        output_dir=dims["workdir"], use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=2,
        num_generations=2, max_completion_length=tokens, augmentations=[], replay_fraction=0.0,
        fused_lm_head=dims["fused"], gradient_checkpointing=dims["checkpointing"], save_strategy="no",
    )  # fmt: skip
    question = dict(id="q", question="q", images=[], answer="1", source="s", subdataset="s")
    trainer = ZPPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list([question]),
        processing_class=tokenizer,
    )
    trainer.model.train()
    if dims["checkpointing"]:  # what Trainer.train() does before its first step
        trainer.model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=args.gradient_checkpointing_kwargs
        )
    trainer.current_gradient_accumulation_steps = 1
    optimizer = trainer.create_optimizer()
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, dims["vocab"], (1, PROMPT_TOKENS), generator=g)
    completion = torch.randint(10, dims["vocab"], (1, tokens), generator=g)
    inputs = dict(
        prompt_ids=prompt,
        prompt_mask=torch.ones_like(prompt),
        completion_ids=completion,
        completion_mask=torch.ones_like(completion),
        advantages=torch.ones(1),
        num_items_in_batch=torch.tensor(tokens),
    )
    trainer._compute_loss(trainer.model, inputs).backward()  # ratio 1: the first update of a rollout step
    optimizer.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB
    plan = plan_memory(
        architecture(model.config),
        UpdateShape(1, PROMPT_TOKENS + tokens, tokens),
        layout="single",
        gradient_checkpointing=dims["checkpointing"],
        fused_head=dims["fused"],
    )
    hidden_states = (dims["layers"] + 1) * (PROMPT_TOKENS + tokens) * dims["hidden"] * 4 / GB
    return dict(measured=peak - base, planned=plan.total() / GB, hidden_states=hidden_states)


def _measure(dims: dict) -> dict | None:
    """``one_update`` in a fresh process (so that its peak is its own), or None when it failed."""
    out = subprocess.run([sys.executable, __file__, "--one-update", json.dumps(dims)], capture_output=True, text=True)
    if out.returncode:
        print(f"    (failed, exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]})")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def _planned_gb(dims: dict) -> float:
    import torch

    from zppo_trl.memory_plan import UpdateShape, architecture, plan_memory

    with torch.device("meta"):
        model = _update_model(dims)
    plan = plan_memory(
        architecture(model.config), UpdateShape(1, PROMPT_TOKENS + dims["tokens"], dims["tokens"]),
        layout="single", gradient_checkpointing=dims["checkpointing"], fused_head=dims["fused"],
    )  # fmt: skip
    return plan.total() / GB


def lm_head_part(lengths: list[int], workdir: Path) -> str:
    """Part (a): the peak memory of one update at each completion length, fused and unfused, measured where this
    machine's free memory allows (else the plan's figure, marked), next to the plan; then the plan checked on a
    model whose activations, not its LM head, dominate. Returns the part's last line."""
    print(
        f"(a) one optimizer update, one sequence of {PROMPT_TOKENS} prompt + N completion tokens, a 2-layer model "
        f"(hidden 64) with Qwen3.5's {QWEN35_VOCAB:,}-token vocabulary, float32, gradient checkpointing; peak RSS "
        "above the process's baseline, and the memory plan's estimate (GB):"
    )
    print(f"  {'tokens':>6}  {'fused':>16}  {'unfused':>16}  hidden states")
    results = {}
    for tokens in lengths:
        row = []
        for fused in (True, False):
            dims = dict(
                tokens=tokens, fused=fused, hidden=64, layers=2, vocab=QWEN35_VOCAB, checkpointing=True,
                workdir=str(workdir / "update"),
            )  # fmt: skip
            planned = _planned_gb(dims)
            if planned + 1.5 > _available_gb():
                result = dict(measured=None, planned=planned, hidden_states=None)
            else:
                result = _measure(dims) or dict(measured=None, planned=planned, hidden_states=None)
            results[tokens, fused] = result
            measured = "not run" if result["measured"] is None else f"{result['measured']:.2f}"
            row.append(f"{measured:>7} / {result['planned']:6.2f}")
        states = results[tokens, True]["hidden_states"]
        print(f"  {tokens:6d}  {row[0]:>16}  {row[1]:>16}  {'' if states is None else f'{states * 1024:.0f} MB'}")
    skipped = [f"{t:,}" for (t, fused), r in results.items() if r["measured"] is None]
    if skipped:
        print(
            f"  not run: the unfused update at {', '.join(skipped)} tokens needs more than this machine's "
            f"{_available_gb():.1f} GB of free memory; its figure below is the plan's"
        )
    last = max(lengths)
    fused, unfused = results[last, True], results[last, False]
    if len(lengths) > 1:
        before = max(t for t in lengths if t < last)
        if fused["measured"] is not None and results[before, True]["measured"] is not None:
            growth = (fused["measured"] - results[before, True]["measured"]) * 1024
            states = (fused["hidden_states"] - results[before, True]["hidden_states"]) * 1024
            print(
                f"  fused growth from {before:,} to {last:,} tokens: {growth:.0f} MB (hidden states: {states:.0f} MB)"
            )
    print(
        "  the plan checked where activations dominate (hidden 512, 4 layers, 8,192-token vocabulary, 4,096 tokens):"
    )
    for checkpointing in (True, False):
        dims = dict(
            tokens=4096, fused=True, hidden=512, layers=4, vocab=8192, checkpointing=checkpointing,
            workdir=str(workdir / "update"),
        )  # fmt: skip
        result = _measure(dims)
        if result:
            label = "with" if checkpointing else "without"
            print(
                f"    {label:7s} gradient checkpointing: measured {result['measured']:.2f}, "
                f"planned {result['planned']:.2f}"
            )
    fused_text = "not run" if fused["measured"] is None else f"{fused['measured']:.2f} GB"
    unfused_text = (
        f"{unfused['planned']:.2f} GB planned" if unfused["measured"] is None else f"{unfused['measured']:.2f} GB"
    )
    return f"fused LM-head: peak {fused_text} at {last} tokens (unfused {unfused_text})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["lmhead"], default="lmhead")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/zppo-bench-memory"))
    parser.add_argument("--one-update", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_update:
        print(json.dumps(one_update(json.loads(args.one_update))))
        return
    print(lm_head_part(args.lengths, args.workdir))


if __name__ == "__main__":
    main()
