"""ZPPO vs GRPO† step time on the same tiny setup, and the share of a ZPPO step spent waiting on the teacher.

Both runs use the same boxed student (a tiny model fine-tuned to answer toy questions in
the paper's format, from ``tests/boxed_models.py``), the same seed and the same new
prompts per step. ZPPO talks to a real teacher server on 127.0.0.1 serving a same-size
teacher, so the teacher is no slower than the student: vLLM's CPU engine (``--teacher
vllm``, the production server; from ``make vllm-env``) or ``transformers serve``, which
answers one request at a time (``--teacher transformers``). The first rollout step of each
run is a warm-up and not counted. The models are fine-tuned on first use (minutes; the paper
shape's teacher up to half an hour on a busy machine) into ``--workdir`` and reused from there.

    python benchmarks/bench_trainer.py [--teacher vllm] [--student transformers|vllm] [--shape toy|paper]
        [--steps 6] [--workdir /tmp/zppo-bench] [--pin]

``--student vllm`` generates the student's rollouts on vLLM's CPU server in TRL's server mode
(the production topology; weights synced through /dev/shm after every update, see
docs/student_server.md) instead of in the trainer, and reports the weight sync's time.

``--shape toy`` (the default) is a small step that the second generation round and the BCQ/NCQ prompts
dominate: 32-token completions, I = 2 partitions, augment fraction 0.5. ``--shape paper`` is the recipe's
step in miniature: its fractions (augment 0.25, replay 0.25), G_S = 8, I = 4, G_T = 4, and completions
(student and teacher, 256 tokens, every one run to its length) over five times a compressed candidate
(48 tokens), as the paper's 12,288-token responses are to its 512-token compressions.

Both shapes measure the paper's regime. The student is right on each question with probability 0.15-0.3,
0.4-0.6 or 0.7-0.85 (:data:`STUDENT_ACCURACY`; the tests' student has questions at 0 and 1, whose groups
never carry a signal), so a step's plain accuracy lies near 0.45 and most groups carry a signal. The
teacher is the tests' boxed teacher, right with probability 0.8 on every question, the student's hard ones
included, so each step has a hard question with a correct teacher response for BCQ and wrong student
answers for NCQ. At the paper's shape both are trained for its length: each answer is padded after its box
to 256 tokens (``completion_tokens`` of ``train_boxed_model``), so a response forced to run on keeps the
answer its model chose (a forced continuation after EOS writes more ``\\boxed{}``, the last of which
counts, and left the tests' models right on 0-5% of the questions). That teacher, with a padded response
in its context, does not write the ``<summary>`` it learns at the short length: its compressions are
untagged, so the candidates are the 48 tokens it writes, as long as the cap lets them run.

With ``--pin`` the teacher server runs on the first core and the trainer (one torch thread)
on the last, for both runs, with the student's server if there is one: the paper's layout in
miniature, where the teacher has devices of its own. Without it, all share every core, and the
student's rollouts and updates slow down whenever the teacher works.

With ``--student vllm`` ZPPO runs twice: first with its second round sent whole once every compression is
back (``pipeline_second_round: false``), then as configured by default, each BCQ/NCQ prompt sent to the
student's server as soon as its own candidates are compressed (docs/zppo_trainer.md).

Prints per-run mean step time (one rollout step and its optimizer updates) and where each step's
time goes (plain round, teacher wait, compression, second round, weight sync, old-policy log-probs,
updates, everything else; and, where the trainer logs them, what runs beside another stage and is not
added to the step: the old-policy log-probs computed while the BCQ/NCQ round runs, "old log-probs
hidden", and the BCQ/NCQ round's generation while compressions were still out); then each run's regime:
its plain accuracy per counted step, BCQ and NCQ groups per step and the share of its optimizer updates
skipped for lack of signal; then each ZPPO run's exact floor (:func:`exact_floor`: GRPO†'s step, the
second round as long as it takes with every prompt ready at once, the serial run's, and the updates over
the extra groups) and its overhead above it; then on its last line ``ZPPO/GRPO† step time: <R>x, teacher
wait: <W>%, exact floor <F> s, overhead above it <O> s (<P>% of the ZPPO step)`` for the default ZPPO
(waiting: time blocked on the teacher's samples and compressions, over the ZPPO step; with the round
pipelined, the student's server generates during part of it). Targets at the paper's shape: at most
1.5x, waiting under 10% and overhead above the exact floor at most 3% of a ZPPO step.

A run outside the regime gets no verdict: where a run's plain accuracy leaves 0.2-0.8 in a counted step,
more than a quarter of its optimizer updates are skipped, or (ZPPO) a counted step trains no BCQ or no
NCQ group, the last line says why instead and the script exits with status 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


# The student's probability of answering each toy question right, cycling hard / middling / easy as the tests'
# student does (boxed_models.STUDENT_ACCURACY), but none near 0 or 1, where a group of 8 is nearly always all
# wrong or all right and carries no signal: a step's plain accuracy lies near 0.45, as the paper's students' do.
_TIERS = ([0.15, 0.25, 0.2, 0.3, 0.15, 0.25], [0.45, 0.55, 0.5, 0.4, 0.6], [0.75, 0.85, 0.8, 0.7, 0.8])
STUDENT_ACCURACY = {f"toy-{i:02d}": _TIERS[i % 3][i // 3] for i in range(16)}
# The boxed models' options per shape (tests/boxed_models.train_boxed_model); none: the tests' own model. The
# teachers are right with the tests' probability (0.8) on every question.
MODEL_OPTIONS = {
    "toy": {"student": {"accuracy": STUDENT_ACCURACY}, "teacher": {}},
    "paper": {
        "student": {"accuracy": STUDENT_ACCURACY, "completion_tokens": 256},
        "teacher": {"completion_tokens": 256},
    },
}


def _models(workdir: Path, shape: str) -> tuple[Path, Path]:
    """The shape's student and teacher: a role without options is the tests' model, from their cache
    (``.cache/boxed-models``); one with options is fine-tuned into ``workdir`` unless there already (the student
    from the shape's teacher), in a directory named by the recipe's hash and the options, so a change to either
    trains anew."""
    from boxed_models import boxed_model, recipe_key, train_boxed_model

    options = MODEL_OPTIONS[shape]
    key = hashlib.sha256(json.dumps([recipe_key(), options], sort_keys=True).encode()).hexdigest()[:12]
    teacher, student = workdir / f"{shape}-teacher-{key}", workdir / f"{shape}-student-{key}"
    if not options["teacher"]:
        teacher = boxed_model("teacher", "text")
    for directory, role in ((teacher, "teacher"), (student, "student")):
        if directory.is_dir():
            continue
        print(f"fine-tuning the boxed {role} into {directory} ...", flush=True)
        scratch = directory.with_name(directory.name + ".partial")  # renamed once whole
        shutil.rmtree(scratch, ignore_errors=True)  # left by a run killed mid-fit
        start = time.perf_counter()
        teacher_dir = teacher if role == "student" else None
        train_boxed_model(scratch, role=role, kind="text", teacher_dir=teacher_dir, **options[role])
        scratch.rename(directory)
        print(f"fine-tuned the boxed {role} in {time.perf_counter() - start:.0f} s", flush=True)
    return student, teacher


# The two step shapes (see the module's docstring); every other setting is shared.
SHAPES = {
    "toy": dict(
        per_device_train_batch_size=32,  # 4 new questions per partition at G=8
        num_partitions=2,
        augment_fraction=0.5,
        replay_fraction=0.25,
        max_completion_length=32,
        teacher_max_tokens=32,
    ),
    "paper": dict(
        per_device_train_batch_size=16,  # 2 new questions per partition at G=8
        num_partitions=4,
        augment_fraction=0.25,
        replay_fraction=0.25,
        teacher_num_generations=4,
        max_completion_length=256,
        teacher_max_tokens=256,
    ),
}
COMPRESSED_TOKENS = 48


def _shape_settings(shape: str, student: str, teacher: str) -> dict:
    """The shape's ZPPOConfig fields; at the paper's shape every response runs to its length (the tiny boxed
    models answer in a few tokens), through each engine's own minimum-length option."""
    settings = dict(SHAPES[shape], compression_max_tokens=COMPRESSED_TOKENS)
    if shape == "paper":
        length = settings["max_completion_length"]
        settings["generation_kwargs"] = {"min_tokens": length} if student == "vllm" else {"min_new_tokens": length}
        if teacher == "vllm":  # vLLM's OpenAI server takes min_tokens; transformers serve has no such field
            settings["teacher_extra_body"] = {"min_tokens": settings["teacher_max_tokens"]}
            settings["compression_extra_body"] = {"min_tokens": 0}  # merged over the above; compressions stay short
    return settings


# The runs: GRPO\u2020; ZPPO with its second round sent whole once every compression is back (pipeline_second_round
# off: its round is the exact floor's); ZPPO as configured by default (each BCQ/NCQ prompt sent as its own
# compressions return, where the student's rollouts are on a server).
VARIANTS = {
    "GRPO\u2020": dict(augmentations=[]),
    "ZPPO, serial second round": dict(augmentations=["bcq", "ncq"], pipeline_second_round=False),
    "ZPPO": dict(augmentations=["bcq", "ncq"]),
}
SERIAL = "ZPPO, serial second round"


def _run(variant: str, student: Path, server, steps: int, workdir: Path, shape: dict, student_server=None) -> dict:
    from boxed_models import toy_rows
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zppo_trl import ZPPOConfig, ZPPOTrainer

    rows = toy_rows("text")
    dataset = Dataset.from_list(rows * 8)  # enough distinct new prompts for every step (ids made unique below)
    dataset = dataset.map(lambda row, i: {"id": f"{row['id']}-{i // len(rows)}"}, with_indices=True)
    args = ZPPOConfig(
        output_dir=str(workdir / variant.replace(", ", "-").replace(" ", "-")),
        use_cpu=True,
        bf16=False,
        report_to=[],
        num_generations=8,
        gradient_accumulation_steps=1,
        max_steps=shape["num_partitions"] * steps,
        **VARIANTS[variant],
        teacher_base_url=server.base_url,
        teacher_model=server.model,
        **shape,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        data_seed=0,
        disable_tqdm=True,
        max_prompt_length=1024,  # sizes the student server's context only (the tiny model has 4,096 positions)
        **(
            dict(
                use_vllm=True,
                vllm_mode="server",
                vllm_server_base_url=student_server.root_url,
                vllm_max_model_length=student_server.max_model_len,
            )  # fmt: skip
            if student_server is not None
            else {}
        ),
    )
    trainer = ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(student),
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(student),
    )
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    logs = [h for h in trainer.state.log_history if "zppo/time/rollout_step_s" in h][1:]  # drop the warm-up step
    # TRL's step_time covers one optimizer step, generation included; a full ZPPO step is one
    # rollout step and its num_partitions optimizer updates.
    step_times = [h["step_time"] for h in trainer.state.log_history if "step_time" in h][args.num_partitions :]
    full_steps = [sum(step_times[i : i + args.num_partitions]) for i in range(0, len(step_times), args.num_partitions)]
    waits = [h["zppo/time/teacher_wait_s"] for h in logs]

    def mean(name: str) -> float:
        return statistics.mean(h.get(f"zppo/{name}", 0.0) for h in logs)

    def per_step(name: str) -> list[float] | None:  # None: a metric this run does not log (GRPO† has no BCQ)
        return [h[f"zppo/{name}"] for h in logs] if all(f"zppo/{name}" in h for h in logs) else None

    result = {
        "variant": variant,
        "augmenting": bool(args.augmentations),
        "step_s": statistics.mean(full_steps),
        "rollout_step_s": mean("time/rollout_step_s"),
        "teacher_wait_s": statistics.mean(waits),
        "teacher_wait_fraction": statistics.mean(w / s for w, s in zip(waits, full_steps)),
        "teacher_sample_wait_s": mean("time/teacher_sample_wait_s"),
        "compression_s": mean("time/compression_s"),
        "weight_sync_s": mean("time/weight_sync_s"),  # TRL's, as the plain round starts
        "plain_generation_s": mean("time/plain_generation_s"),
        "reformulated_generation_s": mean("time/reformulated_generation_s"),
        "old_logps_s": mean("time/old_logps_s"),
        # the plain rollouts' old log-probs computed during the BCQ/NCQ round: inside it, not added to the step
        "old_logps_hidden_s": mean("time/old_logps_hidden_s") if per_step("time/old_logps_hidden_s") else None,
        # pipeline_second_round: how long the BCQ/NCQ round generated before its last compression was back
        "second_round_early_s": mean("time/second_round_early_s") if per_step("time/second_round_early_s") else None,
        # the regime: per counted step, and the updates skipped for want of a group with signal
        "plain_accuracy": per_step("plain_accuracy"),
        "bcq_groups": per_step("bcq_trained"),
        "ncq_groups": per_step("ncq_trained"),
        "updates": args.num_partitions * len(logs),
        "updates_skipped": int(sum(per_step("skipped_partitions") or [0])),
        "wall_s": wall,
    }
    # where the step went: the sync runs inside the plain round, the updates after the rollout step
    result["plain_round_s"] = result["plain_generation_s"] - result["weight_sync_s"]
    result["updates_s"] = result["step_s"] - result["rollout_step_s"]
    result["else_s"] = result["rollout_step_s"] - sum(
        result[name] for name in ("plain_generation_s", "teacher_wait_s", "reformulated_generation_s", "old_logps_s")
    )
    return result


