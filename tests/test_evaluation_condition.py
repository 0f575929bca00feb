"""The evaluation condition a checkpoint carries: recorded in its config.json, found and applied by `zppo-eval run`.

The checkpoints are real saved configs; the endpoint below is a closed port on 127.0.0.1 (nothing
answers, as with a server that is down). Against real servers (vLLM's ``/v1/models`` ``root``,
``transformers serve``'s model names) the resolution is checked in ``test_evaluation_run.py``.
"""

from __future__ import annotations

import json
import logging

import pytest
from servers import free_port
from transformers import AutoConfig

from zppo_trl.evaluation.cli import main
from zppo_trl.evaluation.condition import (
    CONDITION_KEY,
    checkpoint_condition,
    record_condition,
    resolve_condition,
)

NOWHERE = f"http://127.0.0.1:{free_port()}/v1"


@pytest.fixture
def correction_checkpoint(tiny_text_model_dir, tmp_path):
    """The tiny model's config saved as a Correction-SFT checkpoint records it."""
    config = AutoConfig.from_pretrained(tiny_text_model_dir)
    record_condition(config, "<correct>")
    config.save_pretrained(tmp_path / "correction-sft")
    return tmp_path / "correction-sft"


def test_a_recorded_condition_survives_saving_and_none_clears_a_stale_one(correction_checkpoint, tmp_path):
    assert json.loads((correction_checkpoint / "config.json").read_text())[CONDITION_KEY] == "<correct>"
    assert checkpoint_condition(correction_checkpoint) == "<correct>"
    config = AutoConfig.from_pretrained(correction_checkpoint)  # a later row trained from that checkpoint
    record_condition(config, None)
    config.save_pretrained(tmp_path / "grpo")
    assert CONDITION_KEY not in json.loads((tmp_path / "grpo" / "config.json").read_text())
    assert checkpoint_condition(tmp_path / "grpo") is None


def test_the_checkpoint_given_decides_unless_the_flag_overrides_it(correction_checkpoint, caplog):
    where = f"{correction_checkpoint / 'config.json'} (--checkpoint)"
    resolved = resolve_condition(None, correction_checkpoint, NOWHERE, "served-name")
    assert (resolved.condition, resolved.source) == ("<correct>", f"recorded in {where}")
    with caplog.at_level(logging.WARNING, logger="zppo_trl.evaluation.condition"):
        resolved = resolve_condition("none", correction_checkpoint, NOWHERE, "served-name")
    assert (resolved.condition, resolved.source) == (None, "--condition none")
    assert f"overrides the condition '<correct>' recorded in {where}" in caplog.text


def test_a_served_model_named_by_its_directory_is_read_without_the_endpoint(correction_checkpoint):
    # `transformers serve` (and vLLM without --served-model-name) name a local model by its directory
    resolved = resolve_condition(None, None, NOWHERE, str(correction_checkpoint))
    assert resolved.condition == "<correct>"
    assert resolved.source == (
        f"recorded in {correction_checkpoint / 'config.json'} (the served model name, a local directory)"
    )


def test_a_checkpoint_that_cannot_be_located_is_said_and_not_fatal(caplog):
    with caplog.at_level(logging.WARNING, logger="zppo_trl.evaluation.condition"):
        resolved = resolve_condition(None, None, NOWHERE, "org/correction-sft")
    assert resolved.condition is None and resolved.source.startswith(
        "not checked: the checkpoint could not be located"
    )
    assert "its evaluation condition could not be checked" in caplog.text
    assert "'org/correction-sft' is not a local directory and the endpoint's /v1/models could not be read" in (
        caplog.text
    )
    explicit = resolve_condition("<correct>", None, NOWHERE, "org/correction-sft")
    assert (explicit.condition, explicit.source) == ("<correct>", "--condition")


def test_a_checkpoint_option_without_a_config_is_an_error_naming_it(tmp_path, capsys):
    with pytest.raises(ValueError, match="config.json is not a readable config.json"):
        checkpoint_condition(tmp_path)
    argv = ["run", "--base-url", NOWHERE, "--model", "m", "--no-judge", "--tasks", "GPQA-D",
            "--output-dir", str(tmp_path / "run"), "--checkpoint", str(tmp_path / "missing")]  # fmt: skip
    assert main(argv) == 2
    assert f"error: {tmp_path / 'missing' / 'config.json'} is not a readable config.json" in capsys.readouterr().err
