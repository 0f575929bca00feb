"""The distillation rows: Off-Distill and On-Distill, each with and without the buffer (the paper's
off-policy and on-policy distillation algorithms).

Both imitate the frozen teacher's per-token distributions under GKD's generalized Jensen-Shannon
divergence at beta = 0.5 (Agarwal et al. 2024): ``beta KL(p_T || m) + (1 - beta) KL(p_S || m)``
with the mixture ``m = beta p_T + (1 - beta) p_S``, symmetric at 0.5. They differ only in where the
imitated sequences come from:

- Off-Distill: the graded-correct ones of ``teacher_num_generations`` fresh teacher rollouts on
  every question of the step (sampled by the teacher server, as ZPPO samples them); a question
  without one contributes no target.
- On-Distill: the student's own ``num_generations`` rollouts on every question, re-scored by the
  teacher.

The teacher's distributions come from its vLLM server, as the paper serves the teacher (separate GPUs):
the top ``distill_top_k`` log-probs at every completion position (:meth:`TeacherClient.sequence_logprobs_async`),
over which the JSD is taken with one more bucket holding the rest of the vocabulary's mass (:func:`top_k_support`).
Merging the tail into one bucket can only lower the divergence, and it is exact when the two distributions
agree outside the top k. A teacher loaded next to the student (``distill_teacher``) gives the full
distributions instead. Either way the JSD is computed a chunk of completion tokens at a time from the last
hidden states (:func:`chunked_jsd`): the LM head's ``[tokens, vocab]`` logits exist for one chunk only and
are recomputed in the backward pass, so that memory does not grow with the completion length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from .augmentations.base import BuiltGroup, BuiltGroups, TargetSource
from .checks import check_integer, check_number
from .description import Description, served_teacher
from .losses import LossInputs, LossOutput, register_loss
from .needs import SCORES_TOP_K, Needs

__all__ = [
    "DISTILLATIONS",
    "DistillInputs",
    "Distillation",
    "DistillationSettings",
    "JSD_LOSS",
    "OffDistill",
    "OnDistill",
    "TeacherTopK",
    "chosen_token_logps",
    "check_distillation",
    "chunked_jsd",
    "completion_states",
    "frozen_distill_teacher",
    "generalized_jsd_per_token",
    "jsd_loss",
    "load_distill_teacher",
    "top_k_support",
]


@dataclass(kw_only=True)  # after GRPOConfig's positional output_dir in ZPPOConfig
class DistillationSettings:
    """The distillation rows' fields of :class:`zppo_trl.ZPPOConfig` (the paper's Off-Distill and On-Distill
    algorithms); ``distill_teacher``, ``distill_top_k``, ``distill_chunk_size`` and ``distill_beta`` are also read by
    the other rows the teacher scores."""

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


def check_distillation(args: Any) -> None:
    """The ``distillation`` mode and the teacher-scoring fields (read by the distillation rows and by the other rows
    the teacher scores), whatever the row; raises ValueError naming the field."""
    if isinstance(args.distillation, bool):
        raise ValueError(
            'distillation must be "on" or "off" as a string: YAML reads a bare on/off as a boolean; quote it'
        )
    if args.distillation is not None and args.distillation not in DISTILLATIONS:
        raise ValueError(f"distillation must be one of {list(DISTILLATIONS)} or null, got {args.distillation!r}")
    check_integer("distill_top_k", args.distill_top_k, 1)
    check_integer("distill_chunk_size", args.distill_chunk_size, 1)
    check_number("distill_beta", args.distill_beta, high=1.0)


# The multimodal inputs a TRL batch may carry that a forward pass takes as they are.
_FORWARD_FIELDS = (
    "pixel_values",
    "image_grid_thw",
    "pixel_attention_mask",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
)
# A log-prob standing for zero mass: finite, so that 0 * log 0 terms stay 0 in the forward and backward pass.
_LOG_ZERO = -1e4


@dataclass
class TeacherTopK:
    """The teacher server's top-k at every completion position of a micro-batch: ``ids`` and ``logps``,
    each (B, C, k) in rank order (positions outside the loss mask hold zeros)."""

    ids: torch.Tensor
    logps: torch.Tensor


@dataclass
class DistillInputs:
    """What the JSD needs of one micro-batch: the student's ``states`` at the completion positions and the
    ``head`` that turns them into next-token logits over the first ``vocab`` entries, and the teacher's signal:
    its server ``topk``, or (a local teacher) its own ``teacher_states`` and ``teacher_head``."""

    states: torch.Tensor
    head: Callable[[torch.Tensor], torch.Tensor]
    vocab: int
    topk: TeacherTopK | None = None
    teacher_states: torch.Tensor | None = None
    teacher_head: Callable[[torch.Tensor], torch.Tensor] | None = None


def generalized_jsd_per_token(student_logps: torch.Tensor, teacher_logps: torch.Tensor, beta: float) -> torch.Tensor:
    """GKD's generalized JSD of each position's two distributions (log-probs over the last dimension):
    ``beta KL(T || M) + (1 - beta) KL(S || M)``, ``M = beta T + (1 - beta) S``; as GKD, beta = 0 is
    ``KL(T || S)`` and beta = 1 is ``KL(S || T)``."""
    s, t = student_logps.clamp(min=_LOG_ZERO), teacher_logps.clamp(min=_LOG_ZERO)

    def kl(p, q):  # KL(p || q) from log-probs
        return (p.exp() * (p - q)).sum(-1)

    if beta == 0:
        return kl(t, s)
    if beta == 1:
        return kl(s, t)
    mixture = torch.logsumexp(torch.stack([s + math.log(1 - beta), t + math.log(beta)]), dim=0)
    return beta * kl(t, mixture) + (1 - beta) * kl(s, mixture)


def _with_tail(logps: torch.Tensor) -> torch.Tensor:
    """``logps`` of k tokens plus a last bucket with the rest of the mass, ``log(1 - sum p)``."""
    covered = torch.logsumexp(logps, dim=-1, keepdim=True).clamp(max=-1e-7)  # the top k never hold all the mass
    return torch.cat([logps, torch.log(-torch.expm1(covered))], dim=-1)


def top_k_support(
    student_logps: torch.Tensor, topk_ids: torch.Tensor, topk_logps: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The student's and the teacher's distributions on the teacher's top k tokens plus one tail bucket:
    ``(student, teacher)`` log-probs, each (..., k + 1). ``student_logps`` is the full (..., V) log-softmax."""
    return _with_tail(student_logps.gather(-1, topk_ids)), _with_tail(topk_logps)


