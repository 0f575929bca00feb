"""The step-6 objectives' settings: the :class:`zppo_trl.ZPPOConfig` fields GSPO, CISPO, DISPO, KDRL and RLAD read
(their losses are registered in :mod:`zppo_trl.losses` and :mod:`zppo_trl.hybrid_objectives`), and their checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .checks import check_number
from .losses import CISPO_WEIGHT_BOUND, DISPO_FIELDS, PAPER_POLICY_OBJECTIVE, DispoBounds
from .objectives import objective_terms, policy_objectives
from .terms import validate_term

__all__ = [
    "DISPO_FIELDS",
    "DISPO_OUT_OF_BOUNDS",
    "GSPO_SETTINGS",
    "ObjectiveSettings",
    "check_objective_settings",
    "validate_objective",
]

# GSPO as its paper trains it, or with the ZPPO table's clip range and aggregation (see gspo_settings).
GSPO_SETTINGS = ("gspo_paper", "zppo_table")
DISPO_OUT_OF_BOUNDS = ("zero", "clamp")


@dataclass(kw_only=True)  # after GRPOConfig's positional output_dir in ZPPOConfig
class ObjectiveSettings:
    """The fields of the objectives other than GRPO's (each read only by the ``policy_objective`` its help names)."""

    gspo_settings: str = field(
        default="gspo_paper",
        metadata={
            "help": "GSPO's clip range and aggregation: 'gspo_paper' (the GSPO paper's: the sequence ratio clipped to "
            "[1 - 3e-4, 1 + 4e-4], the loss averaged per response) or 'zppo_table' (the ZPPO hyperparameter "
            "table's epsilon/epsilon_high and DAPO's token mean, a reading of 'every other setting follows' under "
            "which the clip essentially never binds). Only policy_objective: gspo reads it."
        },
    )
    cispo_weight_bound: float = field(
        default=CISPO_WEIGHT_BOUND,
        metadata={
            "help": "CISPO's upper bound on the stop-gradient importance weight (no lower bound, as MiniMax-M1). "
            "MiniMax-M1 does not state its value; 5 is ScaleRL's eps_max for CISPO (TRL's recommendation). Only "
            "policy_objective: cispo reads it."
        },
    )
    # DISPO's defaults: the values of a public DISPO training script (slime-based), NOT checked against the DISPO
    # paper's own table, which could not be read here. Correct responses keep a gradient for 0.8 <= r <= 11;
    # incorrect ones for 0 <= r <= 101 (the paper finds tight bounds on incorrect responses collapse training).
    dispo_epsilon_low_pos: float = field(
        default=0.2,
        metadata={"help": "DISPO, correct responses (A > 0): tokens with weight below 1 - this get no gradient."},
    )
    dispo_epsilon_high_pos: float = field(
        default=10.0,
        metadata={"help": "DISPO, correct responses (A > 0): tokens with weight above 1 + this get no gradient."},
    )
    dispo_epsilon_low_neg: float = field(
        default=1.0,
        metadata={
            "help": "DISPO, incorrect responses (A < 0): tokens with weight below 1 - this get no gradient (1: no "
            "lower bound)."
        },
    )
    dispo_epsilon_high_neg: float = field(
        default=100.0,
        metadata={"help": "DISPO, incorrect responses (A < 0): tokens with weight above 1 + this get no gradient."},
    )

    dispo_out_of_bounds: str = field(
        default="zero",
        metadata={
            "help": "DISPO, a token whose weight is outside its interval: 'zero' (no gradient, our reading of the "
            "DISPO abstract) or 'clamp' (the weight clamped into the interval, as secondary summaries write "
            "J_DISPO). See docs/comparison_rows.md."
        },
    )
    # KDRL's annealed reverse-KL weight (zppo_trl.hybrid_objectives): its paper's best-scoring schedule.
    kdrl_beta: float = field(
        default=5e-3,
        metadata={"help": "KDRL: the reverse-KL weight at step 0. Only policy_objective: kdrl reads it."},
    )
    kdrl_beta_decay: float = field(
        default=5e-5,
        metadata={
            "help": "KDRL: how much the reverse-KL weight falls per optimizer step (0: a constant kdrl_beta). Only "
            "policy_objective: kdrl reads it."
        },
    )
    kdrl_beta_min: float = field(
        default=1e-3,
        metadata={"help": "KDRL: the floor of the annealed reverse-KL weight. Only policy_objective: kdrl reads it."},
    )
    rlad_alpha: float = field(
        default=0.5,
        metadata={
            "help": "RLAD: the old policy's share of the ratio's anchor pi_old^alpha pi_T^(1 - alpha) (1: GRPO's "
            "ratio; its paper's 0.5). Only policy_objective: rlad reads it."
        },
    )
    rlad_teacher_log_ratio_bound: float = field(
        default=1.0,
        metadata={
            "help": "RLAD: log pi - log pi_T is clamped to [-bound, bound] in the ratio (its paper's 1). Only "
            "policy_objective: rlad reads it."
        },
    )

    @property
    def dispo_bounds(self) -> DispoBounds:
        """DISPO's four clip epsilons (see :func:`zppo_trl.losses.dispo_per_token_loss`)."""
        return DispoBounds(
            self.dispo_epsilon_low_pos,
            self.dispo_epsilon_high_pos,
            self.dispo_epsilon_low_neg,
            self.dispo_epsilon_high_neg,
        )