BREAKDOWN = (
    ("plain round", "plain_round_s"),
    ("waiting on teacher samples", "teacher_sample_wait_s"),
    ("waiting on compressions", "compression_s"),
    ("second round", "reformulated_generation_s"),
    ("weight sync", "weight_sync_s"),
    ("old-policy log-probs", "old_logps_s"),
    ("updates", "updates_s"),
    ("everything else", "else_s"),
)
# Stages that run beside others (inside the second round): shown, not part of the step's sum.
OVERLAPPED = (
    ("old log-probs hidden", "old_logps_hidden_s"),
    ("second round generating while compressions were out", "second_round_early_s"),
)

# The paper's regime (see the module's docstring): plain accuracy per counted step, and the most updates skipped.
ACCURACY_RANGE = (0.2, 0.8)
MAX_SKIPPED = 0.25


def _breakdown(r: dict) -> str:
    """One run's step, stage by stage, each with its share of the step."""
    parts = ", ".join(f"{label} {r[name]:.2f} s ({100 * r[name] / r['step_s']:.1f}%)" for label, name in BREAKDOWN)
    hidden = "".join(
        f"; {label} {r[name]:.2f} s ({100 * r[name] / r['step_s']:.1f}%, overlapped, not added)"
        for label, name in OVERLAPPED
        if r[name] is not None
    )
    return f"{r['variant']}: step {r['step_s']:.2f} s = {parts}{hidden}; run {r['wall_s']:.0f} s"


