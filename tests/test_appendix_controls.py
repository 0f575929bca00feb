"""The paper's config-level controls (its appendix on additional comparisons): the group-size and corpus-pass
sweep, the replay control and the BCQ candidate-content controls. Each is a recipe (and, for the candidate
content, a named transform); this checks the recipes' names and plans as the paper states them, and the
transforms on hand-written candidates."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

from zppo_trl import ZPPOConfig
from zppo_trl.augmentations import CANDIDATE_CONTENTS, CandidateReformulation, candidate_content, make_augmentation
from zppo_trl.augmentations.candidate_content import BOXED_MASK
from zppo_trl.data import write_jsonl
from zppo_trl.plan import HubStatus, print_checks, print_plan
from zppo_trl.prompts import bcq_block, ncq_block
from zppo_trl.recipe import parse_recipe_args
from zppo_trl.reformulate import Reformulation
from zppo_trl.rewards import boxed_spans, extract_boxed

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from settings import CPU as CPU_ONLY
    from settings import UNREACHABLE_TEACHER
except ImportError:
    from tests.settings import CPU as CPU_ONLY
    from tests.settings import UNREACHABLE_TEACHER

REPO = Path(__file__).resolve().parents[1]
CPU = {**CPU_ONLY, **UNREACHABLE_TEACHER}
# the four swept baselines: recipe stem -> the name the paper's tables print
SWEPT = {
    "grpo_dagger": "GRPO\u2020",
    "on_distill_dagger": "On-Distill\u2020",
    "grpo_dagger_hint": "GRPO\u2020+Hint",
    "grpo_dagger_prefix": "GRPO\u2020+Prefix",
}
SETTINGS = ((16, 1), (8, 2), (16, 2))


def _plan(path: str, *overrides: str) -> tuple[ZPPOConfig, list[str]]:
    script, args, _ = parse_recipe_args(["--config", path, "--dry_run", *overrides])
    lines: list[str] = []
    print_plan(script, args, lines.append)
    return args, lines


# ---------------------------------------------------------------- the group-size and corpus-pass sweep


def test_the_budget_sweep_has_a_recipe_per_swept_row_and_setting():
    expected = {f"{stem}_g{g}_p{p}" for stem in SWEPT for g, p in SETTINGS}
    assert {p.stem for p in (REPO / "recipes/rows/budget").glob("*.yaml")} == expected


@pytest.mark.parametrize("stem", SWEPT)
@pytest.mark.parametrize("group_size, passes", SETTINGS)
def test_a_budget_recipe_is_its_row_with_the_settings_and_names_them(stem, group_size, passes):
    path = REPO / f"recipes/rows/budget/{stem}_g{group_size}_p{passes}.yaml"
    assert yaml.safe_load(path.read_text())["base"] == f"../{stem}.yaml"  # the method's own row recipe
    _, row_lines = _plan(f"recipes/rows/{stem}.yaml")
    args, lines = _plan(str(path.relative_to(REPO)))
    word = "pass" if passes == 1 else "passes"
    assert lines[0] == f"ZPPO dry run: {SWEPT[stem]} (G_S={group_size}, {passes} {word})"
    assert row_lines[0] == f"ZPPO dry run: {SWEPT[stem]}"  # the (8, 1) row keeps its headline name
    step = args.composition(48)
    # the same 384 new questions per rollout step in updates of 96, each drawn G_S times
    assert (step.new_prompts, step.new_prompts_per_update, step.rollouts) == (384, 96, group_size)
    # a second pass doubles the rollout steps and the optimizer updates (On-Distill†: 800 -> 1,600)
    assert step.rollout_steps == 200 * passes and args.max_steps == 800 * passes
    draws = f"{200 * passes * 384:,}"
    tail = "" if passes == 1 else f" ({passes} corpus passes)"
    schedule = (
        f"  schedule: {200 * passes} rollout steps = {800 * passes} optimizer updates = {draws} new-prompt draws"
    )
    assert schedule + tail in lines
    # everything else is the row's: its plan differs only in what the setting moves
    moved = ("ZPPO dry run", "per rollout step", "  per rank", "  schedule", "  server context")
    named = {f"{SWEPT[stem]} against": f"{args.variant} against"}  # On-Distill†'s line names the row
    assert [line for line in lines if not line.startswith(moved)] == [
        line.replace(*next(iter(named.items()))) for line in row_lines if not line.startswith(moved)
    ]


def test_the_budget_qualifier_appears_only_off_the_papers_default():
    assert ZPPOConfig(**CPU, augmentations=[]).variant == "GRPO\u2020"
    assert ZPPOConfig(**CPU, augmentations=[], num_generations=4).variant == "GRPO\u2020"  # a scaled-down run
    assert ZPPOConfig(**CPU, augmentations=[], num_generations=16).variant == "GRPO\u2020 (G_S=16, 1 pass)"
    two = ZPPOConfig(**CPU, augmentations=["hint"], corpus_passes=2, max_steps=1600)
    assert two.variant == "GRPO\u2020+Hint (G_S=8, 2 passes)"
    # one pair of brackets with another qualifier
    gspo = ZPPOConfig(**CPU, policy_objective="gspo", num_generations=16, per_device_train_batch_size=16)
    assert gspo.variant == "ZPPO (GSPO, G_S=16, 1 pass)"


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(corpus_passes=0), "corpus_passes must be an integer >= 1, got 0"),
        (dict(corpus_passes=True), "corpus_passes must be an integer >= 1, got True"),
        (dict(corpus_passes=2), "corpus_passes=2 needs a schedule in steps"),  # training by epochs
        (dict(corpus_passes=3, max_steps=800), "corpus_passes=3 needs a schedule in steps"),  # 800 is not 3 passes
    ],
)
def test_a_bad_corpus_passes_is_named(settings, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ZPPOConfig(**CPU, **settings)


def test_the_dry_run_checks_the_passes_against_a_local_corpus(tmp_path):
    # 384 questions: the paper's rollout step draws 384 of them, so 2 rollout steps are 2 passes
    rows = [
        {
            "id": f"q{i}",
            "question": f"What is {i} + 1?",
            "images": [],
            "answer": str(i + 1),
            "source": "t",
            "subdataset": "t",
        }
        for i in range(384)
    ]
    data = tmp_path / "train.jsonl"
    write_jsonl(rows, data)
    offline = HubStatus(True, "  down  Hugging Face Hub (test)")
    common = ["--dataset_name", str(data), "--output_dir", str(tmp_path / "out"), "--corpus_passes", "2"]
    for max_steps, fails in (("8", False), ("16", True)):
        script, args, model = parse_recipe_args(
            ["--config", "recipes/rows/budget/grpo_dagger_g8_p2.yaml", "--dry_run", *common, "--max_steps", max_steps]
        )
        lines: list[str] = []
        problems = print_checks(script, args, model, lines.append, hub=offline)
        failed = [line for line in lines if "corpus_passes=2" in line]
        if fails:
            assert problems == [f"corpus_passes=2, but the schedule's 1,536 draws are 4.00 passes of {data}"]
            assert failed == [f"  FAIL  {problems[0]}"]
        else:
            assert problems == [] and failed == []


# ---------------------------------------------------------------- the replay control


@pytest.mark.parametrize(
    "recipe, headline, replayed, cap",
    [
        ("recipes/rows/grpo_dagger.yaml", "GRPO\u2020", 96, 480),
        ("recipes/rows/grpo_dagger_replay050.yaml", "Replay-matched GRPO\u2020", 192, 576),
        ("recipes/qwen35_0.8b.yaml", "ZPPO", 96, 576),
        ("recipes/rows/zppo_replay050.yaml", "ZPPO (\u03c1_replay=0.50)", 192, 672),
    ],
)
def test_the_replay_rows_caps_are_the_papers(recipe, headline, replayed, cap):
    args, lines = _plan(recipe)
    step = args.composition(48)
    assert lines[0] == f"ZPPO dry run: {headline}"
    assert (step.new_prompts, step.max_replayed, step.max_prompts) == (384, replayed, cap)
    assert f"  per-step cap: <= {cap} prompt groups (new + replayed + reformulated)" in lines


def test_replay_matched_grpo_dagger_is_capped_at_the_headline_zppos_maximum():
    grpo, _ = _plan("recipes/rows/grpo_dagger_replay050.yaml")
    zppo, _ = _plan("recipes/qwen35_0.8b.yaml")
    assert grpo.composition(48).max_prompts == zppo.composition(48).max_prompts == 576
    assert grpo.composition(48).max_reformulated == 0  # no teacher is involved


def test_other_replay_fractions_are_named_and_the_other_rows_keep_their_names():
    assert ZPPOConfig(**CPU, augmentations=[], replay_fraction=0.75).variant == "GRPO\u2020 (\u03c1_replay=0.75)"
    assert ZPPOConfig(**CPU, replay_fraction=0.5).variant == "ZPPO (\u03c1_replay=0.50)"
    assert ZPPOConfig(**CPU, augmentations=["hint"], replay_fraction=0.5).variant == "GRPO\u2020+Hint"
    assert ZPPOConfig(**CPU, augmentations=[], replay_fraction=0.0).variant == "GRPO"


# ---------------------------------------------------------------- the BCQ candidate-content controls

NESTED = "Area = \\frac{1}{2} b h, so \\boxed{\\frac{3}{2}}"  # braces inside the box
TWO = "First guess \\boxed{4}; checking the units again gives \\boxed{5 \\text{ cm}}."
NONE = "The answer is 7."
CUT = "So the total is \\boxed{\\frac{12}{5"  # a compression cut at its token cap
EMPTY = "Nothing to report: \\boxed{}"
INNER = "Hence \\boxed{\\boxed{3}}"  # a box in a box


@pytest.mark.parametrize(
    "text, masked, final",
    [
        (NESTED, "Area = \\frac{1}{2} b h, so \\boxed{[MASKED]}", "\\boxed{\\frac{3}{2}}"),
        (
            TWO,
            "First guess \\boxed{[MASKED]}; checking the units again gives \\boxed{[MASKED]}.",
            "\\boxed{5 \\text{ cm}}",
        ),
        (INNER, "Hence \\boxed{[MASKED]}", "\\boxed{3}"),  # the grader reads the inner box
        (NONE, None, None),
        (CUT, None, None),
        (EMPTY, None, None),
    ],
)
def test_each_content_on_hand_written_candidates(text, masked, final):
    assert candidate_content("full").transform(text) == text
    assert candidate_content("boxed_masked").transform(text) == masked
    assert candidate_content("final_answer_only").transform(text) == final
    if masked is not None:  # what the grader reads: nothing in the masked one, the answer in the final one
        assert extract_boxed(masked) == "[MASKED]" and masked.count("\\boxed{") == masked.count(BOXED_MASK)
        assert extract_boxed(final) == extract_boxed(text)


def test_boxed_spans_counts_braces_as_the_grader_does():
    assert boxed_spans(NESTED) == [(NESTED.index("\\boxed"), len(NESTED))]
    assert [TWO[a:b] for a, b in boxed_spans(TWO)] == ["\\boxed{4}", "\\boxed{5 \\text{ cm}}"]
    assert boxed_spans(NONE) == [] and boxed_spans(None) == [] and boxed_spans(CUT) is None
    assert boxed_spans(INNER) == [(6, len(INNER))]  # the outer span holds the inner box


def _pair(teacher: str, student: str) -> tuple[Reformulation, tuple[str, ...]]:
    """A kept BCQ instance (raw rollouts as candidates) with its compressed candidates (what the block shows)."""
    raw = ("teacher's long rollout \\boxed{3/2}", "student's long rollout \\boxed{4}")
    return Reformulation("bcq", "q1", raw, teacher_position=0), (teacher, student)


def test_both_compressed_candidates_are_transformed_and_ncq_is_not():
    ncq = Reformulation("ncq", "q2", ("s \\boxed{4}",), wrong_answers=("4",))
    kept = [_pair(NESTED, TWO), (ncq, (TWO,))]
    metrics: dict = {}
    built = CandidateReformulation(["bcq", "ncq"], content="boxed_masked").render(kept, metrics)
    masked = candidate_content("boxed_masked").transform
    assert [g.block for g in built.groups] == [bcq_block([masked(NESTED), masked(TWO)]), ncq_block(["4"], [TWO])]
    assert "3}{2}" not in built.groups[0].block and "\\boxed{5" not in built.groups[0].block
    assert metrics == {"bcq_multiple_boxed": 1}  # TWO, counted once: in the BCQ pair, not in NCQ

    final = CandidateReformulation(["bcq"], content="final_answer_only").render([_pair(NESTED, TWO)], {})
    assert final.groups[0].block == bcq_block(["\\boxed{\\frac{3}{2}}", "\\boxed{5 \\text{ cm}}"])
    # the compressed texts are transformed, not the raw rollouts behind them
    full = CandidateReformulation(["bcq"]).render([_pair(NESTED, TWO)], {})
    assert full.groups[0].block == bcq_block([NESTED, TWO])


@pytest.mark.parametrize("content", ["boxed_masked", "final_answer_only"])
def test_a_pair_with_an_unboxed_candidate_is_dropped_and_counted(content):
    metrics: dict = {}
    augmentation = CandidateReformulation(["bcq"], content=content)
    built = augmentation.render([_pair(NESTED, NONE), _pair(CUT, TWO), _pair(TWO, NESTED)], metrics)
    assert [inst.key for inst in built.instances] == ["q1"] and len(built.groups) == 1
    assert metrics == {"bcq_content_unboxed": 2, "bcq_multiple_boxed": 2}
    assert augmentation.summed_metrics == ("bcq_content_unboxed", "bcq_multiple_boxed")
    # the paper's BCQ shows every pair and counts nothing
    full = CandidateReformulation(["bcq"])
    assert len(full.render([_pair(NESTED, NONE), _pair(CUT, TWO)], metrics := {}).groups) == 2 and metrics == {}
    assert full.summed_metrics == ()


def test_build_without_compression_shows_the_rollouts_under_the_content():
    from types import SimpleNamespace

    (inst, _), args = _pair(NESTED, TWO), SimpleNamespace(compress_candidates=False)
    built = CandidateReformulation(["bcq"], content="final_answer_only").build([inst], None, args, {})
    assert built.groups[0].block == bcq_block(["\\boxed{3/2}", "\\boxed{4}"]) and built.failures == 0


def test_the_content_is_a_config_field_the_registry_validates():
    assert list(CANDIDATE_CONTENTS) == ["full", "boxed_masked", "final_answer_only"]
    with pytest.raises(ValueError, match=r"bcq_candidate_content must be one of \['full', 'boxed_masked'"):
        ZPPOConfig(**CPU, augmentations=["bcq"], bcq_candidate_content="masked")
    with pytest.raises(ValueError, match="bcq_candidate_content must be one of"):
        make_augmentation(["bcq"], bcq_candidate_content="answer")
    augmentation = make_augmentation(["bcq"], bcq_candidate_content="boxed_masked")
    assert augmentation.content.name == "boxed_masked"
    assert ZPPOConfig(**CPU, augmentations=["bcq"], bcq_candidate_content="final_answer_only").variant == (
        "GRPO\u2020+BCQ (final-answer-only)"
    )
    assert ZPPOConfig(**CPU, bcq_candidate_content="boxed_masked").variant == "ZPPO (boxed-answer-masked)"
    with pytest.warns(UserWarning, match="bcq_candidate_content='boxed_masked' has no effect on this row"):
        ZPPOConfig(**CPU, augmentations=["ncq"], bcq_candidate_content="boxed_masked")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert ZPPOConfig(**CPU, augmentations=["ncq"]).variant == "GRPO\u2020+NCQ"


@pytest.mark.parametrize(
    "recipe, headline",
    [
        ("recipes/rows/grpo_dagger_bcq_boxed_masked.yaml", "GRPO\u2020+BCQ (boxed-answer-masked)"),
        ("recipes/rows/grpo_dagger_bcq_final_answer_only.yaml", "GRPO\u2020+BCQ (final-answer-only)"),
    ],
)
def test_the_content_recipes_are_grpo_dagger_bcq_with_the_content(recipe, headline):
    args, lines = _plan(recipe)
    assert lines[0] == f"ZPPO dry run: {headline}" and args.augmentations == ["bcq"]
    printed = headline.split("(")[1].rstrip(")")
    assert any(line.startswith("  teacher: ") and line.endswith(f"; BCQ candidates {printed})") for line in lines)
