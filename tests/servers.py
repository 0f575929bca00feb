"""The servers the tests and benchmarks start: real OpenAI-compatible processes on 127.0.0.1.

`Server` is `transformers serve` (in this environment), `VLLMServer` vLLM's CPU engine (from the environment
`make vllm-env` builds; the production teacher server), `VLLMStudentServer` vLLM as the student's rollout
server in TRL's server mode. A plain module, no pytest: conftest.py builds its fixtures on it and the scripts
under benchmarks/ import it in environments without pytest (the demo's, for bench_memory.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT = 180.0

# `transformers serve`; for a VL checkpoint (saved as a standard Qwen3VLProcessor) the standard
# class resolves to the image-only one first: torchvision is missing here, so the standard class
# cannot be built and the server would treat the tiny VLM as text-only (silently dropping images).
# With `--raw-replies` the server sends the reply's raw decode, as vLLM without a reasoning parser
# (production) does: transformers >= 5.23 parses a Qwen reply into `reasoning_content` and strips the
# whitespace around it, and the tiny boxed models, trained on exact strings, then read the teacher's
# drafts back in a form they never saw. The client's handling of a split reply has its own test.
_LAUNCHER = """
import json, pathlib, sys
if "vision_config" in json.loads((pathlib.Path(sys.argv[1]) / "config.json").read_text()):
    import transformers.models.qwen3_vl as qwen3_vl
    from zppo_trl.processing import ImageOnlyQwen3VLProcessor
    qwen3_vl.Qwen3VLProcessor = ImageOnlyQwen3VLProcessor  # what AutoProcessor looks the name up in
if "--raw-replies" in sys.argv:
    sys.argv.remove("--raw-replies")
    try:
        import transformers.cli.serving.utils as serving_utils
        serving_utils._RESPONSE_TEMPLATE_FALLBACKS = {}  # no template: the raw decode is the content
    except ImportError:  # releases before the response parser send the raw decode anyway
        pass
