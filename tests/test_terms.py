"""The named-terms seam (zppo_trl.terms) and its promise: nothing outside terms/ names a term or a term's field.

A term's needs, settings, checks, dry-run and card text, run-time glue and checkpoint state live in its module; the
trainer, the config, the dry run, the model card and the launcher read what the terms declare. The guard below scans
every module of the package outside terms/ (its code, not its docstrings or help texts), as the evaluation harness's
test scans the harness for benchmark names.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from zppo_trl import ZPPOConfig, terms
from zppo_trl.needs import Needs
from zppo_trl.terms import (
    SETTINGS,
    TERM_SELECTORS,
    TERMS,
    Term,
    register_term,
    selected_by,
    settings_fields,
    terms_for,
)

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from code_scan import code_strings, identifiers
except ImportError:
    from tests.code_scan import code_strings, identifiers

PACKAGE = Path(terms.__file__).resolve().parents[1]
OUTSIDE = sorted(p for p in PACKAGE.rglob("*.py") if "terms" not in p.relative_to(PACKAGE).parts)
NAMES = {cls.name for cls in TERMS.values()} | {cls.printed for cls in TERMS.values()}
FIELDS = {name for cls in TERMS.values() for name in settings_fields(cls)} | set(TERM_SELECTORS)
CPU = dict(
    output_dir="unused",
    use_cpu=True,
    bf16=False,
    report_to="none",
    teacher_base_url="http://127.0.0.1:1/v1",
    teacher_model="t",
)


@pytest.mark.parametrize("path", OUTSIDE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_outside_terms_names_a_term_or_a_terms_field(path):
    named = [(line, text) for line, text in code_strings(path) if text in NAMES or any(f in text for f in FIELDS)]
    named += [(line, name) for line, name in identifiers(path) if name in FIELDS]
    assert not named, f"{path.name} names a term or a term's field (declare it on the term instead): {named}"


def test_the_guard_would_catch_a_name(tmp_path):
    source = tmp_path / "leaky.py"
    source.write_text('"""Docstrings may say rlkd."""\ndef f(args):\n    return args.reward_term == "rlkd"\n')
    assert "rlkd" in [text for _, text in code_strings(source)]
    assert "reward_term" in [name for _, name in identifiers(source)]
    assert "Docstrings may say rlkd." not in [text for _, text in code_strings(source)]


def test_the_registry_is_the_term_modules_in_order_and_every_term_declares_itself():
    registered = []
    for module_name in terms.TERM_MODULES:
        module = importlib.import_module(f"zppo_trl.terms.{module_name}")
        registered += [cls for cls in vars(module).values() if isinstance(cls, type) and cls in TERMS.values()]
    assert sorted(registered, key=list(TERMS.values()).index) == list(TERMS.values())
    for (selector, name), cls in TERMS.items():
        assert (cls.selector, cls.name) == (selector, name) and cls.printed and isinstance(cls.needs, Needs)
        assert selector in TERM_SELECTORS
        assert set(cls.reads) <= set(settings_fields(cls)) | {"distill_beta", "distill_chunk_size"}, cls
        assert cls.settings is None or cls.settings in SETTINGS
    # every term's settings are ZPPOConfig fields with their defaults, and a selector value selects exactly its term
    config = ZPPOConfig(**CPU)
    for settings in SETTINGS:
        for name, spec in settings.__dataclass_fields__.items():
            assert getattr(config, name) == spec.default, name
    for selector in TERM_SELECTORS:
        for name, cls in selected_by(selector).items():
            assert terms_for(ZPPOConfig(**CPU, augmentations=[], **{selector: name})) == (cls,)


def test_a_term_registered_twice_or_under_the_objective_field_is_refused():
    cls = next(iter(TERMS.values()))
    with pytest.raises(ValueError, match="is already registered"):
        register_term(type("Again", (Term,), {"selector": cls.selector, "name": cls.name, "printed": "X"}))
    # policy_objective selects from the loss registry only: an objective's term is registered with its loss
    with pytest.raises(ValueError, match="register_loss"):
        register_term(type("Objective", (Term,), {"selector": "policy_objective", "name": "x", "printed": "X"}))