def _counts(values: list[float]) -> str:
    return " ".join(str(int(v)) for v in values)


def _regime(r: dict) -> str:
    """One run's regime: plain accuracy per counted step, BCQ/NCQ groups per step, the updates skipped."""
    accuracy = r["plain_accuracy"]
    parts = [
        f"plain accuracy per step {' '.join(f'{a:.2f}' for a in accuracy)} (min {min(accuracy):.2f}, mean "
        f"{statistics.mean(accuracy):.2f}, max {max(accuracy):.2f})"
    ]
    if r["bcq_groups"] is not None:
        parts.append(f"BCQ groups per step {_counts(r['bcq_groups'])}, NCQ {_counts(r['ncq_groups'])}")
    share = r["updates_skipped"] / r["updates"]
    parts.append(f"{r['updates_skipped']} of {r['updates']} updates skipped ({100 * share:.0f}%)")
    return f"regime, {r['variant']}: " + "; ".join(parts)


def _out_of_regime(r: dict) -> list[str]:
    """Why one run does not measure the paper's regime (empty: it does)."""
    low, high = ACCURACY_RANGE
    problems = []
    outside = [f"{a:.2f} in step {i}" for i, a in enumerate(r["plain_accuracy"], 1) if not low <= a <= high]
    if outside:
        problems.append(f"plain accuracy outside {low}-{high} ({', '.join(outside)})")
    if r["updates_skipped"] > MAX_SKIPPED * r["updates"]:
        problems.append(f"{r['updates_skipped']} of {r['updates']} updates skipped (more than a quarter)")
    for kind in ("bcq", "ncq"):
        groups = r[f"{kind}_groups"]
        if not r["augmenting"]:
            continue
        if groups is None:
            problems.append(f"no {kind.upper()} groups logged (zppo/{kind}_trained)")
        elif not all(groups):
            empty = ", ".join(str(i) for i, n in enumerate(groups, 1) if not n)
            problems.append(f"no {kind.upper()} group in counted step {empty}")
    return [f"{r['variant']}: {problem}" for problem in problems]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", choices=("vllm", "transformers"), default="vllm", help="the teacher's server")
    parser.add_argument("--steps", type=int, default=6, help="rollout steps per run (the first is a warm-up)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/zppo-bench"))
    parser.add_argument(
        "--student", choices=("transformers", "vllm"), default="transformers",
        help="where the student's rollouts are generated: in the trainer, or on a vLLM server",
    )  # fmt: skip
    parser.add_argument("--shape", choices=tuple(SHAPES), default="toy", help="the step's shape (see above)")
    parser.add_argument("--pin", action="store_true", help="teacher server on the first core, trainer on the last")
    options = parser.parse_args()
    options.workdir.mkdir(parents=True, exist_ok=True)

    from servers import SERVERS, vllm_unavailable

    if "vllm" in (options.teacher, options.student) and vllm_unavailable():
        parser.error(f"{vllm_unavailable()}; run `make vllm-env` or pass --teacher/--student transformers")
    student, teacher = _models(options.workdir, options.shape)
    server = SERVERS[options.teacher](teacher, log_dir=options.workdir).start()
    student_server = None
    if options.student == "vllm":  # 2,048 tokens: the context ZPPOConfig asks for at these lengths (1,769)
        student_server = SERVERS["vllm-student"](student, log_dir=options.workdir, max_model_len=2048).start()
    layout = "teacher, student server and trainer share every core"
    if options.pin:
        layout = _pin(server, student_server)
    shape = _shape_settings(options.shape, options.student, options.teacher)
    # the second round is pipelined only where a server batches what arrives: elsewhere ZPPO's round is the serial one
    variants = [variant for variant in VARIANTS if variant != SERIAL or student_server is not None]
    try:
        results = [
            _run(variant, student, server, options.steps, options.workdir, shape, student_server)
            for variant in variants
        ]
    finally:
        server.stop()
        if student_server is not None:
            student_server.stop()
    grpo, serial, zppo = results[0], results[1], results[-1]
    print(json.dumps(results))
    for r in results:
        print(_breakdown(r))
    print(f"shape: {options.shape}; teacher: {server.name}; student rollouts: {options.student}; {layout}")
    for r in results:
        print(_regime(r))
    problems = [problem for r in results for problem in _out_of_regime(r)]
    if problems:
        print("no verdict, the runs are not in the paper's regime: " + "; ".join(problems))
        sys.exit(1)
    for r in results[1:]:
        print(_floor_line(r, grpo, serial))
    floor = exact_floor(zppo, grpo, serial)
    print(
        f"ZPPO/GRPO\u2020 step time: {zppo['step_s'] / grpo['step_s']:.2f}x, "
        f"teacher wait: {100 * zppo['teacher_wait_fraction']:.1f}%, exact floor {floor:.2f} s, "
        f"overhead above it {zppo['step_s'] - floor:.2f} s ({100 * (zppo['step_s'] - floor) / zppo['step_s']:.1f}% "
        "of the ZPPO step)"
    )


