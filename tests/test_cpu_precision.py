"""The CPU-side precision decision (zppo_trl/cpu_precision.py), per class of CPU, from /proc/cpuinfo-style flags.

The flag lines are trimmed from real CPUs of each class: a Xeon with AMX (Sapphire Rapids), a Zen 4 EPYC (AVX-512
BF16, no AMX), a Skylake-SP Xeon (AVX-512 without BF16), a Zen 2 EPYC (AVX2 only) and a CPU before AVX2. The launch
scripts that follow the decision are tested in tests/test_launch.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from zppo_trl.cpu_precision import CPU_CLASSES, cpu_class, cpu_flags, cpu_precision

MODULE = Path(__file__).resolve().parent.parent / "zppo_trl" / "cpu_precision.py"
COMMON = "fpu vme sse sse2 ssse3 sse4_1 sse4_2 popcnt aes xsave avx f16c rdrand hypervisor"
FLAGS = {
    "amx": f"{COMMON} avx2 fma bmi2 avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16 amx_bf16 amx_tile",
    "avx512_bf16": f"{COMMON} avx2 fma bmi2 avx512f avx512dq avx512bw avx512vl avx512_vnni avx512_bf16",
    "avx512": f"{COMMON} avx2 fma bmi2 avx512f avx512dq avx512cd avx512bw avx512vl",
    "avx2": f"{COMMON} avx2 fma bmi1 bmi2 sha_ni",
    "baseline": COMMON,
}
CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\nbogomips\t: 4000.00\n\nprocessor\t: 1\n"


@pytest.mark.parametrize("name", CPU_CLASSES)
def test_each_class_of_cpu_gets_bf16_only_where_it_pays(name):
    flags = cpu_flags(CPUINFO.format(flags=FLAGS[name]))
    assert cpu_class(flags, env={}) == name
    trainer, servers = cpu_precision(flags, env={})
    # the servers wherever the CPU computes bf16 natively; the trainer's autocast only where AMX pays for its casts
    assert servers == ("bfloat16" if name in ("amx", "avx512_bf16") else "float32")
    assert trainer == ("bf16" if name == "amx" else "fp32")
    # PRECISION overrides the decision either way, for both
    assert cpu_precision(flags, "fp32", env={}) == ("fp32", "float32")
    assert cpu_precision(flags, "bf16", env={}) == ("bf16", "bfloat16")


def test_vector_units_held_down_lower_the_class():
    amx = cpu_flags(CPUINFO.format(flags=FLAGS["amx"]))
    assert cpu_class(amx, env={"ATEN_CPU_CAPABILITY": "avx2"}) == "avx2"
    assert cpu_precision(amx, env={"ONEDNN_MAX_CPU_ISA": "AVX2"}) == ("fp32", "float32")
    assert cpu_class(amx, env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}) == "avx512"
    assert cpu_precision(amx, env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}) == ("fp32", "bfloat16")
    # holding down never raises a class, and an unknown value holds nothing
    avx2 = cpu_flags(CPUINFO.format(flags=FLAGS["avx2"]))
    assert cpu_class(avx2, env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}) == "avx2"
    assert cpu_class(amx, env={"ATEN_CPU_CAPABILITY": "fastest"}) == "amx"


def test_the_command_line_prints_what_the_scripts_read_and_refuses_a_bad_precision(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(CPUINFO.format(flags=FLAGS["avx2"]))

    def decide(*args):  # as the scripts run it: a file, by any Python, no package on the path
        env = {"PATH": "/usr/bin:/bin"}
        cmd = [sys.executable, "-S", str(MODULE), "--cpuinfo", str(cpuinfo), *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)

    assert decide().stdout.split() == ["fp32", "float32", "avx2"]
    assert decide("--precision", "bf16").stdout.split() == ["bf16", "bfloat16", "avx2"]
    refused = decide("--precision", "fp16")
    assert refused.returncode == 2 and "precision must be auto, bf16 or fp32, got 'fp16'" in refused.stderr
    assert cpu_flags("no flags here") == frozenset()
