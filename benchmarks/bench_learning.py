"""Does ZPPO teach? The paper's effect in miniature: ZPPO against GRPO† from the same student, held-out accuracy
with a 95% interval over seeds and questions, and the mechanism behind it measured on the hard questions.

    python benchmarks/bench_learning.py [--seeds 1 2 3] [--out DIR] [--ablation] [--teacher vllm|transformers]
        [--jobs 2]

The design is fixed before any comparison and written in docs/learning.md; this docstring is its short form.

Task and models (``benchmarks/learning_task.py``). Two-digit addition worked in the paper's answer format
(``<think> 7 + 8 = 15 . 4 + 3 + 1 = 8 . </think> \\boxed{85}``), split once into 400 held-out questions that no
row trains on, 1,000 training questions and a pool for fine-tuning the models. The student, a tiny Qwen3 (two
layers, hidden size 64) fine-tuned here, always forgets the carry (right on no carry question alone, on about 74%
of the others: about 40% of the training questions in all) and can read the paper's BCQ and NCQ prompts: inside a
BCQ prompt it follows one of the two candidates at random 70% of the time, which puts it right on about a third
of the carry questions. The teacher, the same size, is right on about 88% of them and
compresses candidates into ``<summary>`` tags; it sits behind a real OpenAI-compatible server on 127.0.0.1
(vLLM's CPU engine by default, ``transformers serve`` with ``--teacher transformers``).

Rows. GRPO† and ZPPO (with ``--ablation`` also GRPO†+BCQ and GRPO†+NCQ), each defined by its recipe under
``recipes/rows/`` (only the fields the row changes), train the same student for :data:`DESIGN` ``.steps``
rollout steps on the same data order (the seed), with the paper's settings (G_S 8, G_T 4, I 4, tau 0.5,
replay and augment fractions 0.25, clip 0.2/0.28, dual clip 10, two-step advantages without zero groups,
AdamW with weight decay 0.1 and clipping at 1) except where the miniature needs its own (the learning rate,
16 new questions a step, 48-token responses and 64-token compressions). Each run is its own process.

Measured. Held-out accuracy (4 samples per question at the paper's evaluation decoding, scored by the
evaluation harness's deterministic scorer) every 5 rollout steps; the same on 200 training questions that
were hard for the student at the start (the hard-question probe). ZPPO - GRPO† at the last step with a 95%
paired bootstrap interval over seeds and, within each drawn seed, questions (``zppo_trl.evaluation.stats``).
From each run's ``groups.jsonl`` (``log_groups``): the student's accuracy inside BCQ prompts against its plain
accuracy on the same questions in the same steps, and the share of hard questions that gave any learning
signal. Cost: the tokens each row's student generated and trained on, the teacher's requests, wall seconds.

Writes ``DIR/summary.json``, ``DIR/learning.png`` (held-out curves per row with 95% bands) and one directory per
run (its metrics.jsonl, groups.jsonl, eval.jsonl and log); prints a one-screen summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # servers.py: the real servers the tests start
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import learning_task as task  # noqa: E402  (this script's folder is on sys.path)


def _paper(name: str):
    """The paper's value of a ZPPOConfig field: its default (zppo_trl/config.py: the hyperparameter table)."""
    from zppo_trl import ZPPOConfig

    return next(f.default for f in dataclasses.fields(ZPPOConfig) if f.name == name)


G_S, PARTITIONS, TAU = _paper("num_generations"), _paper("num_partitions"), _paper("hard_threshold")
ROWS = {
    "GRPO\u2020": "grpo_dagger.yaml",
    "ZPPO": None,  # the paper's recipe as it is
    "GRPO\u2020+BCQ": "grpo_dagger_bcq.yaml",
    "GRPO\u2020+NCQ": "grpo_dagger_ncq.yaml",
}
HEADLINE = ("GRPO\u2020", "ZPPO")


