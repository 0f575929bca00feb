"""The dry run's memory plan (zppo_trl.memory_plan): its architecture counts against real models, its
arithmetic term by term on hand-computed values, padded against packed tokens per micro-batch, and what the dry
run prints for every scale's recipe."""

from __future__ import annotations

import random

import pytest

from zppo_trl.memory_plan import (
    GPU_BYTES,
    GPU_RESERVED,
    KNOWN_STUDENTS,
    Architecture,
    PaddingPlan,
    UpdateShape,
    activation_bytes,
    architecture,
    known_student_config,
    layer_activation_elements,
    optimizer_state,
    packed_tokens,
    packing_refusal,
    padded_tokens,
    padding_plan,
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
    # padding_free: true, and Qwen3.5 packs (sdpa, transformers' default for it): the packed row is this run's
    assert (
        "\npadding (padding_free: true, and the student packs), tokens through the model per micro-batch of 4 rows:"
        in lines
    )
    assert (
        "  padded: 4 x (its longest prompt + its longest completion) <= 4 x (4,096 + 5,017 + 12,288) = 85,604; "
        "one completion at the 12,288-token limit pads all 4 rows to it"
    ) in lines
    assert (
        "  packed (this run): the sum of its rows' own tokens, <= 85,604 (every row at its limit), >= 1/4 of the "
        "padded grid: it avoids 0 to 75% of the padded tokens"
    ) in lines
    sized = next(line for line in lines if line.startswith("  the plan above sizes 85,604 tokens ("))
    activations = next(line for line in lines if "activations (with gradient checkpointing)" in line)
    per_token = float(sized.split("(")[1].split()[0].replace(",", ""))  # KiB per token; times the tokens: activations
    assert per_token * 85_604 / 1024**2 == pytest.approx(float(activations.split()[0]), rel=0.01)
    # storage: bf16 weights, float32 master weights, AnyPrecisionAdamW's bf16 moments (4 bytes), the ZPPO state at
    # its capacity; 20 checkpoints (save_steps 40 of 800 updates, no save_total_limit), against output_dir's disk
    parameters = int(float(text.split(f"Qwen3.5-{scale.upper()}: ")[1].split("B parameters")[0]) * 1e9)
    storage = next(line for line in lines if line.startswith("\nstorage: each checkpoint about "))
    size = float(storage.split("about ")[1].split()[0])
    assert size == pytest.approx((2 + 4 + 4) * parameters / 2**30, rel=0.02), storage
    assert "float32 master weights" in storage and "optimizer state" in storage and "ZPPO state 2.5 MiB" in storage
    kept = lines[lines.index(storage) + 1]
    assert kept.startswith("  kept: 20 checkpoint(s) (no save_total_limit), ") and "; free on " in kept
    assert float(kept.split("), ")[1].split()[0]) == pytest.approx(20 * size, rel=0.01)
    assert kept.endswith((": fits", ": WOULD NOT FIT"))


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
    assert f"  (the student {tmp_path / 'student'}: {parameters / 1e9:.2f}B parameters, from its config)" in lines


# ---------------------------------------------------------------- padded against packed tokens


def test_padded_and_packed_tokens_of_a_micro_batch():
    prompts, completions = [12, 10, 7], [5, 20, 1]  # the longest prompt and the longest completion in two rows
    assert padded_tokens(prompts, completions) == 3 * (12 + 20)  # every row as wide as the longest of each
    assert packed_tokens(prompts, completions) == 29 + 26
    assert padded_tokens([4], [9]) == packed_tokens([4], [9]) == 13  # one row: nothing to pad
    assert padded_tokens([], []) == packed_tokens([], []) == 0
    with pytest.raises(ValueError, match="2 prompt lengths, 1 completion lengths"):
        padded_tokens([1, 2], [3])
    with pytest.raises(ValueError, match="1 prompt lengths, 2 completion lengths"):
        packed_tokens([1], [2, 3])


def test_a_packed_micro_batch_holds_between_one_row_share_and_all_of_its_grid():
    rng = random.Random(0)
    for _ in range(500):
        rows = rng.randint(1, 8)
        prompts = [rng.randint(1, 4096) for _ in range(rows)]
        completions = [rng.randint(0, 12288) for _ in range(rows)]
        padded, packed = padded_tokens(prompts, completions), packed_tokens(prompts, completions)
        assert padded / rows <= packed <= padded
        plan = PaddingPlan(rows, 4096, 0, 12288, padding_free=True)
        assert 1 - packed / padded <= plan.most_avoided + 1e-12
    # the bounds are reached: rows equally long avoid nothing; one long row among near-empty ones nearly 1 - 1/B
    assert packed_tokens([100] * 4, [50] * 4) == padded_tokens([100] * 4, [50] * 4)
    padded, packed = padded_tokens([4096, 1, 1, 1], [12288, 0, 0, 0]), packed_tokens([4096, 1, 1, 1], [12288, 0, 0, 0])
    assert 1 - packed / padded == pytest.approx(0.75, abs=1e-4) and PaddingPlan(4, 1, 0, 1, True).most_avoided == 0.75


def test_the_padding_plan_of_the_papers_recipe_and_whether_the_run_packs():
    _, args, _ = parse_recipe_args(["--config", "recipes/qwen35_0.8b.yaml", "--dry_run"])
    plan = padding_plan(args)
    assert (plan.rows, plan.plain_prompt, plan.block, plan.completion) == (4, 4096, 5017, 12288)
    assert plan.worst_case == update_shape(args).tokens == 85_604  # the memory plan's micro-batch, padded or packed
    assert plan.padding_free and plan.packs
    prompts, completions = [300, 300, 9000, 9000], [12288, 2000, 500, 4000]
    assert packed_tokens(prompts, completions) == 37_388 < padded_tokens(prompts, completions) == 85_152
    padded = padding_plan(
        args, refusal="attention implementation 'flash_attention_2' is not one packing was checked on"
    )
    assert padded.padding_free and not padded.packs
    _, args, _ = parse_recipe_args(["--config", "recipes/qwen35_0.8b.yaml", "--dry_run", "--padding_free", "false"])
    off = padding_plan(args)
    assert not off.padding_free and not off.packs


def test_whether_the_student_packs_follows_its_type_and_attention():
    config = known_student_config("Qwen/Qwen3.5-0.8B")
    arch = architecture(config)
    assert arch.attention == "sdpa"  # transformers' default for Qwen3.5, resolved by the meta build
    assert config.get_text_config()._attn_implementation is None  # on a copy: the caller's config is untouched
    assert packing_refusal(config, arch.attention) is None
    assert packing_refusal(config, "eager") is None
    refusal = packing_refusal(config, "flash_attention_2")
    assert refusal is not None and "'flash_attention_2'" in refusal
    assert packing_refusal(tiny_text_model().config, "sdpa") is None  # Qwen3: softmax attention only


def test_activations_are_linear_in_the_micro_batch_tokens():
    for layout in ("fsdp", "single"):
        for checkpointing in (True, False):
            one = activation_bytes(ARCH, 1, layout=layout, gradient_checkpointing=checkpointing)
            assert activation_bytes(ARCH, 12_345, layout=layout, gradient_checkpointing=checkpointing) == 12_345 * one
    plan = plan_memory(ARCH, UpdateShape(2, 5000, 3000), ranks=4)
    assert dict(plan.lines)["activations (with gradient checkpointing)"] == activation_bytes(ARCH, 10_000)


@pytest.mark.parametrize(
    "flags, state, run",
    [
        ([], "padding_free: true, and the student packs", "packed"),
        (["--padding_free", "false"], "padding_free: false, so micro-batches run padded", "padded"),
        (
            ["--attn_implementation", "flash_attention_2"],
            "padding_free: true, but the student runs padded: attention implementation 'flash_attention_2' is not "
            "one packing was checked on (sdpa, eager)",
            "padded",
        ),
    ],
)
def test_the_dry_run_says_whether_micro_batches_run_padded_or_packed(tmp_path, flags, state, run):
    try:
        from tiny_models import save_tiny_text_model
    except ImportError:
        from tests.tiny_models import save_tiny_text_model
    save_tiny_text_model(tmp_path / "student")
    script, args, model = parse_recipe_args(
        [
            "--config",
            "recipes/qwen35_0.8b.yaml",
            "--dry_run",
            "--model_name_or_path",
            str(tmp_path / "student"),
            *flags,
        ]
    )
    lines: list[str] = []
    print_memory_plan(script, args, model, lines.append)
    start = lines.index(f"\npadding ({state}), tokens through the model per micro-batch of 4 rows:")
    padded, packed = lines[start + 1], lines[start + 2]
    assert padded.startswith("  padded (this run): " if run == "padded" else "  padded: ")
    assert packed.startswith("  packed (this run): " if run == "packed" else "  packed: ")
