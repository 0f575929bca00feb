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

import os
import warnings
from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

from .advantages import NORMALIZATIONS
from .augmentations import parse_kinds
from .checks import check_integer, check_number
from .composition import StepComposition, step_composition
from .context import PAPER_MAX_PROMPT_LENGTH, ContextLengths, context_lengths
from .distill import DistillationSettings
from .losses import PAPER_POLICY_OBJECTIVE
from .objective_settings import ObjectiveSettings
from .objectives import OBJECTIVE_TERM_SETTINGS, policy_objectives
from .optim import ANYPRECISION_OPTIM, anyprecision_kwargs
from .parts import check_parts, unused_settings
from .prompts import RL_CLOSER
from .reformulate import KINDS
from .row import (
    MATCHED_REPLAY_FRACTION,
    PAPER_GROUP_SIZE,
    PAPER_REPLAY_FRACTION,
    Row,
    resolve_row,
    row_name,
)
from .terms import SETTINGS as TERM_SETTINGS

__all__ = [
    "MATCHED_REPLAY_FRACTION",
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
    "multi_objective_aggregation": ("sum_then_normalize", "the advantages read the weighted sum of the rewards"),
}


# ZPPO's own switches and counts, checked on construction (a bool is no count here).
_FLAGS = (
    "compress_candidates",
    "padding_free",
    "shared_prompt_forward",
    "audit_traces",
    "log_groups",
    "defer_old_logps",
    "overlap_old_logps",
    "prefetch_teacher_samples",
    "pipeline_second_round",
)
_COUNTS = (
    "replay_capacity",
    "num_partitions",
    "teacher_num_generations",
    "teacher_max_tokens",
    "compression_max_tokens",
    "teacher_max_concurrency",
    "max_prompt_length",
)