@dataclass(frozen=True)
class Design:
    """What a run does; :data:`DESIGN` is the pre-registered one (docs/learning.md), :data:`SMOKE` the test's."""

    steps: int = 40  # rollout steps per run
    new_questions: int = 16  # per rollout step
    learning_rate: float = 2e-4
    max_completion_length: int = 48  # a solution is at most 30 tokens
    compression_max_tokens: int = 64  # a summary is at most 40
    eval_every: int = 10  # rollout steps between held-out evaluations (an evaluation costs about 1.5 steps)
    eval_passes: int = 4
    heldout_size: int = task.HELDOUT_SIZE
    probe_size: int = 200  # training questions hard for the student at the start
    regime_samples: int = G_S  # plain samples per training question in the start measurement
    regime_questions: int | None = None  # training questions it measures (None: all)
    fits: tuple[int, int] | None = None  # (teacher, student) fine-tuning steps; None: learning_task's

    def config(self) -> dict:
        """The ZPPOConfig fields in which every row of the miniature leaves the paper's defaults (the rest, G_S 8,
        G_T 4, I 4, tau 0.5, the fractions, the clips, the optimizer's settings and the temperatures, are
        ZPPOConfig's, which are the paper's; the row's recipe adds its own)."""
        return dict(
            per_device_train_batch_size=self.new_questions * G_S // PARTITIONS,
            max_steps=PARTITIONS * self.steps,
            learning_rate=self.learning_rate,
            max_completion_length=self.max_completion_length,
            teacher_max_tokens=self.max_completion_length,
            compression_max_tokens=self.compression_max_tokens,
            max_prompt_length=512,  # sizes nothing here (no server of the student's); the NCQ prompts reach 383
            padding_free=True,  # the paper's: no update pays for the padding to the longest NCQ prompt
            # the paper's recipe checkpoints for its 12,288-token responses; here it would only recompute (no
            # number changes): 4 rollout steps' updates took 18.4 s without it, 24.7 s with it
            gradient_checkpointing=False,
        )


DESIGN = Design()
SMOKE = Design(
    steps=2, new_questions=4, eval_every=2, eval_passes=1, heldout_size=16, probe_size=4, regime_samples=2,
    regime_questions=8, fits=(30, 30),
)  # fmt: skip
# The paper's evaluation decoding (zppo_trl.evaluation.spec.PAPER_DECODING) as transformers' generate takes it;
# its presence penalty has no equivalent there (and would penalise the digits a sum repeats).
EVAL_DECODING = dict(temperature=0.6, top_p=0.95, top_k=20)


def row_fields(row: str) -> dict:
    """The fields ``row``'s recipe changes from the paper's recipe (recipes/qwen35_0.8b.yaml): its definition."""
    from zppo_trl.recipe import recipe_changes

    if ROWS[row] is None:
        return {}
    return recipe_changes(REPO / "recipes" / "rows" / ROWS[row], REPO / "recipes" / "qwen35_0.8b.yaml")


HELDOUT_SPEC = None


def heldout_spec():
    """The held-out split as a setting of the evaluation harness: Exact (the boxed grader) against ``answer``."""
    global HELDOUT_SPEC
    if HELDOUT_SPEC is None:
        from zppo_trl.evaluation.spec import TaskSpec

        HELDOUT_SPEC = TaskSpec(
            name="Addition", family="llm", title="Two-digit addition (held-out)", scoring="exact+judge",
            dataset="benchmarks/learning_task.py", split="heldout", question_field="question", answer_field="answer",
        )  # fmt: skip
    return HELDOUT_SPEC


def score(questions: Sequence[task.Question], responses: Sequence[Sequence[str]]) -> dict[str, float]:
    """Question id -> mean score of its responses under the harness's deterministic scorer (the judge is never
    consulted: every gold is an integer the boxed grader decides)."""
    from zppo_trl.evaluation.scorers import score_deterministic

    spec = heldout_spec()
    return {
        q.id: statistics.fmean(score_deterministic(spec, r, q.row()).score for r in rs)
        for q, rs in zip(questions, responses)
    }


# ------------------------------------------------------------------ one run (its own process)


def evaluate(model, tokenizer, questions: Sequence[task.Question], passes: int, seed: int) -> dict[str, float]:
    """Plain held-out style evaluation: ``passes`` samples per question at :data:`EVAL_DECODING`, scored; the
    global RNG is seeded for it and restored after, so evaluating never changes what the run trains on."""
    import torch

    state = torch.get_rng_state()
    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        texts = task.sample(model, tokenizer, [task.prompt_text(q) for q in questions], n=passes, **EVAL_DECODING)
    finally:
        model.train(was_training)
        torch.set_rng_state(state)
    return score(questions, texts)


