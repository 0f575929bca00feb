"""`ZPPOConfig`: every ZPPO field, with the paper's defaults, validated on construction.

ZPPO reuses TRL's own fields where TRL has the concept (``num_generations`` is G_S,
``epsilon``/``epsilon_high`` the clip-higher pair, ``delta`` the dual-clip ratio,
``loss_type`` the token-level ``"dapo"`` aggregation, ``beta`` the KL weight) and only
changes their defaults to the paper's (its hyperparameter table). TRL's ``delta``
clamps the unclipped ratio at ``delta`` inside the min; for A < 0 that is exactly the
dual clip ``max(q, c_dual * A)`` of the paper's dual-clip equation, and for A >= 0 it never binds because
``1 + epsilon_high < delta``.

``policy_objective`` swaps Step 6's objective for one of the paper's appendix on alternative policy
objectives (GSPO, CISPO, DISPO; see :mod:`zppo_trl.losses`); it alone may move TRL's objective settings
off the paper's (``importance_sampling_level`` for GSPO, ``loss_type`` for CISPO).

The I optimizer partitions of one rollout step map onto TRL's batching as
``steps_per_generation = num_partitions * gradient_accumulation_steps``: one generation
feeds ``num_partitions`` optimizer updates.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from .advantages import NORMALIZATIONS
from .augmentations import candidate_content, check_kinds
from .consistency import CARE_BONUS, CARE_DECAY, CARE_EVERY, CARE_MARGIN
from .context import PAPER_MAX_PROMPT_LENGTH, ContextLengths, context_lengths
from .distill import DISTILLATION_MODES, DISTILLATION_NAMES
from .losses import CISPO_WEIGHT_BOUND, DispoBounds, policy_objectives
from .optim import ANYPRECISION_OPTIM, anyprecision_kwargs
from .perception import PERCEPTION_REWARD_WEIGHT
from .prompts import RL_CLOSER
from .reformulate import KINDS, augment_limit
from .replay import replay_count
from .row import Row, resolve_row
from .self_distillation import OPSD_BETA, OPSD_TOP_K, SDPO_IS_CLIP, SDPO_TEACHER_UPDATE_RATE, SELF_TEACHERS
from .structure_reward import GSRM_MAX_TOKENS, RLKD_REWARD_WEIGHT
from .zero_variance import ZERO_VARIANCE_SIGNALS

__all__ = [
    "MATCHED_REPLAY_FRACTION",
    "OBJECTIVE_SETTINGS",
    "PAPER_GROUP_SIZE",
    "PAPER_OBJECTIVE",
    "PAPER_REPLAY_FRACTION",
    "StepComposition",
    "ZPPOConfig",
]

# TRL settings that would change the paper's objective, with the value it needs and why.
# The objective (the paper's per-token PPO ratio and dual-clip equations, "What on-policy means"): a per-token PPO
# ratio against the policy that sampled the group is the only ratio; DAPO's token-level
# aggregation; no KL; ZPPO's two-step advantages; one pass over each rollout step.
PAPER_OBJECTIVE: dict[str, tuple[object, str]] = {
    "loss_type": ("dapo", "the loss is aggregated over tokens (DAPO)"),
    "importance_sampling_level": ("token", "the paper's PPO ratio is per token"),
    "vllm_importance_sampling_correction": (
        False,
        "the PPO ratio against the sampling policy is the only ratio; TRL's vLLM/trainer ratio would reweight and "
        "mask sequences",
    ),
    "mask_truncated_completions": (False, "every sampled response enters the loss"),
    "top_entropy_quantile": (1.0, "every response token enters the loss"),
    "off_policy_mask_threshold": (None, "no sequence is masked for being off-policy"),
    "scale_rewards": (
        "none",
        "ZPPO's two-step advantages (the paper's two advantage equations) replace TRL's reward scaling",
    ),
    "num_iterations": (1, "one pass over each rollout step, in num_partitions updates"),
    "beta": (0.0, "the objective has no KL penalty"),
    "entropy_coef": (0.0, "the objective has no entropy bonus"),
    "use_adaptive_entropy": (False, "the objective has no entropy bonus"),
}

# What each Step-6 objective (policy_objective) sets among PAPER_OBJECTIVE's TRL settings; the rest
# stay the paper's ("every other setting follows" its hyperparameter table). Every objective's loss is
# registered in zppo_trl.losses (GSPO and CISPO with TRL's arithmetic for these settings, so TRL's
# attributes state what trains); an objective not listed here changes no TRL setting.
OBJECTIVE_SETTINGS: dict[str, dict[str, object]] = {
    "grpo": {},
    "gspo": {"importance_sampling_level": "sequence"},
    "cispo": {"loss_type": "cispo"},
    "dispo": {},
    "kdrl": {},
    "rlad": {},
    "sdpo": {},
    "opsd": {},
}


def _check_number(name: str, value, high: float | None = None) -> None:
    """Refuse a field that is not a finite number >= 0 (and <= ``high``), naming it."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0.0 <= value < float("inf")
        or (high is not None and value > high)
    ):
        where = f"in [0.0, {high}]" if high is not None else ">= 0.0"
        raise ValueError(f"{name} must be a finite number {where}, got {value!r}")


def _kinds(value) -> list[str]:
    """A kind list as the command line or a YAML gives it ("bcq,ncq", ["bcq", "ncq"], or [""] for none):
    flattened, stripped, empties dropped."""
    parts = [value] if isinstance(value, str) else list(value or [])
    return [k.strip() for part in parts for k in str(part).split(",") if k.strip()]


# GSPO as its paper trains it, or with the ZPPO table's clip range and aggregation (see gspo_settings).
GSPO_SETTINGS = ("gspo_paper", "zppo_table")
DISPO_OUT_OF_BOUNDS = ("zero", "clamp")
DISPO_FIELDS = ("dispo_epsilon_low_pos", "dispo_epsilon_high_pos", "dispo_epsilon_low_neg", "dispo_epsilon_high_neg")
# The reward terms (reward_term) and how the paper's table prints each row.
REWARD_TERMS = {"none": None, "grpo_care": "GRPO-CARE", "perception_r1": "Perception-R1", "rlkd": "RLKD"}
# How the paper's mistakes table prints the supervised controls (the dagger marks the replay buffer).
_SUPERVISED_NAMES = {"correction": "Correction-SFT", "reflection": "Error-reflection-SFT"}
# The paper's defaults that the appendix's controls vary, and that a row's name states when it differs from them:
# G_S and the corpus passes (the group-size and corpus-pass controls), rho_replay (the replay control).
PAPER_GROUP_SIZE = 8
PAPER_REPLAY_FRACTION = 0.25
# "Replay-matched": GRPO†'s replay raised until its per-step cap (|X_new| new + rho_replay |X_new| replayed groups)
# equals the headline ZPPO's (|X_new| new + 0.25 |X_new| replayed + at most rho_aug = 0.25 |X_new| reformulated).
MATCHED_REPLAY_FRACTION = PAPER_REPLAY_FRACTION + 0.25


