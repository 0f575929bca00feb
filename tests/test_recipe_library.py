"""`zppo_trl.recipe`, called directly: recipe YAMLs with ``base:`` inheritance, the parse of a
command line into the three argument objects, the grouped parser, the student, the reward
functions and the servers a run waits for."""

from __future__ import annotations

import logging
import re
import socket
from pathlib import Path

import pytest
import torch
import yaml
from trl import ModelConfig

from zppo_trl import ZPPOConfig
from zppo_trl.recipe import (
    RecipeError,
    ScriptArguments,
    build_parser,
    endpoints,
    load_recipe,
    load_student,
    parse_recipe_args,
    recipe_changes,
    resolve_base,
    reward_functions,
    student_config,
    wait_for_servers,
)

REPO = Path(__file__).resolve().parent.parent


def _closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def _config(**fields) -> ZPPOConfig:
    common = dict(output_dir="unused", use_cpu=True, bf16=False, per_device_train_batch_size=8, report_to="none")
    return ZPPOConfig(**{**common, **fields})


def test_load_recipe_puts_each_yaml_on_top_of_its_base(tmp_path):
    (tmp_path / "rows").mkdir()
    (tmp_path / "scale.yaml").write_text(yaml.safe_dump({"a": 1, "b": 1, "c": 1, "augmentations": ["bcq", "ncq"]}))
    row = {"base": "../scale.yaml", "b": 2, "augmentations": []}
    (tmp_path / "rows" / "row.yaml").write_text(yaml.safe_dump(row))
    (tmp_path / "rows" / "tweak.yaml").write_text(yaml.safe_dump({"base": "row.yaml", "c": 3}))
    assert load_recipe(tmp_path / "scale.yaml") == {"a": 1, "b": 1, "c": 1, "augmentations": ["bcq", "ncq"]}
    assert load_recipe(tmp_path / "rows" / "row.yaml") == {"a": 1, "b": 2, "c": 1, "augmentations": []}
    assert load_recipe(str(tmp_path / "rows" / "tweak.yaml")) == {"a": 1, "b": 2, "c": 3, "augmentations": []}
    (tmp_path / "empty.yaml").write_text("")
    assert load_recipe(tmp_path / "empty.yaml") == {}


def test_recipe_changes_are_the_fields_a_row_sets_otherwise_except_where_it_writes(tmp_path):
    (tmp_path / "rows").mkdir()
    (tmp_path / "paper.yaml").write_text(yaml.safe_dump({"a": 1, "b": 2, "output_dir": "out/paper"}))
    row = {"base": "../paper.yaml", "a": 1, "b": 3, "c": 4, "output_dir": "out/row", "hub_model_id": "x/row"}
    (tmp_path / "rows" / "row.yaml").write_text(yaml.safe_dump(row))
    assert recipe_changes(tmp_path / "rows" / "row.yaml", tmp_path / "paper.yaml") == {"b": 3, "c": 4}
    assert recipe_changes(tmp_path / "paper.yaml", tmp_path / "paper.yaml") == {}


def test_load_recipe_names_a_cycle_a_missing_base_and_a_non_mapping(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ValueError, match="base recipes form a cycle") as cycle:
        load_recipe(tmp_path / "a.yaml")
    assert f"{tmp_path / 'a.yaml'} -> {tmp_path / 'b.yaml'} -> {tmp_path / 'a.yaml'}" in str(cycle.value)
    (tmp_path / "c.yaml").write_text("base: missing.yaml\n")
    with pytest.raises(ValueError, match=r"missing.yaml does not exist \(the base of .*c.yaml\)"):
        load_recipe(tmp_path / "c.yaml")
    with pytest.raises(ValueError, match="nope.yaml does not exist$"):
        load_recipe(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="a recipe is a mapping of field: value"):
        load_recipe(tmp_path / "list.yaml")


def test_resolve_base_rewrites_only_a_config_with_a_base(tmp_path):
    assert resolve_base(["--dry_run"]) == ["--dry_run"]
    assert resolve_base(["--dry_run", "--config"]) == ["--dry_run", "--config"]  # argparse names the missing value
    plain = ["--config", "recipes/qwen35_0.8b.yaml", "--max_steps", "8"]
    assert resolve_base(plain) == plain
    row = str(REPO / "recipes" / "rows" / "grpo_dagger_hint.yaml")
    resolved = resolve_base(["--dry_run", "--config", row, "--max_steps", "8"])
    try:
        assert resolved[:2] == ["--dry_run", "--config"] and resolved[3:] == ["--max_steps", "8"]
        assert resolved[2] != row and "base" not in yaml.safe_load(Path(resolved[2]).read_text())
        assert yaml.safe_load(Path(resolved[2]).read_text()) == load_recipe(row)
    finally:
        Path(resolved[2]).unlink()


