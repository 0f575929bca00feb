"""`recipes/zppo.py`: the scale YAMLs carry the paper's table, dry runs print its composition,
bad input is named, and a real run trains, checkpoints, resumes and writes its card."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from unittest import mock

import pytest
import yaml
from boxed_models import toy_rows
from transformers import AutoModelForCausalLM
from trl import ModelConfig

from zppo_trl.callbacks import read_metrics
from zppo_trl.checkpoint_state import last_complete_checkpoint
from zppo_trl.data import write_jsonl
from zppo_trl.preemption import PREEMPTED_EXIT
from zppo_trl.rank_digest import params_digest, read_rank_digests, state_digest
from zppo_trl.recipe import ScriptArguments, load_recipe

REPO = Path(__file__).resolve().parent.parent
SCALES = {"0.8b": "Qwen/Qwen3.5-0.8B", "2b": "Qwen/Qwen3.5-2B", "4b": "Qwen/Qwen3.5-4B", "9b": "Qwen/Qwen3.5-9B"}
PAPER_STEP = (
    "per rollout step: 384 new + <=96 replayed + <=96 reformulated prompts x 8 rollouts; "
    "4 optimizer updates of 96 new prompts; teacher G_T=4"
)


def _recipe(*args, timeout=300, env=None) -> subprocess.CompletedProcess:
    """`python recipes/zppo.py ARGS` in a process of its own, as a user runs it."""
    env = env or {**os.environ, "HF_HUB_OFFLINE": "1"}  # no Hub here: fail its lookups at once instead of retrying
    command = [sys.executable, "recipes/zppo.py", *map(str, args)]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@functools.cache
def _recipe_module():
    spec = importlib.util.spec_from_file_location("recipe_zppo", REPO / "recipes" / "zppo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _dry_run(*args) -> subprocess.CompletedProcess:
    """The recipe's ``main(ARGS)`` in this process, from the repository's root with the Hub offline, its output and
    exit code as `_recipe` gives them (an uncaught exception: its traceback and exit code 1, as the interpreter).

    For what returns before training (dry runs, ``--help``, bad recipes and fields, a teacher that does not
    answer): the script's process costs about 10 s of imports each time, and the script is run as a user runs it
    by the tests that train, by the Hub probe's test and by tests/test_launch.py's plans.
    """
    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.chdir(REPO),
        mock.patch.dict(os.environ, HF_HUB_OFFLINE="1"),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        warnings.catch_warnings(),
    ):
        try:
            code = _recipe_module().main([str(arg) for arg in args])
        except SystemExit as exit_:  # argparse's --help and usage errors, a run stopped with its reason
            if exit_.code is not None and not isinstance(exit_.code, int):
                print(exit_.code, file=err)  # what the interpreter prints for SystemExit("...")
            code = exit_.code if isinstance(exit_.code, int) else 1
        except Exception:  # noqa: BLE001 - what the interpreter would print and exit with
            traceback.print_exc(file=err)
            code = 1
    return subprocess.CompletedProcess(["recipes/zppo.py", *map(str, args)], code, out.getvalue(), err.getvalue())


@pytest.mark.parametrize("scale", SCALES)
def test_scale_yaml_is_the_papers_table(scale):
    from trl import TrlParser

    from zppo_trl import ZPPOConfig

    parser = TrlParser((ScriptArguments, ZPPOConfig, ModelConfig))
    script, args, model = parser.parse_args_and_config(
        ["--config", f"recipes/qwen35_{scale}.yaml", "--use_cpu", "true"]
    )
    assert model.model_name_or_path == SCALES[scale] and model.dtype == "bfloat16"
    assert args.teacher_model == "Qwen/Qwen3.5-27B-FP8"
    expected = {
        # Optimization
        "learning_rate": 1e-6, "warmup_steps": 0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
        "weight_decay": 0.1, "max_grad_norm": 1.0, "num_iterations": 1, "bf16": True, "beta": 0.0,
        # Rollouts
        "num_generations": 8, "teacher_num_generations": 4, "temperature": 1.0, "teacher_temperature": 1.0,
        "top_p": 1.0, "teacher_top_p": 1.0, "max_completion_length": 12288, "teacher_max_tokens": 12288,
        "use_vllm": True, "vllm_mode": "server",
        # GRPO backbone and recipe choices
        "epsilon": 0.2, "epsilon_high": 0.28, "delta": 10.0, "loss_type": "dapo", "num_partitions": 4,
        "advantage_normalization": "without_zero",
        # ZPPO-specific
        "hard_threshold": 0.5, "replay_fraction": 0.25, "replay_capacity": 10000, "augment_fraction": 0.25,
        "augmentations": ["bcq", "ncq"], "compression_max_tokens": 512,
        # Schedule and batching
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4, "max_steps": 800,
    }  # fmt: skip
    for name, value in expected.items():
        assert getattr(args, name) == value, name
    assert getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type) == "constant"
    assert args.save_steps % args.num_partitions == 0
    assert script.num_training_ranks == 48 and script.use_judge
    assert args.judge_extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    assert args.compression_extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    assert args.vllm_importance_sampling_correction is False and args.max_prompt_length == 4096
    # the student's context holds the longest NCQ prompt (8 candidates of 512 tokens) and a full completion
    lengths = args.context_lengths()
    assert args.vllm_max_model_length == lengths.student >= 4096 + 8 * 512 + 12288
    assert lengths.teacher >= 4096 + 2 * 12288 // 2 + 512  # the judge reads a whole response under its question
    step = args.composition(script.num_training_ranks)
    assert str(step) == PAPER_STEP and step.rollout_steps == 200 and step.max_prompts == 576


@pytest.mark.parametrize("scale", SCALES)
def test_dry_run_prints_the_papers_composition(scale):
    run = _dry_run("--config", f"recipes/qwen35_{scale}.yaml", "--dry_run")
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert PAPER_STEP in out
    assert "training ranks: 48" in out
    assert "200 rollout steps = 800 optimizer updates = 76,800 new-prompt draws" in out
    assert "vLLM server at http://127.0.0.1:8001" in out and "teacher: Qwen/Qwen3.5-27B-FP8" in out
    assert "server context: student --max-model-len 21,504 (prompt 4,096 + BCQ/NCQ block <= " in out
    assert "dry run ok; nothing was trained." in out


# recipes/rows/: the paper's name of each comparison row at 0.8B, and the fields that make it that row.
ROWS = {
    "grpo": ("GRPO", dict(augmentations=[], replay_fraction=0.0)),
    "grpo_dagger": ("GRPO\u2020", dict(augmentations=[], replay_fraction=0.25)),
    "grpo_dagger_bcq": ("GRPO\u2020+BCQ", dict(augmentations=["bcq"])),
    "grpo_dagger_ncq": ("GRPO\u2020+NCQ", dict(augmentations=["ncq"])),
    "grpo_dagger_bcq_boxed_masked": (
        "GRPO\u2020+BCQ (boxed-answer-masked)",
        dict(augmentations=["bcq"], bcq_candidate_content="boxed_masked"),
    ),
    "grpo_dagger_bcq_final_answer_only": (
        "GRPO\u2020+BCQ (final-answer-only)",
        dict(augmentations=["bcq"], bcq_candidate_content="final_answer_only"),
    ),
    "grpo_dagger_replay050": ("Replay-matched GRPO\u2020", dict(augmentations=[], replay_fraction=0.5)),
    "zppo_replay050": ("ZPPO (\u03c1_replay=0.50)", dict(replay_fraction=0.5)),
    "grpo_both": ("GRPO+Both", dict(augmentations=["bcq", "ncq"], replay_fraction=0.0)),
    "grpo_dagger_hint": ("GRPO\u2020+Hint", dict(augmentations=["hint"])),
    "grpo_dagger_prefix": ("GRPO\u2020+Prefix", dict(augmentations=["prefix"], prefix_fraction=0.4)),
    "zppo_gspo": ("ZPPO (GSPO)", dict(policy_objective="gspo", importance_sampling_level="sequence")),
    "zppo_cispo": ("ZPPO (CISPO)", dict(policy_objective="cispo", loss_type="cispo")),
    "zppo_dispo": ("ZPPO (DISPO)", dict(policy_objective="dispo")),
    "gspo_dagger": ("GSPO\u2020", dict(policy_objective="gspo", augmentations=[])),
    "cispo_dagger": ("CISPO\u2020", dict(policy_objective="cispo", augmentations=[])),
    "dispo_dagger": ("DISPO\u2020", dict(policy_objective="dispo", augmentations=[])),
    "rl_zvp_dagger": ("RL-ZVP\u2020", dict(augmentations=[], zero_variance_signal="rl_zvp")),
    "lens_dagger": ("LENS\u2020", dict(augmentations=[], zero_variance_signal="lens")),
    "relift_dagger": ("ReLIFT\u2020", dict(augmentations=[], zero_variance_signal="relift")),
    "rstg_dagger": ("RSTG\u2020", dict(augmentations=[], zero_variance_signal="rstg")),
    "grpo_care_dagger": ("GRPO-CARE\u2020", dict(augmentations=[], reward_term="grpo_care")),
    "sdpo_dagger": ("SDPO\u2020", dict(augmentations=[], policy_objective="sdpo")),
    "opsd_dagger": ("OPSD\u2020", dict(augmentations=[], policy_objective="opsd")),
    "rlkd_dagger": ("RLKD\u2020", dict(augmentations=[], reward_term="rlkd")),
    "perception_r1_dagger": ("Perception-R1\u2020", dict(augmentations=[], reward_term="perception_r1")),
    "kdrl_dagger": (
        "KDRL\u2020",
        dict(augmentations=[], policy_objective="kdrl", distill_teacher="Qwen/Qwen3.5-27B"),
    ),
    "rlad_dagger": (
        "RLAD\u2020",
        dict(augmentations=[], policy_objective="rlad", distill_teacher="Qwen/Qwen3.5-27B"),
    ),
    "correction_sft_dagger": ("Correction-SFT\u2020", dict(augmentations=["correction"])),
    "reflection_sft_dagger": ("Error-reflection-SFT\u2020", dict(augmentations=["reflection"])),
    "off_distill": (
        "Off-Distill",
        dict(augmentations=[], replay_fraction=0.0, distillation="off", distill_teacher="Qwen/Qwen3.5-27B"),
    ),
    "off_distill_dagger": (
        "Off-Distill\u2020",
        dict(augmentations=[], distillation="off", distill_teacher="Qwen/Qwen3.5-27B"),
    ),
    "on_distill": (
        "On-Distill",
        dict(augmentations=[], replay_fraction=0.0, distillation="on", distill_teacher="Qwen/Qwen3.5-27B"),
    ),
    "on_distill_dagger": (
        "On-Distill\u2020",
        dict(augmentations=[], distillation="on", distill_teacher="Qwen/Qwen3.5-27B"),
    ),
}


def test_every_row_recipe_is_the_0_8b_recipe_changed_only_where_the_row_differs(tmp_path):
    from trl import TrlParser

    from zppo_trl import ZPPOConfig

    assert sorted(p.stem for p in (REPO / "recipes/rows").glob("*.yaml")) == sorted(ROWS)
    base = yaml.safe_load((REPO / "recipes/qwen35_0.8b.yaml").read_text())
    derived = ("importance_sampling_level", "loss_type")  # set by policy_objective, never by a YAML
    for name, (variant, fields) in ROWS.items():
        merged = load_recipe(str(REPO / f"recipes/rows/{name}.yaml"))
        differs = {k: v for k, v in merged.items() if v != base.get(k) and k not in ("output_dir", "hub_model_id")}
        assert differs == {k: v for k, v in fields.items() if k not in derived and v != base.get(k)}, name
        assert merged["output_dir"] != base["output_dir"] and merged["hub_model_id"] != base["hub_model_id"], name
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(merged))
        parser = TrlParser((ScriptArguments, ZPPOConfig, ModelConfig))
        _, args, _ = parser.parse_args_and_config(["--config", str(tmp_path / f"{name}.yaml"), "--use_cpu", "true"])
        assert args.variant == variant, name
        for field_name, value in fields.items():
            assert getattr(args, field_name) == value, (name, field_name)


def test_a_row_recipe_dry_runs_through_its_base(tmp_path):
    run = _dry_run("--config", "recipes/rows/grpo_dagger_prefix.yaml", "--dry_run")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ZPPO dry run: GRPO\u2020+Prefix" in run.stdout and "response prefix alpha=0.4" in run.stdout
    assert "output_dir outputs/grpo-dagger-prefix-qwen35-0.8b" in run.stdout
    cycle = tmp_path / "a.yaml"
    cycle.write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    run = _dry_run("--config", cycle, "--dry_run")
    assert run.returncode == 2 and "form a cycle" in run.stderr, run.stderr[-2000:]
    (tmp_path / "c.yaml").write_text("base: missing.yaml\n")
    run = _dry_run("--config", tmp_path / "c.yaml", "--dry_run")
    assert run.returncode == 2 and "missing.yaml does not exist" in run.stderr, run.stderr[-2000:]


def test_an_unreachable_hub_is_asked_once_and_the_dry_run_goes_on_offline(tmp_path):
    # No network needed: the Hub's endpoint is a local port nothing listens on, the cache is empty,
    # and nothing sets HF_HUB_OFFLINE. Before the probe, each of the row's two Hub configs (the
    # student and the distillation teacher) cost five retries with a warning each (about 23 s).
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"))
    run = _recipe("--config", "recipes/rows/off_distill.yaml", "--dry_run", env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    both = run.stdout + run.stderr
    assert "Retrying" not in both and "Retry " not in both, both[-3000:]
    assert endpoint not in run.stderr, run.stderr[-3000:]  # no warning about a request to the Hub
    hub_lines = [line for line in run.stdout.splitlines() if "Hugging Face Hub" in line]
    assert len(hub_lines) == 1, run.stdout
    assert hub_lines[0].startswith(f"  down  Hugging Face Hub at {endpoint} (not reachable now"), run.stdout
    assert "the rest of this dry run is offline" in hub_lines[0]
    assert "  skip  student Qwen/Qwen3.5-0.8B: config not reachable here" in run.stdout
    assert "  skip  distill_teacher Qwen/Qwen3.5-27B: config not reachable here" in run.stdout
    assert "dry run ok; nothing was trained." in run.stdout


def test_command_line_overrides_the_yaml():
    run = _dry_run(
        "--config",
        "recipes/qwen35_0.8b.yaml",
        "--dry_run",
        "--num_training_ranks",
        "24",
        "--reformulations",
        "",
        "--replay_fraction",
        "0.5",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ZPPO dry run: Replay-matched GRPO\u2020" in run.stdout  # GRPO† at rho_replay 0.5
    assert (
        "per rollout step: 192 new + <=96 replayed + <=0 reformulated prompts x 8 rollouts; "
        "4 optimizer updates of 48 new prompts; no teacher" in run.stdout
    )


def test_bad_config_and_bad_rows_are_named(tmp_path, tiny_text_model_dir):
    config = yaml.safe_load((REPO / "recipes" / "qwen35_0.8b.yaml").read_text())
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text(yaml.safe_dump({**config, "bogus_field": 3}))
    run = _dry_run("--config", bad_yaml, "--dry_run")
    assert run.returncode != 0 and "bogus_field" in run.stderr
    # a YAML syntax error names the file, line and column (a flow mapping left open on line 2)
    broken = tmp_path / "broken.yaml"
    broken.write_text("augmentations: []\nreplay_fraction: {0.5\nseed: 1\n")
    run = _dry_run("--config", broken, "--dry_run")
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert run.returncode == 2 and len(lines) == 1, run.stderr[-2000:]
    assert re.match(rf"error: {re.escape(str(broken))}:\d+:\d+: YAML syntax error: ", lines[0]), lines

    # a bad value: one line naming the field, no traceback, a usage-error exit code
    for flags, message in (
        (["--hard_threshold", "1.5"], "error: hard_threshold must be a finite number in [0.0, 1.0], got 1.5"),
        (["--epsilon", "0.3", "--epsilon_high", "0.1"], "error: epsilon (0.3) is above epsilon_high (0.1)"),
        (["--loss_type", "grpo"], "error: loss_type='grpo' changes ZPPO's objective"),
    ):
        run = _dry_run("--config", "recipes/qwen35_0.8b.yaml", "--dry_run", *flags)
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert run.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), run.stderr[-2000:]

    # a dataset path that does not exist fails the dry run (it is not taken for a Hub id)
    run = _dry_run("--config", "recipes/qwen35_0.8b.yaml", "--dry_run", "--dataset_name", "recipes/data/nope.jsonl")
    assert (
        run.returncode == 1
        and "FAIL  dataset recipes/data/nope.jsonl: dataset 'recipes/data/nope.jsonl': no such file" in run.stdout
    )

    rows = toy_rows("text")[:4]
    rows[2] = {**rows[2], "answer": ""}
    data = tmp_path / "train.jsonl"
    write_jsonl(rows, data)
    common = [
        "--config",
        "recipes/demo.yaml",
        "--dry_run",
        "--dataset_name",
        data,
        "--model_name_or_path",
        tiny_text_model_dir,
    ]
    run = _dry_run(*common)
    assert run.returncode == 1
    assert "FAIL  dataset" in run.stdout and "row 2: field 'answer' must be a non-empty string" in run.stdout
    run = _dry_run(*common, "--skip_invalid", "true")
    assert run.returncode == 0, run.stdout
    assert "3 valid rows, 1 invalid rows would be skipped" in run.stdout
    assert (
        "per rollout step: 4 new + <=2 replayed + <=4 reformulated prompts x 4 rollouts; "
        "2 optimizer updates of 2 new prompts; teacher G_T=4" in run.stdout
    )
    assert "llama" not in run.stdout and "qwen3 (text)" in run.stdout


def test_a_missing_teacher_stops_the_run_naming_the_fields(tmp_path, tiny_text_model_dir):
    data = tmp_path / "toy.jsonl"
    write_jsonl(toy_rows("text"), data)
    run = _dry_run(
        "--config", "recipes/demo.yaml", "--dataset_name", data, "--model_name_or_path", tiny_text_model_dir,
        "--teacher_base_url", "http://127.0.0.1:9/v1", "--teacher_wait_s", "1", "--output_dir", tmp_path / "out",
        "--bf16", "false",
    )  # fmt: skip
    assert run.returncode != 0
    assert (
        "the teacher at http://127.0.0.1:9/v1" in run.stderr and "fix teacher_base_url / teacher_model" in run.stderr
    )
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


@pytest.mark.parametrize("name", ["zero2", "zero3", "fsdp"])
def test_accelerate_configs_load(name):
    from accelerate.commands.config.config_args import ClusterConfig

    config = ClusterConfig.from_yaml_file(str(REPO / "recipes" / "accelerate_configs" / f"{name}.yaml"))
    assert config.mixed_precision == "bf16" and config.num_machines == 1 and not config.use_cpu
    if name == "fsdp":
        assert config.distributed_type == "FSDP" and config.fsdp_config["fsdp_reshard_after_forward"] is True
    else:
        assert config.distributed_type == "DEEPSPEED" and config.deepspeed_config["zero_stage"] == int(name[-1])


@pytest.mark.integration
def _signal_once_logged(process: subprocess.Popen, metrics: Path, step: int, timeout: float = 600) -> None:
    """Send ``process`` SIGTERM once ``metrics`` (its metrics.jsonl) holds optimizer step ``step``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.is_file() and any(row.get("step") == step and "loss" in row for row in read_metrics(metrics)):
            process.send_signal(signal.SIGTERM)
            return
        time.sleep(0.05)
    raise AssertionError(f"step {step} was never logged (exit {process.poll()})")


