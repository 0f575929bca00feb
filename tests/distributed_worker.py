"""One rank of 2-process ZPPO runs, for ``tests/two_ranks.py`` (launched by `accelerate launch`).

Usage::

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no --main_process_port PORT tests/distributed_worker.py OUTDIR RUNS.json

(``--multi_gpu`` selects accelerate's torchrun launcher; the config sets ``use_cpu=True``, so
the processes run on CPU with the gloo backend. ``--cpu`` would start one process only.)

``RUNS.json`` is a list of runs, trained one after the other in the same two processes (a launch
costs each rank ten seconds of a core in imports alone): ``{"name", "mode", "model_dir",
"max_steps"}`` and, for the modes that ask a teacher, ``"teacher_url"``/``"teacher_model"``;
``"distill_teacher"`` (on-distill: the teacher directory loaded for its logits); ``"student_url"`` with
``"student_context"`` (that server's ``--max-model-len``); ``"signal_rank"`` with ``"signal_step"`` (that rank, and
only that one, sends itself SIGTERM when that optimizer step ends, as a cluster's time limit would; with
``"signal_at_begin"`` as it begins, before its rollout step generates) and ``"grace"`` (preemption_grace_seconds);
``"resume_of"``
(the name of an earlier run of the launch whose output_dir this run resumes from, its newest whole checkpoint).
Mode ``grpo`` trains GRPO† (``augmentations=[]``) on synthetic questions with a deterministic
pseudo-random reward; ``zppo`` trains with BCQ/NCQ against a teacher server on the boxed toy
questions of :mod:`boxed_models`, graded by the real boxed reward; ``correction`` and
``on-distill`` are those rows on the same questions. ``student_url`` generates the rollouts on
that student vLLM server (TRL's server mode, weights synced through shared memory) instead of
in the trainer: both ranks share it.

Each rank writes ``OUTDIR/NAME/rank{R}.json`` per run with what the tests compare across ranks:
the buffer residents, counters and ZPPO RNG state at the end, per rollout step the groups this
rank scored in each round (kind and key), the micro-batches it built (rows, padding rows,
skipped) and the ZPPO metrics of the step, per micro-step the rows it trained on, per optimizer
step a parameter checksum, and the final parameter checksum.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import signal
import sys
import zlib
from collections.abc import Mapping
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from zppo_trl import ZPPOConfig, ZPPOTrainer
from zppo_trl.rewards import completion_text

QUESTIONS = [
    dict(id=f"q{i:02d}", question=f"What is {i} + {i}?", images=[], answer=str(2 * i), source="toy", subdataset="sum")
    for i in range(24)
]


class CoinReward:
    """A pseudo-random 0/1 reward, a pure function of (question id, rollout index, completion).

    Question ``qNN`` is rewarded with probability ``(NN % 4) / 4``, so groups mix trivial
    and non-trivial ones and about half the questions are hard (admitted to the buffer).
    """

    __name__ = "coin"

    def __call__(self, completions, id, **kwargs):
        rewards = []
        for n, (key, completion) in enumerate(zip(id, completions)):
            coin = zlib.crc32(f"{key}|{n}|{completion_text(completion)}".encode()) % 1000 / 1000
            rewards.append(float(coin < (int(key[1:]) % 4) / 4))
        return rewards


def param_checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(p.detach().cpu().contiguous().float().numpy().tobytes())
    return digest.hexdigest()


class ParamChecksums(TrainerCallback):
    """A parameter checksum after every optimizer step."""

    def __init__(self):
        self.trainer = None
        self.after: list[str] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.after.append(param_checksum(self.trainer.model))


def _describe(micro: Mapping) -> dict:
    if micro.get("zppo_skip"):
        return {"skip": True}
    mask = micro["completion_mask"]
    return {
        "skip": False,
        "rows": int(mask.size(0)),
        "padding": int((mask.sum(dim=1) == 0).sum()),
        "tokens": int(mask.sum()),
        "num_items_in_batch": float(micro["num_items_in_batch"]),
    }


def instrument(trainer: ZPPOTrainer) -> dict:
    """Wrap the rollout step, the scoring rounds and the per-micro-step inputs; return the record."""
    record: dict = {"rollout_steps": [], "micro_steps": []}
    current: dict = {}
    rollout_step, generate_round, prepare_inputs = (
        trainer._rollout_step,
        trainer.rounds.play,
        trainer._prepare_inputs,
    )

    def _rollout_step(inputs):
        current.clear()
        current.update(
            buffer_before=trainer.replay_buffer.residents(), rounds=[], global_step=trainer.state.global_step
        )
        micro_batches = rollout_step(inputs)
        zppo = {
            k.removeprefix("zppo/"): v[-1]
            for k, v in trainer._metrics["train"].items()
            if k.startswith("zppo/") and not k.startswith("zppo/time") and v
        }
        # teacher/* are this rank's own client statistics (requests, failures, latency), not decisions
        zppo = {k: v for k, v in zppo.items() if not k.startswith("teacher/") and k != "teacher_wait_fraction"}
        record["rollout_steps"].append(
            {**current, "micro_batches": [_describe(m) for m in micro_batches], "metrics": zppo}
        )
        return micro_batches

    def _generate_round(groups, name, early=None):
        current["rounds"].append([[g.kind, g.row["id"], g.block is not None] for g in groups])
        return generate_round(groups, name, early)

    def _prepare_inputs(generation_batch):
        out = prepare_inputs(generation_batch)
        if not isinstance(generation_batch, Mapping) and trainer.model.training:
            record["micro_steps"].append(_describe(out))
        return out

    trainer._rollout_step, trainer.rounds.play, trainer._prepare_inputs = (
        _rollout_step,
        _generate_round,
        _prepare_inputs,
    )
    return record


def _settings(run: dict, outdir: Path) -> tuple[dict, list[dict], object]:
    """The run's ZPPOConfig fields, its rows and its reward function."""
    settings = dict(
        output_dir=str(outdir / "trainer"),
        use_cpu=True,
        bf16=False,
        report_to=[],
        # 4 rows per micro-batch x 3 partitions = 12 rows per rank = 3 questions per rank at G=4:
        # |X_new| = 6 over both ranks, so up to 3 replays, which two ranks cannot split evenly.
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        num_partitions=3,
        gradient_accumulation_steps=1,
        replay_fraction=0.5,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        max_steps=run["max_steps"],
        preemption_grace_seconds=run.get("grace", 600.0),
        seed=0,
        data_seed=0,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    if run["mode"] == "grpo":
        settings.update(augmentations=[])
        rows, reward = QUESTIONS, CoinReward()
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from boxed_models import toy_rows

        from zppo_trl.rewards import boxed_accuracy_reward

        settings.update(
            augmentations={"zppo": ["bcq", "ncq"], "correction": ["correction"], "on-distill": []}[run["mode"]],
            learning_rate=1e-4,  # keep the boxed student answering in format for the next steps
            augment_fraction=0.5,  # at most floor(0.5 * 6) = 3 instances per step: an odd number to deal over 2 ranks
            teacher_base_url=run["teacher_url"],
            teacher_model=run["teacher_model"],
            teacher_num_generations=4,
            teacher_max_tokens=32,
            compression_max_tokens=32,
            max_completion_length=32,
        )
        if run["mode"] == "on-distill":
            settings.update(distillation="on", distill_teacher=run["distill_teacher"])
        if run["mode"] == "zppo":  # each rank counts its own shared-prompt savings; check_zppo_run: the sums agree
            settings.update(shared_prompt_forward=True)
        rows, reward = toy_rows("text"), boxed_accuracy_reward
    if run.get("student_url"):
        settings.update(
            use_vllm=True, vllm_mode="server", vllm_server_base_url=run["student_url"], vllm_server_timeout=60,
            vllm_max_model_length=run["student_context"], max_prompt_length=1024,
        )  # fmt: skip
    return settings, rows, reward


class SignalAt(TrainerCallback):
    """This process sends itself SIGTERM when optimizer step ``step`` ends, or (``begin``) as it begins: before its
    rollout step generates, where that is the step's first update."""

    def __init__(self, step: int, begin: bool = False):
        self.step, self.begin = step, begin

    def on_step_begin(self, args, state, control, **kwargs):
        if self.begin and state.global_step == self.step - 1:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_step_end(self, args, state, control, **kwargs):
        if not self.begin and state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


def train_and_record(run: dict, outdir: Path) -> None:
    """Train ``run`` on this rank; write its record to ``outdir/rank{R}.json``."""
    settings, rows, reward = _settings(run, outdir.parent / run["resume_of"] if run.get("resume_of") else outdir)
    model = AutoModelForCausalLM.from_pretrained(run["model_dir"])
    tokenizer = AutoTokenizer.from_pretrained(run["model_dir"])
    checksums = ParamChecksums()
    trainer = ZPPOTrainer(
        model=model,
        reward_funcs=reward,
        args=ZPPOConfig(**settings),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[checksums],
    )
    checksums.trainer = trainer
    if run.get("signal_rank") == trainer.accelerator.process_index:
        trainer.add_callback(SignalAt(run["signal_step"], begin=run.get("signal_at_begin", False)))
    record = instrument(trainer)
    initial = param_checksum(trainer.model)
    trainer.train(resume_from_checkpoint=True if run.get("resume_of") else None)

    acc = trainer.accelerator
    version, internal, gauss = trainer.zppo_state.rng.getstate()
    record.update(
        rank=acc.process_index,
        world=acc.num_processes,
        distributed_type=str(acc.distributed_type),
        backend=torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        residents=trainer.replay_buffer.residents(),
        counters=dict(trainer.counters),
        rng=[version, list(internal), gauss],
        initial_params=initial,
        params_after_step=checksums.after,
        final_params=param_checksum(trainer.model),
        global_step=trainer.state.global_step,
        stopped_at=trainer.preemption.stopped_at,
        # the main process's client to the student server (None where rollouts come from the trainer)
        student_client=type(getattr(getattr(trainer, "vllm_generation", None), "vllm_client", None)).__name__,
        # each rank's own client for the second round's prompts sent as they were built, and how many it sent
        early_client=type(getattr(trainer.early_rollouts, "client", None)).__name__,
        sent_early=getattr(trainer.early_rollouts, "sent_total", 0),
        log_history=[
            {
                k: v
                for k, v in h.items()
                if k.startswith("zppo/")
                and not k.startswith(("zppo/time", "zppo/teacher/"))
                and k != "zppo/teacher_wait_fraction"
            }
            for h in trainer.state.log_history
        ],
    )
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / f"rank{acc.process_index}.json").write_text(json.dumps(record, indent=1, sort_keys=True))
    acc.wait_for_everyone()  # both ranks are done with this run before either starts the next


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("outdir")
    parser.add_argument("runs", help="a JSON file: the runs to train, in order (see the module docstring)")
    cli = parser.parse_args()
    for run in json.loads(Path(cli.runs).read_text()):
        train_and_record(run, Path(cli.outdir) / run["name"])
        gc.collect()  # the finished trainer and its model
    # Skip interpreter teardown: every result is on disk and both ranks are past the barrier. At
    # teardown a rank sometimes aborts in C++ ("terminate called without an active exception",
    # SIGABRT), with or without destroy_process_group first (seen in CI with both), which would
    # fail a run whose records are complete (pytorch/pytorch#190489).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