def chunked_jsd(inputs: DistillInputs, mask: torch.Tensor, beta: float, chunk_size: int) -> torch.Tensor:
    """The sum over the loss positions (``mask`` (B, C)) of the per-token generalized JSD, computed
    ``chunk_size`` positions at a time, each chunk under activation checkpointing: the chunk's logits
    (student, and a local teacher's) are made from the states, used and dropped, and made again in the
    backward pass, so their memory is one chunk's whatever the completion length."""
    where = mask.bool()
    states = inputs.states[where]
    extras = (
        (inputs.topk.ids[where], _at_least_fp32(inputs.topk.logps[where]))
        if inputs.topk is not None
        else (inputs.teacher_states[where],)
    )

    def chunk_loss(chunk_states: torch.Tensor, *teacher: torch.Tensor) -> torch.Tensor:
        student = torch.log_softmax(_at_least_fp32(inputs.head(chunk_states)[..., : inputs.vocab]), dim=-1)
        if inputs.topk is not None:
            student, teacher_logps = top_k_support(student, *teacher)
        else:
            with torch.no_grad():
                logits = _at_least_fp32(inputs.teacher_head(teacher[0])[..., : inputs.vocab])
                teacher_logps = torch.log_softmax(logits, dim=-1)
        return generalized_jsd_per_token(student, teacher_logps, beta).sum()

    # zero, but through the head and the states: a rank whose micro-batch has no loss position (padding rows)
    # still backpropagates through every parameter, as data-parallel training needs of each rank
    total = _at_least_fp32(inputs.head(inputs.states[:, :1]).sum()) * 0
    for start in range(0, states.size(0), chunk_size):
        pieces = [x[start : start + chunk_size] for x in (states, *extras)]
        total = total + checkpoint(chunk_loss, *pieces, use_reentrant=False)
    return total


