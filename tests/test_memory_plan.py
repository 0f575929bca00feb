"""The dry run's memory plan (zppo_trl.memory_plan): its architecture counts against real models, its
arithmetic term by term on hand-computed values, and what the dry run prints for every scale's recipe."""

from __future__ import annotations

import pytest

from zppo_trl.memory_plan import (
    GPU_BYTES,
    GPU_RESERVED,
    KNOWN_STUDENTS,
    Architecture,
    UpdateShape,
    architecture,
    known_student_config,
    layer_activation_elements,
    optimizer_state,
    plan_memory,
    update_shape,
)
from zppo_trl.plan import HubStatus, print_memory_plan
from zppo_trl.recipe import parse_recipe_args

try:
    from tiny_models import tiny_text_model, tiny_vlm
except ImportError:
    from tests.tiny_models import tiny_text_model, tiny_vlm

GiB = 1024**3
SCALES = ["0.8b", "2b", "4b", "9b"]


@pytest.mark.parametrize("build", [tiny_text_model, tiny_vlm])
def test_the_architecture_counts_what_the_real_model_holds(build):
    model = build()
    arch = architecture(model.config)
    assert arch.parameters == sum(p.numel() for p in model.parameters())
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    assert arch.num_layers == len(layers) == 2
    assert arch.largest_layer == max(sum(p.numel() for p in layer.parameters()) for layer in layers)
    assert arch.root == arch.parameters - sum(sum(p.numel() for p in layer.parameters()) for layer in layers)
    assert arch.vocab_size == model.get_output_embeddings().weight.shape[0]
    assert arch.hidden_size == 64


def test_the_known_students_have_the_papers_sizes():
    # transformers' model without the checkpoints' multi-token-prediction layer: 0.85B, 2.21B, 4.54B, 9.41B
    sizes = {name: architecture(known_student_config(name)).parameters / 1e9 for name in KNOWN_STUDENTS}
    assert sizes == pytest.approx(
        {"Qwen/Qwen3.5-0.8B": 0.853, "Qwen/Qwen3.5-2B": 2.213, "Qwen/Qwen3.5-4B": 4.539, "Qwen/Qwen3.5-9B": 9.410},
        abs=1e-3,
    )
    assert known_student_config("someone/else") is None


ARCH = Architecture(
    parameters=1_000_000,
    largest_layer=100_000,
    root=200_000,
    hidden_size=10,
    intermediate_size=30,
    attention_width=20,
    num_layers=4,
    vocab_size=1000,
)


def test_the_fsdp_plan_term_by_term():
    shape = UpdateShape(rows=2, tokens_per_row=5000, completion_per_row=3000)  # 10,000 tokens, 6,000 completion
    plan = plan_memory(ARCH, shape, ranks=4, optimizer_state_bytes=4)
    lines = dict(plan.lines)
    assert lines["weights (float32 shard)"] == 4 * 1_000_000 // 4
    assert lines["gradients (float32 shard)"] == 1_000_000
    assert lines["optimizer state (4 bytes per parameter)"] == 4 * 1_000_000 // 4
    assert lines["gathered weights (root, 2 layers, 1 layer's grads, LM-head grad)"] == (
        2 * 200_000 + 6 * 100_000 + 4 * 1000 * 10
    )
    per_token = layer_activation_elements(ARCH)
    assert per_token == 5 * 10 + 2 * 20 + 4 * 30
    assert lines["activations (with gradient checkpointing)"] == 4 * 10_000 * 10 * 2 + 2 * per_token * 10_000 * 2
    assert (
        plan.fused_head == 4096 * 1000 * 2 + 6000 * 10 * 6
    )  # one bf16 tile (never wider than V), hidden states, grads
    assert plan.unfused_head == 6000 * 1000 * 14
    assert plan.total() == sum(lines.values()) + plan.fused_head
    assert plan.total(fused=False) - plan.total() == plan.unfused_head - plan.fused_head


def test_without_checkpointing_every_layer_keeps_its_activations():
    shape = UpdateShape(1, 100, 50)
    plan = plan_memory(ARCH, shape, ranks=1, gradient_checkpointing=False, layout="single")
    lines = dict(plan.lines)
    assert lines["activations (without gradient checkpointing)"] == 5 * layer_activation_elements(ARCH) * 100 * 4
    assert "gathered weights (root, 2 layers, 1 layer's grads, LM-head grad)" not in lines
    assert lines["optimizer state (8 bytes per parameter)"] == 8 * 1_000_000