def check_objective_settings(args: Any) -> None:
    """Refuse a bad value of an objective's field, its own term's included, naming it (whatever the row: a set field
    must be valid)."""
    if args.policy_objective not in policy_objectives():
        raise ValueError(f"policy_objective must be one of {list(policy_objectives())}, got {args.policy_objective!r}")
    for term in dict.fromkeys(objective_terms().values()):
        term.check_settings(args)
    if args.epsilon_high is not None and args.epsilon > args.epsilon_high:  # clip-higher: upper >= lower
        raise ValueError(f"epsilon ({args.epsilon}) is above epsilon_high ({args.epsilon_high}); paper: 0.2, 0.28")
    if args.gspo_settings not in GSPO_SETTINGS:
        raise ValueError(f"gspo_settings must be one of {list(GSPO_SETTINGS)}, got {args.gspo_settings!r}")
    if args.dispo_out_of_bounds not in DISPO_OUT_OF_BOUNDS:
        raise ValueError(
            f"dispo_out_of_bounds must be one of {list(DISPO_OUT_OF_BOUNDS)}, got {args.dispo_out_of_bounds!r}"
        )
    bound = args.cispo_weight_bound
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 1.0 <= bound < float("inf"):
        raise ValueError(f"cispo_weight_bound must be a finite number >= 1, got {bound!r}")
    for name in DISPO_FIELDS:
        check_number(name, getattr(args, name))
    for name in ("kdrl_beta", "kdrl_beta_decay", "kdrl_beta_min", "rlad_teacher_log_ratio_bound"):
        check_number(name, getattr(args, name))
    check_number("rlad_alpha", args.rlad_alpha, high=1.0)
    if args.kdrl_beta_min > args.kdrl_beta:
        raise ValueError(
            f"kdrl_beta_min ({args.kdrl_beta_min}) must not exceed kdrl_beta ({args.kdrl_beta}): "
            "the weight anneals down to it"
        )


def validate_objective(args: Any) -> None:
    """Refuse a configuration its ``policy_objective`` cannot train: on a row that trains another loss (a target
    source's) it has no effect; one that reads the teacher's token log-probs needs a teacher; one with the dual clip
    (the paper's) needs ``delta`` above ``1 + epsilon_high``; one with a term of its own, what that term refuses."""
    objective, trains = policy_objectives()[args.policy_objective], args.row.objective
    if args.policy_objective != PAPER_POLICY_OBJECTIVE and trains.objective is None:
        raise ValueError(
            f"policy_objective={args.policy_objective!r} has no effect on this row: it trains the {trains.name!r} "
            f"loss, not a policy objective; leave it {PAPER_POLICY_OBJECTIVE!r}"
        )
    if objective.needs_teacher_logps and not ((args.teacher_base_url and args.teacher_model) or args.distill_teacher):
        raise ValueError(
            f"policy_objective={args.policy_objective!r} reads the teacher's log-prob of every sampled token: set "
            "teacher_base_url and teacher_model (its vLLM server's prompt_logprobs), or distill_teacher to load "
            "it next to the student"
        )
    if objective.term is not None:
        validate_term(objective.term, args)
    if not objective.dual_clip:
        return  # CISPO and DISPO bound the importance weight themselves: delta plays no part in them
    if args.delta is None:
        raise ValueError("delta=None turns off the dual clip, which ZPPO's objective has; set delta (paper: 10.0)")
    if args.delta <= 1 + (args.epsilon_high if args.epsilon_high is not None else args.epsilon):
        raise ValueError(f"delta (dual-clip ratio, {args.delta}) must exceed 1 + epsilon_high to act as the dual clip")
