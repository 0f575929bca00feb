import warnings

import pytest
import yaml
from trl import TrlParser

from zppo_trl.config import PAPER_OBJECTIVE, ZPPOConfig
from zppo_trl.prompts import RL_CLOSER

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from settings import CPU as CPU_ONLY
except ImportError:
    from tests.settings import CPU as CPU_ONLY

CPU = {**CPU_ONLY, "per_device_train_batch_size": 8}
TEACHER = dict(teacher_base_url="http://127.0.0.1:8000/v1", teacher_model="Qwen/Qwen3.5-27B-FP8")


def test_defaults_are_the_papers():
    c = ZPPOConfig(**CPU, **TEACHER)
    # ZPPO-specific rows of the paper's hyperparameter table
    assert (c.hard_threshold, c.replay_fraction, c.replay_capacity, c.augment_fraction) == (0.5, 0.25, 10_000, 0.25)
    assert c.augmentations == ["bcq", "ncq"] and c.compression_max_tokens == 512
    assert (c.num_partitions, c.advantage_normalization) == (4, "without_zero")
    assert (c.num_generations, c.teacher_num_generations, c.teacher_max_tokens) == (8, 4, 12_288)
    assert (c.teacher_temperature, c.teacher_top_p, c.temperature, c.top_p) == (1.0, 1.0, 1.0, 1.0)
    # GRPO backbone and optimisation rows
    assert (c.epsilon, c.epsilon_high, c.delta, c.loss_type, c.beta) == (0.2, 0.28, 10.0, "dapo", 0.0)
    assert (c.learning_rate, c.weight_decay, c.max_grad_norm, c.warmup_steps) == (1e-6, 0.1, 1.0, 0)
    assert (c.adam_beta1, c.adam_beta2, c.adam_epsilon) == (0.9, 0.999, 1e-8)
    assert c.lr_scheduler_type == "constant" and c.num_iterations == 1
    assert c.closer == RL_CLOSER
    # the judge defaults to the teacher
    assert (c.judge_base_url, c.judge_model) == (TEACHER["teacher_base_url"], TEACHER["teacher_model"])


def test_partitions_map_onto_trl_batching():
    c = ZPPOConfig(**CPU, **TEACHER, gradient_accumulation_steps=2)
    assert c.steps_per_generation == 8 and c.generation_batch_size == 8 * 8
    with pytest.raises(ValueError, match="num_partitions .* steps_per_generation"):
        ZPPOConfig(**CPU, **TEACHER, steps_per_generation=3)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(hard_threshold=1.5), "hard_threshold"),
        (dict(replay_fraction=-0.1), "replay_fraction"),
        (dict(augment_fraction=2), "augment_fraction"),
        (dict(augmentations=["bcq", "hint"]), "augmentations"),
        (dict(augmentations=["bcq", "bcq"]), "augmentations"),
        (dict(advantage_normalization="batch"), "advantage_normalization"),
        (dict(num_partitions=0), "num_partitions"),
        (dict(replay_capacity=-1), "replay_capacity"),
        (dict(num_partitions=True), "num_partitions must be an integer >= 1, got True"),  # a bool is no count
        (dict(teacher_num_generations=0), "teacher_num_generations"),
        (dict(compression_max_tokens=0), "compression_max_tokens"),
        (dict(padding_free="yes"), "padding_free"),
        (dict(delta=1.1), "delta"),
        (dict(delta=None), "delta"),
        (dict(augmentations=["hint", "prefix"]), "augmentations"),
        (dict(augmentations=["correction", "bcq"]), "augmentations"),
        (dict(augmentations=["prefix"], prefix_fraction=1.0), "prefix_fraction"),
        (dict(augmentations=["correction"], policy_objective="cispo"), "policy_objective"),
        (dict(augmentations=[], distillation="sideways", distill_teacher="t"), "distillation"),
        (dict(augmentations=[], distillation=True, distill_teacher="t"), "quote it"),
        (dict(distillation="on", distill_teacher="t"), "augmentations"),
        (dict(augmentations=[], distillation="on", teacher_base_url=None), "distill_teacher"),
        (dict(augmentations=[], distillation="on", distill_top_k=0), "distill_top_k"),
        (dict(augmentations=[], distillation="on", distill_chunk_size=1.5), "distill_chunk_size"),
        (dict(augmentations=[], distillation="on", distill_teacher="t", distill_beta=2.0), "distill_beta"),
        (dict(augmentations=[], distillation="off", distill_teacher="t", teacher_base_url=None), "teacher_base_url"),
    ],
)
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        ZPPOConfig(**{**CPU, **TEACHER, **overrides})