@torch.no_grad()
def chosen_token_logps(
    states: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], vocab: int, ids: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """The log-prob of each token of ``ids`` (B, C) under the logits ``head`` makes of ``states`` (B, C, H), over
    the first ``vocab`` entries, ``chunk_size`` positions at a time (only one chunk's logits exist at once);
    float32, no gradient. The hybrid RL rows' signal from a teacher loaded next to the student."""
    flat_states, flat_ids = states.reshape(-1, states.size(-1)), ids.reshape(-1)
    out = torch.empty(flat_ids.shape, dtype=torch.float32, device=flat_ids.device)
    for start in range(0, flat_ids.numel(), chunk_size):
        end = start + chunk_size
        logps = torch.log_softmax(_at_least_fp32(head(flat_states[start:end])[..., :vocab]), dim=-1)
        out[start:end] = logps.gather(-1, flat_ids[start:end, None]).squeeze(-1)
    return out.view(ids.shape)


@torch.no_grad()
def top_k_logps(
    states: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], vocab: int, k: int, chunk_size: int
) -> TeacherTopK:
    """The top ``k`` next-token log-probs (and their ids) at each position of ``states`` (B, C, H), over the first
    ``vocab`` entries, ``chunk_size`` positions at a time; float32, no gradient, in rank order. A local teacher's
    signal kept for later micro-batches in the form a teacher server sends (OPSD's frozen self-teacher)."""
    flat = states.reshape(-1, states.size(-1))
    ids = torch.empty(flat.size(0), k, dtype=torch.long, device=flat.device)
    logps = torch.empty(flat.size(0), k, dtype=torch.float32, device=flat.device)
    for start in range(0, flat.size(0), chunk_size):
        end = start + chunk_size
        chunk = torch.log_softmax(_at_least_fp32(head(flat[start:end])[..., :vocab]), dim=-1).topk(k, dim=-1)
        logps[start:end], ids[start:end] = chunk.values.float(), chunk.indices
    shape = (*states.shape[:-1], k)
    return TeacherTopK(ids.view(shape), logps.view(shape))


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or as it is when wider: log-softmax and divergences are never taken in bf16."""
    return x if x.dtype == torch.float64 else x.float()


def completion_states(model: Any, inputs: dict, vocab: int, fused: bool = True) -> tuple[torch.Tensor, Callable]:
    """``model``'s last hidden states at the positions that predict each completion token of a TRL batch
    (B, C, H), and its LM head (``hidden -> logits``): the logits themselves are left to :func:`chunked_jsd`.

    The head's weight must be whole on this rank to be applied outside the forward pass; where FSDP or
    ZeRO-3 shards it, or with ``fused=False`` (``ZPPOConfig.fused_lm_head``), the forward computes the
    completion positions' logits itself and those are returned with an identity head (their memory then
    grows with the completion length).
    """
    completion_width = inputs["completion_ids"].size(1)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    extra = {name: inputs[name] for name in _FORWARD_FIELDS if inputs.get(name) is not None}
    head = _local_head(model) if fused else None
    if head is None:
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            logits_to_keep=completion_width + 1,
            use_cache=False,
            **extra,
        ).logits
        return logits[:, :-1, :vocab], lambda states: states
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        logits_to_keep=1,
        output_hidden_states=True,
        use_cache=False,
        **extra,
    )
    hidden = out.hidden_states[-1]
    # The last hidden state must be the head's input (after the final norm): checked on the one position
    # whose logits the forward returned.
    if not torch.allclose(head(hidden[:, -1:]).float(), out.logits.float(), rtol=1e-3, atol=1e-3):
        raise RuntimeError(
            f"{type(model).__name__}'s last hidden state is not its LM head's input: the chunked JSD cannot be "
            "computed from it"
        )
    return hidden[:, -completion_width - 1 : -1], head


def _local_head(model: Any) -> Callable | None:
    """The output embedding of ``model`` (unwrapped from DDP), or None where its weight is sharded."""
    module = getattr(model, "module", model)
    head = module.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if weight is None or weight.numel() == 0 or type(weight).__name__ == "DTensor" or hasattr(weight, "ds_id"):
        return None
    return head


def load_distill_teacher(name_or_path: str, student: Any) -> Any:
    """The teacher for its logits, loaded like the student (a VLM when its config has a vision tower,
    else a causal LM) in the student's dtype, frozen, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(name_or_path)
    cls = AutoModelForImageTextToText if getattr(config, "vision_config", None) is not None else AutoModelForCausalLM
    teacher = cls.from_pretrained(name_or_path, dtype=student.dtype)
    teacher.requires_grad_(False)
    return teacher.eval()


