"""What the evaluation harness adds to the endpoint's own time, per sample, on CPU.

    .venv/bin/python benchmarks/bench_eval.py [--setting GPQA-D] [--rows 256] [--concurrency 32]
                                              [--max-tokens 32] [--repeats 3] [--model DIR]

The student is vLLM's CPU engine (from `make vllm-env`) serving the tiny random text model
(tests/tiny_models.py) or ``--model DIR``. Two timings over the same questions, same decoding
(the paper's sampling fields, ``--max-tokens`` new tokens), same concurrency, alternated
``--repeats`` times after one untimed warm-up batch:

1. endpoint: the requests built beforehand and sent as one `TeacherClient.sample` batch: the
   endpoint's own time (plus the thinnest client this package has);
2. harness: `run_suite` from nothing into a fresh directory: loading the fixture, building each
   prompt, generating, scoring, appending every record, writing details and results.

Overhead = harness / endpoint - 1 (target: under 5% at concurrency 32). No judge: its requests
are endpoint time, not harness time. The fixture is the setting's tests/eval_fixtures.py copy
with ``--rows`` rows. ``--vlm`` measures AI2D (one image per question) against the tiny VLM on
`transformers serve` instead (vLLM's CPU build cannot serve the VLM here).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]

from bench_teacher import _NOOP_SERVER, _listening  # noqa: E402
from eval_fixtures import write_fixture  # noqa: E402
from tiny_models import save_tiny_text_model, save_tiny_vlm  # noqa: E402

from tests.servers import Server, VLLMServer, free_port, vllm_unavailable  # noqa: E402
from zppo_trl.evaluation.data import load_setting  # noqa: E402
from zppo_trl.evaluation.prompting import build_requests  # noqa: E402
from zppo_trl.evaluation.runner import EvalOptions, run_suite, sampling_extra_body  # noqa: E402
from zppo_trl.evaluation.tasks import PAPER_DECODING, SUITE  # noqa: E402
from zppo_trl.teacher import TeacherClient  # noqa: E402


class NoopEndpoint:
    """bench_teacher.py's no-op chat endpoint (one fixed reply, no model): what is left is the harness."""

    name = "no-op endpoint"
    model = "noop"

    def __init__(self):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.process: subprocess.Popen | None = None

    def start(self) -> NoopEndpoint:
        self.process = subprocess.Popen([sys.executable, "-c", _NOOP_SERVER, str(self.port)])
        deadline = time.monotonic() + 30
        while not _listening(self.port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the no-op endpoint did not start")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


def timings(server, setting: str, data: Path, messages: list, options: EvalOptions, repeats: int) -> tuple[list, list]:
    """(endpoint seconds, harness seconds), alternated `repeats` times after one untimed batch."""
    server.start()
    try:
        endpoint_seconds(server, messages, options)  # untimed: the engine's first batches are slower
        endpoint, harness = [], []
        for _ in range(repeats):
            endpoint.append(endpoint_seconds(server, messages, options))
            harness.append(harness_seconds(server, setting, data, options))
    finally:
        server.stop()
    return endpoint, harness


def report(name: str, questions: int, endpoint: list, harness: list) -> tuple[float, float]:
    """Print one server's medians; returns (endpoint, harness) median ms per sample."""
    e, h = (1000 * statistics.median(times) / questions for times in (endpoint, harness))
    print(
        f"  {name}: endpoint alone {e:.1f} ms/sample (runs {', '.join(f'{t:.2f}' for t in endpoint)} s); "
        f"harness {h:.1f} ms/sample (runs {', '.join(f'{t:.2f}' for t in harness)} s): {100 * (h / e - 1):+.1f}%"
    )
    return e, h


def endpoint_seconds(server: Server, messages: list, options: EvalOptions) -> float:
    """One batch of the prebuilt requests at the options' concurrency and decoding."""
    decoding = options.decoding
    with TeacherClient(server.base_url, server.model, max_concurrency=options.concurrency, max_retries=0) as client:
        client.sample(messages[:2], n=1, max_tokens=4)  # warm: loop thread, connections
        start = time.perf_counter()
        replies = client.sample(
            messages,
            n=1,
            max_tokens=decoding.max_new_tokens,
            temperature=decoding.temperature,
            top_p=decoding.top_p,
            extra_body=sampling_extra_body(decoding, options.sampling_fields),
        )
        elapsed = time.perf_counter() - start
    assert all(replies), "some requests failed"
    return elapsed


def harness_seconds(server: Server, setting: str, data: Path, options: EvalOptions) -> float:
    """`run_suite` from an empty directory: everything the harness does for one setting."""
    with (
        tempfile.TemporaryDirectory() as run_dir,
        TeacherClient(server.base_url, server.model, max_concurrency=options.concurrency, max_retries=0) as client,
    ):
        client.sample(["warm up"], n=1, max_tokens=4)
        start = time.perf_counter()
        results = run_suite(
            [setting], client, None, run_dir, dataclasses.replace(options, sources={setting: str(data)})
        )
        elapsed = time.perf_counter() - start
    assert results["settings"][setting]["skipped"] == 0
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setting", default="GPQA-D", help="a text setting of the suite (default GPQA-D)")
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", type=Path, help="a model directory to serve instead of the tiny one")
    parser.add_argument("--vlm", action="store_true", help="AI2D against the tiny VLM on transformers serve")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    setting = "AI2D" if args.vlm else args.setting
    if args.vlm:
        server: Server = Server(args.model or save_tiny_vlm(work / "vlm"), log_dir=work)
        fields = "openai"  # transformers serve rejects vLLM's extra sampling fields
    else:
        reason = vllm_unavailable()
        if reason:
            sys.exit(f"vLLM's CPU build is not installed ({reason}); run `make vllm-env`")
        server = VLLMServer(args.model or save_tiny_text_model(work / "text"), log_dir=work)
        fields = "all"
    data = write_fixture(setting, work / "data" / setting, rows=args.rows)
    decoding = dataclasses.replace(PAPER_DECODING, max_new_tokens=args.max_tokens)
    options = EvalOptions(passes=1, decoding=decoding, concurrency=args.concurrency, sampling_fields=fields)
    rows = load_setting(SUITE[setting], data)
    messages = [request.messages for row in rows for request in build_requests(SUITE[setting], row)]

    print(f"{setting}: {len(messages)} questions, {args.max_tokens} new tokens, concurrency {args.concurrency}, "
          f"medians of {args.repeats}")  # fmt: skip
    real_e, _ = report(server.name, len(messages), *timings(server, setting, data, messages, options, args.repeats))
    noop_e, noop_h = report(
        "no-op endpoint", len(messages), *timings(NoopEndpoint(), setting, data, messages, options, args.repeats)
    )
    # The harness's own cost is what it adds over an endpoint that does no work; set against the
    # real endpoint's time per sample (its work overlaps that wait, so this is an upper bound).
    cost = noop_h - noop_e
    print(
        f"  harness cost {cost:.2f} ms/sample = {100 * cost / real_e:.1f}% of {server.name}'s {real_e:.1f} ms/sample"
    )


if __name__ == "__main__":
    main()
