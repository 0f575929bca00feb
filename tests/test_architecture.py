"""The house rules of the layout (docs/architecture.md), checked on the source:

* no import cycles inside ``zppo_trl`` (lazy imports inside functions count too);
* the pure modules import neither TRL nor the trainer at import time;
* the architecture page's worked examples (a new objective, a new augmentation, a new benchmark) run as
  written: each is one module plus one registration, and the rest of the pipeline picks it up.
"""

from __future__ import annotations

import ast
import random
import re
import sys
import types
from pathlib import Path

import pytest
import torch

import zppo_trl

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from settings import CPU as CPU_ONLY
    from settings import UNREACHABLE_TEACHER
except ImportError:
    from tests.settings import CPU as CPU_ONLY
    from tests.settings import UNREACHABLE_TEACHER

try:  # tests/ on sys.path (pytest's default import mode) or imported as a package
    from code_scan import code_strings
except ImportError:
    from tests.code_scan import code_strings

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "zppo_trl"
PURE = (
    "prompts",
    "teacher_sampling",
    "prompt_sizes",
    "objectives",
    "rounds",
    "logp_paths",
    "step_batches",
    "checkpoint_state",
    "step_records",
    "replay",
    "reformulate",
    "advantages",
    "rewards",
    "losses",
    "ranks",
    "partitioning",
    "rollout",
    "step_metrics",
    "augmentations",
    "augmentations.base",
    "augmentations.candidates",
    "augmentations.candidate_content",
    "augmentations.guidance",
    "augmentations.targets",
    "batches",
    "packing",
    "memory_plan",
    "optim",
    "needs",
    "description",
    "row",
    "checks",
    "student_copy",
    "teacher_scores",
    "terms",
    "terms.base",
    "terms.zero_variance",
    "terms.self_teachers",
    "terms.grpo_care",
    "terms.perception_r1",
    "terms.rlkd",
    "host_memory",
    "prefetch",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


CPU = {**CPU_ONLY, **UNREACHABLE_TEACHER}
MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, top_level_only: bool = False) -> set[str]:
    """The modules ``name`` imports (zppo_trl modules resolved to their files' names; others by their root)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module
            candidates = [f"{target}.{alias.name}" for alias in node.names]
            found |= {c for c in candidates if c in MODULES} or {target}
    return {m if m in MODULES else m.split(".")[0] for m in found if m != name}


def test_no_import_cycles_inside_the_package():
    graph = {name: {m for m in _imports(name) if m in MODULES and m != "zppo_trl"} for name in MODULES}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_relative_imports_resolve_to_modules():
    """The graph above sees real edges: relative imports resolve to the modules they name."""
    assert "zppo_trl.trainer" in _imports("zppo_trl")  # the package imports the trainer ...
    assert "zppo_trl.rollout" in _imports("zppo_trl.trainer")  # ... and relative imports resolve to modules


@pytest.mark.parametrize("name", PURE)
def test_pure_modules_import_neither_trl_nor_the_trainer(name):
    seen, todo = set(), [f"zppo_trl.{name}"]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += [m for m in _imports(module, top_level_only=True) if m in MODULES]
    roots = {m for module in seen for m in _imports(module, top_level_only=True)}
    assert "trl" not in roots, f"zppo_trl.{name} imports TRL (through {sorted(seen)})"
    assert "zppo_trl.trainer" not in seen and "zppo_trl.config" not in seen


def _example(heading: str) -> list[str]:
    """The python code blocks of the architecture page's section ``heading``."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split(f"### {heading}\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


def _run_as(module: str, code: str) -> dict:
    """Run ``code`` as the module ``module`` (in ``sys.modules`` while it runs, as an import would put it)."""
    namespace = types.ModuleType(module)
    namespace.__package__ = module.rpartition(".")[0]
    sys.modules[module] = namespace
    try:
        exec(compile(code, f"<docs/architecture.md: {module}>", "exec"), vars(namespace))
    finally:
        sys.modules.pop(module, None)
    return vars(namespace)


def test_the_objective_example_registers_a_trainable_objective():
    from zppo_trl import ZPPOConfig
    from zppo_trl.losses import LOSSES, LossInputs
    from zppo_trl.objectives import loss_for

    module, registration = _example("A new objective")
    assert "OBJECTIVE_MODULES" in registration and '"zppo_trl.my_objective"' in registration
    try:
        _run_as("zppo_trl.my_objective", module)
        args = ZPPOConfig(**CPU, policy_objective="clipped_reinforce")
        assert loss_for(args).name == "clipped_reinforce" and args.variant == "ZPPO (Clipped-REINFORCE)"
        logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
        inputs = LossInputs(
            mask=torch.ones(1, 2),
            normalizer=2.0,
            logps=logps,
            old_logps=logps.detach() - 1.0,
            advantages=torch.tensor([[1.0]]),
            entropies=torch.zeros(1, 2),
        )
        out = loss_for(args).fn(inputs, args)
        out.loss.backward()  # ratio e > 1.2: the weight is clamped at 1.2 and carries no gradient
        torch.testing.assert_close(logps.grad, torch.full((1, 2), -1.2 / 2))
    finally:
        LOSSES.pop("clipped_reinforce", None)


