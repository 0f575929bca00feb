"""Shared fixtures: real OpenAI-compatible servers on 127.0.0.1 serving the tiny models, and the boxed models.

The server processes themselves are servers.py's (`Server` is `transformers serve`, `VLLMServer` vLLM's CPU
engine, the production teacher server). `teacher_server` / `vllm_teacher_server` (session) serve the tiny
text model and `live_teacher` is each of them in turn; `vlm_server` serves the tiny VLM (`transformers serve`
only: vLLM's Qwen-VL code needs torchvision, which CPU torch cannot have here); `make_server` starts
throwaway servers of either kind that a test may kill and restart on the same port (`Server.kill`,
`Server.restart`). Every server runs on CPU with the Hub offline. The session servers that serve a model no test
changes are shared by the pytest-xdist workers (one process each per session) and stopped when the session ends;
the others are stopped at teardown, whatever the test did. A vLLM fixture skips, naming the reason, where vLLM is
not installed.

The `boxed_*` fixtures (session, each built only when a test asks for it) are tiny models
fine-tuned to answer the toy arithmetic rows of boxed_models.py as ``<think> ...
</think> \\boxed{N}``: students with a mix of right and wrong answers, teachers right about
80% of the time, and servers for the two teachers. tests/README.md lists every fixture with its cost.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Under pytest-xdist, each worker's torch gets its share of the cores (one thread with two workers on two
# cores), set before torch is first imported. Two workers each running two intra-op threads oversubscribe the
# cores, and the tiny models' steps then spin in OpenMP barriers: several times slower, not twice. Subprocesses
# (servers, accelerate launches, recipe runs) inherit it.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    _SHARE = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _SHARE)))
# TRL sends a telemetry ping from rank 0 of every trainer it builds (huggingface_hub's send_telemetry) unless
# this, HF_HUB_OFFLINE or CI is set: the tests never reach the Hub (docs/installation.md).
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

try:  # tests/ is on sys.path under pytest's default (rootdir-less, prepend) import mode
    from boxed_models import DEFAULT_CACHE, MODELS, boxed_model, cached_model_dir, start_background
    from servers import REPO_ROOT, SERVERS, Server, stop_group, vllm_unavailable
    from tiny_models import save_tiny_text_model, save_tiny_vlm
except ImportError:  # tests/ imported as a package
    from tests.boxed_models import DEFAULT_CACHE, MODELS, boxed_model, cached_model_dir, start_background
    from tests.servers import REPO_ROOT, SERVERS, Server, stop_group, vllm_unavailable
    from tests.tiny_models import save_tiny_text_model, save_tiny_vlm

# The judge of the evaluation tests is a random model: its replies never parse and never end, so each
# would run to the judge's 512 tokens, on a server that decodes one request at a time. Passed as
# `--judge-extra-body`, this cuts a verdict off at 16 tokens: the same unparsed noise, scored the same
# way, with every other field of the harness's requests as in production.
SHORT_JUDGE = '{"max_tokens": 16}'


def require_vllm() -> None:
    """Skip the calling test, naming why, when vLLM's CPU build is not installed."""
    reason = vllm_unavailable()
    if reason:
        pytest.skip(reason)


# ---------------------------------------------------------------- session servers, one for every worker

# The session servers serve models the tests never change, so the pytest-xdist workers share them: the first
# worker to ask for one starts it and records it here, under the controller's temporary directory; a worker
# asking later talks to the same process; the controller (the one process without xdist) stops them all when
# the session ends (pytest_sessionfinish), once no worker can still be using one. Each is started once per
# session instead of once per worker: a vLLM server is about 30 s of a core and 2.4 GB.
SHARED_SERVERS_ENV = "ZPPO_SHARED_SERVERS"


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller; workers inherit its environment
        os.environ[SHARED_SERVERS_ENV] = tempfile.mkdtemp(prefix="zppo-shared-servers-")


def _serve(name: str, model_dir: Path, backend: str = "transformers") -> Server:
    """The session's ``name`` server (``backend`` serving ``model_dir``): started here where no worker has
    started it yet, else the one a worker started (this worker's copy of ``model_dir`` is then not the one
    served: the same model, copied from the same cache). Stopped when the session ends, not here."""
    from filelock import FileLock

    if backend.startswith("vllm"):
        require_vllm()
    record = Path(os.environ[SHARED_SERVERS_ENV]) / f"{name}.json"
    with FileLock(f"{record}.lock"):
        if not record.exists():
            server = SERVERS[backend](model_dir).start()
            fields = {"pid": server.process.pid, "model_dir": str(server.model_dir), "port": server.port}
            record.write_text(json.dumps({**fields, "log_dir": str(server.log_dir)}))
            return server
        fields = json.loads(record.read_text())
    server = SERVERS[backend](fields["model_dir"], port=fields["port"], log_dir=fields["log_dir"])
    if not server.healthy():
        raise RuntimeError(f"the session's {name} (pid {fields['pid']}) does not answer:\n{server.log_tail()}")
    return server