def test_fitting_is_against_the_usable_h100_memory():
    capacity = GPU_BYTES - GPU_RESERVED
    assert 75 * GiB < capacity < 77 * GiB
    big = plan_memory(ARCH, UpdateShape(1, 10, 10), ranks=1, layout="single")
    assert big.fits()
    huge = Architecture(**{**ARCH.__dict__, "parameters": capacity // 16 + 1})
    assert not plan_memory(huge, UpdateShape(1, 10, 10), ranks=1, layout="single").fits()


@pytest.mark.parametrize(
    "optim, optim_args, expected",
    [
        ("adamw_torch", None, 8),
        ("adamw_anyprecision", None, 8),  # transformers' defaults: float32 moments
        ("adamw_anyprecision", "momentum_dtype=bfloat16,variance_dtype=bfloat16", 4),
        ("adamw_anyprecision", "use_kahan_summation=true,momentum_dtype=bfloat16,variance_dtype=bfloat16", 4),
    ],
)
def test_the_optimizer_state_follows_optim_and_its_args(optim, optim_args, expected):
    class Args:
        pass

    args = Args()
    args.optim, args.optim_args = optim, optim_args
    assert optimizer_state(args) == expected


def test_the_update_shape_is_the_longest_sequence_the_recipe_builds():
    _, args, _ = parse_recipe_args(["--config", "recipes/qwen35_0.8b.yaml", "--dry_run"])
    lengths = args.context_lengths()
    shape = update_shape(args)
    assert shape.rows == 4 and shape.completion_per_row == 12288
    assert shape.tokens_per_row == lengths.plain_prompt + lengths.block + lengths.completion == 4096 + 5017 + 12288


@pytest.mark.parametrize("scale", SCALES)
def test_the_dry_run_plans_every_scale_and_the_unfused_head_would_not_fit(scale):
    script, args, model = parse_recipe_args(["--config", f"recipes/qwen35_{scale}.yaml", "--dry_run"])
    lines: list[str] = []
    print_memory_plan(script, args, model, lines.append, hub=HubStatus(True, "offline (test)"))
    text = "\n".join(lines)
    assert "memory plan (one student rank of 48, FSDP full shard, bf16; micro-batch 4 rows x 21,401 tokens" in text
    total = next(line for line in lines if "total:" in line)
    assert "total: fits an 80 GB H100" in total
    assert float(total.split()[0]) > 5  # GiB: the activations of 85,604 tokens alone are several
    unfused = next(line for line in lines if "with the LM head unfused" in line)
    assert unfused.endswith("would not fit")
    assert f"(the student Qwen/Qwen3.5-{scale.upper()}: " in text and "from the architecture" in text


def test_a_student_whose_config_cannot_be_read_is_said_so():
    script, args, model = parse_recipe_args(
        ["--config", "recipes/qwen35_0.8b.yaml", "--dry_run", "--model_name_or_path", "someone/unknown-model"]
    )
    lines: list[str] = []
    print_memory_plan(script, args, model, lines.append, hub=HubStatus(True, "offline (test)"))
    assert lines == [
        "\nmemory plan: skipped (the config of someone/unknown-model cannot be read here, and it is not one of the "
        "paper's students)"
    ]


def test_a_local_student_is_planned_from_its_own_config(tmp_path):
    try:
        from tiny_models import save_tiny_text_model
    except ImportError:
        from tests.tiny_models import save_tiny_text_model
    save_tiny_text_model(tmp_path / "student")
    script, args, model = parse_recipe_args(
        ["--config", "recipes/qwen35_0.8b.yaml", "--dry_run", "--model_name_or_path", str(tmp_path / "student")]
    )
    lines: list[str] = []
    print_memory_plan(script, args, model, lines.append)
    parameters = sum(p.numel() for p in tiny_text_model().parameters())
    assert lines[-1] == f"  (the student {tmp_path / 'student'}: {parameters / 1e9:.2f}B parameters, from its config)"
