"""The zero-variance rows' named terms: a signal for the all-wrong groups that ZPPO's (Z0) leaves at zero.

The paper's appendix on the zero-variance line adds RL-ZVP and LENS to the GRPO† pipeline: "both replace that
zero advantage with an extra signal from the student's own rollouts, so the group is not skipped". An
all-wrong group (every rollout's reward at or below :data:`zppo_trl.rollout.CORRECT`) gets zero two-step
advantage (:mod:`zppo_trl.advantages`); under a signal its rows are marked, the partition holding it is no
longer an empty-signal partition, and the signal is added to their (zero) advantage. Mixed groups keep
their two-step advantages exactly; all-correct groups stay at zero (the ZPPO paper adapts both methods to
the all-wrong group only).

==========  ==================================================================================================
``rl_zvp``  Le et al. 2026, "No Prompt Left Behind: Exploiting Zero-Variance Prompts in LLM Reinforcement
            Learning via Entropy-Guided Advantage Shaping" (arXiv 2509.21880), eq. 5, negative branch: token t
            of response i gets ``-alpha (max_k H_ik - H_it)``, H the policy's detached token entropy and the
            max over the response's own loss tokens; alpha 0.1 (its best value, Table 3). Token-level, so it
            is applied at the loss, on the entropies of the same forward (:func:`token_advantages`).
``lens``    Feng et al. 2025, "Don't Waste Mistakes: Leveraging Negative RL-Groups via Confidence Reweighting"
            (arXiv 2510.08696), section 5: a wrong response's calibrated reward
            ``r~_i = -(1/G) pbar_i / (D - pbar_i)``, ``pbar_i = pi_old(o_i | q)^(1/|o_i|)`` (the sampling policy's
            length-normalised likelihood) and, for a negative group, ``D = 2 max_j pbar_j``; the group is
            de-meaned only (no std) and weighted by alpha 0.25 (its one hyperparameter):
            ``A_i = alpha (r~_i - mean_j r~_j)``. Response-level, so it is computed where groups are whole, in
            the partition (:func:`lens_advantages`).
``relift``  Ma et al. 2025, "Learning What Reinforcement Learning Can't: Interleaved Online Fine-Tuning for
            Hardest Questions" (arXiv 2506.07527): supervised fine-tuning on a teacher solution of every
            question the student got all wrong. Each all-wrong question gets one graded-correct teacher
            rollout (of the G_T the teacher server sampled for it), drawn uniformly, as a target row
            (:func:`relift_targets`); the row trains with cross-entropy in its question's partition, next to
            the RL rows, weighted by alpha 1.0 (:func:`teacher_target_term`).
``rstg``    Han et al. 2026 (the ZPPO paper's ``han2026distill``): selective on-policy distillation. The
            student's own rollouts of the all-wrong groups, and only those, are distilled towards the frozen
            teacher's per-token distributions (its server's top-k), under the distillation rows' generalized
            JSD (``distill_beta``), weighted by alpha 1.0 (:func:`teacher_target_term`).
==========  ==================================================================================================

The last two are the teacher-target rows ("ReLIFT and RSTG add teacher-authored targets on those questions"):
their all-wrong groups keep zero advantage (their RL term is zero) and the term is added to the loss.

This module is pure: torch only, no TRL, no trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..augmentations.base import BuiltGroup, BuiltGroups
from ..batches import MARKED_ROWS, TARGET_ROWS
from ..distill import DistillInputs, chunked_jsd
from ..needs import SCORES_TOP_K, Needs
from ..rollout import CORRECT, FILLER
from .base import Contribution, Description, PlainStep, Term, register_term

__all__ = [
    "MARK_FIELD",
    "TARGET_FIELD",
    "LENS",
    "RLZVP",
    "RSTG",
    "ReLIFT",
    "ZERO_VARIANCE_SIGNALS",
    "ZeroVarianceSettings",
    "ZeroVarianceSignal",
    "all_wrong_keys",
    "all_wrong_rows",
    "lens_advantages",
    "partition_signal",
    "relift_targets",
    "response_log_confidence",
    "rl_zvp_token_advantages",
    "signal_for",
    "teacher_target_term",
    "token_advantages",
]

# The micro-batch field that marks the rows of all-wrong groups (1.0) for a loss-time signal, and the one that marks
# ReLIFT's teacher-target rows (1.0): trained with cross-entropy, never with RL.
MARK_FIELD, TARGET_FIELD = MARKED_ROWS, TARGET_ROWS


@dataclass(frozen=True)
class ZeroVarianceSignal:
    """A registered named term: the ``zero_variance_signal`` value, how the paper's table prints the row
    (``<printed>†``), its paper's coefficient, and where it is computed: ``"loss"`` (per token, from the
    forward's entropies), ``"partition"`` (per response, from the sampling policy's log-probs, which the
    trainer gathers for it: ``needs_confidence``), ``"target"`` (teacher solutions as extra target rows:
    ``teacher_targets``) or ``"distill"`` (the teacher's distributions on the all-wrong rollouts: ``distills``)."""

    name: str
    printed: str
    default_alpha: float
    at: str

    @property
    def needs_confidence(self) -> bool:
        return self.at == "partition"

    @property
    def teacher_targets(self) -> bool:
        return self.at == "target"

    @property
    def distills(self) -> bool:
        return self.at == "distill"

    @property
    def needs_teacher(self) -> bool:
        """Whether the row asks the teacher server (a teacher-target row)."""
        return self.at in ("target", "distill")


ZERO_VARIANCE_SIGNALS: dict[str, ZeroVarianceSignal] = {
    "rl_zvp": ZeroVarianceSignal("rl_zvp", "RL-ZVP", 0.1, "loss"),
    "lens": ZeroVarianceSignal("lens", "LENS", 0.25, "partition"),
    "relift": ZeroVarianceSignal("relift", "ReLIFT", 1.0, "target"),
    "rstg": ZeroVarianceSignal("rstg", "RSTG", 1.0, "distill"),
}


def signal_for(args) -> ZeroVarianceSignal | None:
    """The configuration's signal (``args.zero_variance_signal``), or None for ``"none"``."""
    name = getattr(args, "zero_variance_signal", "none")
    if name == "none":
        return None
    if name not in ZERO_VARIANCE_SIGNALS:
        raise ValueError(f"zero_variance_signal must be one of {['none', *ZERO_VARIANCE_SIGNALS]}, got {name!r}")
    return ZERO_VARIANCE_SIGNALS[name]


def _alpha(args, signal: ZeroVarianceSignal) -> float:
    alpha = getattr(args, "zero_variance_alpha", None)
    return signal.default_alpha if alpha is None else float(alpha)


def all_wrong_rows(rewards: Sequence[float] | torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
    """(N,) bool: the rows whose group has every reward at or below :data:`CORRECT` (an all-wrong group)."""
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    wrong: dict[Hashable, bool] = {}
    for g, value in zip(group_ids, r.tolist()):
        wrong[g] = wrong.get(g, True) and value <= CORRECT
    return torch.tensor([wrong[g] for g in group_ids], dtype=torch.bool)


def lens_advantages(
    log_confidence: Sequence[float] | torch.Tensor,
    group_ids: Sequence[Hashable],
    marked: torch.Tensor,
    alpha: float,
) -> torch.Tensor:
    """LENS's advantage of every row of the ``marked`` (all-wrong) groups; 0 elsewhere.

    ``log_confidence`` is each row's mean token log-prob under the sampling policy, so ``pbar = exp`` of it is
    the length-normalised likelihood. Per marked group of size G: ``D = 2 max_j pbar_j``,
    ``r~_i = -(1/G) pbar_i / (D - pbar_i)`` (in [-1/G, 0): the most confident mistake gets -1/G), and
    ``A_i = alpha (r~_i - mean_j r~_j)``: the more confident a mistake, the lower its advantage.
    """
    c = torch.as_tensor(log_confidence, dtype=torch.float64).flatten()
    out = torch.zeros_like(c)
    rows: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        if marked[i]:
            rows.setdefault(g, []).append(i)
    for members in rows.values():
        index = torch.tensor(members)
        pbar = torch.exp(c[index])
        d = 2.0 * pbar.max()
        calibrated = -(pbar / (d - pbar)) / len(members)
        out[index] = alpha * (calibrated - calibrated.mean())
    return out


def partition_signal(
    args,
    rewards: Sequence[float],
    group_ids: Sequence[Hashable],
    log_confidence: Sequence[float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One partition's ``(marked rows, extra advantages)`` under the configuration's signal (both (N,); no
    signal: nothing marked, zeros). A partition with a marked row has a learning signal."""
    n = len(group_ids)
    signal = signal_for(args)
    if signal is None or signal.teacher_targets:  # ReLIFT's signal is its target rows, not the wrong rollouts
        return torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.float64)
    marked = all_wrong_rows(rewards, group_ids)
    if not signal.needs_confidence:
        return marked, torch.zeros(n, dtype=torch.float64)
    if log_confidence is None:
        raise ValueError(f"zero_variance_signal={signal.name!r} needs each rollout's log-confidence")
    return marked, lens_advantages(log_confidence, group_ids, marked, _alpha(args, signal))


def response_log_confidence(batch: Mapping) -> list[float]:
    """Each row's mean token log-prob under the sampling policy (``old_per_token_logps``) over its loss tokens:
    the log of LENS's length-normalised likelihood. A row without loss tokens gets 0."""
    old = batch.get("old_per_token_logps")
    if old is None:
        raise ValueError(
            "zero_variance_signal='lens' reads the sampling policy's log-probs (old_per_token_logps), which TRL "
            "computes only when a rollout step feeds more than one update: set num_partitions >= 2"
        )
    mask = batch["completion_mask"] * batch["tool_mask"] if "tool_mask" in batch else batch["completion_mask"]
    mask = mask.to(torch.float64)
    total = (old.detach().to(torch.float64) * mask).sum(-1)
    return (total / mask.sum(-1).clamp(min=1.0)).tolist()


def rl_zvp_token_advantages(
    advantages: torch.Tensor, entropies: torch.Tensor, mask: torch.Tensor, marked: torch.Tensor, alpha: float
) -> torch.Tensor:
    """RL-ZVP's eq. 5 on the ``marked`` rows (all-wrong groups): ``-alpha (max_k H_k - H_t)`` per loss token,
    the max over the row's own loss tokens, entropies detached; the other rows keep ``advantages``. Returns
    (B, T) advantages."""
    a = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    h = entropies.detach().to(a.dtype)
    valid = mask > 0
    h_max = torch.where(valid, h, torch.full_like(h, float("-inf"))).amax(-1, keepdim=True)
    shaped = torch.where(valid, -alpha * (h_max - h), torch.zeros_like(h))
    return torch.where(marked.bool().unsqueeze(1), shaped, a.expand_as(h))


def token_advantages(
    args, advantages: torch.Tensor, entropies: torch.Tensor | None, mask: torch.Tensor, marked: torch.Tensor | None
) -> torch.Tensor:
    """The advantages a micro-batch's loss trains with: ``advantages`` unchanged, or, under a loss-time signal
    with marked rows, RL-ZVP's token-level advantages on those rows."""
    signal = signal_for(args)
    if signal is None or signal.at != "loss" or marked is None or not bool(marked.any()):
        return advantages
    if entropies is None:
        raise ValueError(f"zero_variance_signal={signal.name!r} needs the per-token entropies of the loss forward")
    return rl_zvp_token_advantages(advantages, entropies, mask, marked, _alpha(args, signal))


def all_wrong_keys(
    groups_per_rank: Sequence[Sequence[tuple[str, Hashable]]], rewards: Sequence[float] | torch.Tensor, group_size: int
) -> list[Hashable]:
    """The keys of the plain groups (every rank's ``(kind, key)``, rank-major, ``group_size`` rewards each)
    whose every reward is at or below :data:`CORRECT`, in order, once each; fillers are never keys."""
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten().tolist()
    wrong: dict[Hashable, bool] = {}
    offset = 0
    for groups in groups_per_rank:
        for kind, key in groups:
            if kind != FILLER:
                wrong[key] = wrong.get(key, True) and all(x <= CORRECT for x in r[offset : offset + group_size])
            offset += group_size
    return [key for key, ok in wrong.items() if ok]


def relift_targets(
    keys: Sequence[Hashable], teacher_correct: Mapping[Hashable, Sequence[str]], rng
) -> list[tuple[Hashable, str]]:
    """ReLIFT's targets: for each all-wrong question in ``keys``, one of its graded-correct teacher rollouts,
    drawn uniformly with ``rng`` (shared by every rank); a question without one gets no target."""
    return [(key, rng.choice(list(teacher_correct[key]))) for key in keys if teacher_correct.get(key)]


def teacher_target_term(
    args,
    inputs: Mapping,
    logps: torch.Tensor | None,
    mask: torch.Tensor,
    normalizer: torch.Tensor | float,
    distill_inputs: Callable[[], DistillInputs],
) -> tuple[torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]] | None:
    """The teacher-target term a micro-batch adds to its RL loss, with what to log; None when the row has none
    or the micro-batch holds none of its rows.

    ReLIFT: ``alpha * sum over the target rows' tokens of -log pi / normalizer`` (the partition's token count, so
    a token mean over the RL and target tokens of the update). RSTG: ``alpha * sum over the all-wrong rows'
    tokens of JSD_beta(teacher, student) / normalizer``; ``distill_inputs()`` runs the student forward that
    gives its distributions (called only when the micro-batch holds an all-wrong row).
    """
    signal = signal_for(args)
    if signal is None or not signal.needs_teacher:
        return None
    rows = inputs.get(TARGET_FIELD if signal.teacher_targets else MARK_FIELD)
    if rows is None or not bool(rows.any()):
        return None
    where = mask * rows.to(mask.dtype).unsqueeze(1)
    count = where.sum().double()
    if signal.teacher_targets:
        total = -(logps * where).sum()
        name = "relift/nll"
    else:
        total = chunked_jsd(distill_inputs(), where, args.distill_beta, args.distill_chunk_size)
        name = "rstg/jsd"
    return _alpha(args, signal) * total / normalizer, {name: (total.detach().double(), count)}


# ---------------------------------------------------------------------- the terms


@dataclass(kw_only=True)  # after GRPOConfig's positional output_dir in ZPPOConfig
class ZeroVarianceSettings:
    """The zero-variance rows' field of :class:`zppo_trl.ZPPOConfig`."""

    zero_variance_alpha: float | None = field(
        default=None,
        metadata={
            "help": "The signal's coefficient alpha; None: its paper's (RL-ZVP 0.1, LENS 0.25; the weight of "
            "ReLIFT's and RSTG's term 1.0). Only zero_variance_signal reads it."
        },
    )


class _ZeroVarianceTerm(Term):
    """A zero-variance row's term: its signal in the partitions, at the loss, or as a teacher target (the
    arithmetic above, read through :data:`ZERO_VARIANCE_SIGNALS`)."""

    selector = "zero_variance_signal"
    settings = ZeroVarianceSettings
    reads = ("zero_variance_alpha",)
    qualifies = True
    what = ""

    @classmethod
    def check_settings(cls, args: Any) -> None:
        alpha = args.zero_variance_alpha
        if alpha is not None and (
            isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha < float("inf")
        ):
            raise ValueError(f"zero_variance_alpha must be a finite number > 0 or null, got {alpha!r}")

    @classmethod
    def validate(cls, args: Any) -> None:
        trains = args.row.objective  # the loss the row trains (zppo_trl.row): a policy objective or a target loss
        if trains.objective is None:
            raise ValueError(
                f"zero_variance_signal={cls.name!r} shapes RL advantages; this row trains the {trains.name!r} loss "
                "(cross-entropy or the JSD): leave it 'none'"
            )
        server = cls.needs.teacher_samples or (cls.needs.teacher_scores and not args.distill_teacher)
        if server and not (args.teacher_base_url and args.teacher_model):
            raise ValueError(
                f"zero_variance_signal={cls.name!r} puts the teacher's targets in the loss: set teacher_base_url and "
                "teacher_model (its vLLM server samples ReLIFT's solutions and scores RSTG's top-k)"
            )

    @classmethod
    def describe(cls, args: Any) -> Description:
        what = cls.what.format(alpha=_alpha(args, ZERO_VARIANCE_SIGNALS[cls.name]))
        return Description(
            plan=(f"  zero-variance term ({cls.printed}): {what}",),
            card=f"The all-wrong groups, which GRPO\u2020 skips, train with {cls.printed}'s term: {what}.",
        )

    def partition_signal(
        self, rewards: Sequence[float], group_ids: Sequence[Hashable], confidences: Sequence[float] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return partition_signal(self.args, rewards, group_ids, confidences)

    def loss_term(self, inputs: Mapping, loss_inputs: Any, distill_inputs: Callable[[], Any]):
        """The teacher-target term (ReLIFT's cross-entropy, RSTG's JSD; None for the others)."""
        return teacher_target_term(
            self.args, inputs, loss_inputs.logps, loss_inputs.mask, loss_inputs.normalizer, distill_inputs
        )


@register_term
class RLZVP(_ZeroVarianceTerm):
    """RL-ZVP† (``zero_variance_signal: rl_zvp``): token-level advantages on the all-wrong rows, at the loss."""

    name = "rl_zvp"
    printed = ZERO_VARIANCE_SIGNALS[name].printed
    needs = Needs(token_level_objective=True)
    what = "an entropy-shaped negative advantage on every token of an all-wrong group (alpha {alpha:g})"

    def advantages(self, loss_inputs: Any, inputs: Mapping) -> torch.Tensor:
        return token_advantages(
            self.args, loss_inputs.advantages, loss_inputs.entropies, loss_inputs.mask, inputs.get(MARK_FIELD)
        )


@register_term
class LENS(_ZeroVarianceTerm):
    """LENS† (``zero_variance_signal: lens``): confidence-weighted advantages on the all-wrong groups, in the
    partitions (from the sampling policy's log-probs, read while the step is scored)."""

    name = "lens"
    printed = ZERO_VARIANCE_SIGNALS[name].printed
    needs = Needs(sampling_logps_at_scoring=True)
    what = "a confidence-weighted negative advantage on every all-wrong group (alpha {alpha:g})"

    def partition_reads(self, batch: Mapping) -> list[float]:
        return response_log_confidence(batch)

    @classmethod
    def validate(cls, args: Any) -> None:
        super().validate(args)
        if args.num_partitions < 2:
            raise ValueError(
                "zero_variance_signal='lens' reads the sampling policy's log-probs, which TRL computes only when a "
                f"rollout step feeds more than one update: set num_partitions >= 2 (got {args.num_partitions})"
            )


@register_term
class ReLIFT(_ZeroVarianceTerm):
    """ReLIFT† (``zero_variance_signal: relift``): one graded-correct teacher solution per all-wrong question as a
    teacher-forced target row in its question's partition, fitted with cross-entropy beside the RL loss."""

    name = "relift"
    printed = ZERO_VARIANCE_SIGNALS[name].printed
    needs = Needs(teacher_samples=True)
    what = "cross-entropy on one graded-correct teacher solution per all-wrong question (weight {alpha:g})"

    @classmethod
    def describe(cls, args: Any) -> Description:
        base = super().describe(args)
        return Description(base.plan, base.card, ("one graded-correct answer per all-wrong question is a target",))

    def after_plain(self, step: PlainStep) -> Contribution:
        """The target rows: one graded-correct teacher rollout per all-wrong plain question (:func:`relift_targets`),
        drawn with the step's RNG, dealt round-robin over ranks."""
        ctx, plain_round = self.ctx, step.round
        keys = all_wrong_keys(plain_round.groups_per_rank, plain_round.rewards, ctx.group_size)
        evidence = ctx.evidence(step, keys)
        planned = relift_targets(keys, evidence.teacher_correct, ctx.rng)
        built = BuiltGroups([BuiltGroup("relift", key, target=text) for key, text in ctx.ranks.share(planned)])
        return Contribution(targets=built, metrics={"relift_all_wrong": len(keys), "relift_targets": len(planned)})


@register_term
class RSTG(_ZeroVarianceTerm):
    """RSTG† (``zero_variance_signal: rstg``): the distillation JSD to the teacher on the all-wrong rollouts only,
    its top-k from the teacher server (or ``distill_teacher`` loaded next to the student)."""

    name = "rstg"
    printed = ZERO_VARIANCE_SIGNALS[name].printed
    needs = Needs(teacher_scores=frozenset({SCORES_TOP_K}))
    scores_only = MARK_FIELD
    reads = ("zero_variance_alpha", "distill_beta", "distill_chunk_size")
    what = "the distillation JSD to the teacher on the rollouts of all-wrong groups (weight {alpha:g})"

    @classmethod
    def describe(cls, args: Any) -> Description:
        base = super().describe(args)
        return Description(base.plan, base.card, ("scores the all-wrong rollouts only",))