def _stop_shared_servers() -> None:
    """Stop every server a worker recorded (the controller, at the session's end)."""
    registry = os.environ.get(SHARED_SERVERS_ENV)
    if registry:
        for record in Path(registry).glob("*.json"):
            stop_group(json.loads(record.read_text())["pid"])
        shutil.rmtree(registry, ignore_errors=True)


# The paper is the spec. Tests that check code against it read the shared checkout's copy where
# there is one (beside the repository) and the copy in tests/data otherwise (CI); the two must
# be the same text (test_evaluation_tasks.py::test_the_repositorys_copy_of_the_paper_is_the_spec).
PAPER_TEX = REPO_ROOT.parent / "shared" / "paper" / "zppo-paper.tex"
PAPER_TEX_COPY = REPO_ROOT / "tests" / "data" / "zppo-paper.tex"


@pytest.fixture(scope="session")
def paper_tex() -> str:
    """The paper's LaTeX source."""
    return (PAPER_TEX if PAPER_TEX.is_file() else PAPER_TEX_COPY).read_text()


@pytest.fixture(scope="session")
def tiny_text_model_dir(tmp_path_factory) -> Path:
    """The tiny random Qwen3 text model, saved once per session."""
    return save_tiny_text_model(tmp_path_factory.mktemp("tiny-text") / "model")


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory) -> Path:
    """The tiny random Qwen3.5 VLM, saved once per session."""
    return save_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm") / "model")


@pytest.fixture(scope="session")
def teacher_server(tiny_text_model_dir) -> Server:
    """`transformers serve` with the tiny text model; use ``.base_url`` and ``.model``. Do not kill it."""
    return _serve("teacher_server", tiny_text_model_dir)


@pytest.fixture(scope="session")
def vllm_teacher_server(tiny_text_model_dir) -> Server:
    """vLLM's CPU server with the tiny text model (skips, naming why, where vLLM is not installed), started as a user
    starts the teacher on a CPU: ``serve_teacher.sh --cpu`` (servers.LaunchedVLLMServer; test_launch.py reads it)."""
    return _serve("vllm_teacher_server", tiny_text_model_dir, "vllm-launched")


@pytest.fixture(scope="session", params=["transformers", "vllm"])
def live_teacher(request) -> Server:
    """The tiny text model on each server the teacher client must work with: `transformers serve` and vLLM."""
    return request.getfixturevalue("vllm_teacher_server" if request.param == "vllm" else "teacher_server")


@pytest.fixture(scope="session")
def vlm_server(tiny_vlm_dir) -> Server:
    """`transformers serve` with the tiny VLM (images reach the model)."""
    return _serve("vlm_server", tiny_vlm_dir)


# ---------------------------------------------------------------- the boxed models, trained beside the other tests

# The boxed models live in an on-disk cache keyed by their recipe's content hash (boxed_models.boxed_model):
# a second run on the same machine reuses them; ZPPO_BOXED_CACHE puts the cache elsewhere (an empty
# directory gives a cold run). A cold session trains them in a background process while the tests that
# need none of them run first (see pytest_collection_modifyitems): the fit runs on one torch thread,
# so on two cores it takes the core the test process leaves idle.
BOXED_CACHE = DEFAULT_CACHE
BOXED_DIR_FIXTURES = {
    "boxed_text_teacher_dir": ("text", "teacher"),
    "boxed_text_student_dir": ("text", "student"),
    "boxed_vlm_teacher_dir": ("vlm", "teacher"),
    "boxed_vlm_student_dir": ("vlm", "student"),
}


def _boxed_needs(item) -> set[tuple[str, str]]:
    """The boxed models ``item`` uses (through any fixture), each student with its teacher."""
    needs = {BOXED_DIR_FIXTURES[name] for name in item.fixturenames if name in BOXED_DIR_FIXTURES}
    return needs | {(kind, "teacher") for kind, _ in needs}


class _BoxedPretraining:
    """The background process that fills the boxed-model cache for this session (one at most)."""

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def start(self, models: list[tuple[str, str]]) -> None:
        missing = [
            (kind, role) for kind, role in models if not cached_model_dir(role, kind, cache_dir=BOXED_CACHE).is_dir()
        ]
        if not missing:
            return
        BOXED_CACHE.mkdir(parents=True, exist_ok=True)
        self.log_path = BOXED_CACHE / f"pretrain-{os.getpid()}.log"
        self.process = start_background(missing, BOXED_CACHE, self.log_path)

    def stop(self) -> str | None:
        """Stop the process if it still runs; the end of its log where it failed, else None."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait()
            return None
        if self.process.returncode != 0 and self.log_path is not None:
            return self.log_path.read_text(errors="replace")[-3000:]
        return None


_PRETRAINING = _BoxedPretraining()


# The fixtures that make a test an integration test whether or not it is marked so: a server.
SERVER_FIXTURES = {"teacher_server", "vllm_teacher_server", "live_teacher", "vlm_server", "make_server"}


def _integration(item) -> bool:
    """Whether ``item`` starts servers or trains models (minutes in all), rather than taking seconds."""
    return item.get_closest_marker("integration") is not None or bool(SERVER_FIXTURES & set(item.fixturenames))


@pytest.hookimpl(trylast=True)  # after -m/-k have deselected
def pytest_collection_modifyitems(session, config, items):
    """Run the integration tests that need no boxed model first, then the text ones, then the VLM ones, so that
    the background training (pytest_collection_finish) is ahead of the first test that waits for it; then the
    unit tests, so that the session ends on tests of seconds: a worker that runs out of work waits for the
    other's last test, and that is then short (xdist gives each worker its next two or three tests ahead)."""

    def tier(item) -> int:
        kinds = {kind for kind, _ in _boxed_needs(item)}
        return 2 if "vlm" in kinds else 1 if kinds else 0 if _integration(item) else 3

    items.sort(key=tier)  # stable: the file order holds within each tier


