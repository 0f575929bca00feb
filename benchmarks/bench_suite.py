"""The whole CI run from a fresh clone, timed by phase: what `bash .ci/run` costs a contributor and CI.

Clones the repository (its committed HEAD, or ``--ref``) into a new folder, runs ``bash .ci/run`` there as CI
does, with empty pip and uv caches and no boxed-model cache (a cold run: nothing this machine built before is
reused), and prints the phases `.ci/run` reports (``ci: <phase> <seconds> s``), the pytest summary line, the
slowest tests `make test` lists, the machine's CPU use over the run (busy, idle, and steal: time the hypervisor
took), and on its last line ``suite: <total> s cold (environments <E> s, lint <L> s, tests <T> s)``. Target:
20 minutes on the reference machine (2 cores), measured twice. ``--warm`` keeps the pip, uv and
boxed-model caches of ``--workdir`` between runs: what a second run on one machine costs.

    python benchmarks/bench_suite.py [--ref HEAD] [--workdir /tmp/zppo-bench-suite] [--warm] [--keep]

Needs only git and Python 3.11 (it runs in no environment of the project's: it builds them).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", default="HEAD", help="the commit to clone and run (default: HEAD)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/zppo-bench-suite"))
    parser.add_argument("--warm", action="store_true", help="keep the pip, uv and boxed-model caches of --workdir")
    parser.add_argument("--keep", action="store_true", help="keep the clone (its environments) afterwards")
    args = parser.parse_args(argv)

    clone = args.workdir / "clone"
    caches = args.workdir / "caches"
    shutil.rmtree(clone, ignore_errors=True)
    if not args.warm:
        shutil.rmtree(caches, ignore_errors=True)
    caches.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", args.ref], check=True)
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "ZPPO_", "PYTEST"))}
    env["PIP_CACHE_DIR"] = str(caches / "pip")
    env["UV_CACHE_DIR"] = str(caches / "uv")  # the Makefile installs with uv after torch (pip)
    env["ZPPO_BOXED_CACHE"] = str(caches / "boxed-models")  # empty unless --warm
    log_path = args.workdir / "ci.log"
    print(f"bash .ci/run on {commit.stdout.strip()} in {clone} (log: {log_path})", flush=True)
    start, cpu_start = time.monotonic(), _cpu_ticks()
    with open(log_path, "w") as log:
        code = subprocess.run(["bash", ".ci/run"], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    total, cpu = time.monotonic() - start, _cpu_share(cpu_start, _cpu_ticks())
    text = log_path.read_text(errors="replace")

    phases = {name: float(seconds) for name, seconds in re.findall(r"^ci: (\w+) (\d+) s$", text, re.MULTILINE)}
    for name, seconds in phases.items():
        print(f"{name:>13}: {seconds:6.0f} s ({seconds / 60:.1f} min)")
    summary = re.findall(r"^=+ (.*(?:passed|failed|error).*) =+$", text, re.MULTILINE)
    print(summary[-1] if summary else "(no pytest summary in the log)")
    slowest = text.split("slowest 15 durations", 1)
    if len(slowest) == 2:
        print("slowest 15 tests:")
        for line in slowest[1].splitlines()[1:16]:
            print(f"  {line}")
    if cpu:
        print(f"cpu over the run ({os.cpu_count()} cores): " + ", ".join(f"{k} {v:.0%}" for k, v in cpu.items()))
    if not args.keep:
        shutil.rmtree(clone, ignore_errors=True)
    parts = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases.items() if name != "total")
    failed = "" if code == 0 else f"; FAILED (exit {code})"
    print(f"suite: {total:.0f} s {'warm' if args.warm else 'cold'} ({parts}){failed}")
    return code


def _cpu_ticks() -> list[int] | None:
    """The machine's cumulative CPU time by state (the ``cpu`` line of /proc/stat), or None without /proc."""
    try:
        with open("/proc/stat") as stat:
            return [int(field) for field in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def _cpu_share(before: list[int] | None, after: list[int] | None) -> dict[str, float]:
    """The share of the machine's CPU time between two readings that was busy, idle, or taken by the hypervisor
    (steal): whether the run waited on something or had no core left to give (empty without /proc)."""
    if not before or not after:
        return {}
    user, nice, system, idle, iowait, irq, softirq, steal = (b - a for a, b in zip(before[:8], after[:8]))
    states = {"busy": user + nice + system + irq + softirq, "idle": idle + iowait, "steal": steal}
    elapsed = sum(states.values()) or 1
    return {name: ticks / elapsed for name, ticks in states.items()}


if __name__ == "__main__":
    sys.exit(main())
