"""One fingerprint per row: what every recipe in recipes/rows/ trains, to compare a refactor against main.

    python tools/row_fingerprints.py --save            # on main: record every row's fingerprint for this CPU
    python tools/row_fingerprints.py --check           # after the change: the same rows, compared
    python tools/row_fingerprints.py --rows grpo_dagger zppo_gspo --check

Each row is the paper's recipe (recipes/qwen35_0.8b.yaml; the row ``zppo``) changed by its file in recipes/rows/,
trained for two seeded rollout steps at a tiny size: the tests' boxed text student (tests/boxed_models.py, from
its cache or trained into it), the boxed teacher on vLLM's CPU engine on 127.0.0.1 (the production server), and
the boxed teacher loaded next to the student where the row loads its teacher there (``distill_teacher``). The
fingerprint of a run is:

- ``weights``: SHA-256 of every parameter's bytes, in name order, after the last update;
- ``buffer``: SHA-256 of the replay buffer's state (residents, counters);
- ``logged``: SHA-256 of every value the run logged, step by step, except those that measure the machine (times,
  rates, memory, :data:`MACHINE`), with the number of values it covers;
- ``teacher_requests``: the requests the run sent the teacher server, in all (per step they depend on timing);
- ``loss``: the logged losses, rounded, to read a difference by eye.

Two runs of one row on one machine give equal fingerprints only if the teacher's replies are equal, so the tool
decodes the teacher greedily (``teacher_temperature: 0``, one reply per question: ``teacher_num_generations: 1``);
every other setting is the row's. Float arithmetic differs between CPUs (AVX2, AVX-512, AMX), and the boxed models
are fitted on the machine, so fingerprints are kept per CPU capability, in ``tools/row_fingerprints/<capability>.json``
with the machine and library versions they were recorded on: on another machine, record main's first with ``--save``
(``--store`` a file of your own). ``--check`` says when the recorded machine is not this one, and exits 1 naming each
row that differs, and how.

It needs ``make env`` and ``make vllm-env``. Not part of ``make test``: the 47 rows take about 4 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAPER = REPO / "recipes" / "qwen35_0.8b.yaml"
ROWS_DIR = REPO / "recipes" / "rows"
STORE = Path(__file__).resolve().parent / "row_fingerprints"
sys.path.insert(0, str(REPO / "tests"))  # the boxed models and the server launcher the tests use

# Logged values that measure the machine, not the training: left out of ``logged``.
MACHINE = re.compile(r"seconds|_s$|time|runtime|per_second|rss|memory|wait|throughput|flos")
# Counted in the step in which a request returns, which the teacher's prefetch during the updates makes a matter of
# timing: compared as the run's total (``teacher_requests``), not per step.
TEACHER_REQUESTS = "zppo/teacher/requests"
# The tiny run: G = 4 and two partitions unless the row sets its own, four new questions per partition, short
# responses; the row's shape is kept, its size is not (see :func:`tiny_shape`).
TINY = dict(
    use_cpu=True, bf16=False, report_to=[], save_strategy="no", seed=0, data_seed=0, disable_tqdm=True,
    logging_steps=1, learning_rate=1e-4, num_generations=4, num_partitions=2, max_completion_length=32,
    max_prompt_length=1024, teacher_max_tokens=32, compression_max_tokens=48, gradient_checkpointing=False,
    teacher_temperature=0.0, teacher_num_generations=1,  # one greedy reply: the same replies on every run
    rlkd_gsrm_max_tokens=256,  # a decomposition within the server's 4,096-token context
)  # fmt: skip


def rows() -> dict[str, Path]:
    """Every row by name: ``zppo`` (the paper's recipe itself) and each file in recipes/rows/ (budget/ included)."""
    found = {"zppo": PAPER}
    for path in sorted(ROWS_DIR.rglob("*.yaml")):
        found[path.relative_to(ROWS_DIR).with_suffix("").as_posix()] = path
    return found


def row_fields(path: Path) -> dict:
    """The fields ``path`` changes from the paper's recipe (:func:`zppo_trl.recipe.recipe_changes`), with
    ``distill_teacher`` True where the row loads its teacher next to the student (the boxed teacher goes there)."""
    from zppo_trl.recipe import recipe_changes

    changed = recipe_changes(path, PAPER)
    if changed.get("distill_teacher"):
        changed["distill_teacher"] = True
    return changed


def questions() -> list[dict]:
    """The tests' toy questions, every other one with two visual annotations (what a perception reward reads)."""
    from boxed_models import toy_rows

    from zppo_trl.terms.perception_r1 import ANNOTATIONS

    rows = toy_rows("text")
    for i, row in enumerate(rows):
        row[ANNOTATIONS] = [f"the question asks about {row['id']}", "a red circle"] if i % 2 == 0 else []
    return rows


def tiny_shape(settings: dict) -> dict:
    """Two rollout steps of four new questions per partition, one micro-batch per update, for the row's G_S and I
    (a budget row changes them: recipes/rows/budget/)."""
    return dict(
        per_device_train_batch_size=4 * settings["num_generations"],
        gradient_accumulation_steps=1,
        max_steps=2 * settings["num_partitions"],
        corpus_passes=1,
    )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def fingerprint(name: str, path: Path, student: Path, teacher: Path, server, out: Path) -> dict:
    """Train row ``name`` (its recipe at ``path``) for two rollout steps; its fingerprint."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zppo_trl import ZPPOConfig, ZPPOTrainer

    fields = row_fields(path)
    if fields.pop("distill_teacher", False):
        fields["distill_teacher"] = str(teacher)
    settings = {**TINY, **fields, "output_dir": str(out / re.sub(r"\W", "-", name))}
    settings.update(tiny_shape(settings))
    settings.update(teacher_base_url=server.base_url, teacher_model=server.model)
    trainer = ZPPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(student),
        args=ZPPOConfig(**settings),
        train_dataset=Dataset.from_list(questions()),
        processing_class=AutoTokenizer.from_pretrained(student),
    )
    trainer.train()
    weights = hashlib.sha256()
    for param_name, param in sorted(trainer.model.named_parameters()):
        weights.update(param_name.encode())
        weights.update(param.detach().to(torch.float32).contiguous().numpy().tobytes())
    history = trainer.state.log_history
    logged = [{k: v for k, v in e.items() if not MACHINE.search(k) and k != TEACHER_REQUESTS} for e in history]
    return {
        "weights": weights.hexdigest()[:16],
        "buffer": _sha(json.dumps(trainer.replay_buffer.state_dict(), sort_keys=True, default=str).encode()),
        "logged": _sha(json.dumps(logged, sort_keys=True, default=str).encode()),
        "logged_values": sum(len(entry) for entry in logged),
        "teacher_requests": sum(entry.get(TEACHER_REQUESTS, 0) for entry in history),
        "loss": [round(entry["loss"], 6) for entry in logged if "loss" in entry],
    }


def capability() -> str:
    """The CPU capability torch runs at (AVX2, AVX512, ...): what a fingerprint holds for."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def alike(measured: dict) -> list[list[str]]:
    """Rows whose tiny runs train the same weights: a change to what tells them apart is not seen by this tool
    (a budget row's schedule, a candidate content that drops every greedy candidate, a term whose judge gets no
    verdict it can read from the boxed teacher)."""
    by_weights: dict[str, list[str]] = {}
    for name, print_ in measured.items():
        by_weights.setdefault(print_["weights"], []).append(name)
    return [names for names in by_weights.values() if len(names) > 1]


def machine() -> str:
    """The CPU, its capability and the library versions the fingerprints were recorded with."""
    import platform

    import torch
    import transformers
    import trl

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}"
    return f"{cpu} ({capability()}), {versions}"


