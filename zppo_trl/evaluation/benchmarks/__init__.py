"""The suite's benchmarks: one module per benchmark (or per family of settings that share
everything), each exporting ``SPECS``, the `TaskSpec` of each of its settings.

A module holds all that is particular to its benchmark: the spec(s), directive patterns and
other prompt particulars, gold normalisation, its matching rule or metric, its judge prompt and
reply parser, how a pass's items combine. Adding a benchmark is one new module here and one line
in `BENCHMARK_MODULES` (docs/evaluation.md, "Adding a benchmark").

The suite's order (the paper's tables: 16 VLM, then 10 LLM, then 5 Video settings) is the order
of `BENCHMARK_MODULES` and, within a module, of its ``SPECS``.
"""

from __future__ import annotations

import importlib

from ..spec import TaskSpec

__all__ = ["BENCHMARK_MODULES", "SPECS"]

BENCHMARK_MODULES = (
    # VLM
    "ai2d",
    "babyvision",
    "charxiv",
    "dynamath",
    "embspatial",
    "infovqa",
    "mathverse",
    "mathvision",
    "mathvista",
    "mmmu_pro",
    "mmvet",
    "ocrbench_v2",
    "visualpuzzles",
    "vlms_are_blind",
    "wemath",
    # LLM
    "aime",
    "ceval",
    "gpqa",
    "hle",
    "imo_answerbench",
    "mmlu",
    "mmlu_pro",
    "mmlu_redux",
    "multichallenge",
    # Video
    "mmvu",
    "mvbench",
    "videomme",
    "videommmu",
)
"""The benchmark modules of this package, in suite order: the registry."""


def _collect() -> tuple[TaskSpec, ...]:
    specs: list[TaskSpec] = []
    for module_name in BENCHMARK_MODULES:
        module = importlib.import_module(f"{__name__}.{module_name}")
        for spec in module.SPECS:
            if any(spec.name == seen.name for seen in specs):
                raise ValueError(f"benchmarks.{module_name}: setting {spec.name!r} is already registered")
            specs.append(spec)
    return tuple(specs)


SPECS: tuple[TaskSpec, ...] = _collect()
"""Every registered setting's spec, in suite order."""