@dataclass
class ZPPOConfig(GRPOConfig, ObjectiveSettings, *OBJECTIVE_TERM_SETTINGS, DistillationSettings, *TERM_SETTINGS):
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
    closer: str | None = field(
        default=RL_CLOSER,
        metadata={"help": "Appended last to every student prompt (plain, BCQ, NCQ): your text, or null for none."},
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
        default=PAPER_POLICY_OBJECTIVE,
        metadata={
            "help": "Step 6's objective: 'grpo' (the paper's: DAPO token-level clipped surrogate with the dual "
            "clip), 'gspo' (one sequence-level ratio per rollout, see gspo_settings), 'cispo' (clipped stop-gradient "
            "importance weight, see cispo_weight_bound), 'dispo' (four-way clip, see dispo_*), or one of the "
            "teacher-side hybrid rows: 'kdrl' (GRPO plus an annealed reverse KL to the teacher, see kdrl_*) or "
            "'rlad' (the ratio taken against a mix of the old policy and the teacher, see rlad_*), or the "
            "self-teacher rows of zppo_trl.terms (docs/comparison_rows.md). Every other setting stays the paper's."
        },
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
    log_groups: bool = field(
        default=False,
        metadata={
            "help": "Write every group each rollout step scored to <output_dir>/groups.jsonl: its kind (new, replay, "
            "bcq, ncq, ...), question id and rollout rewards, one line per step (zppo_trl.group_log), for analyses "
            "per question (e.g. the student's accuracy inside BCQ prompts against its plain accuracy on them)."
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

    # --- "Padding-free training" (zppo_trl.packing). TRL 1.16's GRPOConfig has no padding_free; the field TRL is
    # adding (trl#7087) will mean the same switch. When it comes, this declaration overrides it in place: one field,
    # read only by ZPPO's log-prob hook, which replaces TRL's (tests/test_trl_coupling.py stops a TRL that has the
    # field until its other readers are checked).
    padding_free: bool = field(
        default=False,
        metadata={
            "help": "Run each micro-batch's forward passes (old log-probs and loss) without padding: its sequences "
            "flattened into one continuous row, position ids restarting per sequence, so pad tokens cost no "
            "compute or memory (as TRL's SFTConfig.padding_free). Applied where it was checked exact: Llama, "
            "Qwen3 and the hybrid Qwen3.5 (text and VLM, images included), Qwen3.5-MoE and Qwen3-Next, whose "
            "Gated DeltaNet layers run once per packed sequence, with sdpa or eager attention. Other models and "
            "batches run padded, warned once per reason and counted in zppo/padded_micro_batches_total. "
            "Paper: on."
        },
    )
    # Not in the paper (an exact optimization of the same computation, not a setting of the method) nor in TRL.
    shared_prompt_forward: bool = field(
        default=False,
        metadata={
            "help": "Run each micro-batch's forward passes (old log-probs and loss) with each distinct prompt once: "
            "the rollouts of one prompt laid out after it in one row, under a mask that lets each completion see "
            "its prompt and itself (zppo_trl.shared_prompts). Exact; a group of G rollouts costs P + G(C + 1) "
            "tokens instead of G(P + C). Applied to Llama and Qwen3 under sdpa, text only; other models and "
            "batches run as without it, warned once per reason and counted in "
            "zppo/unshared_micro_batches_total. Takes precedence over padding_free where it applies."
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
    overlap_old_logps: bool = field(
        default=True,
        metadata={
            "help": "With defer_old_logps and the student's rollouts on a vLLM server (vllm_mode: server), compute "
            "the plain rollouts' old log-probs on a second thread while the teacher's samples are collected, the "
            "candidates compressed and the BCQ/NCQ round generated (the trainer's device is idle then); only the "
            "second round's rollouts are scored after it. Every rollout is scored alone either way, so the "
            "trained numbers do not depend on this setting (tests/test_student_server.py). Not with ZeRO-3 or "
            "FSDP (their forward passes gather parameters over ranks), nor in rows without a second round or "
            "with a named term."
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

    pipeline_second_round: bool = field(
        default=True,
        metadata={
            "help": "With the student's rollouts on a vLLM server (vllm_mode: server), send each BCQ/NCQ prompt to "
            "it as soon as its own candidates are compressed, so that the round generates while the other "
            "compressions are still out (every rank sends its own prompts). Only when each prompt reaches the server "
            "changes: the prompts, groups, order, caps and sampling are the same as false, which sends the round as "
            "one request once every compression is back (tests/test_student_server.py compares the two). Not in "
            "colocate mode or with rollouts generated in the trainer, where the round is one generation call."
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

    # --- stopping when the cluster asks (zppo_trl.preemption)
    preemption_grace_seconds: float = field(
        default=600.0,
        metadata={
            "help": "Seconds between a stop signal (SIGTERM, or SIGUSR1 from Slurm's --signal) and the kill that the "
            "run plans for: on a signal the rollout step in progress finishes, its checkpoint is written and the run "
            "exits with 75 to be requeued. The launch scripts ask Slurm for the signal this long before the time "
            "limit; the trainer warns once a rollout step plus a checkpoint takes longer."
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
        # what the objective sets itself among PAPER_OBJECTIVE's TRL settings (zppo_trl.losses.Loss.trl_settings)
        for name, value in policy_objectives()[self.policy_objective].trl_settings.items():
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
        """ZPPO's own fields, then every part's settings and the selected parts' combinations (:mod:`zppo_trl.parts`);
        each error names the field."""
        for name in ("hard_threshold", "replay_fraction", "augment_fraction"):
            check_number(name, getattr(self, name), high=1.0)
        check_number("preemption_grace_seconds", self.preemption_grace_seconds)
        self._resolve_augmentations()
        if self.advantage_normalization not in NORMALIZATIONS:
            raise ValueError(
                f"advantage_normalization must be one of {list(NORMALIZATIONS)}, got {self.advantage_normalization!r}"
            )
        passes = self.corpus_passes
        check_integer("corpus_passes", passes, 1)
        if passes > 1 and (not self.max_steps or self.max_steps <= 0 or self.max_steps % passes):
            raise ValueError(
                f"corpus_passes={passes} needs a schedule in steps that splits into {passes} equal passes: set "
                f"max_steps to {passes} x one pass's optimizer updates (the paper's pass: 800), got "
                f"max_steps={self.max_steps!r}"
            )
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in _COUNTS:
            check_integer(name, getattr(self, name), 0 if name == "replay_capacity" else 1)  # True is no integer here
        temperature = self.teacher_temperature
        check_number("teacher_temperature", temperature)
        if temperature == 0 and self.teacher_num_generations > 1:
            # greedy decoding gives one reply G_T times (and vLLM refuses n > 1 at temperature 0)
            raise ValueError(
                f"teacher_temperature=0 decodes greedily: its teacher_num_generations={self.teacher_num_generations} "
                "rollouts per question would be one reply repeated; set teacher_num_generations: 1 or a "
                "teacher_temperature > 0 (the paper's: 1.0)"
            )
        if self.optim == ANYPRECISION_OPTIM:
            anyprecision_kwargs(self.optim_args)  # a bad optim_args fails here, before any training
        check_parts(self)

    def _resolve_augmentations(self) -> None:
        """Set ``augmentations`` from itself, its deprecated alias ``reformulations`` (with a FutureWarning) or
        the default ``["bcq", "ncq"]``, normalised; refuse the two set to different kinds. Afterwards
        ``reformulations`` reads the same kinds, for code and checks that still read the old name."""
        new = None if self.augmentations is None else parse_kinds(self.augmentations)
        old = None if self.reformulations is None else parse_kinds(self.reformulations)
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
        ``prefix_fraction`` without ``augmentations: [prefix]``), naming the field and what reads it
        (:func:`zppo_trl.parts.unused_settings`)."""
        for name, reader in unused_settings(self):
            warnings.warn(
                f"{name}={getattr(self, name)!r} has no effect on this row ({self.variant}): only {reader} reads it",
                stacklevel=3,
            )

    def _validate_objective(self) -> None:
        """Refuse TRL settings that would train a different objective than the paper's (after TRL's
        own normalisation of them, e.g. ``scale_rewards: false`` -> ``"none"``). The one exception is
        the value ``policy_objective`` itself sets (so a saved config of, say, CISPO loads again)."""
        objectives = policy_objectives()
        own = objectives[self.policy_objective].trl_settings
        for name, (required, why) in PAPER_OBJECTIVE.items():
            value = getattr(self, name)
            if value == required or (name in own and value == own[name]):
                continue
            hint = ""
            for objective, loss in objectives.items():
                if name in loss.trl_settings and loss.trl_settings[name] == value:  # loss_type="cispo": CISPO's
                    hint = f" (to train with {loss.printed} as Step 6's objective, set policy_objective={objective!r})"
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

        A named term (:mod:`zppo_trl.terms`) names GRPO† after its method; on any other row it is a suffix or, for
        a term that qualifies, a qualifier (``ZPPO (<term>)``).
        """
        return row_name(self)

    @property
    def row(self) -> Row:
        """This configuration's row: its parts and the union of their needs (:func:`zppo_trl.row.resolve_row`),
        resolved from the current fields."""
        return resolve_row(self)

    def composition(self, world_size: int) -> StepComposition:
        """The rollout step this configuration makes on ``world_size`` ranks (see :class:`StepComposition`)."""
        return step_composition(self, world_size)

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
