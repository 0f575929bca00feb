"""TeacherClient throughput and overhead, on CPU, with nothing but this repository.

    .venv/bin/python benchmarks/bench_teacher.py [--requests 64] [--max-tokens 8] [--model DIR]

1. The two teacher servers side by side: `transformers serve` and vLLM's CPU engine (from
   `make vllm-env`; skipped, saying why, where it is not installed), each serving the tiny
   random text model (tests/tiny_models.py) or ``--model DIR`` (e.g. the demo's
   .cache/demo/SmolLM2-135M-Instruct): requests/s and replies/s of TeacherClient.sample with
   ``n=4`` at concurrency 1 and 16. vLLM honours ``n``; for `transformers serve` the client
   makes up the other 3 replies with single requests.
2. The client's own cost: at ``n=1`` against `transformers serve`, TeacherClient next to bare
   `openai.AsyncOpenAI` and raw `httpx2` posting the same JSON body; and the same against a
   no-op endpoint (a bare ASGI app under uvicorn that answers every POST with one fixed chat
   completion), where TeacherClient minus httpx2 and minus bare openai show.

Numbers depend on the machine; `transformers serve` runs with one intra-op thread, vLLM binds
its own (see tests/servers.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import httpx2  # noqa: E402  (openai's HTTP library)
import openai  # noqa: E402
from tiny_models import save_tiny_text_model  # noqa: E402

from tests.servers import Server, VLLMServer, free_port, vllm_unavailable  # noqa: E402
from zppo_trl.teacher import TeacherClient  # noqa: E402

_REPLY = {
    "id": "noop",
    "object": "chat.completion",
    "created": 0,
    "model": "noop",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}

# A chat-completions endpoint that does nothing: drains the body, answers _REPLY.
_NOOP_SERVER = f"""
import sys, uvicorn
BODY = {json.dumps(json.dumps(_REPLY))}.encode()
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}})
    await send({{"type": "http.response.body", "body": BODY}})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def client_rate(base_url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int, n: int = 1) -> float:
    """Conversations/s of one TeacherClient.sample batch (``n`` replies each) at ``concurrency``."""
    with TeacherClient(base_url, model, max_concurrency=concurrency, max_retries=0) as client:
        client.sample(prompts[:2], n=n, max_tokens=max_tokens)  # warm: loop thread, connections, n support
        client.stats(reset=True)
        start = time.perf_counter()
        replies = client.sample(prompts, n=n, max_tokens=max_tokens)
        elapsed = time.perf_counter() - start
        assert all(len(r) == n for r in replies), client.stats()
    return len(prompts) / elapsed


def raw_rate(base_url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> float:
    """Requests/s of plain httpx2 posts of the same body, ``concurrency`` at a time."""

    async def run() -> float:
        limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx2.AsyncClient(base_url=base_url, timeout=600, limits=limits) as http:
            semaphore = asyncio.Semaphore(concurrency)

            async def one(prompt: str) -> None:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": prompt}],
                    "n": 1,
                    "max_tokens": max_tokens,
                    "temperature": 1.0,
                    "top_p": 1.0,
                }
                async with semaphore:
                    response = await http.post("/chat/completions", json=body)
                response.raise_for_status()
                assert response.json()["choices"]

            await asyncio.gather(*(one(p) for p in prompts[:2]))
            start = time.perf_counter()
            await asyncio.gather(*(one(p) for p in prompts))
            return len(prompts) / (time.perf_counter() - start)

    return asyncio.run(run())


def openai_rate(base_url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> float:
    """Requests/s of bare ``openai.AsyncOpenAI`` calls, ``concurrency`` at a time (what TeacherClient wraps)."""

    async def run() -> float:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)
        semaphore = asyncio.Semaphore(concurrency)

        async def one(prompt: str) -> None:
            async with semaphore:
                response = await client.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": prompt}],
                    n=1,
                    max_tokens=max_tokens,
                    temperature=1.0,
                    top_p=1.0,
                )
            assert response.choices

        try:
            await asyncio.gather(*(one(p) for p in prompts[:2]))
            start = time.perf_counter()
            await asyncio.gather(*(one(p) for p in prompts))
            return len(prompts) / (time.perf_counter() - start)
        finally:
            await client.close()

    return asyncio.run(run())


