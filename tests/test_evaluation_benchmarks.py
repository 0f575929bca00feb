"""The benchmark registry (zppo_trl.evaluation.benchmarks) and the harness's promise to know no
benchmark by name: what a benchmark needs is a field or hook of its TaskSpec."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from zppo_trl.evaluation import benchmarks
from zppo_trl.evaluation.spec import TaskSpec
from zppo_trl.evaluation.tasks import SUITE

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from code_scan import code_strings
except ImportError:
    from tests.code_scan import code_strings

HARNESS = Path(benchmarks.__file__).resolve().parents[1]


def test_suite_is_the_registered_modules_specs_in_registry_order():
    names = []
    for module_name in benchmarks.BENCHMARK_MODULES:
        module = importlib.import_module(f"zppo_trl.evaluation.benchmarks.{module_name}")
        assert module.SPECS and all(isinstance(spec, TaskSpec) for spec in module.SPECS), module_name
        names += [spec.name for spec in module.SPECS]
    assert names == list(SUITE)
    assert all(SUITE[name] is spec for name, spec in zip(names, benchmarks.SPECS, strict=True))


@pytest.mark.parametrize("path", sorted(HARNESS.glob("*.py")), ids=lambda p: p.name)
def test_the_harness_names_no_benchmark_in_its_code(path):
    named = [(line, text) for line, text in code_strings(path) if any(name in text for name in SUITE)]
    assert not named, f"{path.name} names a benchmark (make it a TaskSpec field or hook): {named}"


@pytest.mark.parametrize("scoring, hook", [("rule+judge", "rule"), ("det", "det"), ("benchjudge", "bench_judge")])
def test_a_scoring_path_without_its_hook_is_refused(scoring, hook):
    with pytest.raises(ValueError, match=hook):
        TaskSpec("New", "vlm", "New benchmark", scoring, "org/new", "test", "question", "answer")


def test_a_gold_form_must_be_known():
    with pytest.raises(ValueError, match="gold_form"):
        TaskSpec("New", "llm", "New", "exact+judge", "org/new", "test", "q", "a", gold_form="ordinal")