def run_one(row: str, seed: int, run_dir: Path, design: Design, student: Path, teacher_url: str, teacher_model: str,
            probe: Sequence[str]) -> None:  # fmt: skip
    """Train ``row`` for ``design.steps`` rollout steps with ``seed``; write eval.jsonl (held-out and probe
    accuracy per question every ``eval_every`` steps), metrics.jsonl, groups.jsonl, progress and run.json."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from zppo_trl import ZPPOConfig, ZPPOTrainer
    from zppo_trl.callbacks import JsonlMetricsCallback

    torch.set_num_threads(1)
    start = time.monotonic()
    splits = task.splits()
    heldout = splits["heldout"][: design.heldout_size]
    by_id = {q.id: q for q in splits["train"]}
    probe_questions = [by_id[key] for key in probe]
    tokenizer = AutoTokenizer.from_pretrained(student)
    args = ZPPOConfig(
        output_dir=str(run_dir), use_cpu=True, bf16=False, report_to=[], save_strategy="no", disable_tqdm=True,
        logging_steps=4, seed=seed, data_seed=seed, teacher_base_url=teacher_url, teacher_model=teacher_model,
        log_groups=True, **design.config(), **row_fields(row),
    )  # fmt: skip

    class Evaluate(TrainerCallback):
        """Held-out and probe accuracy at step 0, every ``eval_every`` rollout steps and at the end."""

        seconds = 0.0  # spent evaluating: not part of what the row costs

        def _evaluate(self, state, model) -> None:
            began = time.monotonic()
            step = state.global_step // args.num_partitions
            # the same sampling seed at a step for every row of a seed: their evaluations share their noise
            line = {
                "step": step,
                "heldout": evaluate(model, tokenizer, heldout, design.eval_passes, seed * 100_003 + step),
                "probe": evaluate(model, tokenizer, probe_questions, design.eval_passes, seed * 100_019 + step),
            }
            with open(run_dir / "eval.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
            self.seconds += time.monotonic() - began

        def on_train_begin(self, args_, state, control, model=None, **kwargs):
            self._evaluate(state, model)

        def on_step_end(self, args_, state, control, model=None, **kwargs):
            if state.global_step % args.num_partitions:
                return
            step = state.global_step // args.num_partitions
            (run_dir / "progress").write_text(str(step))
            if step % design.eval_every == 0 or step == design.steps:
                self._evaluate(state, model)

    evaluations = Evaluate()
    trainer = ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(student),
        args=args,
        train_dataset=Dataset.from_list([q.row() for q in splits["train"]]),
        processing_class=tokenizer,
        callbacks=[JsonlMetricsCallback(), evaluations],
    )
    trainer.train()
    wall = time.monotonic() - start
    summary = {
        "row": row,
        "seed": seed,
        "variant": args.variant,
        "wall_s": wall,
        "eval_s": evaluations.seconds,
        "train_s": wall - evaluations.seconds,
    }
    (run_dir / "run.json").write_text(json.dumps(summary))


# ------------------------------------------------------------------ before the runs: the regime


def measure_regime(student: Path, teacher_client, design: Design, seed: int) -> dict:
    """The student's plain accuracy on the training questions at the start (``regime_samples`` samples each at
    temperature 1, as a rollout step samples), the teacher's (4 replies each from its server, as the trainer asks
    them), and the probe: the first ``probe_size`` training questions on which the student is below tau."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    train = task.splits()["train"][: design.regime_questions]
    tokenizer = AutoTokenizer.from_pretrained(student)
    model = AutoModelForCausalLM.from_pretrained(student).eval()
    torch.manual_seed(seed)
    prompts = [task.prompt_text(q) for q in train]
    student_accuracy = score(train, task.sample(model, tokenizer, prompts, n=design.regime_samples))
    replies = teacher_client.sample(
        [[{"role": "user", "content": p}] for p in prompts], n=4, max_tokens=design.max_completion_length
    )
    teacher_accuracy = score(train, [r or [""] for r in replies])
    hard = [q.id for q in train if student_accuracy[q.id] < TAU]

    def by_class(accuracy: Mapping[str, float]) -> dict:
        return {
            name: statistics.fmean(accuracy[q.id] for q in train if q.carry == carry)
            for name, carry in (("carry", True), ("no_carry", False))
        }

    return {
        "student_plain_accuracy_start": statistics.fmean(student_accuracy.values()),
        "teacher_accuracy": statistics.fmean(teacher_accuracy.values()),
        "student_by_class": by_class(student_accuracy),
        "teacher_by_class": by_class(teacher_accuracy),
        "hard_questions": len(hard),
        "training_questions": len(train),
        "probe": hard[: design.probe_size],
    }


REGIME = {"student_plain_accuracy_start": (0.15, 0.60), "teacher_accuracy": (0.70, 1.0)}


# ------------------------------------------------------------------ the runs, in processes of their own