def server_rates(server_class, model_dir: Path, log_dir: str, prompts: list[str], max_tokens: int) -> list[tuple]:
    """(server, concurrency, conversations/s, replies/s) at n=4 for one server of ``server_class``."""
    server = server_class(model_dir, log_dir=log_dir).start()
    try:
        rows = []
        for concurrency in (1, 16):
            rate = client_rate(server.base_url, server.model, prompts, concurrency, max_tokens, n=4)
            rows.append((server.name, concurrency, rate, 4 * rate))
        return rows
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64, help="conversations per measurement against a real server")
    parser.add_argument(
        "--noop-requests", type=int, default=2000, help="requests per measurement against the no-op endpoint"
    )
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--model", type=Path, help="serve this checkpoint instead of the tiny random model")
    args = parser.parse_args()

    servers, overhead = [], []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model.resolve() if args.model else save_tiny_text_model(Path(tmp) / "model")
        prompts = [f"What is {i} + {i}?" for i in range(args.requests)]
        servers += server_rates(Server, model_dir, tmp, prompts, args.max_tokens)
        reason = vllm_unavailable()
        if reason:
            print(f"vLLM skipped: {reason}")
        else:
            servers += server_rates(VLLMServer, model_dir, tmp, prompts, args.max_tokens)
        server = Server(model_dir, log_dir=tmp).start()
        try:
            for concurrency in (1, 16):
                client = client_rate(server.base_url, server.model, prompts, concurrency, args.max_tokens)
                bare = openai_rate(server.base_url, server.model, prompts, concurrency, args.max_tokens)
                raw = raw_rate(server.base_url, server.model, prompts, concurrency, args.max_tokens)
                overhead.append((f"transformers serve, {args.max_tokens} tokens", concurrency, client, bare, raw))
        finally:
            server.stop()

    port = free_port()
    noop = subprocess.Popen([sys.executable, "-c", _NOOP_SERVER, str(port)])
    try:
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 30
        while not _listening(port):
            if time.monotonic() > deadline or noop.poll() is not None:
                raise RuntimeError("the no-op endpoint did not start")
            time.sleep(0.1)
        prompts = [f"p{i}" for i in range(args.noop_requests)]
        for concurrency in (1, 16):
            client = client_rate(url, "noop", prompts, concurrency, 1)
            bare = openai_rate(url, "noop", prompts, concurrency, 1)
            raw = raw_rate(url, "noop", prompts, concurrency, 1)
            overhead.append(("no-op endpoint", concurrency, client, bare, raw))
    finally:
        noop.terminate()
        noop.wait(10)

    model = args.model.name if args.model else "tiny random model"
    print(f"\nteacher servers, {model}, {args.max_tokens}-token replies, TeacherClient.sample with n=4")
    print(f"{'server':<22} {'conc':>4} {'requests/s':>11} {'replies/s':>10}")
    for name, concurrency, rate, replies in servers:
        print(f"{name:<22} {concurrency:>4} {rate:>11.1f} {replies:>10.1f}")
    print(
        f"\n{'client overhead (n=1)':<40} {'conc':>4} {'TeacherClient':>13} {'openai':>8} {'httpx2':>8}   "
        "overhead/request vs httpx2 (vs openai)"
    )
    for name, concurrency, client, bare, raw in overhead:
        vs_raw, vs_openai = ((1 / client - 1 / other) * 1e6 for other in (raw, bare))
        print(
            f"{name:<40} {concurrency:>4} {client:>13.1f} {bare:>8.1f} {raw:>8.1f}   "
            f"{vs_raw:>6.0f} us ({vs_openai:.0f} us)"
        )
    print("(requests/s; overhead = 1/rate difference, so noise of a few percent shows as tens of us)")


if __name__ == "__main__":
    main()