@dataclass(frozen=True)
class StepComposition:
    """What one rollout step of a :class:`ZPPOConfig` holds on ``world_size`` ranks.

    ``str()`` gives the one-line summary the recipe's dry run prints, e.g. "per rollout
    step: 384 new + <=96 replayed + <=96 reformulated prompts x 8 rollouts; 4 optimizer
    updates of 96 new prompts; teacher G_T=4".
    """

    world_size: int
    new_prompts: int  # |X_new| per rollout step, over all ranks
    max_replayed: int  # floor(rho_replay * |X_new|), reached once the buffer is that full
    max_reformulated: int  # floor(rho_aug * |X_new|) augmented instances (BCQ + NCQ for ZPPO; 0 without augmentations)
    rollouts: int  # G_S
    updates: int  # I
    new_prompts_per_update: float
    teacher_rollouts: int  # G_T (0 where step 2 samples no teacher rollouts)
    rows_per_micro_batch: int  # per rank, for the new prompts; replayed and reformulated groups add to it
    micro_batches_per_update: int
    rollout_steps: int | None  # from max_steps; None when training by epochs
    uses_teacher: bool = False  # a teacher takes part (sampled, asked, or scoring), with or without rollouts

    @property
    def max_prompts(self) -> int:
        return self.new_prompts + self.max_replayed + self.max_reformulated

    def __str__(self) -> str:
        per_update = f"{self.new_prompts_per_update:g}"
        if self.teacher_rollouts:
            teacher = f"teacher G_T={self.teacher_rollouts}"
        else:
            teacher = "teacher (no G_T rollouts)" if self.uses_teacher else "no teacher"
        return (
            f"per rollout step: {self.new_prompts} new + <={self.max_replayed} replayed + <={self.max_reformulated} "
            f"reformulated prompts x {self.rollouts} rollouts; {self.updates} optimizer updates of {per_update} new "
            f"prompts; {teacher}"
        )