def test_distillation_takes_the_teacher_from_its_server_unless_one_is_given_to_load():
    server = ZPPOConfig(**CPU, **TEACHER, augmentations=[], distillation="on")
    assert server.distill_teacher is None and server.distill_top_k == 20
    ZPPOConfig(
        **{**CPU, **TEACHER, "teacher_base_url": None}, augmentations=[], distillation="on", distill_teacher="t"
    )


def test_trl_defaults_that_change_the_objective_are_the_papers():
    # TRL 1.16 turns its vLLM importance-sampling correction on by default; ZPPO's only ratio is the PPO ratio.
    for overrides in ({}, dict(use_vllm=True, vllm_mode="server")):
        c = ZPPOConfig(**CPU, **TEACHER, **overrides)
        for name, (required, _why) in PAPER_OBJECTIVE.items():
            assert getattr(c, name) == required, name


@pytest.mark.parametrize(
    "name, value",
    [
        ("loss_type", "grpo"),
        ("loss_type", "cispo"),
        ("importance_sampling_level", "sequence"),
        ("vllm_importance_sampling_correction", True),
        ("mask_truncated_completions", True),
        ("top_entropy_quantile", 0.2),
        ("off_policy_mask_threshold", 0.5),
        ("scale_rewards", "group"),
        ("scale_rewards", True),  # TRL reads True as "group"
        ("num_iterations", 2),
        ("beta", 0.04),
        ("entropy_coef", 0.01),
        ("use_adaptive_entropy", True),
        ("multi_objective_aggregation", "normalize_then_sum"),  # the advantages read the weighted reward sum
    ],
)
def test_settings_that_change_the_objective_are_refused_naming_the_field(name, value):
    with pytest.raises(ValueError, match=rf"^{name}=.* changes ZPPO's objective.*Set {name}="):
        ZPPOConfig(**CPU, **TEACHER, **{name: value})


@pytest.mark.parametrize(
    "row, trains", [({"augmentations": ["correction"]}, "sft"), ({"distillation": "on", "augmentations": []}, "jsd")]
)
def test_a_policy_objective_on_a_row_without_one_is_refused_naming_the_loss_it_trains(row, trains):
    with pytest.raises(
        ValueError, match=rf"policy_objective='cispo' has no effect on this row: it trains the '{trains}'"
    ):
        ZPPOConfig(**CPU, **TEACHER, **row, policy_objective="cispo")


def test_an_objective_sets_the_trl_settings_it_declares_and_loading_its_saved_config_keeps_them():
    cispo = ZPPOConfig(**CPU, **TEACHER, policy_objective="cispo")
    gspo = ZPPOConfig(**CPU, **TEACHER, policy_objective="gspo")
    assert (cispo.loss_type, gspo.importance_sampling_level) == ("cispo", "sequence")
    assert ZPPOConfig(**CPU, **TEACHER, policy_objective="cispo", loss_type="cispo").loss_type == "cispo"
    with pytest.raises(ValueError, match="set policy_objective='cispo'"):  # the hint names the objective that sets it
        ZPPOConfig(**CPU, **TEACHER, loss_type="cispo")


def test_objective_table_covers_the_trl_settings_that_change_the_loss():
    assert set(PAPER_OBJECTIVE) >= {
        "loss_type",
        "importance_sampling_level",
        "mask_truncated_completions",
        "top_entropy_quantile",
        "off_policy_mask_threshold",
        "scale_rewards",
        "num_iterations",
        "vllm_importance_sampling_correction",
    }
    fields = set(ZPPOConfig.__dataclass_fields__)
    assert set(PAPER_OBJECTIVE) <= fields  # every name is a real TRL field


