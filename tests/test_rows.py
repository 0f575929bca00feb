"""Every row's needs, declared once (zppo_trl.needs, zppo_trl.row), and everything that reads them agreeing.

A table over every recipe in recipes/ (the scale recipes, every row and budget control in recipes/rows/, and the
server-teacher variants of the rows that can load their teacher next to the student) states what each row asks of the
run; the test checks that the resolved row says so, and that
the dry run's plan and memory plan, the launcher's server list, the step composition and the model card all say the
same. The rows these used to disagree on (KDRL, OPSD, RLKD, ReLIFT, RSTG, Off-/On-Distill with a server teacher,
the models a row keeps next to the student) are in the table.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from zppo_trl.model_card import _approach, _teacher_line
from zppo_trl.needs import COPY_EMA, COPY_FROZEN, SCORES_TOKEN_LOGPS, SCORES_TOP_K, Needs
from zppo_trl.plan import HubStatus, _beside_student, print_plan
from zppo_trl.recipe import endpoints, parse_recipe_args

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"
ROWS = RECIPES / "rows"
TOP_K, TOKENS = frozenset({SCORES_TOP_K}), frozenset({SCORES_TOKEN_LOGPS})

# recipe (and overrides) -> (teacher server, teacher loaded next to the student, step-2 teacher samples, the teacher's
# scores, a judge of the row's own, student copies)
_NONE = (False, False, False, frozenset(), False, ())
_ZPPO = (True, False, True, frozenset(), False, ())
TABLE = {
    "grpo": _NONE,
    "grpo_dagger": _NONE,
    "grpo_dagger_replay050": _NONE,
    "gspo_dagger": _NONE,
    "cispo_dagger": _NONE,
    "dispo_dagger": _NONE,
    "lens_dagger": _NONE,
    "rl_zvp_dagger": _NONE,
    "grpo_both": _ZPPO,
    "grpo_dagger_bcq": _ZPPO,
    "grpo_dagger_bcq_boxed_masked": _ZPPO,
    "grpo_dagger_bcq_final_answer_only": _ZPPO,
    "grpo_dagger_ncq": _ZPPO,
    "grpo_dagger_hint": _ZPPO,
    "grpo_dagger_prefix": _ZPPO,
    "reflection_sft_dagger": _ZPPO,
    "zppo_cispo": _ZPPO,
    "zppo_dispo": _ZPPO,
    "zppo_gspo": _ZPPO,
    "zppo_replay050": _ZPPO,
    "correction_sft_dagger": (True, False, False, frozenset(), False, ()),
    "off_distill": (True, True, True, TOP_K, False, ()),
    "off_distill_dagger": (True, True, True, TOP_K, False, ()),
    "on_distill": (False, True, False, TOP_K, False, ()),
    "on_distill_dagger": (False, True, False, TOP_K, False, ()),
    "kdrl_dagger": (False, True, False, TOKENS, False, ()),
    "rlad_dagger": (False, True, False, TOKENS, False, ()),
    "relift_dagger": (True, False, True, frozenset(), False, ()),
    "rstg_dagger": (True, False, False, TOP_K, False, ()),
    "opsd_dagger": (True, False, True, frozenset(), False, (COPY_FROZEN,)),
    "rlkd_dagger": (True, False, True, frozenset(), True, ()),
    "perception_r1_dagger": (False, False, False, frozenset(), True, ()),
    "grpo_care_dagger": (False, False, False, frozenset(), False, (COPY_EMA,)),
    "sdpo_dagger": (False, False, False, frozenset(), False, (COPY_EMA,)),
    # the scale recipes (ZPPO at each scale and backbone, and the CPU demo's)
    **dict.fromkeys(
        ("demo", "qwen35_0.8b", "qwen35_2b", "qwen35_4b", "qwen35_9b", "internvl35_2b", "ovis25_2b"), _ZPPO
    ),
    # the teacher's scores from its server when no distill_teacher is set
    "on_distill_dagger:server": (True, False, False, TOP_K, False, ()),
    "off_distill:server": (True, False, True, TOP_K, False, ()),
    "kdrl_dagger:server": (True, False, False, TOKENS, False, ()),
    "rlad_dagger:server": (True, False, False, TOKENS, False, ()),
}
CPU = ["--use_cpu", "true", "--bf16", "false", "--use_vllm", "false"]


def _recipe(name: str) -> Path:
    """A table entry's recipe: a row (recipes/rows/), a budget control of a row (recipes/rows/budget/, as its row),
    or a scale recipe (recipes/)."""
    for folder in (ROWS, ROWS / "budget", RECIPES):
        if (folder / f"{name}.yaml").exists():
            return folder / f"{name}.yaml"
    raise FileNotFoundError(name)


def _parse(entry: str, *more: str):
    name, _, variant = entry.partition(":")
    argv = ["--config", str(_recipe(name)), *CPU, *more]
    if variant == "server":
        argv += ["--distill_teacher", ""]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return parse_recipe_args(argv)


BUDGET = {path.stem: path.stem.rsplit("_g", 1)[0] for path in (ROWS / "budget").glob("*.yaml")}
TABLE.update({name: TABLE[row] for name, row in BUDGET.items()})  # a budget control needs what its row needs


def test_the_table_covers_every_recipe():
    recipes = {
        path.stem for path in [*RECIPES.glob("*.yaml"), *ROWS.glob("*.yaml"), *(ROWS / "budget").glob("*.yaml")]
    }
    assert {entry.partition(":")[0] for entry in TABLE} == recipes


@pytest.mark.parametrize("entry", sorted(TABLE))
def test_a_rows_needs_and_everything_that_reads_them_agree(entry):
    server, loads, samples, scores, judge, copies = TABLE[entry]
    script, args, _model = _parse(entry)
    row = args.row
    needs = row.needs
    assert (row.uses_teacher_server, row.loads_teacher, needs.teacher_samples) == (server, loads, samples)
    assert (needs.teacher_scores, needs.judge, needs.student_copy_kinds) == (scores, judge, copies)
    uses_teacher = server or loads
    assert row.uses_teacher == uses_teacher

    # the launcher waits for the teacher's server exactly when the row talks to it, and for a row's own judge
    roles = {role: (url, model) for role, url, model in endpoints(script, args)}
    assert ("teacher" in roles) == server
    if judge:
        assert (args.judge_base_url, args.judge_model) in roles.values()
    script.use_judge = False  # without the reward's judge, a row's own judge is still waited for
    roles = {role: (url, model) for role, url, model in endpoints(script, args)}
    assert ("teacher" in roles) == server
    assert "judge" not in roles or judge
    if judge:  # listed once: as the judge, or as the teacher where the judge lives on the teacher's server
        assert (args.judge_base_url, args.judge_model) in roles.values()

    # the step composition: G_T where step 2 samples the teacher, "no teacher" only where none takes part
    step = args.composition(args.world_size)
    assert step.teacher_rollouts == (args.teacher_num_generations if samples else 0)
    assert ("no teacher" in str(step)) == (not uses_teacher)

    # the dry run's plan
    lines: list[str] = []
    print_plan(script, args, lines.append)
    teacher = [line for line in lines if line.startswith("  teacher:")]
    assert (teacher == ["  teacher: none"]) == (not uses_teacher), teacher
    assert any(f"{args.teacher_model} at {args.teacher_base_url}" in line for line in teacher) == server
    assert any(f"{args.distill_teacher}, loaded next to the student" in line for line in teacher) == loads
    if judge:
        assert f"  judge: {args.judge_model} at {args.judge_base_url}" in lines

    # the memory plan counts every model the row keeps next to the student on each rank
    beside, whole = _beside_student(args, 10**9, 8, HubStatus(offline=True))
    assert len(beside) == len(copies) + loads
    assert [size for _, size in beside[len(beside) - len(copies) :]] == [4 * 10**9] * len(copies)
    if loads:  # bf16, sharded over the 8 ranks by FSDP; whole under ZeRO-2 or DDP
        assert beside[0][1] == 2 * 27 * 10**9 // 8 and whole == 2 * 27 * 10**9 - beside[0][1]

    # the model card
    line = _teacher_line(args)
    assert (line == "none.") == (not uses_teacher), line
    assert ("loaded next to the student" in line) == loads, line
    if server:
        assert f"`{args.teacher_model}`" in line
    assert ("No teacher takes part" in _approach(args)) == (not uses_teacher)


def test_the_memory_plan_says_a_teacher_loaded_on_every_rank_would_not_fit():
    """Off-Distill's 27B teacher, whole on every rank (ZeRO-2, the launch scripts' default), beside a 9B student."""
    script, args, model = _parse("off_distill", "--model_name_or_path", "Qwen/Qwen3.5-9B")
    from zppo_trl.plan import print_memory_plan

    lines: list[str] = []
    print_memory_plan(script, args, model, lines.append, HubStatus(offline=True))
    text = "\n".join(lines)
    assert "distill_teacher Qwen/Qwen3.5-27B (bf16, 27.0B parameters from its name; FSDP shard of" in text
    assert "under ZeRO-2 or DDP (the launch scripts' default) distill_teacher is whole on every rank" in text
    assert text.split("\npadding (")[0].rstrip().endswith("would not fit an 80 GB H100")  # before the padding lines


def test_needs_union_is_every_field_of_either():
    a = Needs(teacher_samples=True, teacher_scores=TOP_K, student_copies=frozenset({("a.pt", COPY_EMA)}))
    b = Needs(judge=True, teacher_scores=TOKENS, student_copies=frozenset({("b.pt", COPY_FROZEN)}))
    both = a | b
    assert both.teacher_samples and both.judge and both.teacher_scores == TOP_K | TOKENS
    assert both.student_copy_kinds == (COPY_EMA, COPY_FROZEN)
    assert a | Needs() == a and not (Needs() | Needs()).teacher_requests