def test_the_augmentation_example_builds_groups_the_trainer_samples():
    from zppo_trl import ZPPOConfig
    from zppo_trl.augmentations import AUGMENTATIONS, Evidence, make_augmentation

    module, registration = _example("A new augmentation")
    assert '"final_answer": FinalAnswerOnly' in registration
    try:
        namespace = _run_as("zppo_trl.augmentations.final_answer", module)
        AUGMENTATIONS["final_answer"] = namespace["FinalAnswerOnly"]
        args = ZPPOConfig(**CPU, augmentations=["final_answer"])
        augmentation = make_augmentation(args.augmentations)
        evidence = Evidence(["q1", "q2"], {"q1": ["so \\boxed{42}"]}, {"q1": ["\\boxed{7}"], "q2": ["\\boxed{1}"]})
        plan = augmentation.plan(evidence, limit=4, rng=random.Random(0), metrics={})
        built = augmentation.build(plan, teacher=None, args=args, metrics={})
        assert [(g.kind, g.key, g.block) for g in built.groups] == [
            ("final_answer", "q1", "A reference final answer: \\boxed{42}")
        ]
    finally:
        AUGMENTATIONS.pop("final_answer", None)


def test_the_benchmark_example_is_a_valid_setting():
    from zppo_trl.evaluation.benchmarks import BENCHMARK_MODULES
    from zppo_trl.evaluation.spec import TaskSpec

    module, registration = _example("A new benchmark")
    assert "BENCHMARK_MODULES" in registration and '"scienceqa"' in registration
    spec = _run_as("zppo_trl.evaluation.benchmarks.scienceqa", module)["SPECS"][0]
    assert isinstance(spec, TaskSpec) and spec.name == "SciQA" and spec.scoring == "exact+judge"
    assert (
        spec.directives[0][0].sub(
            "", "Which is a mammal? Answer with the option's letter from the given choices directly."
        )
        == "Which is a mammal?"
    )
    assert "scienceqa" not in BENCHMARK_MODULES  # the example is not part of the paper's suite


def test_the_term_example_is_a_row_the_pipeline_reads():
    from dataclasses import dataclass

    from accelerate import Accelerator

    from zppo_trl import ZPPOConfig
    from zppo_trl.model_card import _approach
    from zppo_trl.plan import teacher_lines
    from zppo_trl.ranks import Ranks
    from zppo_trl.rollout import Round
    from zppo_trl.terms import TERMS, PlainStep

    module, registration = _example("A new named term")
    assert "TERM_MODULES" in registration and '"length_penalty"' in registration
    try:
        namespace = _run_as("zppo_trl.terms.length_penalty", module)
        term = namespace["LengthPenalty"]
        # what the package's import does for a module in TERM_MODULES: its settings mixed into the config
        config = dataclass(type("Config", (ZPPOConfig, namespace["LengthPenaltySettings"]), {}))
        row = dict(augmentations=[], reward_term="length_penalty", max_completion_length=8)
        args = config(**CPU, **row, length_penalty_weight=0.5)
        assert args.variant == "Length-Penalty\u2020" and args.row.terms == (term,)
        assert teacher_lines(args) == ["  teacher: none"]
        assert args.row.describe(args)[-1].plan == (
            "  reward term: a length penalty (0.5 x the share of max_completion_length used)",
        )
        assert "loses 0.5 x the share of the length budget" in _approach(args)
        with pytest.raises(ValueError, match="reward_term='length_penalty' is a row on GRPO\u2020's pipeline"):
            config(**CPU, reward_term="length_penalty")
        with pytest.warns(
            UserWarning, match="length_penalty_weight=0.5 has no effect .*only reward_term: length_penalty"
        ):
            config(**CPU, augmentations=[], length_penalty_weight=0.5)
        ctx = type("Context", (), {"ranks": Ranks(Accelerator(cpu=True))})()
        batch = {"completion_mask": torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0], [1] * 8])}
        plain = Round(batch, torch.tensor([1.0, 0.0], dtype=torch.float64), ["a", "b"], [[("new", "q")]])
        contribution = term(args, ctx).after_plain(PlainStep(None, plain, None, {}))
        torch.testing.assert_close(contribution.rewards, torch.tensor([-0.125, -0.5], dtype=torch.float64))
        assert contribution.metrics == {"length_share_mean": 0.625}
    finally:
        TERMS.pop(("reward_term", "length_penalty"), None)