def test_augmentations_need_a_teacher():
    with pytest.raises(ValueError, match="teacher_base_url"):
        ZPPOConfig(**CPU)
    assert ZPPOConfig(**CPU, augmentations=[]).teacher_base_url is None  # GRPO† needs none


@pytest.mark.parametrize(
    "settings, match",
    [
        (dict(teacher_temperature=0.0), "teacher_num_generations=4 rollouts per question would be one reply"),
        (dict(teacher_temperature=-0.5), "teacher_temperature must be a finite number >= 0.0, got -0.5"),
        (dict(teacher_temperature="hot"), "teacher_temperature must be a finite number >= 0.0"),
        (dict(teacher_temperature=float("inf")), "teacher_temperature must be a finite number >= 0.0, got inf"),
    ],
)
def test_a_teacher_temperature_that_cannot_sample_its_rollouts_is_refused(settings, match):
    with pytest.raises(ValueError, match=match):
        ZPPOConfig(**CPU, augmentations=[], **settings)
    greedy = ZPPOConfig(**CPU, augmentations=[], teacher_temperature=0.0, teacher_num_generations=1)
    assert (greedy.teacher_temperature, greedy.teacher_num_generations) == (0.0, 1)


@pytest.mark.parametrize(
    "augmentations, replay_fraction, variant",
    [
        (["bcq", "ncq"], 0.25, "ZPPO"),
        (["bcq", "ncq"], 0.0, "GRPO+Both"),
        ([], 0.25, "GRPO\u2020"),
        ([], 0.0, "GRPO"),
        (["bcq"], 0.25, "GRPO\u2020+BCQ"),
        (["ncq"], 0.25, "GRPO\u2020+NCQ"),
        (["hint"], 0.25, "GRPO\u2020+Hint"),
        (["prefix"], 0.25, "GRPO\u2020+Prefix"),
        (["correction"], 0.25, "Correction-SFT\u2020"),
        (["reflection"], 0.25, "Error-reflection-SFT\u2020"),
        (["reflection"], 0.0, "Error-reflection-SFT"),
    ],
)
def test_ablations_are_configurations(augmentations, replay_fraction, variant):
    c = ZPPOConfig(**CPU, **TEACHER, augmentations=augmentations, replay_fraction=replay_fraction)
    assert c.variant == variant


@pytest.mark.parametrize(
    "mode, replay_fraction, variant",
    [
        ("off", 0.0, "Off-Distill"),
        ("off", 0.25, "Off-Distill\u2020"),
        ("on", 0.0, "On-Distill"),
        ("on", 0.25, "On-Distill\u2020"),
    ],
)
def test_distillation_rows_are_named_as_the_paper_prints_them(mode, replay_fraction, variant):
    c = ZPPOConfig(
        **CPU, **TEACHER, augmentations=[], distillation=mode, distill_teacher="t", replay_fraction=replay_fraction
    )
    assert c.variant == variant


@pytest.mark.parametrize(
    "row, setting",
    [
        (dict(augmentations=["bcq", "ncq"]), dict(prefix_fraction=0.3)),
        (dict(augmentations=["hint"]), dict(distill_teacher="t")),
        (dict(augmentations=[]), dict(distill_beta=0.2)),
        (dict(augmentations=[], policy_objective="cispo"), dict(dispo_epsilon_high_neg=5.0)),
    ],
)
def test_a_row_specific_field_on_another_row_is_warned_about(row, setting):
    (name,) = setting
    with pytest.warns(UserWarning, match=f"{name}=.* has no effect on this row"):
        ZPPOConfig(**CPU, **TEACHER, **row, **setting)


def test_row_specific_fields_on_their_own_rows_are_not_warned_about():
    rows = [
        dict(augmentations=["prefix"], prefix_fraction=0.3),
        dict(augmentations=[], distillation="on", distill_teacher="t", distill_beta=0.2),
        dict(augmentations=["bcq", "ncq"], policy_objective="dispo", dispo_epsilon_high_neg=5.0),
        dict(augmentations=["bcq", "ncq"]),  # defaults everywhere
    ]
    for row in rows:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ZPPOConfig(**CPU, **TEACHER, **row)
        assert not [w for w in caught if "has no effect" in str(w.message)], row


