"""TeacherClient throughput and overhead, on CPU, with nothing but this repository.

    .venv/bin/python benchmarks/bench_teacher.py [--requests 64] [--max-tokens 8]

1. `transformers serve` with the tiny random text model (tests/tiny_models.py): requests/s
   through TeacherClient at concurrency 1 and 16, next to bare `openai.AsyncOpenAI` and raw
   `httpx2` posting the same JSON body (so differences are the client, not the server).
2. The same against a no-op endpoint (a bare ASGI app under uvicorn that answers every POST
   with one fixed chat completion), where the client's own cost per request shows:
   TeacherClient minus httpx2, and TeacherClient minus bare openai.

Numbers depend on the machine; the server runs with one intra-op thread (see tests/conftest.py).
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

from tests.conftest import Server, free_port  # noqa: E402
from tiny_models import save_tiny_text_model  # noqa: E402
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


def client_rate(base_url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> float:
    """Requests/s of one TeacherClient.sample batch (n=1) at ``concurrency``."""
    with TeacherClient(base_url, model, max_concurrency=concurrency, max_retries=0) as client:
        client.sample(prompts[:2], n=1, max_tokens=max_tokens)  # warm: loop thread, connections
        client.stats(reset=True)
        start = time.perf_counter()
        replies = client.sample(prompts, n=1, max_tokens=max_tokens)
        elapsed = time.perf_counter() - start
        assert all(len(r) == 1 for r in replies), client.stats()
    return len(prompts) / elapsed


def raw_rate(base_url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int) -> float:
    """Requests/s of plain httpx2 posts of the same body, ``concurrency`` at a time."""

    async def run() -> float:
        limits = httpx2.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx2.AsyncClient(base_url=base_url, timeout=600, limits=limits) as http:
            semaphore = asyncio.Semaphore(concurrency)

            async def one(prompt: str) -> None:
                body = {"model": model, "messages": [{"role": "user", "content": prompt}], "n": 1, "max_tokens": max_tokens, "temperature": 1.0, "top_p": 1.0}
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
                    model=model, messages=[{"role": "user", "content": prompt}], n=1, max_tokens=max_tokens, temperature=1.0, top_p=1.0
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64, help="requests per measurement against transformers serve")
    parser.add_argument("--noop-requests", type=int, default=2000, help="requests per measurement against the no-op endpoint")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(save_tiny_text_model(Path(tmp) / "model"), log_dir=tmp).start()
        try:
            prompts = [f"What is {i} + {i}?" for i in range(args.requests)]
            for concurrency in (1, 16):
                client = client_rate(server.base_url, server.model, prompts, concurrency, args.max_tokens)
                bare = openai_rate(server.base_url, server.model, prompts, concurrency, args.max_tokens)
                raw = raw_rate(server.base_url, server.model, prompts, concurrency, args.max_tokens)
                rows.append((f"transformers serve, tiny model, {args.max_tokens} tokens", concurrency, client, bare, raw))
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
            rows.append(("no-op endpoint", concurrency, client, bare, raw))
    finally:
        noop.terminate()
        noop.wait(10)

    print(f"\n{'endpoint':<40} {'conc':>4} {'TeacherClient':>13} {'openai':>8} {'httpx2':>8}   overhead/request vs httpx2 (vs openai)")
    for name, concurrency, client, bare, raw in rows:
        vs_raw, vs_openai = ((1 / client - 1 / other) * 1e6 for other in (raw, bare))
        print(f"{name:<40} {concurrency:>4} {client:>13.1f} {bare:>8.1f} {raw:>8.1f}   {vs_raw:>6.0f} us ({vs_openai:.0f} us)")
    print("(requests/s; overhead = 1/rate difference, so noise of a few percent shows as tens of us)")


if __name__ == "__main__":
    main()
