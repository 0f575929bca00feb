"""The model card of a ZPPO run: what was trained, from what, how, and how to load it.

:meth:`zppo_trl.ZPPOTrainer.create_model_card` writes it to ``output_dir/README.md`` (the
file ``push_to_hub`` publishes). It names the student and the dataset as the user gave them
(a Hub id is linked and goes into the card's metadata; a local path is shown as a path),
gives a quick start only for a place the model can be loaded from, describes the training
procedure (method, variant, teacher, data, schedule, settings, final counters) and cites the
paper next to TRL. Every table cell is escaped, so each row renders.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from .data import is_hub_id
from .description import served_teacher
from .evaluation.condition import CONDITION_KEY
from .losses import PAPER_POLICY_OBJECTIVE
from .needs import SCORES_TOKEN_LOGPS, SCORES_TOP_K

__all__ = [
    "PAPER_CITATION",
    "PAPER_TITLE",
    "TRL_CITATION",
    "CardFacts",
    "final_metrics",
    "render_model_card",
    "write_run_card",
    "zppo_card_section",
]

PAPER_TITLE = "Zone of Proximal Policy Optimization: Teacher in Prompts, Not Gradients"
PAPER_CITATION = """@misc{lee_zppo,
    title  = {{Zone of Proximal Policy Optimization: Teacher in Prompts, Not Gradients}},
    author = {Byung-Kwan Lee and Ximing Lu and Shizhe Diao and Minki Kang and Saurav Muralidharan and Karan Sapra and Andrew Tao and Pavlo Molchanov and Yejin Choi and Yu-Chiang Frank Wang and Ryo Hachiuma},
    note   = {Preprint}
}"""
TRL_CITATION = """@misc{vonwerra2022trl,
    title        = {{TRL: Transformer Reinforcement Learning}},
    author       = {Leandro von Werra and Younes Belkada and Lewis Tunstall and Edward Beeching and Tristan Thrush and Nathan Lambert and Shengyi Huang and Kashif Rasul and Quentin Gallou{\\'e}dec},
    year         = 2020,
    journal      = {GitHub repository},
    publisher    = {GitHub},
    howpublished = {\\url{https://github.com/huggingface/trl}}
}"""

# (config field, paper symbol) in the order of the paper's hyperparameter table
_SETTINGS = (
    ("num_generations", "G_S"),
    ("teacher_num_generations", "G_T"),
    ("hard_threshold", "tau"),
    ("replay_fraction", "rho_replay"),
    ("replay_capacity", "|B|_max"),
    ("augment_fraction", "rho_aug"),
    ("augmentations", "BCQ / NCQ (or Hint / Prefix)"),
    ("num_partitions", "I"),
    ("advantage_normalization", "advantage normalization"),
    ("epsilon", "clip-lower"),
    ("epsilon_high", "clip-higher"),
    ("delta", "dual clip"),
    ("loss_type", "loss aggregation"),
    ("policy_objective", "Step 6 objective"),
    ("beta", "KL weight"),
    ("learning_rate", "learning rate"),
    ("weight_decay", "weight decay"),
    ("max_grad_norm", "grad clip"),
    ("temperature", "student temperature"),
    ("teacher_temperature", "teacher temperature"),
    ("max_completion_length", "max response length"),
    ("compress_candidates", "candidate compression"),
    ("compression_max_tokens", "candidate compression cap"),
)

# metric keys (as logged, without the "zppo/" prefix) reported at the end of a run
_FINAL = (
    ("rollout_steps", "rollout steps"),
    ("plain_accuracy", "plain accuracy (last rollout step)"),
    ("buffer_size", "replay buffer size"),
    ("admitted_total", "admitted to the buffer"),
    ("graduated_total", "graduated"),
    ("evicted_total", "evicted"),
    ("bcq_total", "BCQ instances"),
    ("ncq_total", "NCQ instances"),
    ("hint_total", "Hint instances"),
    ("hint_leaked_total", "Hint instances whose hint states the gold answer"),
    ("prefix_total", "Prefix instances"),
    ("correction_trained_total", "verified Correction-SFT corrections"),
    ("reflection_trained_total", "verified Error-reflection-SFT revisions"),
    ("skipped_partitions_total", "skipped (empty-signal) partitions"),
    ("unscored_groups_total", "groups left out unscored (a reward function, e.g. the judge, gave no verdict)"),
    ("compression_failures_total", "failed candidate compressions"),
    ("dropped_total", "augmented instances dropped for them"),
)

_PACKAGES = (
    ("zppo-trl", "zppo-trl"),
    ("TRL", "trl"),
    ("Transformers", "transformers"),
    ("PyTorch", "torch"),
    ("Datasets", "datasets"),
)


def _link(name: str | None, kind: str) -> str:
    """A Hub id as a link (``kind``: ``""`` for models, ``"datasets/"``), a local path as a path."""
    if not name:
        return "unknown"
    if is_hub_id(name):
        return f"[{name}](https://huggingface.co/{kind}{name})"
    return f"the local {'checkpoint' if not kind else 'dataset'} `{name}`"


def final_metrics(log_history: Iterable[Mapping]) -> dict[str, float]:
    """The last logged value of every key in a Trainer's ``state.log_history``."""
    last: dict[str, float] = {}
    for entry in log_history:
        for key, value in entry.items():
            if isinstance(value, (int, float)):
                last[key] = value
    return last


def _format(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def _cell(value) -> str:
    """A markdown table cell: pipes escaped, line breaks folded."""
    return _format(value).replace("|", "\\|").replace("\n", " ")


def _table(header: tuple[str, ...], rows: Iterable[tuple]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return lines


def zppo_card_section(args, *, log_history: Iterable[Mapping] = ()) -> str:
    """The settings and final-counter tables of a ZPPO run of ``args`` (a :class:`zppo_trl.ZPPOConfig`)."""
    lines = [
        "### Settings",
        "",
        *_table(
            ("setting", "paper symbol", "value"),
            ((f"`{name}`", symbol, getattr(args, name)) for name, symbol in _SETTINGS),
        ),
    ]
    metrics = final_metrics(log_history)
    rows = [(label, metrics[f"zppo/{key}"]) for key, label in _FINAL if f"zppo/{key}" in metrics]
    if metrics.get("zppo/hint_trained_total") and "zppo/hint_leaked_total" in metrics:
        rows.append(
            ("hint leak rate (over the run)", metrics["zppo/hint_leaked_total"] / metrics["zppo/hint_trained_total"])
        )
    if "reward" in metrics:
        rows.append(("mean reward (last log)", metrics["reward"]))
    if rows:
        lines += ["", "### Final metrics", "", *_table(("metric", "value"), rows)]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class CardFacts:
    """What a card says about one run, besides its configuration."""

    model_name: str
    student: str | None  # as the user gave it: a Hub id or a local path
    dataset: str | None
    load_from: str  # where the trained model can be loaded: the Hub repo it is pushed to, or output_dir
    on_hub: bool  # load_from is a Hub repository (the run pushes there)
    vision: bool  # an image-text-to-text student
    license: str | None = None
    tags: tuple[str, ...] = ()  # the trainer's own tags (trl, grpo, zppo) and the caller's
    optimizer_steps: int = 0
    evaluation_condition: str | None = None  # text before the closer at evaluation (Correction-SFT: <correct>)


def _front_matter(facts: CardFacts) -> str:
    import yaml

    data = {"library_name": "transformers", "model_name": facts.model_name}
    if is_hub_id(facts.student):
        data["base_model"] = facts.student
    if is_hub_id(facts.dataset):
        data["datasets"] = [facts.dataset]
    if facts.license:
        data["license"] = facts.license
    data["pipeline_tag"] = "image-text-to-text" if facts.vision else "text-generation"
    data["tags"] = list(dict.fromkeys(["generated_from_trainer", *facts.tags]))
    return "---\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True) + "---\n"


def _quick_start(facts: CardFacts, closer: str, max_new_tokens: int) -> list[str]:
    where = "from the Hub" if facts.on_hub else "from the run's output directory"
    condition = facts.evaluation_condition
    ending = (
        f"after the question put `{condition}`, the condition it is evaluated under, then the RL closer it was "
        "trained with"
        if condition
        else "end prompts with the RL closer the model was trained with"
        if closer
        else "prompts are the question alone, as it was trained (no closer)"
    )
    lines = [
        "## Quick start",
        "",
        f"Load it {where}; {ending}.",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        *([f"CONDITION = {condition!r}"] if condition else []),
        *([f"CLOSER = {closer!r}"] if closer else []),
        'question = "A train travels 120 km in 1.5 hours. What is its average speed in km/h?"',
    ]
    parts = ["question", *(["CONDITION"] if condition else []), *(["CLOSER"] if closer else [])]
    text = ' + "\\n\\n" + '.join(parts)
    if facts.vision:
        lines += [
            f'generator = pipeline("image-text-to-text", model="{facts.load_from}")',
            'image = "figure.png"  # a path or URL to the question\'s image',
            'messages = [{"role": "user", "content": [{"type": "image", "url": image}, '
            f'{{"type": "text", "text": {text}}}]}}]',
            f"output = generator(text=messages, max_new_tokens={max_new_tokens}, return_full_text=False)[0]",
        ]
    else:
        lines += [
            f'generator = pipeline("text-generation", model="{facts.load_from}")',
            f'messages = [{{"role": "user", "content": {text}}}]',
            f"output = generator(messages, max_new_tokens={max_new_tokens}, return_full_text=False)[0]",
        ]
    return [*lines, 'print(output["generated_text"])', "```"]


def _approach(args) -> str:
    """What the row trains on and with which loss, in a sentence or two: its source's words, then its policy
    objective's and its terms' (a target source trains its own loss)."""
    replay = (
        " A prompt replay buffer brings hard questions back until they graduate." if args.replay_fraction > 0 else ""
    )
    row = args.row
    source, *terms = row.describe(args)
    if row.objective.objective is None:  # a target source's loss (cross-entropy, the distillation JSD)
        return f"{source.card}{replay}"
    objective = {PAPER_POLICY_OBJECTIVE: "GRPO with DAPO's clip-higher, token-level loss and no KL, a dual clip,"}.get(
        args.policy_objective,
        f"{row.objective.printed} (in place of GRPO's clipped surrogate), with DAPO's token-level loss and no KL,",
    )
    said = "".join(f" {description.card}" for description in terms)
    return (
        f"{source.card}{replay} The objective is {objective} and two-step advantages normalised per optimizer "
        f"mini-batch without zero-variance groups.{said}"
    )


def _teacher_line(args) -> str:
    """The Teacher line: as the row's source says it, or composed from the row's needs and its parts' words (where
    the teacher is, what it samples, what it scores)."""
    row = args.row
    if not row.uses_teacher:
        return "none."
    descriptions = row.describe(args)
    if descriptions[0].teacher:
        return descriptions[0].teacher
    scores = {SCORES_TOP_K: "its top-k per-token log-probs", SCORES_TOKEN_LOGPS: "its log-prob of each sampled token"}
    uses = (
        [f"it samples G_T = {args.teacher_num_generations} answers per question"] if row.needs.teacher_samples else []
    )
    uses += [use for description in descriptions for use in description.teacher_use]
    if row.loads_teacher:
        scored = " and ".join(scores[s] for s in sorted(row.needs.teacher_scores))
        loaded = f"`{args.distill_teacher}`, frozen, loaded next to the student: {scored}"
        if not row.uses_teacher_server:
            return f"{loaded}."
        return f"{loaded}; `{args.teacher_model}` behind an OpenAI-compatible endpoint: {'; '.join(uses)}."
    uses += [scores[s] for s in sorted(row.teacher_scores_from_server)]
    return f"{served_teacher(args)}: {'; '.join(uses)}."


def _procedure(args, facts: CardFacts) -> list[str]:
    rollout_steps = facts.optimizer_steps // args.num_partitions if args.num_partitions else 0
    return [
        "## Training procedure",
        "",
        f"This model was trained with **{args.variant}**, from [{PAPER_TITLE}](#citations), with TRL's `GRPOTrainer` "
        f"extended by zppo-trl's `ZPPOTrainer`. {_approach(args)}",
        "",
        f"- **Student:** {_link(facts.student, '')}",
        f"- **Teacher:** {_teacher_line(args)}",
        f"- **Data:** {_link(facts.dataset, 'datasets/')}",
        f"- **Schedule:** {rollout_steps} rollout steps of {args.num_generations} student rollouts per prompt, "
        f"{facts.optimizer_steps} optimizer updates ({args.num_partitions} per rollout step).",
        *(
            [
                f"- **Evaluation:** every question carries `{facts.evaluation_condition}` before the closer, as the "
                f"paper evaluates this row; `config.json` records it (`{CONDITION_KEY}`) and `zppo-eval run` applies "
                "it by default."
            ]
            if facts.evaluation_condition
            else []
        ),
        "",
    ]


def _versions() -> list[str]:
    lines = ["## Framework versions", ""]
    for label, package in _PACKAGES:
        try:
            lines.append(f"- {label}: {version(package)}")
        except PackageNotFoundError:
            continue
    return lines


def render_model_card(args, facts: CardFacts, log_history: Iterable[Mapping] = ()) -> str:
    """The whole ``README.md`` of a ZPPO run of ``args`` (a :class:`zppo_trl.ZPPOConfig`)."""
    student = _link(facts.student, "") if facts.student else "a student model"
    lines = [
        _front_matter(facts),
        f"# {facts.model_name}",
        "",
        f"A fine-tuned version of {student}, trained with {args.variant} using "
        "[TRL](https://github.com/huggingface/trl) and zppo-trl.",
        "",
        *_quick_start(facts, args.closer, args.max_completion_length),
        "",
        *_procedure(args, facts),
        zppo_card_section(args, log_history=log_history),
        *_versions(),
        "",
        "## Citations",
        "",
        "Cite ZPPO as:",
        "",
        "```bibtex",
        PAPER_CITATION,
        "```",
        "",
        "Cite TRL as:",
        "",
        "```bibtex",
        TRL_CITATION,
        "```",
        "",
    ]
    return "\n".join(lines)


def write_run_card(
    args,
    model_config,
    model_name: str | None,
    dataset: str | None,
    license: str | None,
    tags: Iterable[str],
    optimizer_steps: int,
    log_history: Iterable[Mapping] = (),
) -> str:
    """Write ``args.output_dir/README.md``, the card of a run of ``args`` whose student has ``model_config``, and
    return its path: named after ``model_name`` (default: the Hub repo or output folder it is saved to), on
    ``dataset``, with the student's ``license``, the trainer's and caller's ``tags``, its ``optimizer_steps`` and
    TRL's ``log_history``."""
    on_hub = bool(args.push_to_hub and args.hub_model_id)
    facts = CardFacts(
        model_name=model_name
        or (args.hub_model_id or os.path.basename(os.path.normpath(args.output_dir))).split("/")[-1],
        student=getattr(model_config, "_name_or_path", None) or None,
        dataset=dataset,
        load_from=args.hub_model_id if on_hub else args.output_dir,
        on_hub=on_hub,
        vision=getattr(model_config, "vision_config", None) is not None,
        license=license,
        tags=tuple(tags),
        optimizer_steps=optimizer_steps,
        evaluation_condition=getattr(model_config, CONDITION_KEY, None),
    )
    os.makedirs(args.output_dir, exist_ok=True)
    path = os.path.join(args.output_dir, "README.md")
    with open(path, "w") as f:
        f.write(render_model_card(args, facts, log_history))
    return path