def run_dir(out: Path, row: str, seed: int) -> Path:
    name = row.replace("\u2020", "-dagger").replace("+", "-").lower()
    return out / "runs" / f"{name}-seed{seed}"


def run_all(runs: Sequence[tuple[str, int]], out: Path, design: Design, models: Mapping[str, Path], server,
            probe: Sequence[str], jobs: int, smoke: bool) -> None:  # fmt: skip
    """Each (row, seed) run in a process of its own, ``jobs`` at a time, with one progress bar over all their
    rollout steps; a run already finished in ``out`` (its run.json) is kept, so an interrupted benchmark resumes."""
    from tqdm import tqdm

    todo = [(row, seed) for row, seed in runs if not (run_dir(out, row, seed) / "run.json").exists()]
    done_steps = (len(runs) - len(todo)) * design.steps
    active: dict[tuple[str, int], subprocess.Popen] = {}
    bar = tqdm(total=len(runs) * design.steps, initial=done_steps, unit="step", desc="rollout steps", mininterval=5)
    with bar:
        while todo or active:
            while todo and len(active) < jobs:
                row, seed = todo.pop(0)
                directory = run_dir(out, row, seed)
                if directory.exists():  # a run killed midway starts again from its beginning
                    import shutil

                    shutil.rmtree(directory)
                directory.mkdir(parents=True)
                command = [sys.executable, __file__, "--run", row, str(seed), str(directory), "--student",
                           str(models["student"]), "--teacher-url", server.base_url, "--teacher-model", server.model,
                           "--probe", ",".join(probe)] + (["--smoke"] if smoke else [])  # fmt: skip
                with open(directory / "log.txt", "w") as log:
                    env = dict(os.environ, OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error")
                    active[(row, seed)] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            time.sleep(1.0)
            for (row, seed), process in list(active.items()):
                if process.poll() is None:
                    continue
                del active[(row, seed)]
                if process.returncode != 0:
                    for other in active.values():
                        other.terminate()
                    tail = (run_dir(out, row, seed) / "log.txt").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"the {row} run with seed {seed} failed (exit {process.returncode}):\n{tail}")
                done_steps += design.steps
            progress = done_steps + sum(_progress(run_dir(out, row, seed)) for row, seed in active)
            bar.update(progress - bar.n)


def _progress(directory: Path) -> int:
    """The rollout steps a running run has finished (its callback writes them)."""
    try:
        return int((directory / "progress").read_text() or 0)
    except (OSError, ValueError):
        return 0


# ------------------------------------------------------------------ after the runs: what they say


def read_run(directory: Path) -> dict:
    """A finished run's evaluations (step -> {heldout, probe}), metrics rows (one per rollout step), groups (step ->
    groups) and run.json."""
    from zppo_trl.callbacks import read_metrics
    from zppo_trl.group_log import read_group_log

    evaluations = {}
    for line in (directory / "eval.jsonl").read_text().splitlines():
        record = json.loads(line)
        evaluations[record["step"]] = record
    metrics = [m for m in read_metrics(directory / "metrics.jsonl") if "zppo/rollout_steps" in m]
    return {
        "eval": dict(sorted(evaluations.items())),
        "metrics": metrics,
        "groups": read_group_log(directory / "groups.jsonl"),
        "run": json.loads((directory / "run.json").read_text()),
    }


def cluster_indices(n_seeds: int, n_questions: int, resamples: int, seed: int = 0):
    """Bootstrap positions over units sorted seed-major: each resample draws seeds with replacement, then within
    each drawn seed its questions with replacement (a two-stage bootstrap: the interval holds run-to-run noise,
    not only the questions')."""
    import numpy as np

    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, n_seeds, size=(resamples, n_seeds))
    questions = rng.integers(0, n_questions, size=(resamples, n_seeds, n_questions))
    return (seeds[:, :, None] * n_questions + questions).reshape(resamples, n_seeds * n_questions)


def _units(per_seed: Mapping[int, Mapping[str, float]]) -> dict[str, float]:
    """(seed, question) units keyed so that sorting them groups each seed's questions, in question order."""
    return {f"{seed:012d}/{key}": value for seed, scores in per_seed.items() for key, value in scores.items()}


