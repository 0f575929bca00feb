"""The TRL and transformers internals ZPPOTrainer relies on, checked against what is installed.

ZPPOTrainer overrides private hooks of `trl.GRPOTrainer` and `transformers.Trainer` and reads
some of their private state. setup.cfg bounds both packages to the releases the suite ran
on; these tests fail first when an installed release moves a hook, so a widened bound is
never taken on trust.
"""

from __future__ import annotations

import configparser
import inspect
import re
from importlib.metadata import version
from pathlib import Path

import pytest
import transformers
from datasets import Dataset
from packaging.requirements import Requirement
from tiny_models import tiny_text_model, tiny_tokenizer
from trl import GRPOTrainer

from zppo_trl import ZPPOConfig, ZPPOTrainer

ROOT = Path(__file__).resolve().parents[1]
# State ZPPOTrainer adds itself (everything else it reads on self is TRL's or transformers').
ZPPO_ATTRIBUTES = {
    "replay_buffer",
    "counters",
    "teacher",
    "dataset_name",
    "model_license",
    "_row_of",
    "_rng",
    "_admitted_at",
    "_active_round",
    "ranks",
    "objective_loss",
}


def _requirements() -> dict[str, Requirement]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = [line.split("#")[0].strip() for line in config["options"]["install_requires"].splitlines()]
    return {(req := Requirement(line)).name: req for line in lines if line}


def test_installed_versions_are_within_the_declared_bounds():
    requirements = _requirements()
    for name in ("trl", "transformers"):
        specifier = requirements[name].specifier
        assert any(s.operator == "<" for s in specifier), (
            f"{name} needs an upper bound: the trainer overrides its private hooks"
        )
        assert specifier.contains(version(name)), f"{name} {version(name)} is outside the declared {specifier}"
    for name, requirement in requirements.items():
        assert requirement.specifier.contains(version(name), prereleases=True), (
            f"{name} {version(name)} not in {requirement.specifier}"
        )


def _ours() -> list[type]:
    """ZPPOTrainer and its mixins (every class of its MRO defined in zppo_trl)."""
    return [cls for cls in ZPPOTrainer.__mro__ if cls.__module__.startswith("zppo_trl.")]


def _overridden_hooks() -> list[str]:
    own = {name: value for cls in reversed(_ours()) for name, value in vars(cls).items()}
    return sorted(
        name for name in own if callable(own[name]) and not name.startswith("__") and hasattr(GRPOTrainer, name)
    )


def test_every_overridden_hook_exists_upstream_with_the_same_parameters():
    hooks = _overridden_hooks()
    assert {
        "training_step",
        "_prepare_inputs",
        "_calculate_rewards",
        "_save_rng_state",
        "_load_optimizer_and_scheduler",
    } <= set(hooks)
    for name in hooks:
        ours = list(inspect.signature(getattr(ZPPOTrainer, name)).parameters)
        theirs = list(inspect.signature(getattr(GRPOTrainer, name)).parameters)
        assert ours == theirs, f"{name}: ZPPOTrainer takes {ours}, the installed TRL/transformers passes {theirs}"


def test_the_upstream_methods_and_state_the_trainer_uses_exist(tmp_path):
    source = "\n".join(inspect.getsource(inspect.getmodule(cls)) for cls in _ours())
    called_upstream = set(re.findall(r"super\(\)\.(\w+)\(", source)) - {"__init__"}
    used = set(re.findall(r"self\.(\w+)", source))
    defined_here = {name for cls in _ours() for name in vars(cls)} | ZPPO_ATTRIBUTES
    for name in called_upstream:
        assert callable(getattr(GRPOTrainer, name, None)), f"GRPOTrainer.{name} is gone"
    args = ZPPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to=[],
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        augmentations=[],
        replay_fraction=0.0,
    )
    rows = [
        dict(id=f"q{i}", question="What is 1 + 1?", images=[], answer="2", source="t", subdataset="t")
        for i in range(2)
    ]

    async def async_reward(completions, **kwargs):  # so that TRL starts its async loop, which _grade uses
        return [0.0] * len(completions)

    trainer = ZPPOTrainer(
        model=tiny_text_model(),
        reward_funcs=[async_reward],
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tiny_tokenizer(),
    )
    upstream_state = sorted(used - defined_here - called_upstream)
    assert {"_metrics", "_logs", "async_loop", "_tokenizer", "_buffered_inputs", "_step", "reward_weights"} <= set(
        upstream_state
    )
    # Set at construction, or (e.g. current_gradient_accumulation_steps) by the training loop.
    upstream_source = inspect.getsource(GRPOTrainer) + inspect.getsource(transformers.Trainer)
    missing = [
        name for name in upstream_state if not hasattr(trainer, name) and f"self.{name} =" not in upstream_source
    ]
    assert not missing, f"ZPPOTrainer uses {missing}, which the installed TRL/transformers no longer sets"
    assert "advantages" in trainer._logs and hasattr(trainer._logs["advantages"], "pop")


@pytest.mark.parametrize(
    "name",
    [
        "vllm_importance_sampling_correction",
        "importance_sampling_level",
        "top_entropy_quantile",
        "off_policy_mask_threshold",
    ],
)
def test_the_objective_settings_zppo_pins_exist_in_trl(name):
    from trl import GRPOConfig

    assert name in GRPOConfig.__dataclass_fields__, (
        f"GRPOConfig.{name} is gone: revisit zppo_trl.config.PAPER_OBJECTIVE"
    )