def test_command_line_and_api_key_env(monkeypatch):
    args = [
        "--output_dir",
        "unused",
        "--use_cpu",
        "--bf16",
        "false",
        "--per_device_train_batch_size",
        "8",
        "--teacher_base_url",
        "http://127.0.0.1:9/v1",
        "--teacher_model",
        "t",
        "--augmentations",
        "ncq",
        "--hard_threshold",
        "0.375",
        "--teacher_extra_body",
        '{"chat_template_kwargs": {"enable_thinking": true}}',
        "--judge_extra_body",
        '{"chat_template_kwargs": {"enable_thinking": false}}',
    ]
    (config,) = TrlParser((ZPPOConfig,)).parse_args_and_config(args)
    assert config.augmentations == ["ncq"] and config.hard_threshold == 0.375
    assert config.teacher_extra_body == {"chat_template_kwargs": {"enable_thinking": True}}
    assert config.judge_extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    monkeypatch.setenv("MY_TEACHER_KEY", "sk-test")
    assert ZPPOConfig(**CPU, **TEACHER, teacher_api_key_env="MY_TEACHER_KEY").teacher_api_key() == "sk-test"


def test_checkpoints_inside_a_rollout_step_are_warned_about(tmp_path):
    with pytest.warns(UserWarning, match="save_steps"):
        ZPPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            augmentations=[],
            save_strategy="steps",
            save_steps=6,
            num_partitions=4,
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ZPPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            augmentations=[],
            save_strategy="steps",
            save_steps=8,
            num_partitions=4,
        )
    assert not [w for w in caught if "save_steps" in str(w.message)]


def test_composition_and_clients_follow_the_config():
    c = ZPPOConfig(
        **{**CPU, "per_device_train_batch_size": 4}, gradient_accumulation_steps=4, max_steps=800, **TEACHER,
        judge_base_url="http://judge:9000/v1", judge_extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )  # fmt: skip
    step = c.composition(48)
    assert (step.new_prompts, step.max_replayed, step.max_reformulated, step.max_prompts) == (384, 96, 96, 576)
    assert (step.new_prompts_per_update, step.rollout_steps, step.teacher_rollouts) == (96, 200, 4)
    assert c.composition(24).new_prompts == 192
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        c.composition(0)
    c.num_generations = 12  # 4 x 16 rows per rank: not whole groups of 12
    with pytest.raises(ValueError, match=r"\(4 x 16\) must be a multiple of num_generations \(12\)"):
        c.composition(2)
    c.num_generations = 8
    from zppo_trl.teacher import TeacherClient

    teacher, judge = TeacherClient.from_config(c), TeacherClient.from_config(c, role="judge")
    try:
        assert (teacher.base_url, teacher.model, teacher.extra_body) == (
            TEACHER["teacher_base_url"],
            TEACHER["teacher_model"],
            {},
        )
        assert (judge.base_url, judge.model) == ("http://judge:9000/v1", TEACHER["teacher_model"])
        assert judge.extra_body == {"chat_template_kwargs": {"enable_thinking": False}}
    finally:
        teacher.close()
        judge.close()
    cli = ZPPOConfig(**CPU, augmentations=[""])  # `--augmentations ""` on the command line: none
    assert cli.augmentations == [] and cli.variant == "GRPO\u2020"


# `reformulations` is the deprecated name of `augmentations` (it held only BCQ/NCQ when it was named).


@pytest.mark.parametrize("kinds", [["hint"], [], ["ncq", "bcq"], "bcq,ncq"])
def test_the_old_name_warns_and_sets_augmentations(kinds):
    with pytest.warns(FutureWarning, match="reformulations is deprecated.*augmentations"):
        c = ZPPOConfig(**CPU, **TEACHER, reformulations=kinds)
    expected = kinds.split(",") if isinstance(kinds, str) else kinds
    assert c.augmentations == expected and c.reformulations == c.augmentations  # read under either name
    assert "reformulations" not in c.to_dict() and c.to_dict()["augmentations"] == expected


