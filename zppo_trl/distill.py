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

The teacher's distributions come from the teacher loaded next to the student (``distill_teacher``),
which must share the student's tokenizer, as TRL's distillation trainers require. The divergence
itself is TRL's own ``GKDTrainer.generalized_jsd_loss`` (``trl.experimental.gkd``); this module adds
the completion-position logits it reads and the teacher's loading.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = [
    "DISTILLATION_MODES",
    "DISTILLATION_NAMES",
    "completion_logits",
    "frozen_distill_teacher",
    "generalized_jsd",
    "load_distill_teacher",
]

DISTILLATION_MODES = ("off", "on")
# How the paper's tables print the rows (a dagger is added with the replay buffer).
DISTILLATION_NAMES = {"off": "Off-Distill", "on": "On-Distill"}
# The multimodal inputs a TRL batch may carry that a forward pass takes as they are.
_FORWARD_FIELDS = (
    "pixel_values",
    "image_grid_thw",
    "pixel_attention_mask",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
)


def generalized_jsd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    normalizer: torch.Tensor | float,
) -> torch.Tensor:
    """GKD's per-token generalized JSD summed over the positions where ``mask`` is 1, over ``normalizer``.

    ``*_logits`` are ``(B, T, V)`` next-token logits at the completion positions; ``mask`` ``(B, T)``.
    The computation is TRL's ``GKDTrainer.generalized_jsd_loss`` (temperature 1).
    """
    with warnings.catch_warnings():  # trl.experimental announces itself on import
        warnings.simplefilter("ignore")
        from trl.experimental.gkd import GKDTrainer
    labels = torch.where(mask.bool(), 0, -100)
    return GKDTrainer.generalized_jsd_loss(
        student_logits, teacher_logits, labels=labels, beta=beta, num_items_in_batch=normalizer
    )


def completion_logits(model: Any, inputs: dict, vocab: int) -> torch.Tensor:
    """``model``'s next-token logits at every completion position of a TRL batch, cut to the first
    ``vocab`` entries (the shared tokenizer's; models may pad their embedding tables differently)."""
    completion_width = inputs["completion_ids"].size(1)
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    extra = {name: inputs[name] for name in _FORWARD_FIELDS if inputs.get(name) is not None}
    # only the positions that predict a completion token: the full (B, P + C, V) logits would not fit at the
    # paper's lengths
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        logits_to_keep=completion_width + 1,
        use_cache=False,
        **extra,
    ).logits
    return logits[:, :-1, :vocab]


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