def test_parse_recipe_args_reads_a_row_through_its_base_with_overrides():
    script, args, model = parse_recipe_args(
        ["--config", "recipes/rows/grpo_dagger_prefix.yaml", "--dry_run", "--num_training_ranks", "24"]
    )
    assert isinstance(script, ScriptArguments) and isinstance(args, ZPPOConfig) and isinstance(model, ModelConfig)
    assert script.dry_run and script.num_training_ranks == 24 and args.variant == "GRPO\u2020+Prefix"
    assert args.reformulations == ["prefix"] and model.model_name_or_path == "Qwen/Qwen3.5-0.8B"
    if not torch.cuda.is_available():  # a dry run validates a GPU recipe on this machine
        assert args.use_cpu


def test_parse_recipe_args_names_what_to_fix_in_one_line(tmp_path):
    for argv, message in (
        (["--config", "recipes/qwen35_0.8b.yaml", "--dry_run", "--hard_threshold", "1.5"], "hard_threshold must be"),
        (["--config", str(tmp_path / "nope.yaml")], "nope.yaml"),
        (["--config", "recipes/demo.yaml", "--dry_run", "--model_name_or_path", ""], "model_name_or_path is required"),
    ):
        with pytest.raises(RecipeError, match=message) as raised:
            parse_recipe_args(argv)
        assert "\n" not in str(raised.value), argv
    (tmp_path / "a.yaml").write_text("base: a.yaml\n")
    with pytest.raises(RecipeError, match="form a cycle"):
        parse_recipe_args(["--config", str(tmp_path / "a.yaml"), "--dry_run"])
    with pytest.raises(RecipeError, match=r"not used by the HfArgumentParser: \['--bogus', '1'\]"):
        parse_recipe_args(["--config", "recipes/qwen35_0.8b.yaml", "--dry_run", "--bogus", "1"])
    with pytest.raises(SystemExit):  # argparse's own error (a flag without its value), with its usage line
        parse_recipe_args(["--config", "recipes/qwen35_0.8b.yaml", "--dry_run", "--max_steps"])


def test_the_deprecated_key_overrides_its_base_at_every_level(tmp_path):
    """A row written with the old key ``reformulations`` over a base that says ``augmentations`` still wins,
    as it did before the rename; so does ``--reformulations`` on the command line over the YAML's key."""
    row = tmp_path / "row.yaml"
    row.write_text(f"base: {REPO / 'recipes/qwen35_0.8b.yaml'}\nreformulations: [hint]\n")
    with pytest.warns(FutureWarning, match="now called augmentations"):
        fields = load_recipe(row)
    assert fields["augmentations"] == ["hint"] and "reformulations" not in fields
    with pytest.warns(FutureWarning):
        _, args, _ = parse_recipe_args(
            ["--config", str(row), "--output_dir", str(tmp_path / "out"), "--use_cpu", "true"]
        )
    assert args.augmentations == args.reformulations == ["hint"] and args.variant == "GRPO\u2020+Hint"
    with pytest.warns(FutureWarning, match="--augmentations"):
        _, args, _ = parse_recipe_args(
            [
                "--config",
                str(REPO / "recipes/qwen35_0.8b.yaml"),
                "--output_dir",
                str(tmp_path / "out"),
                "--use_cpu",
                "true",
                "--reformulations",
                "ncq",
            ]
        )
    assert args.augmentations == ["ncq"]
    both = tmp_path / "both.yaml"
    both.write_text(f"base: {REPO / 'recipes/qwen35_0.8b.yaml'}\nreformulations: [hint]\naugmentations: [bcq]\n")
    with pytest.raises(ValueError, match="disagree"):
        load_recipe(both)


def test_parser_groups_the_help_zppo_fields_first():
    help_text = build_parser().format_help()
    titles = [line[:-1] for line in help_text.splitlines() if line and not line[0].isspace() and line.endswith(":")]
    assert titles[:5] == [
        "ZPPO (zppo_trl.ZPPOConfig)", "this script (recipes/zppo.py)", "TRL fields at the paper's values",
        "the student (trl.ModelConfig)", "training (trl.GRPOConfig, transformers.TrainingArguments)",
    ]  # fmt: skip
    script = help_text.split("this script (recipes/zppo.py):")[1].split("TRL fields at the paper's values:")[0]
    assert "--dry_run" in script and "--print_server_lengths" in script and "--hard_threshold" not in script