def frozen_distill_teacher(model: Any, name_or_path: str, student: Any, tokenizer: Any) -> Any:
    """The distillation rows' teacher: ``model`` frozen, or ``name_or_path`` loaded like the student; checked
    to share the student's tokenizer (the rows compare next-token distributions token by token)."""
    if model is None:
        from transformers import AutoTokenizer

        if AutoTokenizer.from_pretrained(name_or_path).get_vocab() != tokenizer.get_vocab():
            raise ValueError(
                f"distill_teacher {name_or_path} has another tokenizer than the student: the distillation rows "
                "compare next-token distributions token by token, so teacher and student must share one"
            )
    teacher = load_distill_teacher(name_or_path, student) if model is None else model.eval().requires_grad_(False)
    vocab = teacher.get_output_embeddings().weight.size(0)
    if vocab < len(tokenizer):
        raise ValueError(
            f"distill_teacher's vocabulary ({vocab}) is smaller than the student's tokenizer ({len(tokenizer)}): "
            "the distillation rows need a teacher that shares the student's tokenizer"
        )
    return teacher


# The distillation rows' loss (registered here; Distillation.loss names it).
JSD_LOSS = "jsd"


@register_loss(JSD_LOSS, computes="distributions")
def jsd_loss(inputs: LossInputs, args: Any) -> LossOutput:
    """GKD's generalized JSD to the teacher at every completion token, a chunk of tokens at a time
    (:func:`chunked_jsd`), over ``normalizer``."""
    total = chunked_jsd(inputs.distill, inputs.mask, args.distill_beta, args.distill_chunk_size)
    count = inputs.mask.sum().to(total.dtype)
    return LossOutput(total / inputs.normalizer, means={"distill/jsd": (total.detach(), count)})


# ---------------------------------------------------------------------- the rows' step-5 part