from transformers.cli.transformers import main
sys.argv = ["transformers", "serve", *sys.argv[1:]]
sys.exit(main())
"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """One `transformers serve` process for ``model_dir`` on 127.0.0.1:``port``."""

    name = "transformers serve"

    def __init__(
        self,
        model_dir: str | Path,
        port: int | None = None,
        log_dir: str | Path | None = None,
        split_reasoning: bool = False,
    ):
        self.model_dir = Path(model_dir)
        self.split_reasoning = split_reasoning  # True: the server's own reply parser (reasoning_content) stays on
        self.port = port or free_port()
        self.log_dir = Path(log_dir or self.model_dir.parent)
        self.log_path = self.log_dir / f"serve-{self.port}.log"
        self.process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model(self) -> str:
        """The model name requests must carry (the server is pinned to this directory)."""
        return str(self.model_dir)

    def start(self, timeout: float = STARTUP_TIMEOUT) -> Server:
        """Start the process and return once ``/health`` answers 200 (raises with the log tail otherwise)."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError(f"server on port {self.port} is already running")
        (self.log_dir / "hf-cache").mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.environment(), start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} did not become healthy in {timeout:.0f}s:\n{self.log_tail()}")

    def command(self) -> list[str]:
        """The server's command line."""
        command = [
            sys.executable,
            "-c",
            _LAUNCHER,
            str(self.model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        return (
            command + ["--device", "cpu", "--log-level", "info"] + ([] if self.split_reasoning else ["--raw-replies"])
        )

    def environment(self) -> dict[str, str]:
        """The server's environment: CPU only, the Hub offline."""
        return dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            HF_HUB_CACHE=str(self.log_dir / "hf-cache"),  # an empty cache keeps /v1/models working
            CUDA_VISIBLE_DEVICES="",
            # One intra-op thread: with more, concurrent requests to a tiny model oversubscribe the
            # cores and throughput collapses (about 5 req/s at 16 in flight on 2 cores, 80 with this).
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        )

    def healthy(self) -> bool:
        """Whether ``GET /health`` answers 200 now."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def kill(self) -> None:
        """SIGKILL the server's process group: a crash, not a shutdown."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; a no-op when not running."""
        if self.process is None or self.process.poll() is not None:
            return
        self._signal(signal.SIGTERM, wait=10.0)
        if self.process.poll() is None:
            self.kill()

    def restart(self, timeout: float = STARTUP_TIMEOUT) -> Server:
        """Stop (if running) and start again on the same port."""
        self.stop()
        return self.start(timeout)

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _signal(self, sig: int, wait: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, sig)  # the server's own session: start_new_session=True
        except ProcessLookupError:
            pass
        try:
            self.process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


def stop_group(pid: int, wait: float = 10.0) -> None:
    """SIGTERM the process group of the server whose process is ``pid`` (started with start_new_session), and
    SIGKILL what is left after ``wait`` s: for a server another process started, so no `Server.stop` can wait on it."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)  # what did not exit in time, and any child left in the group
    except ProcessLookupError:
        pass


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: not gone, and not a zombie that only its parent can reap."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)  # where there is no /proc
        except OSError:
            return False
        return True


# vLLM's CPU engine lives in an environment of its own (`make vllm-env`): it pins its own torch
# and transformers. ZPPO_VLLM_PYTHON points elsewhere.
VLLM_PYTHON = Path(os.environ.get("ZPPO_VLLM_PYTHON", REPO_ROOT / ".venv-vllm" / "bin" / "python"))


def vllm_unavailable(python: Path = VLLM_PYTHON, log: Path = REPO_ROOT / ".venv-vllm.log") -> str | None:
    """Why a vLLM server cannot start here, or None when it can (quoting the install's error line)."""
    if python.exists() and (python.parent.parent / ".installed").exists():
        return None
    errors = (
        [line for line in log.read_text(errors="replace").splitlines() if line.startswith("error:")]
        if log.exists()
        else []
    )
    why = f": {errors[-1]} (see {log.name})" if errors else f" (`make vllm-env` was not run, or see {log.name})"
    return f"vLLM's CPU build is not installed at {python}{why}"


# vLLM's own switch: the model worker runs inside the engine-core process instead of a third process that
# imports vLLM and torch once more. A start takes 27 s instead of 48 s on 2 idle cores; the HTTP API, the
# engine and the worker extension are the same code. Every vLLM server the tests start has it, serve_teacher.sh's
# included, but for serve_student.sh's, whose test checks the worker's own core binding (test_launch.py).
VLLM_WORKER_IN_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


class VLLMServer(Server):
    """vLLM's OpenAI-compatible server (CPU engine) for ``model_dir``: the production teacher server.

    Its CPU attention needs a head_dim it has kernels for (the tiny models use 64); its
    Qwen-VL model code imports torchvision, which cannot be installed next to CPU torch here,
    so it serves text models only. ``n`` is honoured (no top-up requests).
    """

    name = "vLLM server"

    def command(self) -> list[str]:
        # vLLM's server module, as serve_teacher.sh --cpu runs it (recipes/launch/common.sh: why not `vllm serve`)
        return [
            str(VLLM_PYTHON), "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(self.model_dir),
            "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", "4096", "--seed", "0",
            # float32 as the tiny models were trained; eager mode starts in about 16 s instead of 27 s
            "--dtype", "float32", "--enforce-eager",
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return dict(
            os.environ,
            HF_HUB_OFFLINE="1",
            HF_HUB_CACHE=str(self.log_dir / "hf-cache"),
            CUDA_VISIBLE_DEVICES="",
            # KV cache in GiB: on CPU, vLLM otherwise reserves 92% of the NUMA node's memory and
            # refuses to start when other processes hold some of it.
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_NO_USAGE_STATS="1",
            **VLLM_WORKER_IN_ENGINE,
        )


class LaunchedVLLMServer(VLLMServer):
    """`VLLMServer` as a user starts the teacher on a CPU: ``recipes/launch/serve_teacher.sh --cpu``, which starts
    the server in the background (in this process group: ``pid`` is the script's, the group's id), waits for
    ``/health`` and exits 0. The script's own output is ``log_path``; the server's log is ``server_log_path``.
    The same server command line and environment as `VLLMServer`."""

    name = "serve_teacher.sh --cpu"
    script = REPO_ROOT / "recipes" / "launch" / "serve_teacher.sh"

    @property
    def server_log_path(self) -> Path:
        return self.log_dir / f"serve-{self.port}.vllm.log"

    def command(self) -> list[str]:
        served = super().command()
        extra = served[served.index("--seed") :]  # what the script has no option for: seed, dtype, eager mode
        return [
            "bash", str(self.script), "--cpu", "--model", str(self.model_dir), "--host", "127.0.0.1",
            "--port", str(self.port), "--max-model-len", served[served.index("--max-model-len") + 1],
            "--kv-cache-gib", self.environment()["VLLM_CPU_KVCACHE_SPACE"], "--timeout", str(int(STARTUP_TIMEOUT)),
            "--log", str(self.server_log_path), "--", *extra,
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return dict(super().environment(), VLLM_PYTHON=str(VLLM_PYTHON))

    def start(self, timeout: float = STARTUP_TIMEOUT) -> Server:
        """Run the script; return once it has exited 0 (the server answers), raise with both logs' ends otherwise."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(), cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, env=self.environment(),
                start_new_session=True,
            )  # fmt: skip
        try:
            code = self.process.wait(timeout=timeout + 30)
        except subprocess.TimeoutExpired:
            code = None
        if code != 0 or not self.healthy():
            self.stop()
            raise RuntimeError(f"{self.name} exited with {code}:\n{self.log_tail()}")
        return self

    def stop(self) -> None:
        """SIGTERM the script's process group (the server and its engine), then SIGKILL it: the group's leader, the
        script, has exited, so `stop_group` has no process to wait on and sends both at once."""
        if self.process is not None:
            stop_group(self.process.pid)
            self.process = None

    def kill(self) -> None:
        raise NotImplementedError("a launched server is the session's: start a VLLMServer to kill one")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            server = self.server_log_path.read_text(errors="replace")[-chars:]
        except OSError:
            server = ""
        return super().log_tail(chars) + ("\n--- the server's log ---\n" + server if server else "")


class VLLMStudentServer(VLLMServer):
    """vLLM's CPU server as the student's rollout server (TRL's server mode): dev mode and the
    shared-memory reload extension (``zppo_trl.vllm_worker``), the flags TRL's client needs, and a
    context of ``max_model_len`` tokens."""

    name = "student vLLM server"

    def __init__(self, model_dir: str | Path, port: int | None = None, log_dir: str | Path | None = None,
                 max_model_len: int = 4096):  # fmt: skip
        super().__init__(model_dir, port, log_dir)
        self.max_model_len = max_model_len

    @property
    def root_url(self) -> str:
        """What TRL's ``vllm_server_base_url`` takes (no ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("--max-model-len") + 1] = str(self.max_model_len)
        return command + [
            "--worker-extension-cls", "zppo_trl.vllm_worker.SharedMemoryWeightReload",
            "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
        ]  # fmt: skip

    def environment(self) -> dict[str, str]:
        return dict(
            super().environment(),
            VLLM_SERVER_DEV_MODE="1",  # /collective_rpc and /server_info
            PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        )


class LaunchedVLLMStudentServer(LaunchedVLLMServer):
    """`VLLMStudentServer` as a user starts the student's rollout server on a CPU: ``recipes/launch/serve_student.sh
    --cpu`` (dev mode and the reload extension are the script's own), a context of ``max_model_len`` tokens, the
    engine bound to ``cpu_cores``. The model worker runs in a process of its own, as the script leaves it: the core
    binding is the worker's (it logs ``core ids=[...]``), and test_student_server.py checks it. A test may kill it
    (`kill`), as a crash."""

    name = "serve_student.sh --cpu"
    script = REPO_ROOT / "recipes" / "launch" / "serve_student.sh"

    def __init__(self, model_dir: str | Path, port: int | None = None, log_dir: str | Path | None = None,
                 max_model_len: int = 4096, cpu_cores: str | None = None):  # fmt: skip
        super().__init__(model_dir, port, log_dir)
        self.max_model_len, self.cpu_cores = max_model_len, cpu_cores

    root_url = VLLMStudentServer.root_url

    def command(self) -> list[str]:
        command = super().command()
        command[command.index("--max-model-len") + 1] = str(self.max_model_len)
        if self.cpu_cores is not None:
            extra = command.index("--")
            command[extra:extra] = ["--cpu-cores", self.cpu_cores]
        return command

    def environment(self) -> dict[str, str]:
        return {k: v for k, v in super().environment().items() if k not in VLLM_WORKER_IN_ENGINE}

    def kill(self) -> None:
        """SIGKILL the server's process group (the script, its leader, has exited): a crash, not a shutdown."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)


SERVERS = {
    "transformers": Server,
    "vllm": VLLMServer,
    "vllm-launched": LaunchedVLLMServer,
    "vllm-student": VLLMStudentServer,
}


def kill_after_first_rollout_step(server: Server):
    """A trainer callback that SIGKILLs ``server`` once the first rollout step has trained (its ``num_partitions``
    updates): the outage tests' server lost mid-run."""
    from transformers import TrainerCallback

    class KillAfterFirstRolloutStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == args.num_partitions:
                server.kill()

    return KillAfterFirstRolloutStep()
