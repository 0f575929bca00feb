"""Every CPU-side precision decided in one place, from the CPU's capabilities.

On a CPU, bf16 pays only where the CPU computes it natively: AMX tiles (``amx_bf16``) or AVX-512 BF16 dot products
(``avx512_bf16``). Elsewhere torch and oneDNN convert every bf16 operand to float32 and back: one bf16 matmul of the
demo model's shape (16 x 576 x 1536) took 42.6 ms against 1.1 ms in float32 on a 2-core AMD EPYC with AVX2 only
(38x). Training adds a cost of its own: bf16 autocast casts every weight at every matmul, and the demo's forward and
backward pass took 0.51x float32's time on a Xeon with AMX but 1.68x on a CPU with AVX-512 BF16 and no AMX
(``benchmarks/bench_cpu_precision.py``), while vLLM's CPU engine, whose weights are stored in bf16, served about
1.6x float32's throughput there. So:

- the vLLM servers' ``--dtype``: bfloat16 where the CPU class is ``amx`` or ``avx512_bf16``, float32 elsewhere
  (``avx512``, ``avx2``, ``baseline``);
- the trainer: bf16 autocast where the class is ``amx``, float32 elsewhere;
- the vector units may be held below what the CPU has: ``ATEN_CPU_CAPABILITY`` (torch's kernels) and
  ``ONEDNN_MAX_CPU_ISA`` (oneDNN's, which torch's and vLLM's CPU matmuls use) lower the class the decision reads;
- ``PRECISION=bf16|fp32`` (``--precision``) overrides the decision.

What follows it: the demo's trainer (``--bf16``, autocast on a CPU) and both of its vLLM servers (``--dtype``), and
``serve_student.sh``/``serve_teacher.sh`` with ``--cpu`` where no ``--dtype`` is given. Standard library only, so that
any Python runs it (vLLM's environment has no zppo_trl)::

    python zppo_trl/cpu_precision.py [--precision auto|bf16|fp32] [--cpuinfo /proc/cpuinfo]
    # prints: <the trainer's bf16|fp32> <the servers' --dtype> <CPU class>, e.g. "fp32 float32 avx2"
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Mapping

__all__ = ["CPU_CLASSES", "SERVER_BF16", "TRAINER_BF16", "VLLM_DTYPES", "cpu_class", "cpu_flags", "cpu_precision"]

# From the most capable down; each class is a CPU that has its own and every later one's units.
CPU_CLASSES = ("amx", "avx512_bf16", "avx512", "avx2", "baseline")
# The /proc/cpuinfo flag that makes a CPU each class (the baseline needs none).
_CLASS_FLAG = {"amx": "amx_bf16", "avx512_bf16": "avx512_bf16", "avx512": "avx512f", "avx2": "avx2"}
# The classes that compute bf16 natively, where the servers run in it; and those where the trainer's autocast,
# which casts every weight at every matmul, pays for its casts.
SERVER_BF16 = frozenset({"amx", "avx512_bf16"})
TRAINER_BF16 = frozenset({"amx"})
# The trainer's precision -> the vLLM servers' --dtype.
VLLM_DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
# What holding the vector units down leaves: ATEN_CPU_CAPABILITY's values (torch) and ONEDNN_MAX_CPU_ISA's (oneDNN).
_ATEN_CAP = {"default": "baseline", "avx2": "avx2", "avx512": "avx512"}
_ONEDNN_CAP = {
    "sse41": "baseline",
    "avx": "baseline",
    "avx2": "avx2",
    "avx2_vnni": "avx2",
    "avx2_vnni_2": "avx2",
    "avx512_core": "avx512",
    "avx512_core_vnni": "avx512",
    "avx512_core_bf16": "avx512_bf16",
    "avx10_1_512": "avx512_bf16",
    "avx512_core_fp16": "avx512_bf16",
    "avx512_core_amx": "amx",
    "avx512_core_amx_fp16": "amx",
    "avx10_1_512_amx": "amx",
    "avx10_1_512_amx_fp16": "amx",
}


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The feature flags of ``/proc/cpuinfo``'s text (its first processor's ``flags`` line; empty where none)."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_class(flags: Iterable[str], env: Mapping[str, str] | None = None) -> str:
    """The CPU's class (:data:`CPU_CLASSES`) from its flags, lowered to what ``ATEN_CPU_CAPABILITY`` and
    ``ONEDNN_MAX_CPU_ISA`` in ``env`` (default: this process's) leave."""
    flags = set(flags)
    found = next((c for c in CPU_CLASSES if c == "baseline" or _CLASS_FLAG[c] in flags), "baseline")
    env = os.environ if env is None else env
    for variable, caps in (("ATEN_CPU_CAPABILITY", _ATEN_CAP), ("ONEDNN_MAX_CPU_ISA", _ONEDNN_CAP)):
        value = env.get(variable, "").strip().lower()
        if value in caps and CPU_CLASSES.index(caps[value]) > CPU_CLASSES.index(found):
            found = caps[value]
    return found


def cpu_precision(
    flags: Iterable[str], override: str = "auto", env: Mapping[str, str] | None = None
) -> tuple[str, str]:
    """The trainer's precision (``"bf16"``: autocast, or ``"fp32"``) and the vLLM servers' (``--dtype``) on a CPU with
    ``flags``: bf16 only in the classes where it pays (:data:`TRAINER_BF16`, :data:`SERVER_BF16`); ``override``
    ``"bf16"`` or ``"fp32"`` sets both instead."""
    if override not in ("auto", *VLLM_DTYPES):
        raise ValueError(f"precision must be auto, bf16 or fp32, got {override!r}")
    if override != "auto":
        return override, VLLM_DTYPES[override]
    found = cpu_class(flags, env)
    return "bf16" if found in TRAINER_BF16 else "fp32", "bfloat16" if found in SERVER_BF16 else "float32"


def main(argv: list[str] | None = None) -> int:
    """Print ``<trainer precision> <servers' dtype> <CPU class>`` for this CPU (what the launch scripts read)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--precision", default=os.environ.get("PRECISION", "auto"), help="auto, bf16 or fp32")
    parser.add_argument("--cpuinfo", default="/proc/cpuinfo", help="the CPU's flags (default: /proc/cpuinfo)")
    args = parser.parse_args(argv)
    try:
        with open(args.cpuinfo, encoding="utf-8") as f:
            flags = cpu_flags(f.read())
    except OSError:  # no /proc (not Linux): no flags, the baseline class
        flags = frozenset()
    try:
        trainer, servers = cpu_precision(flags, args.precision)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(trainer, servers, cpu_class(flags))
    return 0


if __name__ == "__main__":
    sys.exit(main())