def exact_floor(r: dict, grpo: dict, serial: dict) -> float:
    """The least a ZPPO step ``r`` can take: GRPO\u2020's step plus what Algorithm 1 makes serial and only ZPPO does,
    the second round (as long as it takes with every prompt ready at once: ``serial``'s, the run that sends it whole)
    and the updates over the extra groups (``r``'s updates less GRPO\u2020's). The rest of ``r``'s step is overhead:
    waiting on compressions, old log-probs not hidden, bookkeeping."""
    return grpo["step_s"] + serial["reformulated_generation_s"] + (r["updates_s"] - grpo["updates_s"])


def _floor_line(r: dict, grpo: dict, serial: dict) -> str:
    floor = exact_floor(r, grpo, serial)
    over = r["step_s"] - floor
    return (
        f"{r['variant']}: exact floor {floor:.2f} s = GRPO\u2020 step {grpo['step_s']:.2f} s + second round "
        f"{serial['reformulated_generation_s']:.2f} s + extra updates {r['updates_s'] - grpo['updates_s']:.2f} s; "
        f"overhead above it {over:.2f} s ({100 * over / r['step_s']:.1f}% of its step), of which waiting on "
        f"compressions {r['compression_s']:.2f} s"
    )


def _pin(server, student_server=None) -> str:
    """Every thread of the teacher server's processes on the first core; this process, and the
    student's server if any, on the last."""
    import subprocess

    import torch

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return "one core: nothing to pin"
    for running, core in ((server, cores[0]), (student_server, cores[-1])):
        if running is None:
            continue
        group = subprocess.run(["pgrep", "-g", str(running.process.pid)], capture_output=True, text=True).stdout
        for pid in group.split():
            subprocess.run(["taskset", "-a", "-p", "-c", str(core), pid], capture_output=True, check=True)
    os.sched_setaffinity(0, {cores[-1]})
    torch.set_num_threads(1)
    beside = " beside the student server" if student_server is not None else ""
    return f"teacher server on core {cores[0]}, trainer on core {cores[-1]} with one thread{beside}"


if __name__ == "__main__":
    main()
