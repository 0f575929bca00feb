"""The demo's vLLM CPU server, measured: one plain round's generation (4 prompts x 4 rollouts x 48 tokens) on the
cores and KV-cache block sizes ``make demo`` could give it.

    python benchmarks/bench_cpu_server.py [--model .cache/demo/SmolLM2-135M-Instruct] [--repeats 3] [--port 8799]

Each setting starts vLLM's CPU engine through ``recipes/launch/serve_teacher.sh --cpu`` on 127.0.0.1 (the dtype
``zppo_trl/cpu_precision.py`` decides for this CPU, eager mode, as the demo starts its servers), sends one warm-up
request and then ``--repeats`` timed ones, and stops the server. A request is the demo's plain round: 4 of its
questions (``recipes/data/demo_math.jsonl``, with the demo's closer, as raw text: no chat template) with ``n=4``
samples each at the demo's temperature, every sample held to exactly 48 tokens (``min_tokens``), so that each
setting generates the same tokens. The settings:

- one core (the last; the demo's teacher keeps the first), the CPU engine's default KV-cache blocks (128 tokens);
- every core, default blocks;
- one core, blocks of 32 tokens (the 4 samples of a prompt then share its full blocks through the prefix cache);
- every core, blocks of 32.

Prints a line per setting and a markdown table; the last line is
``fastest: <setting> <S> s, <R>x the one-core default``. ``make vllm-env`` builds the server's environment and
``make demo-env`` the model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".cache/demo/SmolLM2-135M-Instruct"
QUESTIONS, SAMPLES, TOKENS = 4, 4, 48


def demo_prompts(count: int) -> list[str]:
    """The first ``count`` demo questions with the recipe's closer after each, as raw text."""
    import yaml

    closer = yaml.safe_load((ROOT / "recipes/demo.yaml").read_text())["closer"]
    with open(ROOT / "recipes/data/demo_math.jsonl") as rows:
        return [json.loads(next(rows))["question"] + "\n\n" + closer for _ in range(count)]


def post(url: str, body: dict, timeout: float = 600) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def measure(model: Path, cores: str, block: int | None, port: int, repeats: int, dtype: str) -> list[float]:
    """Start a server on ``cores`` with KV-cache blocks of ``block`` tokens (None: the engine's default), time
    ``repeats`` plain rounds after one warm-up, stop it."""
    log = Path(f"/tmp/bench_cpu_server_{port}.log")
    command = [
        "bash", str(ROOT / "recipes/launch/serve_teacher.sh"), "--cpu", "--model", str(model), "--host", "127.0.0.1",
        "--port", str(port), "--max-model-len", "2048", "--kv-cache-gib", "1", "--cpu-cores", cores,
        "--timeout", "300", "--log", str(log), "--", "--dtype", dtype, "--enforce-eager",
        *(["--block-size", str(block)] if block else []),
    ]  # fmt: skip
    env = {**os.environ, "VLLM_PYTHON": str(ROOT / ".venv-vllm/bin/python")}
    subprocess.run(command, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    pid = int(Path(f"{log}.pid").read_text())
    try:
        body = dict(
            model=str(model), prompt=demo_prompts(QUESTIONS), n=SAMPLES, max_tokens=TOKENS, min_tokens=TOKENS,
            temperature=0.7,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}/v1/completions"
        post(url, body)  # warm-up
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            usage = post(url, body)["usage"]
            seconds.append(time.perf_counter() - start)
            assert usage["completion_tokens"] == QUESTIONS * SAMPLES * TOKENS, usage
        return seconds
    finally:
        os.kill(pid, 15)
        for _ in range(60):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            os.kill(pid, 9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=8799)
    args = parser.parse_args()
    if not (args.model / "config.json").exists():
        raise SystemExit(f"no model at {args.model}: run `make demo-env` or pass --model")
    decided = subprocess.run(
        [sys.executable, str(ROOT / "zppo_trl/cpu_precision.py")], check=True, capture_output=True, text=True
    ).stdout.split()
    _, dtype, cpu_class = decided
    cores = os.cpu_count() or 1
    last, every = str(cores - 1), f"0-{cores - 1}" if cores > 1 else "0"
    settings = [
        ("one core, blocks of 128", last, None),
        ("every core, blocks of 128", every, None),
        ("one core, blocks of 32", last, 32),
        ("every core, blocks of 32", every, 32),
    ]
    print(
        f"{args.model.name}, --dtype {dtype} (CPU class {cpu_class}), {cores} cores; each request {QUESTIONS} "
        f"prompts x {SAMPLES} samples x {TOKENS} tokens; {args.repeats} timed after one warm-up",
        flush=True,
    )
    results = {}
    for name, core_list, block in settings:
        seconds = measure(args.model, core_list, block, args.port, args.repeats, dtype)
        results[name] = statistics.median(seconds)
        print(f"  {name} (cores {core_list}): " + ", ".join(f"{s:.2f}" for s in seconds) + " s", flush=True)
    base = results[settings[0][0]]
    print("\n| setting | median s | vs one core, blocks of 128 |\n|---|---|---|")
    for name, value in results.items():
        print(f"| {name} | {value:.2f} | {value / base:.2f}x |")
    best = min(results, key=results.get)
    print(f"\nfastest: {best} {results[best]:.2f} s, {base / results[best]:.2f}x the one-core default")


if __name__ == "__main__":
    main()