def test_the_new_name_and_the_default_do_not_warn():
    for row in (dict(augmentations=["prefix"]), {}):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            c = ZPPOConfig(**CPU, **TEACHER, **row)
            c.to_dict()
            c.to_json_string()
        assert not [w for w in caught if "reformulations" in str(w.message)], row
        assert c.reformulations == c.augmentations == row.get("augmentations", ["bcq", "ncq"])


def test_both_names_set_differently_is_an_error_naming_both():
    with pytest.raises(ValueError, match=r"augmentations \['bcq'\] and reformulations \['hint'\] disagree"):
        ZPPOConfig(**CPU, **TEACHER, augmentations=["bcq"], reformulations=["hint"])
    # an explicit ["bcq", "ncq"] is a setting too, not the default
    with pytest.raises(ValueError, match="augmentations .* and reformulations .* disagree"):
        ZPPOConfig(**CPU, **TEACHER, augmentations=["bcq", "ncq"], reformulations=[])
    with pytest.warns(FutureWarning):  # the same kinds under both names: no conflict
        assert ZPPOConfig(**CPU, **TEACHER, augmentations=["ncq"], reformulations="ncq").augmentations == ["ncq"]


def test_the_old_name_parses_from_a_yaml_and_the_command_line(tmp_path):
    base = ["--output_dir", "unused", "--use_cpu", "--bf16", "false", "--per_device_train_batch_size", "8",
            "--teacher_base_url", "http://127.0.0.1:9/v1", "--teacher_model", "t"]  # fmt: skip
    old_yaml = tmp_path / "old.yaml"
    old_yaml.write_text("reformulations: [hint]\nreplay_fraction: 0.25\n")
    new_yaml = tmp_path / "new.yaml"
    new_yaml.write_text("augmentations: [hint]\n")
    with pytest.warns(FutureWarning, match="augmentations"):
        (config,) = TrlParser((ZPPOConfig,)).parse_args_and_config(["--config", str(old_yaml), *base])
    assert config.augmentations == config.reformulations == ["hint"] and config.variant == "GRPO\u2020+Hint"
    with pytest.warns(FutureWarning, match="augmentations"):
        (config,) = TrlParser((ZPPOConfig,)).parse_args_and_config([*base, "--reformulations", "bcq", "ncq"])
    assert config.augmentations == ["bcq", "ncq"]
    with pytest.warns(FutureWarning, match="augmentations"):
        (config,) = TrlParser((ZPPOConfig,)).parse_args_and_config([*base, "--reformulations", ""])  # none
    assert config.augmentations == [] and config.variant == "GRPO\u2020"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (config,) = TrlParser((ZPPOConfig,)).parse_args_and_config(["--config", str(new_yaml), *base])
    assert config.augmentations == config.reformulations == ["hint"]
    assert not [w for w in caught if "reformulations" in str(w.message)]
    # the old name on the command line over a YAML with the new one: both set, told apart, refused
    with pytest.raises(ValueError, match="augmentations .* and reformulations .* disagree"):
        TrlParser((ZPPOConfig,)).parse_args_and_config(["--config", str(new_yaml), *base, "--reformulations", "ncq"])


def test_a_recipe_yaml_written_with_the_old_name_still_runs(tmp_path):
    from pathlib import Path

    from zppo_trl.recipe import build_parser, load_recipe

    repo = Path(__file__).resolve().parent.parent
    scale = (repo / "recipes" / "qwen35_0.8b.yaml").read_text()
    assert "\naugmentations: [bcq, ncq]\n" in scale
    (tmp_path / "old_scale.yaml").write_text(
        scale.replace("\naugmentations: [bcq, ncq]\n", "\nreformulations: [bcq, ncq]\n")
    )
    (tmp_path / "old_row.yaml").write_text(
        "base: old_scale.yaml\nreformulations: [ncq]\n"
    )  # a row over it, as rows/ do
    merged = tmp_path / "merged.yaml"
    with pytest.warns(FutureWarning, match="augmentations"):
        merged.write_text(yaml.safe_dump(load_recipe(str(tmp_path / "old_row.yaml"))))
    _, args, _ = build_parser().parse_args_and_config(["--config", str(merged), "--use_cpu", "true"])
    assert args.augmentations == args.reformulations == ["ncq"] and args.variant == "GRPO\u2020+NCQ"