def compare(recorded: dict, measured: dict) -> list[str]:
    """One line per row whose fingerprint differs from the recorded one, naming the parts that differ."""
    lines = []
    for name, print_ in measured.items():
        if name not in recorded:
            lines.append(f"{name}: no recorded fingerprint (record main's with --save)")
            continue
        parts = ("weights", "buffer", "logged", "teacher_requests")
        differs = [part for part in parts if recorded[name][part] != print_[part]]
        if differs:
            lines.append(f"{name}: {', '.join(differs)} differ (loss {recorded[name]['loss']} -> {print_['loss']})")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", help="these rows only (default: every row)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--save", action="store_true", help="record the fingerprints (merged into the store)")
    action.add_argument("--check", action="store_true", help="compare with the recorded fingerprints")
    parser.add_argument("--store", type=Path, default=None, help="default tools/row_fingerprints/<capability>.json")
    options = parser.parse_args(argv)

    from boxed_models import boxed_model
    from servers import VLLMServer, vllm_unavailable
    from tqdm import tqdm

    every = rows()
    chosen = options.rows or list(every)
    unknown = [name for name in chosen if name not in every]
    if unknown:
        parser.error(f"no row {unknown}; the rows: {', '.join(every)}")
    store = options.store or STORE / f"{capability()}.json"
    stored = json.loads(store.read_text()) if store.exists() else {"machine": None, "rows": {}}
    recorded = stored["rows"]
    if options.check and not recorded:
        parser.error(f"no fingerprints recorded in {store}: record main's first with --save on this machine")
    if options.check and stored["machine"] != machine():
        print(f"recorded on {stored['machine']}, checked on {machine()}: record main's here first if rows differ")
    warnings.filterwarnings("ignore", message="rlkd_gsrm_max_tokens=.* has no effect")  # TINY's, on every row
    reason = vllm_unavailable()
    if reason:
        parser.error(f"the teacher runs on vLLM's CPU engine: {reason}")

    student, teacher = boxed_model("student", "text"), boxed_model("teacher", "text")
    began = time.monotonic()
    measured: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="row-fingerprints-") as tmp:
        server = VLLMServer(teacher, log_dir=Path(tmp)).start()
        try:
            for name in tqdm(chosen, desc="rows", unit="row"):
                measured[name] = fingerprint(name, every[name], student, teacher, server, Path(tmp))
                tqdm.write(f"{name}: {measured[name]['weights']} loss {measured[name]['loss']}")
        finally:
            server.stop()
    print(f"{len(measured)} rows in {time.monotonic() - began:.0f} s, CPU capability {capability()}")
    for names in alike(measured):
        print(f"the same weights, not told apart here: {', '.join(names)}")
    if options.save:
        store.parent.mkdir(parents=True, exist_ok=True)
        about = {"machine": machine(), "rows": {**recorded, **measured}}
        store.write_text(json.dumps(about, indent=1, sort_keys=True) + "\n")
        print(f"recorded in {store}")
        return 0
    differences = compare(recorded, measured)
    for line in differences:
        print(line)
    print(f"{len(measured) - len(differences)} of {len(measured)} rows as recorded")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
