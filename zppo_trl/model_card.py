"""The ZPPO section of a trained model's card: method, student, teacher, dataset, settings, final metrics.

TRL writes its own card (framework versions, citation); :class:`zppo_trl.ZPPOTrainer`
appends this section, so a checkpoint pushed to the Hub says how it was trained.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["PAPER_TITLE", "zppo_card_section", "final_metrics"]

PAPER_TITLE = "Zone of Proximal Policy Optimization: Teacher in Prompts, Not Gradients"

# (config field, paper symbol) in the order of the paper's hyperparameter table
_SETTINGS = (
    ("num_generations", "G_S"),
    ("teacher_num_generations", "G_T"),
    ("hard_threshold", "tau"),
    ("replay_fraction", "rho_replay"),
    ("replay_capacity", "|B|_max"),
    ("augment_fraction", "rho_aug"),
    ("reformulations", "BCQ / NCQ"),
    ("num_partitions", "I"),
    ("advantage_normalization", "advantage normalization"),
    ("epsilon", "clip-lower"),
    ("epsilon_high", "clip-higher"),
    ("delta", "dual clip"),
    ("loss_type", "loss aggregation"),
    ("beta", "KL weight"),
    ("learning_rate", "learning rate"),
    ("weight_decay", "weight decay"),
    ("max_grad_norm", "grad clip"),
    ("temperature", "student temperature"),
    ("teacher_temperature", "teacher temperature"),
    ("max_completion_length", "max response length"),
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
    ("skipped_partitions_total", "skipped (empty-signal) partitions"),
    ("compression_failures_total", "failed candidate compressions"),
    ("dropped_total", "BCQ/NCQ instances dropped for them"),
)


def final_metrics(log_history: Iterable[Mapping]) -> dict[str, float]:
    """The last logged value of every key in a Trainer's ``state.log_history``."""
    last: dict[str, float] = {}
    for entry in log_history:
        for key, value in entry.items():
            if isinstance(value, (int, float)):
                last[key] = value
    return last


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def zppo_card_section(args, *, student: str | None, dataset: str | None, log_history: Iterable[Mapping] = ()) -> str:
    """Markdown describing a ZPPO run of ``args`` (a :class:`zppo_trl.ZPPOConfig`)."""
    teacher = args.teacher_model if args.reformulations else "none (no reformulations)"
    lines = [
        "",
        "## ZPPO training",
        "",
        f"Trained with **{args.variant}** ({PAPER_TITLE}): on questions the student mostly fails, a frozen "
        "teacher's answers enter the *prompt* (BCQ/NCQ), never the gradient; a prompt replay buffer brings hard "
        "questions back until they graduate.",
        "",
        f"- **Student:** {student or 'unknown'}",
        f"- **Teacher:** {teacher}",
        f"- **Dataset:** {dataset or 'unknown'}",
        "",
        "| setting | symbol | value |",
        "|---|---|---|",
    ]
    lines += [f"| `{name}` | {symbol} | {_format(getattr(args, name))} |" for name, symbol in _SETTINGS]
    metrics = final_metrics(log_history)
    rows = [(label, metrics[f"zppo/{key}"]) for key, label in _FINAL if f"zppo/{key}" in metrics]
    if "reward" in metrics:
        rows.append(("mean reward (last log)", metrics["reward"]))
    if rows:
        lines += ["", "### Final metrics", "", "| metric | value |", "|---|---|"]
        lines += [f"| {label} | {_format(value)} |" for label, value in rows]
    return "\n".join(lines) + "\n"