def test_recipe_trains_checkpoints_resumes_and_writes_its_card(boxed_text_student_dir, boxed_teacher_server, tmp_path):
    data = tmp_path / "toy.jsonl"
    write_jsonl(toy_rows("text"), data)
    out = tmp_path / "run"
    settings = {
        "model_name_or_path": str(boxed_text_student_dir),
        "dataset_name": str(data),
        "teacher_base_url": boxed_teacher_server.base_url,
        "teacher_model": boxed_teacher_server.model,
        "use_judge": False,
        "teacher_wait_s": 60,
        "use_cpu": True, "bf16": False, "use_vllm": False, "gradient_checkpointing": False, "report_to": [],
        "num_generations": 4, "per_device_train_batch_size": 16, "gradient_accumulation_steps": 1, "num_partitions": 2,
        "max_completion_length": 32, "teacher_max_tokens": 32, "compression_max_tokens": 48,
        "replay_fraction": 0.5, "augment_fraction": 0.5, "learning_rate": 1e-4,
        "max_steps": 6, "save_strategy": "steps", "save_steps": 100, "logging_steps": 1, "seed": 0,
        "output_dir": str(out), "disable_tqdm": True,
        "shared_prompt_forward": True,  # as the demo: micro-batches of 4 groups, each prompt through the model once
        "rank_digests": True,  # the rank's weights and ZPPO state after each update (zppo_trl.rank_digest)
    }  # fmt: skip
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(settings))

    # The first run is stopped as a cluster's time limit stops it: SIGTERM once update 3 is logged, in the middle of
    # rollout step 2. Its updates finish, checkpoint-4 is written, the lock released, and it exits 75 for a requeue.
    first = subprocess.Popen(
        [sys.executable, "recipes/zppo.py", "--config", str(config)], cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _signal_once_logged(first, out / "metrics.jsonl", step=3)
    _, stderr = first.communicate(timeout=600)
    # 6: a signal that came after update 4 (a loaded machine): the stopped step is the run's last, and it ends there
    stopped = 4 if (out / "checkpoint-4").is_dir() else 6
    assert first.returncode == (PREEMPTED_EXIT if stopped < 6 else 0), stderr[-4000:]
    assert "SIGTERM received: finishing the rollout step in progress" in stderr
    assert f"stopped by a signal after {stopped} optimizer updates, all in {out / f'checkpoint-{stopped}'}" in stderr
    assert last_complete_checkpoint(str(out)) == str(out / f"checkpoint-{stopped}")
    assert not (out / "zppo.lock").exists()
    assert (out / "model.safetensors").exists() == (stopped == 6)  # no final model before the last update
    state = json.loads((out / f"checkpoint-{stopped}" / "zppo_state.json").read_text())
    assert state["counters"]["rollout_steps"] == stopped // 2 and state["buffer"]["residents"]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows if "loss" in r] == list(range(1, stopped + 1))  # every finished update kept
    # every row says which of the paper's rows this run is (ZPPO at this toy's rho_replay 0.5)
    assert {r["variant"] for r in rows} == {"ZPPO (\u03c1_replay=0.50)"}

    # The requeued job: the same command resumes from that checkpoint and finishes the run (at once where it stopped
    # at its last update).
    second = _recipe("--config", config, "--save_steps", "2", timeout=600)
    assert second.returncode == 0, second.stderr[-4000:]
    assert f"resuming from {out / f'checkpoint-{stopped}'}" in second.stderr
    resumed = json.loads((out / "checkpoint-6" / "zppo_state.json").read_text())
    assert resumed["counters"]["rollout_steps"] == 3  # the counters went on from the checkpoint
    # every forward pass shared its prompts (zppo_trl.shared_prompts): plain, replayed and BCQ/NCQ groups
    assert resumed["counters"]["shared_prompt_tokens_saved_total"] > 0
    assert resumed["counters"].get("unshared_micro_batches_total", 0) == 0
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["zppo/rollout_steps"] for r in rows if "zppo/rollout_steps" in r] == [1, 2, 3]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == sorted(set(steps)) == list(range(1, 7))  # each update once
    assert rows[-1].get("train_runtime") is not None
    # the rank's digests: one line per update across both runs, the last one the saved model and the checkpoint
    digests = read_rank_digests(out)[0]
    assert [d["step"] for d in digests] == list(range(1, 7)) and {d["host"] for d in digests} == {socket.gethostname()}
    assert digests[-1]["state"] == state_digest(resumed)
    assert digests[-1]["counters"]["bcq_total"] == resumed["counters"]["bcq_total"]
    final = AutoModelForCausalLM.from_pretrained(out)
    assert digests[-1]["params"] == params_digest(final) != digests[0]["params"]
    card = (out / "README.md").read_text()
    for text in (
        "## Training procedure", "trained with **ZPPO (\u03c1_replay=0.50)**",
        f"**Student:** the local checkpoint `{boxed_text_student_dir}`",
        f"**Teacher:** `{boxed_teacher_server.model}`", f"**Data:** the local dataset `{data}`",
        "**Schedule:** 3 rollout steps of 4 student rollouts per prompt, 6 optimizer updates",
        "| `hard_threshold` | tau | 0.5 |", "| `augment_fraction` | rho_aug | 0.5 |", "### Final metrics",
        "| rollout steps | 3 |",
        f'pipeline("text-generation", model="{out}")', "Cite ZPPO as:",
    ):  # fmt: skip
        assert text in card, text
    assert f"| BCQ instances | {int(resumed['counters']['bcq_total'])} |" in card
    assert "None" not in card.split("## Citations")[0]
    assert {"trl", "grpo", "zppo"} <= set(yaml.safe_load(card.split("---")[1])["tags"])  # the trainer's own tags

    plot = subprocess.run(
        [sys.executable, "recipes/demo/plot_run.py", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert plot.returncode == 0, plot.stderr
    counters = resumed["counters"]
    totals = f"bcq: {int(counters['bcq_total'])}, ncq: {int(counters['ncq_total'])}"
    assert (
        f"replay buffer: {len(resumed['buffer']['residents'])} residents; admitted: {int(counters['admitted_total'])}"
        in plot.stdout
    )
    assert totals in plot.stdout
    for kind in ("bcq", "ncq"):  # groups trained, with signal, and the in-prompt accuracy with its sample size
        trained, signal = int(counters[f"{kind}_trained_total"]), int(counters[f"{kind}_signal_total"])
        right, rollouts = int(counters[f"{kind}_correct_total"]), int(counters[f"{kind}_rollouts_total"])
        assert rollouts == 4 * trained and signal <= trained
        line = f"{kind.upper()}: {trained} groups trained, {signal} with signal; in-prompt "
        assert line + (f"{right}/{rollouts} right" if rollouts else "no rollouts") in plot.stdout
    png = out / "zppo_run.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_help_lists_the_zppo_fields_first():
    run = _dry_run("--help")
    assert run.returncode == 0, run.stderr[-2000:]
    titles = [line[:-1] for line in run.stdout.splitlines() if line and not line[0].isspace() and line.endswith(":")]
    assert titles[:5] == [
        "ZPPO (zppo_trl.ZPPOConfig)", "this script (recipes/zppo.py)", "TRL fields at the paper's values",
        "the student (trl.ModelConfig)", "training (trl.GRPOConfig, transformers.TrainingArguments)",
    ]  # fmt: skip
    zppo = run.stdout.split("ZPPO (zppo_trl.ZPPOConfig):")[1].split("this script (recipes/zppo.py):")[0]
    assert "--hard_threshold" in zppo and "--teacher_base_url" in zppo and "--learning_rate" not in zppo
    script = run.stdout.split("this script (recipes/zppo.py):")[1].split("TRL fields at the paper's values:")[0]
    assert "--use_judge" in script and "--no_use_judge" in script and "--dry_run" in script


@pytest.mark.parametrize(
    ("recipe", "family", "trainable"),
    [("internvl35_2b", "InternVL3.5-2B", True), ("ovis25_2b", "Ovis2.5-2B", False)],
)
def test_a_backbone_recipe_names_its_family_and_keeps_the_2b_recipe(recipe, family, trainable):
    run = _dry_run("--config", f"recipes/{recipe}.yaml", "--dry_run")
    assert f"ZPPO dry run: ZPPO ({family})" in run.stdout, run.stdout + run.stderr[-2000:]
    assert PAPER_STEP in run.stdout  # the Qwen3.5-2B recipe's composition, unchanged
    if trainable:
        assert run.returncode == 0, run.stderr[-3000:]
    else:  # Ovis2.5 is remote code only: the dry run says so instead of training it as something else
        assert (
            run.returncode != 0
            and "FAIL  student AIDC-AI/Ovis2.5-2B (ovis2_5): Ovis2.5 has no transformers" in run.stdout
        )


def test_a_dataset_with_no_valid_row_fails_before_training_in_one_line(tmp_path):
    """Every row invalid and --skip_invalid: the run stops before loading anything with one `error:` line naming
    the dataset and the reason (it used to train 0 updates and exit 0), and the dry run fails it."""
    bad = tmp_path / "bad.jsonl"
    row = dict(id="q0", question="What is 1 + 1?", images=["missing.png"], answer=2, source="s", subdataset="d")
    bad.write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "q1", "question": ""}) + "\n")
    common = ("--config", "recipes/demo.yaml", "--dataset_name", bad, "--skip_invalid", "true", "--use_cpu", "true")
    run = _dry_run(*common)
    lines = [line for line in run.stderr.splitlines() if line.startswith("error:")]  # besides progress bars
    assert run.returncode == 2 and len(lines) == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert lines[0].startswith(f"error: dataset {bad}: no valid row left: all 2 rows are invalid"), lines
    assert "no such image file" in lines[0]
    run = _dry_run(*common, "--dry_run")
    assert run.returncode == 1 and f"FAIL  dataset {bad}: no valid row left" in run.stdout, run.stdout[-3000:]
