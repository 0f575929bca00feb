"""The model card: renders as markdown, names the student and data as given, cites the paper."""

from __future__ import annotations

import re

import pytest
import yaml

from zppo_trl import ZPPOConfig
from zppo_trl.model_card import PAPER_TITLE, CardFacts, render_model_card
from zppo_trl.prompts import compose_prompt

ARGS = dict(
    output_dir="outputs/run",
    use_cpu=True,
    bf16=False,
    report_to=[],
    teacher_base_url="http://127.0.0.1:8000/v1",
    teacher_model="Qwen/Qwen3.5-27B-FP8",
)
LOG = [
    {"zppo/rollout_steps": 5.0, "zppo/bcq_total": 3.0, "zppo/ncq_total": 7.0, "zppo/buffer_size": 12.0, "reward": 0.25}
]


def _card(student, dataset, *, on_hub=False, license=None, condition=None, log=LOG, **overrides) -> str:
    args = ZPPOConfig(**{**ARGS, **overrides})
    facts = CardFacts(
        model_name="run", student=student, dataset=dataset, load_from="org/run" if on_hub else args.output_dir,
        on_hub=on_hub, vision=False, license=license, tags=("trl", "grpo", "zppo"), optimizer_steps=20,
        evaluation_condition=condition,
    )  # fmt: skip
    return render_model_card(args, facts, log)


def _front_matter(card: str) -> dict:
    match = re.match(r"---\n(.*?)\n---\n", card, flags=re.DOTALL)
    assert match, card[:200]
    return yaml.safe_load(match.group(1))


def _cells(line: str) -> list[str]:
    """A markdown table row's cells (a backslash-escaped pipe stays inside its cell)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _tables(card: str) -> list[list[str]]:
    tables, current = [], []
    for line in card.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


@pytest.mark.parametrize("student", ["Qwen/Qwen3.5-2B", "/abs/path/to/student", ".cache/demo/SmolLM2-135M-Instruct"])
def test_every_table_row_has_the_headers_cell_count(student):
    card = _card(student, "recipes/data/demo_math.jsonl")
    tables = _tables(card)
    assert len(tables) == 2  # settings and final metrics
    for table in tables:
        width = len(_cells(table[0]))
        assert re.fullmatch(r"\|(---\|)+", table[1]) and table[1].count("|") == width + 1
        for row in table[2:]:
            assert len(_cells(row)) == width, row
    # the buffer capacity's symbol, |B|_max, is escaped rather than breaking its row
    assert "\\|B\\|_max" in card


def test_a_hub_student_is_linked_and_a_local_one_shown_as_a_path():
    hub = _card("Qwen/Qwen3.5-2B", "zppo-trl/ZPPO-77K", on_hub=True, license="apache-2.0")
    meta = _front_matter(hub)
    assert meta["base_model"] == "Qwen/Qwen3.5-2B" and meta["datasets"] == ["zppo-trl/ZPPO-77K"]
    assert meta["license"] == "apache-2.0" and "licence" not in meta
    assert {"trl", "grpo", "zppo"} <= set(meta["tags"])
    assert "A fine-tuned version of [Qwen/Qwen3.5-2B](https://huggingface.co/Qwen/Qwen3.5-2B)" in hub
    assert "[zppo-trl/ZPPO-77K](https://huggingface.co/datasets/zppo-trl/ZPPO-77K)" in hub
    assert 'pipeline("text-generation", model="org/run")' in hub and "from the Hub" in hub

    local = _card(".cache/demo/SmolLM2-135M-Instruct", "recipes/data/demo_math.jsonl")
    meta = _front_matter(local)
    assert "base_model" not in meta and "datasets" not in meta and "license" not in meta
    assert "A fine-tuned version of the local checkpoint `.cache/demo/SmolLM2-135M-Instruct`" in local
    assert "the local dataset `recipes/data/demo_math.jsonl`" in local
    assert "huggingface.co/None" not in local and "huggingface.co/." not in local and 'model="None"' not in local
    assert 'pipeline("text-generation", model="outputs/run")' in local and "from the run's output directory" in local
    for card in (hub, local):
        assert not re.search(r"\]\(https://huggingface\.co/(None|\.|/)", card)


def test_the_training_procedure_and_both_citations_are_there():
    card = _card("Qwen/Qwen3.5-2B", "zppo-trl/ZPPO-77K")
    procedure = card.split("## Training procedure", 1)[1].split("## Framework versions", 1)[0]
    assert "**ZPPO**" in procedure and PAPER_TITLE in procedure
    assert "**Teacher:** `Qwen/Qwen3.5-27B-FP8`" in procedure and "G_T = 4" in procedure
    assert (
        "**Schedule:** 5 rollout steps of 8 student rollouts per prompt, 20 optimizer updates (4 per rollout step)."
        in procedure
    )
    assert "| `hard_threshold` | tau | 0.5 |" in procedure and "| BCQ instances | 3 |" in procedure
    citations = card.split("## Citations", 1)[1]
    assert "title  = {{Zone of Proximal Policy Optimization: Teacher in Prompts, Not Gradients}}" in citations
    assert "TRL: Transformer Reinforcement Learning" in citations
    # the quick start ends prompts with the closer the model was trained with
    assert f"CLOSER = {ZPPOConfig(**ARGS).closer!r}" in card
    grpo = _card("Qwen/Qwen3.5-2B", "zppo-trl/ZPPO-77K", augmentations=[], replay_fraction=0.0)
    assert "**GRPO**" in grpo and "**Teacher:** none" in grpo


def _quick_start_prompt(card: str) -> tuple[str, str]:
    """The question of the card's quick start and the prompt it sends (its code run up to the pipeline)."""
    code = card.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec("\n".join(line for line in code.splitlines() if not re.search(r"pipeline|generator|output", line)), namespace)
    return namespace["question"], namespace["messages"][0]["content"]


def test_a_correction_sft_card_says_which_condition_the_model_is_evaluated_under():
    card = _card("Qwen/Qwen3.5-2B", "zppo-trl/ZPPO-77K", condition="<correct>", augmentations=["correction"])
    closer = ZPPOConfig(**ARGS).closer
    # the quick start's prompt is the one the model trained its corrections under and is evaluated under
    question, prompt = _quick_start_prompt(card)
    assert prompt == compose_prompt(question, "<correct>", closer)
    assert "- **Evaluation:** every question carries `<correct>` before the closer" in card
    assert "`zppo_evaluation_condition`" in card
    plain = _card("Qwen/Qwen3.5-2B", "zppo-trl/ZPPO-77K")
    question, prompt = _quick_start_prompt(plain)
    assert prompt == compose_prompt(question, None, closer)
    assert "**Evaluation:**" not in plain and "CONDITION" not in plain


def test_a_hint_card_reports_how_many_hints_leaked_the_answer():
    log = [{"zppo/rollout_steps": 5.0, "zppo/hint_total": 12.0, "zppo/hint_trained_total": 10.0,
            "zppo/hint_leaked_total": 2.0}]  # fmt: skip
    card = _card("Qwen/Qwen3.5-2B", "zppo-trl/ZPPO-77K", log=log, augmentations=["hint"])
    assert "| Hint instances whose hint states the gold answer | 2 |" in card
    assert "| hint leak rate (over the run) | 0.2 |" in card
    assert "leak" not in _card("Qwen/Qwen3.5-2B", "zppo-trl/ZPPO-77K")  # other rows log no leak count