class Distillation(TargetSource):
    """Off-/On-Distill as a row's step-5 part: the sequences the student imitates the teacher on, trained with the
    generalized JSD (the ``jsd`` loss), each in its question's partition, scored by the teacher."""

    mode = ""
    loss = JSD_LOSS
    reads = {"distill_beta": ("off", "on"), "distill_chunk_size": ("off", "on")}
    imitates = ""  # what the student imitates the teacher on: the model card's and the dry run's words

    @classmethod
    def describe(cls, args: Any) -> Description:
        """What the student imitates, with which divergence; the card's Teacher line: where the targets come from
        (the teacher's server, or a teacher loaded next to the student), and the rollouts it samples."""
        targets = "its per-token distributions are the targets"
        if args.row.loads_teacher:
            where = f"`{args.distill_teacher}`, frozen, loaded next to the student: {targets}"
        else:
            where = f"{served_teacher(args)}: {targets} (its top-k log-probs)"
        sampled = (
            f"; rollouts sampled from `{args.teacher_model}` behind an OpenAI-compatible endpoint "
            f"(G_T = {args.teacher_num_generations})"
            if cls.needs.teacher_samples
            else ""
        )
        return Description(
            plan=(f"  distillation: on {cls.imitates} (GKD JSD, beta={args.distill_beta:g})",),
            card=f"The student imitates the teacher's per-token distributions on {cls.imitates} (GKD's generalized "
            f"JSD, beta = {args.distill_beta:g}).",
            teacher=f"{where}{sampled}.",
        )

    @classmethod
    def validate(cls, args: Any) -> None:
        """A row of its own, with its teacher: behind its server, or (On-Distill) loaded next to the student."""
        if args.augmentations:
            raise ValueError(
                f"distillation={args.distillation!r} is a row of its own: set augmentations: [] "
                f"(got {args.augmentations})"
            )
        if args.teacher_base_url and args.teacher_model:
            return
        if not args.distill_teacher:
            raise ValueError(
                "distillation needs the teacher: set teacher_base_url and teacher_model (its vLLM server gives "
                "the per-token log-probs, and Off-Distill's rollouts), or distill_teacher to load it locally"
            )
        if cls.needs.teacher_samples:
            raise ValueError(
                f"distillation={args.distillation!r} samples the teacher's rollouts from its server: set "
                "teacher_base_url and teacher_model"
            )

    def evidence_keys(self, accuracy: Any, draw: Any, limit: int, threshold: float, rng: Any) -> list | None:
        return None

    def plan(self, evidence: Any, limit: int, rng: Any, metrics: dict) -> list:
        return []

    def build(self, instances: Any, teacher: Any, args: Any, metrics: dict, ready: Any = None) -> BuiltGroups:
        return BuiltGroups()

    def build_metrics(self, plan: Any, built: BuiltGroups, ranks: Any, metrics: Any) -> dict[str, float]:
        return {}  # no teacher call of its own, nothing planned that a build could drop

    def record(self, recorder: Any, plan: Any, built: BuiltGroups, plain: Any, second: Any) -> None:
        """Nothing beyond what :meth:`plan` counted."""


class OffDistill(Distillation):
    """Off-Distill: every graded-correct one of the teacher's G_T rollouts on every question of the step (step 4's
    evidence on all of them), teacher-forced; a question without one contributes no target
    (``distill_questions_with_target`` counts those with one). Each rank builds the targets of its share of the
    questions."""

    mode = "off"
    printed = "Off-Distill"
    imitates = "graded-correct teacher rollouts"
    # the teacher's top-k on every trained sequence (from its server, or from distill_teacher loaded next to the
    # student), and the teacher's G_T rollouts to imitate
    needs = Needs(teacher_samples=True, teacher_scores=frozenset({SCORES_TOP_K}))

    def evidence_keys(self, accuracy: Any, draw: Any, limit: int, threshold: float, rng: Any) -> list | None:
        return list(dict.fromkeys(draw.new_keys + draw.replay_keys))

    def plan(self, evidence: Any, limit: int, rng: Any, metrics: dict) -> list:
        """Every question with its graded-correct teacher rollouts (none for some), in step 1's order."""
        metrics["distill_questions_with_target"] = sum(1 for key in evidence.hard if evidence.teacher_correct.get(key))
        return [(key, tuple(evidence.teacher_correct.get(key, ()))) for key in evidence.hard]

    def build(self, instances: Any, teacher: Any, args: Any, metrics: dict, ready: Any = None) -> BuiltGroups:
        """One target per rollout of this rank's questions."""
        return BuiltGroups([BuiltGroup("off_distill", key, target=text) for key, texts in instances for text in texts])


class OnDistill(Distillation):
    """On-Distill: the student's own rollouts of the plain round, re-scored by the teacher."""

    mode = "on"
    printed = "On-Distill"
    imitates = "the student's own rollouts"
    needs = Needs(teacher_scores=frozenset({SCORES_TOP_K}))

    def second_round(self, rounds: Any, built: BuiltGroups, most_built: int, filler_row: Any, plain: Any) -> Any:
        return rounds.rollouts_as_targets(plain)


# The distillation rows, by their ``distillation`` value (the registry).
DISTILLATIONS: dict[str, type[Distillation]] = {cls.mode: cls for cls in (OffDistill, OnDistill)}
