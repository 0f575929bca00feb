"""Memory, measured on this machine: (a) the fused LM head against the full logits, one optimizer update at
growing completion lengths with Qwen3.5's vocabulary, next to the dry run's memory plan; (b) the CPU demo's
trainer, its resident memory at every rollout step of a run of the demo's settings; (c) padding-free training,
padded against packed tokens of every micro-batch of a real run.

    python benchmarks/bench_memory.py [--part lmhead|rss|padding|all] [--lengths 1024 4096 8192] [--steps 10]
        [--teacher vllm|transformers] [--model DIR] [--num-generations G] [--workdir /tmp/zppo-bench-memory]
        [--padding-steps 4] [--padding-teacher none|vllm|transformers] [--padding-completion N]
        [--padding-record FILE]

(a) Each update runs in a fresh process (so that its peak resident memory, ``ru_maxrss``, is its own) and is
reported above that process's memory before the model was built. An update whose planned memory exceeds what
this machine has free is not run; its line says so and gives the plan's figure. The plan
(:mod:`zppo_trl.memory_plan`, ``layout="single"``: one float32 process) is also checked on a model whose
activations, not its LM head, dominate, with and without gradient checkpointing.

(b) Starts the demo's teacher server (vLLM's CPU engine as ``make demo`` serves it, or ``transformers serve``),
trains with ``recipes/demo.yaml`` and its model (``make demo-env`` materializes it in .cache/demo) for
``--steps`` rollout steps in a process of its own (``recipes/zppo.py``'s own training function), stops the
server, and prints that process's resident memory (RSS) after loading and at the end of every rollout step,
with the peak within each step (the kernel's high-water mark, reset at every step).

(c) No run records its rows' lengths, so this part makes a run: the demo's recipe and model with
``padding_free: true`` for ``--padding-steps`` rollout steps (``recipes/zppo.py``'s own training function, in a
process of its own), as GRPO† (no teacher; ``--padding-teacher`` serves the demo's teacher and runs its ZPPO row,
whose BCQ/NCQ prompts are longer than its plain ones), its completions as the student samples them up to the
recipe's ``max_completion_length`` (``--padding-completion`` to change it). Every loss micro-batch is recorded as
the trainer hands it to the loss: its rows' prompt and completion token counts (its masks) and its padded grid
(rows x columns), and the length of the packed row the trainer ran it as. The table gives per micro-batch the
padded tokens (what ``padding_free: false`` runs), the packed tokens and the share of the padded tokens avoided;
the record is kept (``padding.jsonl``) and ``--padding-record FILE`` reports one again without a run.

Last lines: ``fused LM-head: peak <X> GB at <N> tokens (unfused <Y> GB)`` (a), then
``trainer RSS: peak <P> GB, growth from step 2 to the last <G>%`` (b): the highest peak of the run, and how
much the RSS at the end of the last step exceeds the RSS at the end of step 2; then
``padding-free: <S>% of padded tokens avoided (<K> packed of <P> padded, <M> micro-batches)`` (c).
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


# ---------------------------------------------------------------- (b) the demo trainer's RSS per rollout step

DEMO_RECIPE = ROOT / "recipes" / "demo.yaml"
DEMO_MODEL = ROOT / ".cache" / "demo" / "SmolLM2-135M-Instruct"


def _status_gb(field: str) -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":")) * 1024 / GB


def _reset_peak() -> bool:
    """Restart this process's high-water mark (VmHWM) from its current RSS (Linux 4.0+); False when refused."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def demo_trainer(spec: dict) -> None:
    """The child process of part (b): the demo recipe trained by ``recipes/zppo.py``'s ``train``, with a
    callback that appends ``{"step", "rss", "peak", "s"}`` to ``spec["out"]`` after loading (step 0) and at
    the end of every rollout step (its last optimizer update)."""
    import logging
    import time
    import warnings

    from transformers import TrainerCallback

    sys.path.insert(0, str(ROOT / "recipes"))
    import zppo

    from zppo_trl.recipe import parse_recipe_args

    class RolloutStepMemory(TrainerCallback):
        def __init__(self):
            self.resets = _reset_peak()
            self.start = time.perf_counter()

        def _write(self, step: int) -> None:
            row = {"step": step, "rss": _status_gb("VmRSS"), "peak": _status_gb("VmHWM")}
            row["s"], row["peak_is_lifetime"] = time.perf_counter() - self.start, not self.resets
            with open(spec["out"], "a") as out:
                out.write(json.dumps(row) + "\n")
            self.resets, self.start = _reset_peak(), time.perf_counter()

        def on_train_begin(self, args, state, control, **kwargs):
            self._write(0)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % args.num_partitions == 0:
                self._write(state.global_step // args.num_partitions)

    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.* is deprecated", category=FutureWarning)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    script_args, args, model_args = parse_recipe_args(spec["argv"])
    zppo.train(script_args, args, model_args, callbacks=[RolloutStepMemory()])


def _check_demo(model: Path, teacher: str) -> None:
    """Exit with what to run when the demo's model (or the vLLM teacher's environment) is missing."""
    from servers import vllm_unavailable

    if not (model / "config.json").exists():
        raise SystemExit(f"no demo model at {model}: run `make demo-env` (or pass --model DIR)")
    if teacher == "vllm" and vllm_unavailable():
        raise SystemExit(f"{vllm_unavailable()}; run `make vllm-env` or pass --teacher transformers")


def _demo_teacher(teacher: str, model: Path, config, workdir: Path):
    """The demo's teacher server on ``model``, started: vLLM's CPU engine as recipes/demo/run_demo.sh serves it
    (bfloat16, eager, the recipe's context) or ``transformers serve``."""
    from servers import SERVERS, VLLM_PYTHON, VLLMServer

    class DemoVLLM(VLLMServer):
        def command(self) -> list[str]:
            return [
                str(VLLM_PYTHON), "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(self.model_dir),
                "--host", "127.0.0.1", "--port", str(self.port), "--seed", "0",
                "--max-model-len", str(config.context_lengths().teacher), "--dtype", "bfloat16", "--enforce-eager",
            ]  # fmt: skip

    server_class = DemoVLLM if teacher == "vllm" else SERVERS["transformers"]
    return server_class(model, log_dir=workdir).start()


def rss_part(steps: int, teacher: str, model: Path, workdir: Path, num_generations: int | None = None) -> str:
    """Part (b): the demo trainer's RSS per rollout step over ``steps`` rollout steps, printed as a table.
    Returns the part's last line."""
    import shutil
    import time

    from zppo_trl.recipe import parse_recipe_args

    _check_demo(model, teacher)
    run_dir = workdir / "demo-run"
    shutil.rmtree(run_dir, ignore_errors=True)  # the recipe would resume from a checkpoint left there
    run_dir.mkdir(parents=True)
    overrides = ["--model_name_or_path", str(model), "--teacher_model", str(model), "--output_dir", str(run_dir)]
    overrides += ["--num_generations", str(num_generations)] if num_generations else []
    _, config, _ = parse_recipe_args(["--config", str(DEMO_RECIPE), *overrides])
    server = _demo_teacher(teacher, model, config, workdir)
    out = run_dir / "rss.jsonl"
    argv = ["--config", str(DEMO_RECIPE), *overrides, "--teacher_base_url", server.base_url]
    argv += ["--max_steps", str(steps * config.num_partitions)]
    spec = {"argv": argv, "out": str(out)}
    start = time.perf_counter()
    try:
        with open(run_dir / "trainer.log", "w") as log:
            child = subprocess.run(
                [sys.executable, __file__, "--demo-trainer", json.dumps(spec)], stdout=log, stderr=subprocess.STDOUT
            )
    finally:
        server.stop()
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    if child.returncode or len(rows) < 3:
        tail = (run_dir / "trainer.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"the demo trainer failed (exit {child.returncode}); the end of its log:\n{tail}")

    generations = num_generations or config.num_generations
    print(
        f"(b) the CPU demo's trainer ({DEMO_RECIPE.relative_to(ROOT)}, {model.name}, G={generations}, teacher: "
        f"{server.name}), {len(rows) - 1} rollout steps in {wall / 60:.0f} min; the trainer process's resident memory:"
    )
    print(f"  {'step':>6}  {'RSS at its end':>14}  {'peak in the step':>16}  {'time':>6}")
    for row in rows:
        label = "loaded" if row["step"] == 0 else str(row["step"])
        lifetime = " (lifetime)" if row.get("peak_is_lifetime") else ""
        print(f"  {label:>6}  {row['rss']:11.2f} GB  {row['peak']:13.2f} GB{lifetime}  {row['s']:5.0f} s")
    second, last = rows[2]["rss"], rows[-1]["rss"]
    peak = max(row["peak"] for row in rows)
    return f"trainer RSS: peak {peak:.2f} GB, growth from step 2 to the last {100 * (last - second) / second:.1f}%"


# ---------------------------------------------------------------- (c) padding-free: padded vs packed tokens


def padding_trainer(spec: dict) -> None:
    """The child process of part (c): the demo recipe trained by ``recipes/zppo.py``'s ``train`` with every loss
    micro-batch recorded (one JSON line in ``spec["out"]``): the rollout step, its rows' prompt and completion
    token counts (the masks), the padded grid's rows and columns, and the packed rows the trainer ran it as."""
    import logging
    import warnings

    sys.path.insert(0, str(ROOT / "recipes"))
    import zppo

    import zppo_trl.logp_paths as logp_paths
    from zppo_trl import ZPPOTrainer
    from zppo_trl.recipe import parse_recipe_args

    packed_rows: list[int] | None = None  # the packed rows of the micro-batch in its loss, else None
    pack, compute_loss = logp_paths.pack, ZPPOTrainer._compute_loss

    def recording_pack(*args, **kwargs):
        packed = pack(*args, **kwargs)
        if packed_rows is not None:
            packed_rows.append(int(packed.input_ids.size(1)))
        return packed

    def recording_loss(self, model, inputs):
        nonlocal packed_rows
        packed_rows = []
        try:
            return compute_loss(self, model, inputs)
        finally:
            row = {
                "step": self.state.global_step // self.args.num_partitions + 1,
                "prompt": inputs["prompt_mask"].sum(dim=1).tolist(),
                "completion": inputs["completion_mask"].sum(dim=1).tolist(),
                "grid": [
                    inputs["prompt_ids"].size(0),
                    inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1),
                ],
                "packed_rows": packed_rows,
            }
            packed_rows = None
            with open(spec["out"], "a") as out:
                out.write(json.dumps(row) + "\n")

    logp_paths.pack, ZPPOTrainer._compute_loss = recording_pack, recording_loss
    warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.* is deprecated", category=FutureWarning)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    zppo.train(*parse_recipe_args(spec["argv"]))


def padding_run(steps: int, teacher: str, model: Path, workdir: Path, completion: int | None) -> tuple[Path, str]:
    """Part (c)'s run: ``steps`` rollout steps of the demo recipe with ``padding_free: true`` (GRPO† when
    ``teacher`` is "none", else the demo's ZPPO row with that teacher server). Returns the micro-batch record and
    the run in words."""
    import shutil
    import time

    from zppo_trl.recipe import parse_recipe_args

    _check_demo(model, teacher)
    run_dir = workdir / "padding-run"
    shutil.rmtree(run_dir, ignore_errors=True)  # the recipe would resume from a checkpoint left there
    run_dir.mkdir(parents=True)
    overrides = ["--model_name_or_path", str(model), "--teacher_model", str(model), "--output_dir", str(run_dir)]
    overrides += ["--padding_free", "true", "--save_strategy", "no", "--report_to", "none"]
    overrides += ["--max_completion_length", str(completion)] if completion else []
    overrides += ["--augmentations", ""] if teacher == "none" else []
    _, config, _ = parse_recipe_args(["--config", str(DEMO_RECIPE), *overrides])
    server = None if teacher == "none" else _demo_teacher(teacher, model, config, workdir)
    out = run_dir / "padding.jsonl"
    argv = ["--config", str(DEMO_RECIPE), *overrides, "--max_steps", str(steps * config.num_partitions)]
    argv += ["--teacher_base_url", server.base_url] if server else []
    start = time.perf_counter()
    try:
        with open(run_dir / "trainer.log", "w") as log:
            child = subprocess.run(
                [sys.executable, __file__, "--padding-trainer", json.dumps({"argv": argv, "out": str(out)})],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    finally:
        if server is not None:
            server.stop()
    if child.returncode or not out.exists():
        tail = (run_dir / "trainer.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"the demo trainer failed (exit {child.returncode}); the end of its log:\n{tail}")
    row = "GRPO\u2020, no teacher" if teacher == "none" else f"{config.variant}, teacher: {server.name}"
    what = (
        f"the CPU demo's trainer ({DEMO_RECIPE.relative_to(ROOT)}, {model.name}, {row}, G={config.num_generations}, "
        f"per_device_train_batch_size {config.per_device_train_batch_size}, max completion "
        f"{config.max_completion_length} tokens, padding_free: true), {steps} rollout steps in "
        f"{(time.perf_counter() - start) / 60:.1f} min"
    )
    return out, what


def padding_report(record: Path, what: str, steps: int | None = None) -> str:
    """Part (c)'s table from a micro-batch record: per loss micro-batch its rows, prompt and completion lengths,
    padded tokens (its grid), packed tokens and the share avoided; then the totals, and which of the run's ``steps``
    rollout steps ran no loss micro-batch. Returns the last line."""
    import statistics

    from zppo_trl.memory_plan import packed_tokens, padded_tokens

    batches = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
    if not batches:
        raise SystemExit(f"{record}: no micro-batch recorded")
    print(f"(c) padded against packed tokens, every loss micro-batch of {what}:")
    print(
        f"  {'step':>4}  {'rows':>4}  {'prompts':>9}  {'completions':>11}  {'padded':>7}  {'packed':>7}  "
        f"{'avoided':>7}"
    )
    shares, mismatched = [], []
    for batch in batches:
        prompt, completion = batch["prompt"], batch["completion"]
        padded, packed = padded_tokens(prompt, completion), packed_tokens(prompt, completion)
        grid = batch["grid"][0] * batch["grid"][1]
        ran = sum(batch.get("packed_rows") or [])
        if grid != padded or (batch.get("packed_rows") and ran != packed):
            mismatched.append(
                f"step {batch['step']}: grid {grid} (computed {padded}), packed {ran} (computed {packed})"
            )
        shares.append(1 - packed / padded)
        print(
            f"  {batch['step']:4d}  {len(prompt):4d}  {min(prompt):4d}-{max(prompt):<4d}  "
            f"{min(completion):5d}-{max(completion):<5d}  {padded:7,d}  {packed:7,d}  {shares[-1]:7.1%}"
        )
    padded = sum(padded_tokens(b["prompt"], b["completion"]) for b in batches)
    packed = sum(packed_tokens(b["prompt"], b["completion"]) for b in batches)
    completions = [c for b in batches for c in b["completion"]]
    completion_padding = sum(len(b["completion"]) * max(b["completion"]) - sum(b["completion"]) for b in batches)
    unpacked = sum(1 for b in batches if not b.get("packed_rows"))
    print(
        f"  {len(batches)} micro-batches: {padded:,} tokens padded, {packed:,} packed, {1 - packed / padded:.1%} "
        f"avoided (per micro-batch: median {statistics.median(shares):.1%}, {min(shares):.1%} to {max(shares):.1%}); "
        f"of the padding, {completion_padding / max(1, padded - packed):.0%} was completion padding"
    )
    print(
        f"  completion lengths: {len(completions)} rows, mean {statistics.mean(completions):.1f}, "
        f"{min(completions)} to {max(completions)} tokens"
    )
    idle = sorted(set(range(1, (steps or 0) + 1)) - {b["step"] for b in batches})
    if idle:
        print(
            f"  rollout steps {', '.join(map(str, idle))}: no loss micro-batch (every partition skipped: no group "
            "with a non-zero advantage), so nothing to pad or pack"
        )
    ran = "every micro-batch ran packed" if not unpacked else f"{unpacked} micro-batches ran padded"
    check = "every grid and packed row as computed" if not mismatched else "MISMATCH: " + "; ".join(mismatched[:3])
    print(f"  the trainer: {ran}; {check}")
    return (
        f"padding-free: {1 - packed / padded:.1%} of padded tokens avoided ({packed:,} packed of {padded:,} padded, "
        f"{len(batches)} micro-batches)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["lmhead", "rss", "padding", "all"], default="all")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192], help="(a) completion lengths")
    parser.add_argument("--steps", type=int, default=10, help="(b) rollout steps of the demo run (at least 3)")
    parser.add_argument("--teacher", choices=("vllm", "transformers"), default="vllm", help="(b) the teacher server")
    parser.add_argument("--model", type=Path, default=DEMO_MODEL, help="(b) the demo's student and teacher")
    parser.add_argument("--num-generations", type=int, help="(b) G instead of the demo recipe's")
    parser.add_argument("--padding-steps", type=int, default=4, help="(c) rollout steps of the run")
    parser.add_argument(
        "--padding-teacher",
        choices=("none", "vllm", "transformers"),
        default="none",
        help="(c) none: GRPO\u2020 without a teacher; else the demo's ZPPO row with this teacher server",
    )
    parser.add_argument("--padding-completion", type=int, help="(c) max_completion_length instead of the demo's")
    parser.add_argument("--padding-record", type=Path, help="(c) report this micro-batch record; no run")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/zppo-bench-memory"))
    parser.add_argument("--one-update", help=argparse.SUPPRESS)
    parser.add_argument("--demo-trainer", help=argparse.SUPPRESS)
    parser.add_argument("--padding-trainer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_update:
        print(json.dumps(one_update(json.loads(args.one_update))))
        return
    if args.demo_trainer:
        demo_trainer(json.loads(args.demo_trainer))
        return
    if args.padding_trainer:
        padding_trainer(json.loads(args.padding_trainer))
        return
    if args.steps < 3:
        parser.error("--steps must be at least 3 (growth is measured from step 2)")
    args.workdir.mkdir(parents=True, exist_ok=True)
    lines = []
    if args.part in ("lmhead", "all"):
        lines.append(lm_head_part(args.lengths, args.workdir))
    if args.part in ("rss", "all"):
        lines.append(rss_part(args.steps, args.teacher, args.model.resolve(), args.workdir, args.num_generations))
    if args.part in ("padding", "all"):
        steps = None
        if args.padding_record:
            record, what = args.padding_record, f"the record {args.padding_record}"
        else:
            steps = args.padding_steps
            model = args.model.resolve()
            record, what = padding_run(
                args.padding_steps, args.padding_teacher, model, args.workdir, args.padding_completion
            )
        lines.append(padding_report(record, what, steps))
    print("\n".join(lines))  # each part's summary line, (c)'s last


if __name__ == "__main__":
    main()