def test_endpoints_list_each_server_once():
    teacher = dict(teacher_base_url="http://teacher:8000/v1", teacher_model="t")
    assert endpoints(ScriptArguments(), _config(**teacher)) == [("teacher", "http://teacher:8000/v1", "t")]
    judged = _config(**teacher, judge_base_url="http://judge:8000/v1", judge_model="j")
    assert endpoints(ScriptArguments(), judged) == [
        ("teacher", "http://teacher:8000/v1", "t"),
        ("judge", "http://judge:8000/v1", "j"),
    ]
    assert endpoints(ScriptArguments(use_judge=False), judged) == [("teacher", "http://teacher:8000/v1", "t")]
    grpo = _config(**teacher, augmentations=[])  # no reformulations: the teacher's server only judges
    assert endpoints(ScriptArguments(), grpo) == [("judge", "http://teacher:8000/v1", "t")]
    assert endpoints(ScriptArguments(use_judge=False), grpo) == []


def test_wait_for_servers_names_the_fields_of_a_server_that_does_not_answer():
    url = _closed_url()
    teacher = _config(teacher_base_url=url, teacher_model="t")
    wait_for_servers(ScriptArguments(teacher_wait_s=0), teacher)  # 0 skips the check
    with pytest.raises(SystemExit, match="fix teacher_base_url / teacher_model") as stopped:
        wait_for_servers(ScriptArguments(teacher_wait_s=1e-6), teacher)
    assert f"the teacher at {url} (model 't') did not answer within teacher_wait_s=1e-06 s" in str(stopped.value)
    judge_only = _config(teacher_base_url=url, teacher_model="t", augmentations=[])
    with pytest.raises(SystemExit, match="fix judge_base_url / judge_model"):
        wait_for_servers(ScriptArguments(teacher_wait_s=1e-6), judge_only)


def test_a_server_awaited_gets_a_line_every_report_interval_naming_it(monkeypatch, caplog):
    """A teacher down at start: a warning every WAIT_REPORT_S (shortened here) says what is awaited, for how long
    of teacher_wait_s, and why; the judge's own health warning calls it the judge."""
    import zppo_trl.recipe as recipe
    from zppo_trl.teacher import TeacherClient

    url = _closed_url()
    monkeypatch.setattr(recipe, "WAIT_REPORT_S", 0.2)
    with caplog.at_level(logging.WARNING, logger="zppo"), pytest.raises(SystemExit):
        wait_for_servers(ScriptArguments(teacher_wait_s=0.9), _config(teacher_base_url=url, teacher_model="t"))
    lines = [r.message for r in caplog.records if r.name == "zppo"]
    assert len(lines) >= 2, lines
    assert all(
        re.match(
            rf"still waiting for the teacher at {re.escape(url)} \(model t\): \d+ s of teacher_wait_s=0.9 s \(.+\)",
            line,
        )
        for line in lines
    ), lines
    caplog.clear()
    judge = TeacherClient(url, "j", role="judge")
    with caplog.at_level(logging.WARNING, logger="zppo_trl.teacher"):
        assert not judge.health(timeout=2.0)
    judge.close()
    assert caplog.records[-1].message.startswith(f"judge endpoint {url} (model j) is not healthy")


def test_student_config_reads_the_local_cache_only_when_asked(tiny_text_model_dir):
    local = ModelConfig(model_name_or_path=str(tiny_text_model_dir))
    assert student_config(local, local_files_only=True).model_type == "qwen3"
    with pytest.raises(OSError):  # nothing cached, and no request made
        student_config(ModelConfig(model_name_or_path="zppo-trl/no-such-student"), local_files_only=True)


def test_student_kind_processor_and_rewards_follow_the_config(tiny_vlm_dir, tiny_text_model_dir):
    from zppo_trl.processing import ImageOnlyQwen3VLProcessor

    model, processor = load_student(ModelConfig(model_name_or_path=str(tiny_vlm_dir)))
    assert type(model).__name__ == "Qwen3_5ForConditionalGeneration"
    assert isinstance(processor, ImageOnlyQwen3VLProcessor)
    model, processor = load_student(ModelConfig(model_name_or_path=str(tiny_text_model_dir), dtype="bfloat16"))
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.dtype.is_floating_point
    assert str(model.dtype) == "torch.bfloat16"
    assert not hasattr(processor, "image_processor")

    args = _config(teacher_base_url="http://127.0.0.1:1/v1", teacher_model="t")
    judged = reward_functions(ScriptArguments(), args)
    assert [f.__name__ for f in judged] == ["judged_accuracy_reward"]
    assert reward_functions(ScriptArguments(use_judge=False), args)[0].__name__ == "boxed_accuracy_reward"
    plain = _config(augmentations=[])
    assert reward_functions(ScriptArguments(), plain)[0].__name__ == "boxed_accuracy_reward"  # no judge endpoint