def effect(a: Mapping[int, Mapping[str, float]], b: Mapping[int, Mapping[str, float]], resamples: int = 10_000):
    """``a - b`` in percentage points over (seed, question) units, with its 95% two-stage bootstrap interval
    (``zppo_trl.evaluation.stats.paired_bootstrap`` on :func:`cluster_indices`)."""
    from zppo_trl.evaluation.stats import paired_bootstrap

    n_questions = len(next(iter(a.values())))
    indices = cluster_indices(len(a), n_questions, resamples)
    result = paired_bootstrap(_units(a), _units(b), indices=indices)
    return {
        "delta_pp": 100 * result.delta,
        "ci95_pp": [100 * result.low, 100 * result.high],
        "questions_won": result.wins,
        "units": result.n,
        "per_seed_pp": {seed: 100 * statistics.fmean(a[seed][k] - b[seed][k] for k in a[seed]) for seed in a},
    }


def band(per_seed: Mapping[int, Mapping[str, float]], resamples: int = 2_000) -> tuple[float, float, float]:
    """Mean accuracy over (seed, question) units and its 95% two-stage bootstrap interval."""
    import numpy as np

    units = _units(per_seed)
    values = np.array([units[k] for k in sorted(units)])
    if len(per_seed) == 0:
        return float("nan"), float("nan"), float("nan")
    means = values[cluster_indices(len(per_seed), len(values) // len(per_seed), resamples, seed=1)].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(values.mean()), float(low), float(high)


def mechanism(groups_by_step: Mapping[int, Sequence[dict]], steps: int | None = None) -> dict:
    """From one run's group log: each reformulated kind's accuracy inside its prompts against the plain accuracy of
    the same questions in the same steps, over the run and in its first and last quarter of ``steps`` (default:
    the last step logged); and the hard questions (plain accuracy below tau) that gave any learning signal (a group
    of theirs, plain or reformulated, neither all right nor all wrong)."""
    last = steps or max(groups_by_step, default=0)
    quarter = max(1, last // 4)
    inside: dict[str, list[float]] = defaultdict(list)
    same_plain: dict[str, list[float]] = defaultdict(list)
    phases: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"first": [], "last": []})
    hard = signal = 0
    for step, groups in groups_by_step.items():
        phase = "first" if step <= quarter else "last" if step > last - quarter else None
        plain: dict[str, list[float]] = defaultdict(list)
        mixed: dict[str, bool] = defaultdict(bool)
        for g in groups:
            right = [r > 0.5 for r in g["rewards"]]
            mixed[g["id"]] |= 0 < sum(right) < len(right)
            if g["kind"] in ("new", "replay"):
                plain[g["id"]] += right
        for g in groups:
            if g["kind"] not in ("new", "replay") and g["id"] in plain:
                accuracy = statistics.fmean(r > 0.5 for r in g["rewards"])
                inside[g["kind"]].append(accuracy)
                same_plain[g["kind"]].append(statistics.fmean(plain[g["id"]]))
                if phase is not None:
                    phases[g["kind"]][phase].append(accuracy)
        for key, right in plain.items():
            if statistics.fmean(right) < TAU:
                hard += 1
                signal += mixed[key]
    out = {"hard_groups": hard, "hard_with_signal": signal}
    for kind in inside:
        out[kind] = {"groups": len(inside[kind]), "in_prompt": sum(inside[kind]), "plain": sum(same_plain[kind])}
        for phase, values in phases[kind].items():
            out[kind][f"{phase}_quarter"], out[kind][f"{phase}_quarter_groups"] = sum(values), len(values)
    return out


def summarize(out: Path, rows: Sequence[str], seeds: Sequence[int], design: Design, regime: dict) -> dict:
    """summary.json's content from the finished runs under ``out``."""
    runs = {(row, seed): read_run(run_dir(out, row, seed)) for row in rows for seed in seeds}
    last = design.steps
    heldout = {row: {seed: runs[row, seed]["eval"][last]["heldout"] for seed in seeds} for row in rows}
    curves, mechanisms, costs = {}, {}, {}
    for row in rows:
        steps = sorted(runs[row, seeds[0]]["eval"])
        curves[row] = {
            part: {step: band({seed: runs[row, seed]["eval"][step][part] for seed in seeds}) for step in steps}
            for part in ("heldout", "probe")
        }
        counts: dict = defaultdict(float)
        kinds: dict = defaultdict(lambda: defaultdict(float))
        for seed in seeds:
            m = mechanism(runs[row, seed]["groups"], design.steps)
            counts["hard_groups"] += m.pop("hard_groups")
            counts["hard_with_signal"] += m.pop("hard_with_signal")
            for kind, values in m.items():
                for name, value in values.items():
                    kinds[kind][name] += value
        mechanisms[row] = {
            "signal_share": counts["hard_with_signal"] / max(counts["hard_groups"], 1),
            "hard_question_visits": int(counts["hard_groups"]),
            **{
                kind: {
                    "groups": int(v["groups"]),
                    "in_prompt_accuracy_hard": v["in_prompt"] / max(v["groups"], 1),
                    "plain_accuracy_hard": v["plain"] / max(v["groups"], 1),
                    # whether the student gets better inside the prompt as it trains
                    "in_prompt_accuracy_first_quarter": v["first_quarter"] / max(v["first_quarter_groups"], 1),
                    "in_prompt_accuracy_last_quarter": v["last_quarter"] / max(v["last_quarter_groups"], 1),
                }
                for kind, v in kinds.items()
            },
        }
        totals = defaultdict(list)
        for seed in seeds:
            metrics = runs[row, seed]["metrics"]
            totals["generated_tokens"].append(sum(m.get("zppo/generated_tokens", 0) for m in metrics))
            totals["trained_tokens"].append(sum(m.get("zppo/trained_tokens", 0) for m in metrics))
            totals["teacher_requests"].append(sum(m.get("zppo/teacher/requests", 0) for m in metrics))
            totals["wall_s"].append(runs[row, seed]["run"]["wall_s"])  # its evaluations included
        costs[row] = {name: statistics.fmean(values) for name, values in totals.items()}
    zppo = mechanisms.get("ZPPO", {})
    summary = {
        "design": {**dataclasses.asdict(design), "rows": list(rows), "seeds": list(seeds), "task": task.__name__},
        "regime": {k: regime[k] for k in regime if k != "probe"},
        "regime_met": all(low <= regime[k] <= high for k, (low, high) in REGIME.items()),
        "mechanism": {
            "bcq_in_prompt_accuracy_hard": zppo.get("bcq", {}).get("in_prompt_accuracy_hard"),
            "plain_accuracy_hard": zppo.get("bcq", {}).get("plain_accuracy_hard"),
            "signal_share": {row: mechanisms[row]["signal_share"] for row in rows},
            "per_row": mechanisms,
        },
        "effect": {
            **effect(heldout["ZPPO"], heldout["GRPO\u2020"]),
            "heldout_accuracy": {
                row: {seed: statistics.fmean(heldout[row][seed].values()) for seed in seeds} for row in rows
            },
            "heldout_accuracy_start": {
                row: {seed: statistics.fmean(runs[row, seed]["eval"][0]["heldout"].values()) for seed in seeds}
                for row in rows
            },
            "heldout_by_class": {row: _by_class(heldout[row]) for row in rows},
            "ablation": {row: effect(heldout["ZPPO"], heldout[row]) for row in rows if row not in HEADLINE},
        },
        "curves": {
            row: {part: {str(s): list(v) for s, v in c.items()} for part, c in cs.items()}
            for row, cs in curves.items()
        },
        "cost": costs,
    }
    return summary


def _by_class(per_seed: Mapping[int, Mapping[str, float]]) -> dict:
    """Held-out accuracy on the carry and the other questions (mean over seeds)."""
    carry = {q.id: q.carry for q in task.splits()["heldout"]}
    return {
        name: statistics.fmean(v for scores in per_seed.values() for k, v in scores.items() if carry[k] == want)
        for name, want in (("carry", True), ("no_carry", False))
    }


# ------------------------------------------------------------------ what a reader sees


def plot(summary: dict, path: Path) -> None:
    """Held-out accuracy (left) and the hard-question probe (right) per row over rollout steps, 95% bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharex=True)
    titles = {"heldout": "held-out questions (never trained on)", "probe": "training questions hard at the start"}
    for ax, part in zip(axes, ("heldout", "probe")):
        for row, parts in summary["curves"].items():
            points = sorted((int(step), values) for step, values in parts[part].items())
            steps = [s for s, _ in points]
            mean, low, high = zip(*(v for _, v in points))
            line = ax.plot(steps, [100 * m for m in mean], marker="o", markersize=3, label=row)[0]
            ax.fill_between(steps, [100 * v for v in low], [100 * v for v in high], alpha=0.2, color=line.get_color())
        ax.set_title(titles[part])
        ax.set_xlabel("rollout step")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0].legend()
    seeds = summary["design"]["seeds"]
    fig.suptitle(f"ZPPO vs GRPO\u2020 in miniature: mean of {len(seeds)} seeds, 95% bands over seeds and questions")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def console(summary: dict) -> str:
    """The one-screen summary: regime, mechanism, effect, cost, and the verdict with its weakest link."""
    r, m, e = summary["regime"], summary["mechanism"], summary["effect"]
    rows = summary["design"]["rows"]
    by_class = r["student_by_class"]
    lines = [
        f"regime: student right on {100 * r['student_plain_accuracy_start']:.1f}% of the training questions at the "
        f"start (carry {100 * by_class['carry']:.1f}%, others {100 * by_class['no_carry']:.1f}%), "
        f"teacher {100 * r['teacher_accuracy']:.1f}%: {'met' if summary['regime_met'] else 'NOT met'} "
        "(student 15-60%, teacher >= 70%)",
    ]
    per_row = m["per_row"]
    for row in rows:
        share, visits = per_row[row]["signal_share"], per_row[row]["hard_question_visits"]
        parts = [f"signal on {100 * share:.1f}% of {visits} hard-question visits"]
        for kind in ("bcq", "ncq"):
            if kind in per_row[row]:
                k = per_row[row][kind]
                parts.append(
                    f"{kind.upper()} right {100 * k['in_prompt_accuracy_hard']:.1f}% in-prompt (first quarter of "
                    f"the steps {100 * k['in_prompt_accuracy_first_quarter']:.0f}%, last "
                    f"{100 * k['in_prompt_accuracy_last_quarter']:.0f}%) vs {100 * k['plain_accuracy_hard']:.1f}% "
                    f"plain ({k['groups']} groups)"
                )
        lines.append(f"mechanism, {row}: " + "; ".join(parts))
    for row in rows:
        acc = e["heldout_accuracy"][row]
        start = statistics.fmean(e["heldout_accuracy_start"][row].values())
        by_class = e["heldout_by_class"][row]
        cost = summary["cost"][row]
        lines.append(
            f"{row}: held-out {100 * statistics.fmean(acc.values()):.1f}% (from {100 * start:.1f}%; per seed "
            + ", ".join(f"{100 * v:.1f}" for v in acc.values())
            + f"; carry {100 * by_class['carry']:.1f}%, others {100 * by_class['no_carry']:.1f}%); "
            f"{cost['generated_tokens'] / 1e3:.0f}k tokens generated, {cost['trained_tokens'] / 1e3:.0f}k trained, "
            f"{cost['teacher_requests']:.0f} teacher requests, {cost['wall_s']:.0f} s per run (evaluations included)"
        )
    per_seed = ", ".join(f"{v:+.1f}" for v in e["per_seed_pp"].values())
    lines.append(
        f"effect: ZPPO - GRPO\u2020 = {e['delta_pp']:+.2f} pp on held-out accuracy, 95% CI "
        f"[{e['ci95_pp'][0]:+.2f}, {e['ci95_pp'][1]:+.2f}] (per seed {per_seed})"
    )
    for row, result in e["ablation"].items():
        lines.append(
            f"ablation: ZPPO - {row} = {result['delta_pp']:+.2f} pp, 95% CI "
            f"[{result['ci95_pp'][0]:+.2f}, {result['ci95_pp'][1]:+.2f}]"
        )
    lines.append(verdict(summary))
    return "\n".join(lines)


def verdict(summary: dict) -> str:
    """Whether the run shows the paper's effect and, where it does not, the first link of the chain that fails:
    the student uses the candidate, ZPPO gives more hard questions a signal, the trained hard questions improve
    without the candidate, the held-out questions improve."""
    m, e = summary["mechanism"], summary["effect"]
    if not summary["regime_met"]:
        return "verdict: no verdict, the regime is not met"
    bcq, plain = m["bcq_in_prompt_accuracy_hard"], m["plain_accuracy_hard"]
    if bcq is None or bcq <= plain:
        return "verdict: the student cannot use the candidate (BCQ in-prompt accuracy not above plain)"
    if e["ci95_pp"][0] > 0:
        return "verdict: ZPPO beats GRPO\u2020 on held-out questions (95% interval above 0)"
    shares = m["signal_share"]
    if shares["ZPPO"] <= shares["GRPO\u2020"]:
        return "verdict: no effect shown; ZPPO gave no more hard questions a learning signal than GRPO\u2020"
    probe = {row: summary["curves"][row]["probe"] for row in HEADLINE}
    last = max(probe["ZPPO"], key=int)
    if probe["ZPPO"][last][0] <= probe["GRPO\u2020"][last][0]:
        learned = m["per_row"]["ZPPO"].get("bcq", {})
        first, late = (
            learned.get("in_prompt_accuracy_first_quarter", 0),
            learned.get("in_prompt_accuracy_last_quarter", 0),
        )
        if late > first:
            return (
                f"verdict: no effect shown; the student learned to use the candidates (right {100 * first:.0f}% "
                f"inside BCQ prompts in the first quarter of the steps, {100 * late:.0f}% in the last) but that did "
                "not carry over to plain prompts (the probe of its hard training questions: no better than GRPO\u2020)"
            )
        return (
            "verdict: no effect shown; ZPPO's extra signal did not leave the student better than GRPO\u2020 did on "
            "its hard training questions without the candidates (the probe)"
        )
    return (
        "verdict: no effect shown; the hard training questions improved but the held-out ones not beyond the interval"
    )


# ------------------------------------------------------------------ the command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="training seeds (default 1 2 3)")
    parser.add_argument("--out", type=Path, default=None, help="default outputs/learning/<date-time>")
    parser.add_argument("--ablation", action="store_true", help="add GRPO\u2020+BCQ and GRPO\u2020+NCQ")
    parser.add_argument("--teacher", choices=("vllm", "transformers"), default="vllm", help="the teacher's server")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one torch thread each (default 2)")
    parser.add_argument("--cache-dir", type=Path, default=task.DEFAULT_CACHE, help="the fine-tuned models' cache")
    parser.add_argument(
        "--smoke", action="store_true", help="the smallest setting: the parts run, nothing is measured"
    )
    # one run, as run_all starts it
    parser.add_argument("--run", nargs=3, metavar=("ROW", "SEED", "DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--student", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--teacher-url", help=argparse.SUPPRESS)
    parser.add_argument("--teacher-model", help=argparse.SUPPRESS)
    parser.add_argument("--probe", default="", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    design = SMOKE if options.smoke else DESIGN
    if options.run:
        row, seed, directory = options.run
        probe = [key for key in options.probe.split(",") if key]
        run_one(
            row, int(seed), Path(directory), design, options.student, options.teacher_url, options.teacher_model, probe
        )
        return 0

    from servers import SERVERS, vllm_unavailable

    from zppo_trl.teacher import TeacherClient

    if options.teacher == "vllm" and vllm_unavailable():
        parser.error(f"{vllm_unavailable()}; run `make vllm-env` or pass --teacher transformers")
    out = options.out or REPO / "outputs" / "learning" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    rows = list(ROWS) if options.ablation else list(HEADLINE)
    start = time.monotonic()
    fits = None
    if design.fits is not None:
        fits = {
            "teacher": dataclasses.replace(task.TEACHER_FIT, steps=design.fits[0]),
            "student": dataclasses.replace(task.STUDENT_FIT, steps=design.fits[1]),
        }
    models = task.cached_models(options.cache_dir, fits)
    print(f"models ready ({time.monotonic() - start:.0f} s): {models['student'].parent}", flush=True)
    server = SERVERS[options.teacher](models["teacher"], log_dir=out).start()
    try:
        regime_path = out / "regime.json"
        if regime_path.exists():  # a resumed benchmark keeps its start measurement
            regime = json.loads(regime_path.read_text())
        else:
            client = TeacherClient(server.base_url, server.model)
            regime = measure_regime(models["student"], client, design, options.seeds[0])
            client.close()
            regime_path.write_text(json.dumps(regime))
        print(
            f"regime: student {100 * regime['student_plain_accuracy_start']:.1f}%, teacher "
            f"{100 * regime['teacher_accuracy']:.1f}% on the training questions; "
            f"{regime['hard_questions']} hard for the student ({time.monotonic() - start:.0f} s)",
            flush=True,
        )
        runs = [(row, seed) for seed in options.seeds for row in rows]
        run_all(runs, out, design, models, server, regime["probe"], options.jobs, options.smoke)
    finally:
        server.stop()
    summary = summarize(out, rows, options.seeds, design, regime)
    summary["wall_s"] = time.monotonic() - start
    summary["machine"] = _machine()
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(summary, out / "learning.png")
    print(console(summary))
    print(f"{out / 'summary.json'}, {out / 'learning.png'} ({summary['wall_s'] / 60:.1f} min on {summary['machine']})")
    return 0


def _machine() -> str:
    """The CPU and its core count, for every figure."""
    name = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return f"{len(os.sched_getaffinity(0))} cores of {name} ({torch.backends.cpu.get_cpu_capability()})"


if __name__ == "__main__":
    raise SystemExit(main())