def pytest_collection_finish(session):
    """Start training, in the background, the boxed models the selected tests need and the cache lacks.

    Under pytest-xdist every worker collects the whole session; the first one starts the training for all.
    """
    if session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    wanted = set().union(*(_boxed_needs(item) for item in session.items))
    _PRETRAINING.start([model for model in MODELS if model in wanted])


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: make test runs the suite on two workers
def pytest_xdist_make_scheduler(config, log):
    """Tests in one class run on one worker, in the order collected; every other test goes wherever a worker is
    free. A class is how tests that read one module- or class-scoped run (a training run, a distributed
    launch) say so: spread over two workers, that run would be made twice. (xdist's own `--dist loadgroup`
    does not group under pytest 9, whose node ids it cannot rewrite.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ClassScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            address = nodeid.split("[", 1)[0].split("::")  # a parameter id may hold "::"
            return "::".join(address[:2]) if len(address) > 2 else nodeid

    config.option.loadscopereorder = False  # keep the collection order: the boxed-model tiers
    return ClassScheduling(config, log)


def pytest_sessionfinish(session, exitstatus):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # every worker is done with the shared servers
        _stop_shared_servers()
    failure = _PRETRAINING.stop()
    if failure:
        session.config._boxed_pretraining_failure = failure


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    failure = getattr(config, "_boxed_pretraining_failure", None)
    if failure:
        terminalreporter.section("the boxed models' background training failed (the tests trained them in-process)")
        terminalreporter.write_line(failure)


def _boxed_dir(tmp_path_factory, kind: str, role: str) -> Path:
    """A session copy of the cached boxed model (servers write their logs beside the model they serve)."""
    target = tmp_path_factory.mktemp(f"boxed-{kind}-{role}") / "model"
    shutil.copytree(boxed_model(role, kind, cache_dir=BOXED_CACHE), target)
    return target


@pytest.fixture(scope="session")
def boxed_text_student_dir(tmp_path_factory) -> Path:
    """A tiny text student that answers the toy rows in the paper's format, right on some questions only."""
    return _boxed_dir(tmp_path_factory, "text", "student")


@pytest.fixture(scope="session")
def boxed_text_teacher_dir(tmp_path_factory) -> Path:
    """A tiny text teacher that answers every toy row right about 80% of the time."""
    return _boxed_dir(tmp_path_factory, "text", "teacher")


@pytest.fixture(scope="session")
def boxed_vlm_student_dir(tmp_path_factory) -> Path:
    """The VLM counterpart of `boxed_text_student_dir` (rows from ``toy_rows("vlm")``, one image each)."""
    return _boxed_dir(tmp_path_factory, "vlm", "student")


@pytest.fixture(scope="session")
def boxed_vlm_teacher_dir(tmp_path_factory) -> Path:
    """The VLM counterpart of `boxed_text_teacher_dir`."""
    return _boxed_dir(tmp_path_factory, "vlm", "teacher")


@pytest.fixture(scope="session")
def boxed_teacher_server(boxed_text_teacher_dir) -> Server:
    """`transformers serve` with the boxed text teacher. Do not kill it."""
    return _serve("boxed_teacher_server", boxed_text_teacher_dir)


@pytest.fixture(scope="session")
def vllm_boxed_teacher_server(boxed_text_teacher_dir) -> Server:
    """vLLM's CPU server with the boxed text teacher, as production serves the teacher. Do not kill it."""
    return _serve("vllm_boxed_teacher_server", boxed_text_teacher_dir, "vllm")


@pytest.fixture(scope="session")
def boxed_vlm_teacher_server(boxed_vlm_teacher_dir) -> Server:
    """`transformers serve` with the boxed VLM teacher (images reach the model). Do not kill it."""
    return _serve("boxed_vlm_teacher_server", boxed_vlm_teacher_dir)


@pytest.fixture
def make_server(tiny_text_model_dir, tmp_path) -> Iterator:
    """A factory ``make_server(model_dir=None, port=None, backend="transformers") -> Server`` (started).

    ``backend="vllm"`` skips the test, naming why, where vLLM is not installed. All servers
    are stopped at teardown.
    """
    servers: list[Server] = []

    def make(model_dir: str | Path | None = None, port: int | None = None, backend: str = "transformers") -> Server:
        if backend.startswith("vllm"):
            require_vllm()
        server = SERVERS[backend](model_dir or tiny_text_model_dir, port=port, log_dir=tmp_path)
        servers.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in servers:
            server.stop()