def test_trl_fuses_the_lm_head_with_the_tiles_the_memory_plan_assumes():
    """zppo_trl.lm_head keeps TRL's fused head (GRPOTrainer patches it in and calls it on every log-prob pass),
    and zppo_trl.memory_plan sizes its tile as TRL's kernel does."""
    from trl.kernels import chunked_logprob
    from trl.trainer import utils as trl_utils

    from zppo_trl import memory_plan

    assert "add_fused_lm_head(" in inspect.getsource(GRPOTrainer.__init__)
    assert "fused_lm_head=True" in inspect.getsource(GRPOTrainer._get_per_token_logps_and_entropies)
    assert chunked_logprob.TOKEN_CHUNK_SIZE == memory_plan.FUSED_TILE_TOKENS
    assert trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE == memory_plan.FUSED_TILE_VOCAB
    assert "entropy" in chunked_logprob.OPTIONAL_OUTPUTS


def test_trl_builds_its_vllm_generation_and_client_where_the_shared_memory_sync_hooks_in():
    """zppo_trl.student_server swaps the class GRPOTrainer builds by its module-level name, waives the
    client's vLLM import check by its module-level name, and replaces only the weight transfer."""
    import trl.generation.vllm_client as client_module
    import trl.generation.vllm_generation as generation_module
    import trl.trainer.grpo_trainer as grpo_module

    assert grpo_module.VLLMGeneration is generation_module.VLLMGeneration
    assert "VLLMGeneration(" in inspect.getsource(GRPOTrainer.__init__)
    assert "is_vllm_available()" in inspect.getsource(client_module.VLLMClient.__init__)
    assert callable(client_module.is_vllm_available)
    # the server-mode setup we replace, and the sync we keep: one update_named_params call, then the reset
    init = inspect.getsource(generation_module.VLLMGeneration._init_vllm)
    assert "VLLMClient(" in init and "init_communicator(" in init and "wait_for_everyone()" in init
    sync = inspect.getsource(generation_module.VLLMGeneration.sync_weights)
    assert "vllm_client.update_named_params(self._weight_metadata" in sync and "reset_prefix_cache()" in sync
    for name in ("server_base_url", "server_host", "server_port", "group_port", "server_timeout"):
        assert name in inspect.signature(generation_module.VLLMGeneration.__init__).parameters
    for name in ("_start_weight_update", "_finish_weight_update", "update_named_params", "get_server_info",
                 "init_communicator", "reset_prefix_cache", "generate", "get_sequence_logprobs", "_post"):  # fmt: skip
        assert callable(getattr(client_module.VLLMClient, name)), name


def test_trl_leaves_out_the_old_logps_its_hook_does_not_compute():
    # defer_old_logps: during a round, ZPPOTrainer's _get_per_token_logps_and_entropies returns None for TRL's
    # old log-probs; TRL must then leave the field out of the scored batch (zppo_trl.losses then takes the
    # detached log-probs of the loss's own forward) rather than compute with it.
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "old_per_token_logps, _, _ = self._get_per_token_logps_and_entropies(" in source
    assert re.search(r"if old_per_token_logps is not None:\s+output\[\"old_per_token_logps\"\]", source)


def test_grpo_config_padding_free_is_zppos_switch_alone():
    # TRL 1.16's GRPOConfig has no padding_free; ZPPOConfig's is the paper's switch, read only by ZPPO's log-prob
    # hook (which replaces TRL's). The field TRL is adding (trl#7087) will mean the same switch and ZPPOConfig's
    # declaration will override it in place; this fails on the first TRL that has it, until every place that TRL
    # reads it is checked to be a hook ZPPOTrainer overrides (else a batch could be packed twice, or by TRL's rules).
    from dataclasses import fields

    from trl import GRPOConfig

    assert "padding_free" not in {f.name for f in fields(GRPOConfig)}, "TRL now declares padding_free: review it"
    assert "padding_free" not in inspect.getsource(GRPOTrainer)
    (ours,) = [f for f in fields(ZPPOConfig) if f.name == "padding_free"]
    assert ours.type in (bool, "bool") and ours.default is False  # TRL's defaults: off, as SFTConfig's


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "qwen3_5_moe_text", "qwen3_next"])
def test_the_linear_attention_layers_packing_segments_keep_their_forward(model_type):
    # zppo_trl.packing.segment_packed_sequences wraps these layers' forward and calls the class's own with the
    # same keywords, one packed sequence at a time: the forward must still take the hidden states, the cache and
    # the attention mask by those names and pass the rest (**kwargs) on; the decoder layer must hand its
    # keywords (where transformers' packed-sequence keywords travel) to the layer. tests/test_packing.py checks
    # the numbers of all three types against each sequence run alone.
    import importlib

    from zppo_trl.packing import LINEAR_ATTENTION_LAYERS

    module_name, class_name = LINEAR_ATTENTION_LAYERS[model_type]
    module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    parameters = inspect.signature(getattr(module, class_name).forward).parameters
    assert list(parameters)[:4] == ["self", "hidden_states", "cache", "attention_mask"]
    assert parameters[list(parameters)[-1]].kind is inspect.Parameter.VAR_KEYWORD
    (decoder,) = [c for name, c in vars(module).items() if name.endswith("DecoderLayer") and "Vision" not in name]
    assert re.search(r"self\.linear_attn\([^)]*\*\*kwargs", inspect.getsource(decoder.forward))