@dataclass
class ZPPOConfig(GRPOConfig):
    """Configuration for :class:`zppo_trl.ZPPOTrainer` (a `trl.GRPOConfig` with ZPPO's fields).

    Ablations are configurations: ``augmentations=[]`` is GRPO† (ZPPO's pipeline with the
    replay buffer, without BCQ/NCQ); adding ``replay_fraction=0`` is plain GRPO with the
    paper's recipe; ``augmentations=["bcq"]`` or ``["ncq"]`` keep one branch, and ``["hint"]``,
    ``["prefix"]``, ``["correction"]`` or ``["reflection"]`` is one of the paper's comparison rows.
    ``reformulations`` is the deprecated name of ``augmentations``.
    """

    # --- ZPPO (the "ZPPO-specific" rows of the paper's hyperparameter table)
    hard_threshold: float = field(
        default=0.5,
        metadata={
            "help": "tau: a question is hard when its plain-group accuracy is below this (admission, graduation, "
            "pre-cap)."
        },
    )
    replay_fraction: float = field(
        default=0.25,
        metadata={"help": "rho_replay: residents replayed per step, as a fraction of the new questions."},
    )
    replay_capacity: int = field(
        default=10_000,
        metadata={"help": "|B|_max: replay buffer capacity; the oldest residents are evicted FIFO above it."},
    )
    augment_fraction: float = field(
        default=0.25,
        metadata={
            "help": "rho_aug: cap on hard questions (pre-cap) and on BCQ+NCQ instances (post-cap), as a fraction of "
            "the new questions."
        },
    )
    # None until __post_init__, so that setting it and its deprecated alias differently is told apart
    # from leaving it at the default, ["bcq", "ncq"].
    augmentations: list[str] | None = field(
        default=None,
        metadata={
            "help": "Step 5's augmentations of hard questions (default: ['bcq', 'ncq'], ZPPO): a subset of ['bcq', "
            "'ncq']; [] turns them off (GRPO†); ['hint'] or ['prefix'] alone is the paper's Hint or Prefix control; "
            "['correction'] or ['reflection'] alone trains the supervised Correction-SFT or Error-reflection-SFT "
            "control instead of RL."
        },
    )
    reformulations: list[str] | None = field(
        default=None,
        metadata={
            "help": "Deprecated alias of augmentations (its name while it held only BCQ/NCQ): sets augmentations, "
            "with a FutureWarning. After construction it reads the same kinds as augmentations."
        },
    )
    prefix_fraction: float = field(
        default=0.4,
        metadata={
            "help": "alpha of the Prefix control: the first floor(alpha * L) tokens of a correct teacher rollout "
            "open the response."
        },
    )
    bcq_candidate_content: str = field(
        default="full",
        metadata={
            "help": "What each BCQ <candidate> block shows, both candidates transformed alike after compression: "
            "'full' (the paper's BCQ), 'boxed_masked' (every \\boxed{...} span becomes \\boxed{[MASKED]}) or "
            "'final_answer_only' (\\boxed{answer} alone): the paper's BCQ candidate-content controls. A pair with "
            "a candidate without a closed, non-empty box is dropped (zppo/bcq_content_unboxed). Only BCQ reads it."
        },
    )
    student_family: str | None = field(
        default=None,
        metadata={
            "help": "The student's backbone as the paper's backbone appendix names it (e.g. 'InternVL3.5-2B'), for "
            "a student outside Qwen3.5; appended to the row's name: 'ZPPO (InternVL3.5-2B)'. By default the recipe "
            "sets it from the student's id and the trainer from its config (zppo_trl.backbones); Qwen students "
            "have none. Names only: it changes no setting."
        },
    )
    num_partitions: int = field(
        default=4,
        metadata={
            "help": "I: optimizer mini-batch partitions per rollout step (groups kept intact; empty-signal "
            "partitions skipped)."
        },
    )
    advantage_normalization: str = field(
        default="without_zero",
        metadata={"help": "Step 2 of the two-step advantage: 'without_zero' (paper), 'with_zero' or 'none'."},
    )
    advantage_epsilon: float = field(
        default=1e-6,
        metadata={"help": "Stabiliser added to the partition's advantage standard deviation."},
    )
    max_prompt_length: int = field(
        default=PAPER_MAX_PROMPT_LENGTH,
        metadata={
            "help": "The paper's 'Max prompt length': tokens of a plain prompt (chat template, image tokens and "
            "closer included). It truncates nothing (ZPPO-77K is built under it); it sizes the servers' contexts "
            "(context_lengths(), printed by the dry run)."
        },
    )
    closer: str = field(
        default=RL_CLOSER,
        metadata={"help": "Appended last to every student prompt (plain, BCQ and NCQ); datasets hold raw questions."},
    )
    corpus_passes: int = field(
        default=1,
        metadata={
            "help": "How many times the schedule (max_steps) passes over the training corpus: the paper's "
            "group-size and corpus-pass control trains 1 or 2 (one pass: 200 rollout steps x 384 new prompts = "
            "76,800 draws of ZPPO-77K, max_steps 800). It does not set max_steps: a recipe sets both, the row's "
            "name states it when it is not 1, and the dry run checks it against a local dataset."
        },
    )

    # --- Step 6's policy objective (the paper's appendix and table of alternative policy objectives)
    policy_objective: str = field(
        default="grpo",
        metadata={
            "help": "Step 6's objective: 'grpo' (the paper's: DAPO token-level clipped surrogate with the dual "
            "clip), 'gspo' (one sequence-level ratio per rollout, see gspo_settings), 'cispo' (clipped stop-gradient "
            "importance weight, see cispo_weight_bound), 'dispo' (four-way clip, see dispo_*), or one of the "
            "teacher-side hybrid rows: 'kdrl' (GRPO plus an annealed reverse KL to the teacher, see kdrl_*) or "
            "'rlad' (the ratio taken against a mix of the old policy and the teacher, see rlad_*), or the "
            "self-teacher rows 'sdpo' (GRPO plus a distillation to an EMA copy of the student shown a correct sibling "
            "rollout, see sdpo_*) and 'opsd' (GRPO plus a JSD to the initial student shown the teacher's correct "
            "reply, see opsd_*), both weighted by self_distill_weight. Every other setting stays the paper's."
        },
    )
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

    # The self-teacher rows (zppo_trl.self_distillation): SDPO's and OPSD's official defaults.
    self_distill_weight: float = field(
        default=1.0,
        metadata={
            "help": "SDPO, OPSD: the weight of the self-distillation term added to GRPO's objective. Only "
            "policy_objective: sdpo|opsd reads it."
        },
    )
    sdpo_teacher_update_rate: float = field(
        default=SDPO_TEACHER_UPDATE_RATE,
        metadata={
            "help": "SDPO: the self-teacher (a copy of the initial student) moves this fraction of the way to the "
            "student after every optimizer step (its official 0.05; 0: the initial student, frozen). Only "
            "policy_objective: sdpo reads it."
        },
    )
    sdpo_is_clip: float = field(
        default=SDPO_IS_CLIP,
        metadata={
            "help": "SDPO: the cap on the stop-gradient importance ratio pi / pi_old weighting the term (its "
            "official 2). Only policy_objective: sdpo reads it."
        },
    )
    opsd_beta: float = field(
        default=OPSD_BETA,
        metadata={
            "help": "OPSD: beta of GKD's generalized JSD between the self-teacher and the student (0.5, OPSD's first "
            "version; 0 is KL(teacher || student), its later forward KL). Only policy_objective: opsd reads it."
        },
    )
    opsd_top_k: int = field(
        default=OPSD_TOP_K,
        metadata={
            "help": "OPSD: the self-teacher's top-k tokens per position kept for the divergence (plus one bucket for "
            "the rest of the vocabulary). Only policy_objective: opsd reads it."
        },
    )

    # --- the zero-variance rows (the paper's appendix on the zero-variance line; zppo_trl.zero_variance)
    zero_variance_signal: str = field(
        default="none",
        metadata={
            "help": "A signal for the all-wrong groups, which the two-step advantage leaves at zero: 'none' (the "
            "paper's ZPPO and GRPO), 'rl_zvp' (RL-ZVP: -alpha (max entropy - token entropy) per token), 'lens' "
            "(LENS: a penalty that grows with the sampling policy's length-normalised likelihood of each wrong "
            "answer, de-meaned in its group; needs num_partitions >= 2), or a teacher target on those questions: "
            "'relift' (ReLIFT: cross-entropy on one graded-correct teacher rollout per all-wrong question) or "
            "'rstg' (RSTG: the distillation rows' JSD to the teacher server's top-k on the all-wrong rollouts "
            "only). The group is then not skipped as empty-signal. See docs/comparison_rows.md."
        },
    )
    zero_variance_alpha: float | None = field(
        default=None,
        metadata={
            "help": "The signal's coefficient alpha; None: its paper's (RL-ZVP 0.1, LENS 0.25; the weight of "
            "ReLIFT's and RSTG's term 1.0). Only zero_variance_signal reads it."
        },
    )

    # --- the multimodal-reward rows (the paper's appendix on alternative multimodal RL rewards)
    reward_term: str = field(
        default="none",
        metadata={
            "help": "A named term added to the correctness reward before the advantages: 'none' (the paper's) or "
            "'grpo_care' (GRPO-CARE: a consistency bonus for correct rollouts whose answer an EMA copy of the student "
            "finds at least as likely, given their reasoning, as their group's correct peers do; see care_*), or "
            "'perception_r1' (Perception-R1: perception_reward_weight times the fraction of a question's "
            "visual_annotations the judge finds stated in the rollout), or 'rlkd' (RLKD: rlkd_reward_weight times "
            "how many of the teacher's reasoning steps the rollout's reasoning follows, as the judge decomposes and "
            "compares them). On GRPO†'s pipeline (augmentations: []). See docs/comparison_rows.md."
        },
    )
    care_bonus_coefficient: float = field(
        default=CARE_BONUS,
        metadata={"help": "GRPO-CARE: the bonus is this times the correctness reward. Only reward_term reads it."},
    )
    care_ema_decay: float = field(
        default=CARE_DECAY,
        metadata={"help": "GRPO-CARE: the reference's EMA decay. Only reward_term: grpo_care reads it."},
    )
    care_ema_every: int = field(
        default=CARE_EVERY,
        metadata={"help": "GRPO-CARE: optimizer steps between EMA updates. Only reward_term: grpo_care reads it."},
    )
    care_margin: float = field(
        default=CARE_MARGIN,
        metadata={
            "help": "GRPO-CARE: how far below its group's mean likelihood a correct rollout may be and still get the "
            "bonus (its code: 0, or 0.01 for transfer to general video benchmarks). Only reward_term reads it."
        },
    )

    perception_reward_weight: float = field(
        default=PERCEPTION_REWARD_WEIGHT,
        metadata={
            "help": "Perception-R1: the weight of its perception reward beside the correctness reward (its released "
            "script: 0.7). Only reward_term: perception_r1 reads it."
        },
    )

    # --- the distillation rows (the paper's Off-Distill and On-Distill algorithms; zppo_trl.distill)
    distillation: str | None = field(
        default=None,
        metadata={
            "help": "'off' (Off-Distill: imitate the graded-correct teacher rollouts of every question) or 'on' "
            "(On-Distill: the teacher re-scores the student's own rollouts), trained with GKD's generalized JSD "
            "instead of RL; with augmentations: []. replay_fraction > 0 is the dagger row."
        },
    )
    distill_teacher: str | None = field(
        default=None,
        metadata={
            "help": "Optional: a teacher checkpoint loaded next to the student for its full per-token "
            "distributions (same tokenizer as the student). Default: the teacher server's top-k log-probs."
        },
    )
    distill_top_k: int = field(
        default=20,
        metadata={
            "help": "Tokens per position the teacher server returns (vLLM prompt_logprobs); the JSD is taken over "
            "them plus one bucket for the rest of the vocabulary. At most the server's --max-logprobs "
            "(vLLM's default: 20)."
        },
    )
    distill_chunk_size: int = field(
        default=1024,
        metadata={
            "help": "Completion tokens per chunk of the JSD: the LM head's logits exist for one chunk at a time "
            "(recomputed in the backward pass), so its memory does not grow with the completion length."
        },
    )
    distill_beta: float = field(
        default=0.5,
        metadata={"help": "beta of GKD's generalized JSD (paper: 0.5, symmetric)."},
    )

    # --- the frozen teacher (an OpenAI-compatible server; vLLM in production)
    teacher_base_url: str | None = field(
        default=None,
        metadata={"help": "Base URL of the teacher's OpenAI-compatible API, e.g. http://teacher-node:8000/v1."},
    )
    teacher_model: str | None = field(
        default=None,
        metadata={"help": "Model name the teacher server serves, e.g. Qwen/Qwen3.5-27B-FP8."},
    )
    teacher_api_key_env: str = field(
        default="TEACHER_API_KEY",
        metadata={
            "help": "Environment variable holding the teacher's API key (the key itself never enters the config)."
        },
    )
    teacher_num_generations: int = field(
        default=4,
        metadata={"help": "G_T: teacher rollouts per question, drawn for every question of the step."},
    )
    teacher_max_tokens: int = field(
        default=12_288,
        metadata={"help": "Max tokens of one teacher rollout."},
    )
    teacher_temperature: float = field(default=1.0, metadata={"help": "Teacher sampling temperature."})
    teacher_top_p: float = field(default=1.0, metadata={"help": "Teacher nucleus sampling top-p."})
    teacher_max_concurrency: int = field(default=32, metadata={"help": "Concurrent requests to the teacher server."})
    teacher_timeout: float = field(default=600.0, metadata={"help": "Per-request timeout (seconds) for the teacher."})
    teacher_extra_body: dict | str | None = field(
        default=None,
        metadata={
            "help": "Extra request fields passed to the teacher server, e.g. "
            "{'chat_template_kwargs': {'enable_thinking': true}}."
        },
    )
    compress_candidates: bool = field(
        default=True,
        metadata={
            "help": "Paper: on. The teacher rewrites every BCQ/NCQ candidate under the paper's compression prompt "
            "before it enters a prompt. Off puts the raw rollouts in the blocks: only for a teacher too small to "
            "compress faithfully (the CPU demo's 135M teacher drops the boxed answer and mostly the answer itself)."
        },
    )
    audit_traces: bool = field(
        default=False,
        metadata={
            "help": "Store what the paper's trace-overlap audit reads (`zppo-eval audit-traces`) in "
            "<output_dir>/audit_traces.jsonl: per question of the 0% admission bin, the first teacher candidate a "
            "BCQ prompt showed for it (the fixed reference) and the plain rollouts of the group it graduated with."
        },
    )
    compression_max_tokens: int = field(
        default=512,
        metadata={"help": "Token cap of each compressed BCQ/NCQ candidate."},
    )
    compression_extra_body: dict | str | None = field(
        default=None,
        metadata={
            "help": "Extra request fields for compression only (merged over teacher_extra_body, top-level keys "
            "replaced); with Qwen3.5 on vLLM use {'chat_template_kwargs': {'enable_thinking': false}} so the "
            "512-token cap is spent on the summary. A reply with nothing left after its thinking is a failed "
            "compression."
        },
    )
    judge_base_url: str | None = field(
        default=None,
        metadata={"help": "Judge server for free-form answers the grader scores 0 (default: the teacher's server)."},
    )
    judge_model: str | None = field(default=None, metadata={"help": "Judge model name (default: the teacher model)."})
    judge_extra_body: dict | str | None = field(
        default=None,
        metadata={
            "help": "Extra request fields for the judge; with Qwen3.5 on vLLM use "
            "{'chat_template_kwargs': {'enable_thinking': false}} so the 512-token verdict is not spent thinking."
        },
    )

    # --- memory (the paper's "Fused LM-head kernel" row; zppo_trl.lm_head)
    fused_lm_head: bool = field(
        default=True,
        metadata={
            "help": "Per-token log-probs and entropies from the last hidden states in tiles (TRL's fused LM head), "
            "never the whole [tokens, vocab] logits, as the paper trains. False: the full logits, then a "
            "log-softmax (the reference path; its memory grows with tokens x vocabulary)."
        },
    )

    # --- "Padding-free training" (zppo_trl.packing)
    padding_free: bool = field(
        default=False,
        metadata={
            "help": "Run each micro-batch's forward passes (old log-probs and loss) without padding: its sequences "
            "flattened into one continuous row, position ids restarting per sequence, so pad tokens cost no "
            "compute or memory (as TRL's SFTConfig.padding_free). Applied where it was checked exact: Llama and "
            "Qwen3 with sdpa or eager attention. Other models and multimodal batches run padded, warned once "
            "per reason and counted in zppo/padded_micro_batches_total (Qwen3.5's linear-attention layers mix "
            "packed sequences in transformers' PyTorch path). Paper: on."
        },
    )

    # --- the rollout step's schedule
    defer_old_logps: bool = field(
        default=True,
        metadata={
            "help": "Compute the sampling policy's per-token log-probs (the PPO ratio's denominator) once the "
            "rollout step's micro-batches exist, and only for those that read them: not for the step's first "
            "partition that updates, which runs on the weights that sampled it (its ratio is exactly 1; a "
            "skipped partition changes no weight), nor for skipped partitions. False scores every rollout at "
            "generation, as TRL does: the same trained numbers up to float rounding (tests/test_trainer.py "
            "compares the two), one more forward pass over every rollout of the step."
        },
    )
    prefetch_teacher_samples: bool = field(
        default=True,
        metadata={
            "help": "Ask the teacher for the next rollout step's new questions (the dataloader's next batch, read "
            "ahead) as soon as this step's micro-batches are built, so that it samples them while this step's "
            "optimizer updates run; the next step then asks only for its replayed questions. The teacher is "
            "frozen: the same trained numbers as false, which asks for every question when its step starts "
            "(tests/test_trainer_zppo.py compares the two)."
        },
    )

    # --- the console
    full_console_logs: bool = field(
        default=False,
        metadata={
            "help": "Also print TRL's whole metrics dict at every logging step. By default the console shows the "
            "progress bar and one line per rollout step; TensorBoard, W&B and metrics.jsonl get every metric either "
            "way."
        },
    )

    # --- TRL fields whose defaults the paper changes
    num_generations: int | None = field(default=8, metadata={"help": "G_S: student rollouts per prompt group."})
    epsilon_high: float | None = field(default=0.28, metadata={"help": "Clip-higher upper epsilon (DAPO)."})
    delta: float | None = field(default=10.0, metadata={"help": "Dual-clip ratio c_dual for negative advantages."})
    scale_rewards: str = field(
        default="none",
        metadata={"help": "TRL's group scaling is unused: ZPPO's two-step advantages replace it."},
    )
    vllm_max_model_length: int | None = field(
        default=None,
        metadata={
            "help": "The student's vLLM context. Default: context_lengths().student (plain prompt + the longest "
            "BCQ/NCQ block + max_completion_length). In server mode, the --max-model-len the student server was "
            "started with (recipes/launch sizes it the same way): a prompt that leaves less than "
            "max_completion_length is warned about."
        },
    )
    vllm_importance_sampling_correction: bool = field(
        default=False,
        metadata={
            "help": "Off (TRL defaults it on): the PPO ratio against the sampling policy is the paper's only ratio."
        },
    )
    vllm_weight_transfer: str | None = field(
        default=None,
        metadata={
            "help": "How the student's vLLM server (vllm_mode: server) receives the weights after each update: "
            "'nccl' (TRL's NCCL engine; CUDA) or 'shm' (a safetensors file in vllm_weight_transfer_dir that the "
            "server reloads through its /collective_rpc; no CUDA, trainer and server on one host; "
            "zppo_trl.student_server). Default: nccl where CUDA is available, shm elsewhere."
        },
    )
    vllm_weight_transfer_dir: str = field(
        default="/dev/shm",
        metadata={"help": "With vllm_weight_transfer 'shm': where the weights file is written (memory-backed)."},
    )
    lr_scheduler_type: str = field(
        default="constant", metadata={"help": "Paper: constant learning rate, no warmup, no decay."}
    )
    weight_decay: float = field(default=0.1, metadata={"help": "Paper: decoupled weight decay 0.1."})

    _VALID_DICT_FIELDS = GRPOConfig._VALID_DICT_FIELDS + [
        "teacher_extra_body",
        "compression_extra_body",
        "judge_extra_body",
    ]

    def __post_init__(self):
        self._validate_zppo()
        self._warn_unused_settings()
        if self.steps_per_generation is None and self.generation_batch_size is None:
            self.steps_per_generation = self.num_partitions * self.gradient_accumulation_steps
        super().__post_init__()
        self._validate_objective()
        # after the check: the user may not set them
        for name, value in OBJECTIVE_SETTINGS.get(self.policy_objective, {}).items():
            setattr(self, name, value)
        expected = self.num_partitions * self.gradient_accumulation_steps
        if self.steps_per_generation != expected:
            raise ValueError(
                f"num_partitions ({self.num_partitions}) x gradient_accumulation_steps "
                f"({self.gradient_accumulation_steps}) must equal steps_per_generation ({self.steps_per_generation}): "
                "each rollout step feeds num_partitions optimizer updates; leave steps_per_generation and "
                "generation_batch_size unset to derive them"
            )
        if self.save_strategy == "steps" and self.save_steps >= 1 and int(self.save_steps) % self.num_partitions:
            warnings.warn(
                f"save_steps ({self.save_steps}) is not a multiple of num_partitions ({self.num_partitions}): a run "
                "resumed from such a checkpoint regenerates that rollout step and trains only its remaining "
                "partitions",
                stacklevel=2,
            )
        self.judge_base_url = self.judge_base_url or self.teacher_base_url
        self.judge_model = self.judge_model or self.teacher_model
        self._resolve_weight_transfer()
        if self.use_vllm:
            needed = self.context_lengths().student
            if self.vllm_max_model_length is None:
                self.vllm_max_model_length = needed
            elif self.vllm_max_model_length < needed:
                warnings.warn(
                    f"vllm_max_model_length ({self.vllm_max_model_length}) is below what a BCQ/NCQ rollout can need "
                    f"({self.context_lengths()}): long reformulated prompts will leave less than "
                    "max_completion_length to generate (each such step is warned about and counted in "
                    "zppo/prompts_over_context)",
                    stacklevel=2,
                )

    def _resolve_weight_transfer(self) -> None:
        """vllm_weight_transfer's default (NCCL on CUDA, shared memory elsewhere) and its checks."""
        if self.vllm_weight_transfer not in (None, "nccl", "shm"):
            raise ValueError(f"vllm_weight_transfer must be 'nccl' or 'shm', got {self.vllm_weight_transfer!r}")
        if not (self.use_vllm and self.vllm_mode == "server"):
            if self.vllm_weight_transfer == "shm":
                raise ValueError("vllm_weight_transfer 'shm' needs use_vllm: true and vllm_mode: server")
            return
        if self.vllm_weight_transfer is None:
            self.vllm_weight_transfer = "nccl" if torch.cuda.is_available() else "shm"

    def _validate_zppo(self) -> None:
        for name in ("hard_threshold", "replay_fraction", "augment_fraction"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        self._resolve_augmentations()
        check_kinds(self.augmentations)
        if not isinstance(self.prefix_fraction, (int, float)) or not 0.0 < self.prefix_fraction < 1.0:
            raise ValueError(f"prefix_fraction must be a number in (0, 1), got {self.prefix_fraction!r}")
        if self.advantage_normalization not in NORMALIZATIONS:
            raise ValueError(
                f"advantage_normalization must be one of {list(NORMALIZATIONS)}, got {self.advantage_normalization!r}"
            )
        candidate_content(self.bcq_candidate_content)  # an unknown content fails here, naming the field
        passes = self.corpus_passes
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"corpus_passes must be an integer >= 1, got {passes!r}")
        if passes > 1 and (not self.max_steps or self.max_steps <= 0 or self.max_steps % passes):
            raise ValueError(
                f"corpus_passes={passes} needs a schedule in steps that splits into {passes} equal passes: set "
                f"max_steps to {passes} x one pass's optimizer updates (the paper's pass: 800), got "
                f"max_steps={self.max_steps!r}"
            )
        for name in (
            "compress_candidates",
            "padding_free",
            "audit_traces",
            "defer_old_logps",
            "prefetch_teacher_samples",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in (
            "replay_capacity",
            "num_partitions",
            "teacher_num_generations",
            "teacher_max_tokens",
            "compression_max_tokens",
            "teacher_max_concurrency",
            "max_prompt_length",
        ):
            value = getattr(self, name)
            minimum = 0 if name == "replay_capacity" else 1
            if not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if self.optim == ANYPRECISION_OPTIM:
            anyprecision_kwargs(self.optim_args)  # a bad optim_args fails here, before any training
        self._validate_distillation()
        self._validate_zero_variance()
        self._validate_reward_term()
        if self.augmentations and not (self.teacher_base_url and self.teacher_model):
            raise ValueError(
                f"augmentations {self.augmentations} need a teacher: set teacher_base_url and teacher_model "
                "(or augmentations: [] for GRPO\u2020)"
            )
        if self.policy_objective not in policy_objectives():
            raise ValueError(
                f"policy_objective must be one of {list(policy_objectives())}, got {self.policy_objective!r}"
            )
        if self.policy_objective != "grpo" and set(self.augmentations) & set(_SUPERVISED_NAMES):
            raise ValueError(
                f"policy_objective={self.policy_objective!r} has no effect on the supervised "
                f"{self.augmentations[0]!r} row (it trains cross-entropy); leave it 'grpo'"
            )
        if self.gspo_settings not in GSPO_SETTINGS:
            raise ValueError(f"gspo_settings must be one of {list(GSPO_SETTINGS)}, got {self.gspo_settings!r}")
        if self.dispo_out_of_bounds not in DISPO_OUT_OF_BOUNDS:
            raise ValueError(
                f"dispo_out_of_bounds must be one of {list(DISPO_OUT_OF_BOUNDS)}, got {self.dispo_out_of_bounds!r}"
            )
        bound = self.cispo_weight_bound
        if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 1.0 <= bound < float("inf"):
            raise ValueError(f"cispo_weight_bound must be a finite number >= 1, got {bound!r}")
        for name in DISPO_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < float("inf"):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        self._validate_teacher_objective()
        if not policy_objectives()[self.policy_objective].dual_clip:
            return  # CISPO and DISPO bound the importance weight themselves: delta plays no part in them
        if self.delta is None:
            raise ValueError("delta=None turns off the dual clip, which ZPPO's objective has; set delta (paper: 10.0)")
        if self.delta <= 1 + (self.epsilon_high if self.epsilon_high is not None else self.epsilon):
            raise ValueError(
                f"delta (dual-clip ratio, {self.delta}) must exceed 1 + epsilon_high to act as the dual clip"
            )

    def _validate_teacher_objective(self) -> None:
        """KDRL's and RLAD's settings, and the teacher whose token log-probs they read."""
        for name in ("kdrl_beta", "kdrl_beta_decay", "kdrl_beta_min", "rlad_teacher_log_ratio_bound"):
            _check_number(name, getattr(self, name))
        _check_number("rlad_alpha", self.rlad_alpha, high=1.0)
        if self.kdrl_beta_min > self.kdrl_beta:
            raise ValueError(
                f"kdrl_beta_min ({self.kdrl_beta_min}) must not exceed kdrl_beta ({self.kdrl_beta}): "
                "the weight anneals down to it"
            )
        self._validate_self_teacher()
        if not policy_objectives()[self.policy_objective].needs_teacher_logps:
            return
        if not (self.teacher_base_url and self.teacher_model) and not self.distill_teacher:
            raise ValueError(
                f"policy_objective={self.policy_objective!r} reads the teacher's log-prob of every sampled token: set "
                "teacher_base_url and teacher_model (its vLLM server's prompt_logprobs), or distill_teacher to load "
                "it next to the student"
            )

    def _validate_self_teacher(self) -> None:
        """SDPO's and OPSD's settings; each row is GRPO† with its term, on the plain rollouts."""
        _check_number("self_distill_weight", self.self_distill_weight)
        _check_number("sdpo_teacher_update_rate", self.sdpo_teacher_update_rate, high=1.0)
        _check_number("opsd_beta", self.opsd_beta, high=1.0)
        if isinstance(self.opsd_top_k, bool) or not isinstance(self.opsd_top_k, int) or self.opsd_top_k < 1:
            raise ValueError(f"opsd_top_k must be an integer >= 1, got {self.opsd_top_k!r}")
        if not (isinstance(self.sdpo_is_clip, (int, float)) and not isinstance(self.sdpo_is_clip, bool)) or not (
            0.0 < self.sdpo_is_clip < float("inf")
        ):
            raise ValueError(f"sdpo_is_clip must be a finite number > 0, got {self.sdpo_is_clip!r}")
        if not policy_objectives()[self.policy_objective].self_teacher:
            return
        if self.augmentations or self.distillation is not None:
            raise ValueError(
                f"policy_objective={self.policy_objective!r} is a row on GRPO\u2020's pipeline: its self-teacher "
                f"reads the plain rollouts; set augmentations: [] and no distillation (got augmentations="
                f"{self.augmentations}, distillation={self.distillation!r})"
            )
        if SELF_TEACHERS[self.policy_objective].samples_teacher and not (self.teacher_base_url and self.teacher_model):
            raise ValueError(
                f"policy_objective={self.policy_objective!r} shows the self-teacher the teacher's graded-correct "
                "reply: set teacher_base_url and teacher_model"
            )

    rlkd_reward_weight: float = field(
        default=RLKD_REWARD_WEIGHT,
        metadata={
            "help": "RLKD: the weight of its reasoning-structure reward beside the correctness reward (its code "
            "weighs them equally). Only reward_term: rlkd reads it."
        },
    )
    rlkd_gsrm_max_tokens: int = field(
        default=GSRM_MAX_TOKENS,
        metadata={
            "help": "RLKD: the cap on a decomposition the GSRM (the judge endpoint) writes (its code's 10,000); the "
            "judge server's --max-model-len must hold a whole rollout or teacher reply plus this. Only "
            "reward_term: rlkd reads it."
        },
    )

    def _validate_reward_term(self) -> None:
        """GRPO-CARE's, Perception-R1's and RLKD's settings; each row is GRPO† with its term (plain groups only)."""
        if self.reward_term not in REWARD_TERMS:
            raise ValueError(f"reward_term must be one of {list(REWARD_TERMS)}, got {self.reward_term!r}")
        for name in ("care_bonus_coefficient", "care_margin", "perception_reward_weight", "rlkd_reward_weight"):
            _check_number(name, getattr(self, name))
        _check_number("care_ema_decay", self.care_ema_decay, high=1.0)
        if (
            isinstance(self.care_ema_every, bool)
            or not isinstance(self.care_ema_every, int)
            or self.care_ema_every < 1
        ):
            raise ValueError(f"care_ema_every must be an integer >= 1, got {self.care_ema_every!r}")
        if (
            isinstance(self.rlkd_gsrm_max_tokens, bool)
            or not isinstance(self.rlkd_gsrm_max_tokens, int)
            or self.rlkd_gsrm_max_tokens < 1
        ):
            raise ValueError(f"rlkd_gsrm_max_tokens must be an integer >= 1, got {self.rlkd_gsrm_max_tokens!r}")
        if self.reward_term == "none":
            return
        if self.augmentations or self.distillation is not None:
            raise ValueError(
                f"reward_term={self.reward_term!r} is a row on GRPO\u2020's pipeline: set augmentations: [] and no "
                "distillation"
            )
        judge = (self.judge_base_url or self.teacher_base_url) and (self.judge_model or self.teacher_model)
        if self.reward_term == "perception_r1" and not judge:
            raise ValueError(
                "reward_term='perception_r1' asks a judge whether each rollout states the question's visual "
                "annotations: set judge_base_url and judge_model (or teacher_base_url and teacher_model)"
            )
        if self.reward_term == "rlkd" and not (self.teacher_base_url and self.teacher_model):
            raise ValueError(
                "reward_term='rlkd' compares each rollout's reasoning with the teacher's graded-correct reply: set "
                "teacher_base_url and teacher_model (the judge, judge_base_url and judge_model, defaults to it)"
            )

    def _validate_zero_variance(self) -> None:
        signal = self.zero_variance_signal
        if signal != "none" and signal not in ZERO_VARIANCE_SIGNALS:
            raise ValueError(f"zero_variance_signal must be one of {['none', *ZERO_VARIANCE_SIGNALS]}, got {signal!r}")
        alpha = self.zero_variance_alpha
        if alpha is not None and (
            isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < float("inf")
        ):
            raise ValueError(f"zero_variance_alpha must be a finite number > 0 or null, got {alpha!r}")
        if signal == "none":
            return
        if self.distillation is not None or set(self.augmentations) & set(_SUPERVISED_NAMES):
            raise ValueError(
                f"zero_variance_signal={signal!r} shapes RL advantages; this row trains "
                f"{'the JSD' if self.distillation else 'cross-entropy'}: leave it 'none'"
            )
        if signal == "rl_zvp" and self.policy_objective == "gspo":
            raise ValueError(
                "zero_variance_signal='rl_zvp' gives each token its own advantage; policy_objective='gspo' trains one "
                "ratio per response: use a token-level objective (grpo, cispo, dispo)"
            )
        if ZERO_VARIANCE_SIGNALS[signal].needs_teacher and not (self.teacher_base_url and self.teacher_model):
            raise ValueError(
                f"zero_variance_signal={signal!r} puts the teacher's targets in the loss: set teacher_base_url and "
                "teacher_model (its vLLM server samples ReLIFT's solutions and scores RSTG's top-k)"
            )
        if signal == "lens" and self.num_partitions < 2:
            raise ValueError(
                "zero_variance_signal='lens' reads the sampling policy's log-probs, which TRL computes only when a "
                f"rollout step feeds more than one update: set num_partitions >= 2 (got {self.num_partitions})"
            )

    def _resolve_augmentations(self) -> None:
        """Set ``augmentations`` from itself, its deprecated alias ``reformulations`` (with a FutureWarning) or
        the default ``["bcq", "ncq"]``, normalised; refuse the two set to different kinds. Afterwards
        ``reformulations`` reads the same kinds, for code and checks that still read the old name."""
        new = None if self.augmentations is None else _kinds(self.augmentations)
        old = None if self.reformulations is None else _kinds(self.reformulations)
        if old is not None and new is not None and old != new:
            raise ValueError(
                f"augmentations {new} and reformulations {old} disagree: reformulations is the deprecated name of "
                "augmentations; set only augmentations (in a YAML, on the command line or in Python)"
            )
        if old is not None:
            warnings.warn(
                "reformulations is deprecated and will be removed: it is now called augmentations (it holds hint, "
                f"prefix, correction and reflection too); set augmentations: {old}",
                FutureWarning,
                stacklevel=5,
            )
        self.augmentations = new if new is not None else old if old is not None else list(KINDS)
        self.reformulations = self.augmentations  # the same list object, edited in place together

    def to_dict(self) -> dict:
        """TrainingArguments' dict of the fields, without the deprecated alias ``reformulations``: saved and
        logged arguments (``training_args``, TensorBoard, W&B) name the kinds once, as ``augmentations``."""
        d = super().to_dict()
        d.pop("reformulations", None)
        return d

    def _warn_unused_settings(self) -> None:
        """Warn about a row-specific field set on a row that never reads it (a likely mistake, e.g.
        ``prefix_fraction`` without ``augmentations: [prefix]``), naming the field and what reads it."""
        rstg = self.zero_variance_signal == "rstg"
        teacher_logps = policy_objectives()[self.policy_objective].needs_teacher_logps
        readers = {
            "prefix_fraction": ("prefix" in self.augmentations, "augmentations: [prefix]"),
            "bcq_candidate_content": ("bcq" in self.augmentations, "augmentations with bcq"),
            "distill_teacher": (
                self.distillation is not None or rstg or teacher_logps,
                "distillation: off|on, zero_variance_signal: rstg or policy_objective: kdrl|rlad",
            ),
            "distill_beta": (
                self.distillation is not None or rstg,
                "distillation: off|on or zero_variance_signal: rstg",
            ),
            "distill_top_k": (
                (self.distillation is not None and not self.distill_teacher) or rstg,
                "distillation from the server",
            ),
            "distill_chunk_size": (
                self.distillation is not None
                or rstg
                or (teacher_logps and bool(self.distill_teacher))
                or self.policy_objective in SELF_TEACHERS,
                "distillation: off|on, zero_variance_signal: rstg, policy_objective: sdpo|opsd or policy_objective: "
                "kdrl|rlad with distill_teacher",
            ),
            **dict.fromkeys(DISPO_FIELDS, (self.policy_objective == "dispo", "policy_objective: dispo")),
            "gspo_settings": (self.policy_objective == "gspo", "policy_objective: gspo"),
            "cispo_weight_bound": (self.policy_objective == "cispo", "policy_objective: cispo"),
            "dispo_out_of_bounds": (self.policy_objective == "dispo", "policy_objective: dispo"),
            **dict.fromkeys(
                ("kdrl_beta", "kdrl_beta_decay", "kdrl_beta_min"),
                (self.policy_objective == "kdrl", "policy_objective: kdrl"),
            ),
            **dict.fromkeys(
                ("rlad_alpha", "rlad_teacher_log_ratio_bound"),
                (self.policy_objective == "rlad", "policy_objective: rlad"),
            ),
            **dict.fromkeys(
                ("sdpo_teacher_update_rate", "sdpo_is_clip"),
                (self.policy_objective == "sdpo", "policy_objective: sdpo"),
            ),
            **dict.fromkeys(("opsd_beta", "opsd_top_k"), (self.policy_objective == "opsd", "policy_objective: opsd")),
            "self_distill_weight": (self.policy_objective in SELF_TEACHERS, "policy_objective: sdpo|opsd"),
            "zero_variance_alpha": (self.zero_variance_signal != "none", "zero_variance_signal"),
            **dict.fromkeys(
                ("care_bonus_coefficient", "care_ema_decay", "care_ema_every", "care_margin"),
                (self.reward_term == "grpo_care", "reward_term: grpo_care"),
            ),
            "perception_reward_weight": (self.reward_term == "perception_r1", "reward_term: perception_r1"),
            **dict.fromkeys(
                ("rlkd_reward_weight", "rlkd_gsrm_max_tokens"), (self.reward_term == "rlkd", "reward_term: rlkd")
            ),
        }
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name, (used, reader) in readers.items():
            if not used and getattr(self, name) != defaults[name]:
                warnings.warn(
                    f"{name}={getattr(self, name)!r} has no effect on this row ({self.variant}): only {reader} reads "
                    "it",
                    stacklevel=3,
                )

    def _validate_distillation(self) -> None:
        if self.distillation is None:
            return
        if isinstance(self.distillation, bool):
            raise ValueError(
                'distillation must be "on" or "off" as a string: YAML reads a bare on/off as a boolean; quote it'
            )
        if self.distillation not in DISTILLATION_MODES:
            raise ValueError(
                f"distillation must be one of {list(DISTILLATION_MODES)} or null, got {self.distillation!r}"
            )
        if self.augmentations:
            raise ValueError(
                f"distillation={self.distillation!r} is a row of its own: set augmentations: [] (got "
                f"{self.augmentations})"
            )
        if self.policy_objective != "grpo":
            raise ValueError(
                f"policy_objective={self.policy_objective!r} has no effect on a distillation row (it trains the JSD); "
                "leave it 'grpo'"
            )
        if not (self.teacher_base_url and self.teacher_model):
            if not self.distill_teacher:
                raise ValueError(
                    "distillation needs the teacher: set teacher_base_url and teacher_model (its vLLM server gives "
                    "the per-token log-probs, and Off-Distill's rollouts), or distill_teacher to load it locally"
                )
            if self.distillation == "off":
                raise ValueError(
                    "distillation='off' samples the teacher's rollouts from its server: set teacher_base_url and "
                    "teacher_model"
                )
        for name in ("distill_top_k", "distill_chunk_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if (
            isinstance(self.distill_beta, bool)
            or not isinstance(self.distill_beta, (int, float))
            or not 0.0 <= self.distill_beta <= 1.0
        ):
            raise ValueError(f"distill_beta must be a number in [0, 1], got {self.distill_beta!r}")

    def _validate_objective(self) -> None:
        """Refuse TRL settings that would train a different objective than the paper's (after TRL's
        own normalisation of them, e.g. ``scale_rewards: false`` -> ``"none"``). The one exception is
        the value ``policy_objective`` itself sets (so a saved config of, say, CISPO loads again)."""
        own = OBJECTIVE_SETTINGS.get(self.policy_objective, {})
        for name, (required, why) in PAPER_OBJECTIVE.items():
            value = getattr(self, name)
            if value == required or (name in own and value == own[name]):
                continue
            hint = ""
            for objective, settings in OBJECTIVE_SETTINGS.items():
                if name in settings and settings[name] == value:  # e.g. loss_type="cispo": that objective sets it
                    hint = (
                        f" (to train with {policy_objectives()[objective].printed} as Step 6's objective, "
                        f"set policy_objective={objective!r})"
                    )
            raise ValueError(f"{name}={value!r} changes ZPPO's objective: {why}. Set {name}={required!r}{hint}")

    @property
    def variant(self) -> str:
        """The paper's name for this configuration (ZPPO, GRPO, GRPO†, GRPO†+BCQ, GRPO†+NCQ, GRPO+Both,
        GRPO†+Hint, GRPO†+Prefix, Correction-SFT†, Error-reflection-SFT†, Off-Distill†, On-Distill†; a † row
        without the replay buffer drops the dagger, and ZPPO without it is GRPO+Both).

        With another Step-6 objective, the names of the paper's table of alternative objectives: ``ZPPO (GSPO)``
        for the full method, ``GSPO†`` for the replay pipeline without augmentations; any other ablation is
        ``<variant> (<OBJECTIVE>)``, e.g. ``GRPO†+BCQ (DISPO)``.

        The appendix's controls add what they vary, only where it is not the paper's default, so the names
        above stay as they are: ``Replay-matched GRPO†`` (GRPO† at rho_replay 0.50, its per-step cap that of
        the headline ZPPO) and ``(ρ_replay=0.75)`` for another fraction of GRPO† or ZPPO (e.g.
        ``ZPPO (ρ_replay=0.50)``); the BCQ candidate content (``GRPO†+BCQ (boxed-answer-masked)``); and G_S
        with the corpus passes when G_S is above 8 or the passes not 1 (``GRPO† (G_S=16, 2 passes)``).
        Qualifiers share one pair of brackets: ``ZPPO (GSPO, G_S=16, 1 pass)``. A student outside Qwen3.5
        adds its backbone (``student_family``) last: ``ZPPO (InternVL3.5-2B)``, ``GRPO† (Ovis2.5-2B)``.

        A zero-variance signal (the paper's zero-variance table) names GRPO† after its method, ``RL-ZVP†`` and
        ``LENS†`` (``RL-ZVP`` without the buffer); on any other row it is a qualifier, ``ZPPO (LENS)``.
        """
        name, qualifiers = self._row_name()
        if self._replay_matched:
            name = f"Replay-matched {name}"
        qualifiers += self._control_qualifiers()
        if not qualifiers:
            return name
        if name.endswith(")"):  # one pair of brackets: "ZPPO (GSPO, G_S=16, 1 pass)"
            return f"{name[:-1]}, {', '.join(qualifiers)})"
        return f"{name} ({', '.join(qualifiers)})"

    @property
    def row(self) -> Row:
        """This configuration's row: its parts and the union of their needs (:func:`zppo_trl.row.resolve_row`),
        resolved from the current fields."""
        return resolve_row(self)

    def _row_name(self) -> tuple[str, list[str]]:
        """The row's name from its augmentations, buffer, distillation, objective and zero-variance signal, and
        the qualifier the signal adds where it does not rename the row."""
        kinds = set(self.augmentations)
        replay = self.replay_fraction > 0
        if self.distillation is not None:
            name = DISTILLATION_NAMES[self.distillation] + ("\u2020" if replay else "")
        elif kinds == set(KINDS):
            name = "ZPPO" if replay else "GRPO+Both"
        elif not kinds:
            name = "GRPO\u2020" if replay else "GRPO"
        else:
            kind = next(iter(kinds))
            if kind in _SUPERVISED_NAMES:  # a supervised row of its own, not GRPO plus a branch
                name = _SUPERVISED_NAMES[kind] + ("\u2020" if replay else "")
            else:
                kind = kind.upper() if kind in KINDS else kind.capitalize()
                name = f"GRPO\u2020+{kind}" if replay else f"GRPO+{kind}"
        if self.policy_objective != "grpo":
            objective = policy_objectives()[self.policy_objective].printed
            name = {"GRPO\u2020": f"{objective}\u2020", "GRPO": objective}.get(name, f"{name} ({objective})")
        reward_term = REWARD_TERMS[self.reward_term]
        if reward_term is not None:  # "GRPO-CARE†": GRPO† with the term, named after its method
            name = {"GRPO\u2020": f"{reward_term}\u2020", "GRPO": reward_term}.get(name, f"{name} ({reward_term})")
        zero_variance = ZERO_VARIANCE_SIGNALS.get(self.zero_variance_signal)
        if zero_variance is None:
            return name, []
        # the zero-variance rows: "RL-ZVP†" for GRPO† with the named term, a qualifier elsewhere
        renamed = {"GRPO\u2020": f"{zero_variance.printed}\u2020", "GRPO": zero_variance.printed}.get(name)
        return (renamed, []) if renamed else (name, [zero_variance.printed])

    @property
    def _replay_matched(self) -> bool:
        """GRPO† with its replay raised until its per-step cap is the headline ZPPO's (the replay control)."""
        plain = (
            not self.augmentations
            and self.distillation is None
            and self.zero_variance_signal == "none"
            and self.reward_term == "none"
        )
        return plain and math.isclose(self.replay_fraction, MATCHED_REPLAY_FRACTION)

    def _control_qualifiers(self) -> list[str]:
        """What the appendix's controls vary, where it is not the paper's default: the replay fraction (GRPO†
        and ZPPO), the BCQ candidate content, G_S with the corpus passes, and a backbone outside Qwen3.5."""
        kinds = set(self.augmentations)
        qualifiers = []
        replay_row = self.replay_fraction > 0 and self.distillation is None and kinds in (set(), set(KINDS))
        if replay_row and not self._replay_matched and not math.isclose(self.replay_fraction, PAPER_REPLAY_FRACTION):
            qualifiers.append(f"\u03c1_replay={self.replay_fraction:.2f}")
        printed = candidate_content(self.bcq_candidate_content).printed
        if printed and "bcq" in kinds:
            qualifiers.append(printed)
        if self.num_generations > PAPER_GROUP_SIZE or self.corpus_passes != 1:
            passes = self.corpus_passes
            qualifiers.append(f"G_S={self.num_generations}, {passes} pass{'' if passes == 1 else 'es'}")
        if self.student_family:
            qualifiers.append(self.student_family)
        return qualifiers

    @property
    def dispo_bounds(self) -> DispoBounds:
        """DISPO's four clip epsilons (see :func:`zppo_trl.losses.dispo_per_token_loss`)."""
        return DispoBounds(
            self.dispo_epsilon_low_pos,
            self.dispo_epsilon_high_pos,
            self.dispo_epsilon_low_neg,
            self.dispo_epsilon_high_neg,
        )

    def composition(self, world_size: int) -> StepComposition:
        """The rollout step this configuration makes on ``world_size`` ranks (see :class:`StepComposition`)."""
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
        G = self.num_generations
        rows = self.per_device_train_batch_size * self.steps_per_generation * world_size
        if (self.per_device_train_batch_size * self.steps_per_generation) % G:
            raise ValueError(
                f"per_device_train_batch_size x steps_per_generation ({self.per_device_train_batch_size} x "
                f"{self.steps_per_generation}) must be a multiple of num_generations ({G}) so that every rank holds "
                "whole groups"
            )
        new = rows // G
        row = self.row
        return StepComposition(
            world_size=world_size,
            new_prompts=new,
            max_replayed=replay_count(new, self.replay_fraction, new),
            max_reformulated=augment_limit(new, self.augment_fraction) if self.augmentations else 0,
            rollouts=G,
            updates=self.num_partitions,
            new_prompts_per_update=new / self.num_partitions,
            teacher_rollouts=self.teacher_num_generations if row.needs.teacher_samples else 0,
            rows_per_micro_batch=self.per_device_train_batch_size,
            micro_batches_per_update=self.gradient_accumulation_steps,
            rollout_steps=self.max_steps // self.num_partitions if self.max_steps and self.max_steps > 0 else None,
            uses_teacher=row.uses_teacher,
        )

    def context_lengths(self) -> ContextLengths:
        """The servers' context sizing for this configuration (see :mod:`zppo_trl.context`)."""
        return context_lengths(
            max_prompt_length=self.max_prompt_length,
            max_completion_length=self.max_completion_length,
            num_generations=self.num_generations,
            augmentations=self.augmentations,
            compression_max_tokens=self.compression_max_tokens,
            compress_candidates=self.compress_candidates,
            teacher_max_tokens=self.teacher_max_tokens,
        )

    def teacher_api_key(self) -> str | None:
        """The teacher's API key, read from ``teacher_api_key_env`` at call time."""
        return os.environ.get(self.teacher_api_key_env)