# ---------------------------------------------------------------------- every row family's names stay in its part


def _families() -> dict[str, tuple[set[str], tuple[str, ...]]]:
    """Each row family's registered names (its kinds or modes, and how the paper prints them) and the modules of the
    package that are its parts (paths relative to zppo_trl/). The named terms have their own guard
    (tests/test_terms.py)."""
    from zppo_trl.augmentations import AUGMENTATIONS
    from zppo_trl.distill import DISTILLATIONS
    from zppo_trl.losses import LOSSES

    augmentations = set(AUGMENTATIONS) | {part.printed for part in AUGMENTATIONS.values() if part.printed}
    objectives = set(LOSSES) | {loss.objective for loss in LOSSES.values() if loss.objective}
    objectives |= {loss.printed for loss in LOSSES.values() if loss.printed}
    # distill.py registers the distillation rows' loss
    own_objectives = ("losses.py", "objectives.py", "hybrid_objectives.py", "objective_settings.py", "distill.py")
    return {
        # reformulate.py is the BCQ/NCQ augmentation's planning (augmentations/candidates.py builds on it)
        "augmentation": (augmentations, ("augmentations/", "reformulate.py")),
        "objective": (objectives, (*own_objectives, "terms/self_teachers.py")),
        "distillation": (set(DISTILLATIONS) | {part.printed for part in DISTILLATIONS.values()}, ("distill.py",)),
    }


# Strings that spell a registered name but do not name a row: values of TRL's own settings and tags, and the truthy
# spellings of an environment variable or option.
NOT_A_ROW = {
    ("config.py", "dapo"): "TRL's loss_type that the paper's objective pins (PAPER_OBJECTIVE)",
    ("trainer.py", "grpo"): "TRL's Hub tag of a GRPO-trained model",
    ("plan.py", "on"): "a truthy spelling of an environment variable",
    ("optim.py", "on"): "a truthy spelling of optim_args",
    ("optim.py", "off"): "a falsy spelling of optim_args",
}


@pytest.mark.parametrize("family", ["augmentation", "objective", "distillation"])
def test_no_module_outside_a_family_s_parts_names_its_rows(family):
    # The card, the plan, the context bounds, the config and the trainer read what a part declares (its needs,
    # settings, words, prompt bounds), never its name: a row is one module and one registry line.
    names, own = _families()[family]
    package = Path(zppo_trl.__file__).resolve().parent
    named = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith(own):
            continue
        named += [
            (relative, line, text)
            for line, text in code_strings(path)
            if text in names and (relative, text) not in NOT_A_ROW
        ]
    assert not named, f"modules outside the {family} parts name one of its rows: {named}"


def test_the_family_guard_would_catch_a_name(tmp_path):
    source = tmp_path / "leaky.py"
    source.write_text('"""The card says gspo."""\ndef f(args):\n    return args.policy_objective == "gspo"\n')
    names, _ = _families()["objective"]
    assert [text for _, text in code_strings(source) if text in names] == ["gspo"]


def test_every_source_describes_itself_and_opens_the_card_and_the_plan():
    # the card and the dry run compose their words from Row.describe (the source's first), never from the fields that
    # select a part: each registered source of each family says a card sentence, and the words it gives land there
    from zppo_trl import ZPPOConfig
    from zppo_trl.model_card import _approach, _teacher_line
    from zppo_trl.parts import registered_parts
    from zppo_trl.plan import teacher_lines

    sources = [part for part in registered_parts() if part.family in ("augmentation", "targets")]
    assert {part.family for part in sources} == {"augmentation", "targets"} and len(sources) >= 7
    for part in sources:
        selected = {"distillation": part.name} if part.selector == "distillation" else {"augmentations": [part.name]}
        args = ZPPOConfig(**CPU, **{"augmentations": [], **selected})
        source, *terms = args.row.describe(args)
        assert source == args.row.source.describe(args) and not terms, part.name
        assert source.card and _approach(args).startswith(source.card), part.name
        assert source.teacher and _teacher_line(args) == source.teacher, part.name
        assert all(use in teacher_lines(args)[0] for use in source.teacher_use), part.name
    plain = ZPPOConfig(**CPU, augmentations=[])
    assert _approach(plain).startswith("No teacher takes part.") and _teacher_line(plain) == "none."
