"""`zppo_trl.plan`, called directly: the dry run's plan and checks, and the one Hub probe that
decides whether the checks read the Hub or the local cache only. No network is used: the Hub
is a local HTTP server, or a local port nothing listens on."""

from __future__ import annotations

import http.server
import socket
import threading
import time

import huggingface_hub
import pytest
import transformers

from zppo_trl import ZPPOConfig, plan
from zppo_trl.plan import HubStatus, dry_run, generation_backend, print_checks, print_plan, probe_hub
from zppo_trl.recipe import parse_recipe_args

PAPER_STEP = (
    "per rollout step: 384 new + <=96 replayed + <=96 reformulated prompts x 8 rollouts; "
    "4 optimizer updates of 96 new prompts; teacher G_T=4"
)
OFFLINE = HubStatus(True, "  down  Hugging Face Hub (test)")


def _paper_recipe(*overrides: str):
    return parse_recipe_args(["--config", "recipes/qwen35_0.8b.yaml", "--dry_run", *overrides])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_plan_is_the_papers_step_and_layout():
    script, args, _ = _paper_recipe()
    lines: list[str] = []
    print_plan(script, args, lines.append)
    assert lines[:2] == ["ZPPO dry run: ZPPO", PAPER_STEP]
    assert "  training ranks: 48 (this launch has 1; planned for num_training_ranks)" in lines
    assert "  schedule: 200 rollout steps = 800 optimizer updates = 76,800 new-prompt draws" in lines
    assert "  teacher: Qwen/Qwen3.5-27B-FP8 at http://127.0.0.1:8000/v1 (G_T=4, compression <= 512 tokens)" in lines
    assert "  precision: bf16; lr 1e-06 constant; max completion 12288 tokens" in lines
    assert any(line.startswith("  server context: student --max-model-len 21,504") for line in lines)
    assert all(isinstance(line, str) for line in lines)

    script, args, _ = _paper_recipe("--num_training_ranks", "24", "--reformulations", "", "--use_judge", "false")
    lines = []
    print_plan(script, args, lines.append)
    assert lines[0] == "ZPPO dry run: GRPO\u2020" and "  judge: off (boxed grader only)" in lines
    assert [line for line in lines if line.startswith("  teacher:")] == ["  teacher: none"]


def test_generation_backend_names_where_rollouts_run():
    common = dict(
        output_dir="unused",
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=8,
        report_to="none",
        reformulations=[],
    )
    assert generation_backend(ZPPOConfig(**common, use_vllm=False)).startswith("transformers generate")
    server = ZPPOConfig(**common, use_vllm=True, vllm_mode="server", vllm_server_host="n0", vllm_server_port=8001)
    assert generation_backend(server).startswith("vLLM server at http://n0:8001")
    colocate = ZPPOConfig(**common, use_vllm=True, vllm_mode="colocate")
    assert generation_backend(colocate) == "vLLM colocated on each training rank (tensor parallel 1)"


class _Hub(http.server.BaseHTTPRequestHandler):
    status = 200
    requests = 0

    def do_HEAD(self):
        type(self).requests += 1
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def online(monkeypatch):
    """This process as if nothing set HF_HUB_OFFLINE."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return monkeypatch


@pytest.mark.parametrize("status, offline", [(200, False), (404, False), (503, True)])
def test_probe_hub_asks_the_endpoint_once(online, status, offline):
    handler = type("Hub", (_Hub,), {"status": status, "requests": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    online.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
    try:
        hub = probe_hub(timeout=5.0)
    finally:
        server.shutdown()
        server.server_close()
    assert hub.offline is offline and handler.requests == 1
    if offline:
        assert hub.line.startswith(f"  down  Hugging Face Hub at {endpoint} (not reachable now: HTTP 503)")
    else:
        assert hub.line == ""


def test_probe_hub_takes_an_unreachable_hub_for_offline_at_once(online):
    endpoint = f"http://127.0.0.1:{_free_port()}"
    online.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
    started = time.monotonic()
    hub = probe_hub(timeout=3.0)
    assert time.monotonic() - started < 3.0  # one attempt, no retries
    assert hub.offline and hub.line.startswith(f"  down  Hugging Face Hub at {endpoint} (not reachable now: ")
    assert "the rest of this dry run is offline" in hub.line and "\n" not in hub.line


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_probe_hub_honours_the_offline_variables_without_a_request(online, variable):
    online.setenv(variable, "1")
    online.setattr(plan, "get_session", lambda: pytest.fail("the Hub was asked although it is offline"))
    hub = probe_hub()
    assert hub.offline and "HF_HUB_OFFLINE is set" in hub.line


def test_offline_checks_read_configs_from_the_local_cache_only(monkeypatch):
    asked = []

    def from_pretrained(name, **kwargs):
        asked.append((name, kwargs.get("local_files_only")))
        raise OSError(f"{name} is not in the cache")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    monkeypatch.setattr(plan, "probe_hub", lambda: OFFLINE)  # what a probe of an unreachable Hub returns
    script, args, model = parse_recipe_args(["--config", "recipes/rows/off_distill.yaml", "--dry_run"])
    lines: list[str] = []
    assert print_checks(script, args, model, lines.append) == []  # Hub ids that cannot be read are skipped
    assert asked == [("Qwen/Qwen3.5-0.8B", True), ("Qwen/Qwen3.5-27B", True)]
    assert lines[:2] == ["\nchecks:", OFFLINE.line]
    assert lines[2].startswith("  skip  student Qwen/Qwen3.5-0.8B: config not reachable here (OSError: ")
    assert lines[3] == "  skip  distill_teacher Qwen/Qwen3.5-27B: config not reachable here (OSError)"

    asked.clear()
    lines.clear()
    print_checks(script, args, model, lines.append, hub=HubStatus(False))  # a reachable Hub: asked as usual
    assert asked == [("Qwen/Qwen3.5-0.8B", None), ("Qwen/Qwen3.5-27B", None)] and OFFLINE.line not in lines


def test_a_local_student_and_dataset_need_no_hub(monkeypatch, tiny_text_model_dir, tmp_path):
    from boxed_models import toy_rows

    from zppo_trl.data import write_jsonl

    monkeypatch.setattr(plan, "probe_hub", lambda: pytest.fail("nothing here is on the Hub"))
    data = tmp_path / "train.jsonl"
    write_jsonl(toy_rows("text")[:4], data)
    script, args, model = parse_recipe_args(
        ["--config", "recipes/demo.yaml", "--dry_run", "--dataset_name", str(data)]
        + ["--model_name_or_path", str(tiny_text_model_dir), "--output_dir", str(tmp_path / "out")]
    )
    lines: list[str] = []
    assert dry_run(script, args, model, lines.append) == 0
    assert f"  ok    student {tiny_text_model_dir}: qwen3 (text)" in lines
    assert f"  ok    dataset {data}: 4 valid rows" in lines
    assert f"  ok    output_dir {tmp_path / 'out'}: starts fresh" in lines
    assert lines[-1] == "\ndry run ok; nothing was trained."


def test_a_dry_run_with_problems_returns_1_and_lists_them(tmp_path):
    script, args, model = _paper_recipe("--dataset_name", str(tmp_path / "nope.jsonl"))
    lines: list[str] = []
    assert dry_run(script, args, model, lines.append, hub=OFFLINE) == 1
    assert any(line.startswith(f"  FAIL  dataset {tmp_path / 'nope.jsonl'}: ") for line in lines)
    assert lines[-1] == "\n1 problem(s); nothing was trained."
