"""How long a context the student's and the teacher's servers need, from a recipe's own lengths.

A plain prompt is at most the paper's "Max prompt length" (4,096 tokens; ZPPO-77K is built
under it, RL closer and image tokens included). A BCQ/NCQ prompt adds its block: an NCQ
block lists up to G_S distinct wrong answers and carries up to G_S compressed candidates of
``compression_max_tokens`` each (with ``compress_candidates`` off, whole rollouts of up to
``max(max_completion_length, teacher_max_tokens)``), so the student's context must hold plain
prompt + block + ``max_completion_length``, or reformulated rollouts are silently cut short. The teacher's
server samples on plain prompts, compresses whole rollouts and judges whole responses.

The bounds need no tokenizer: template text is counted in UTF-8 bytes, which bounds its
token count under a byte-level BPE (every token is at least one byte); what a template
wraps gets an allowance. This module is pure: no TRL, no trainer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .augmentations import AUGMENTATIONS
from .prompt_sizes import ANSWER_TOKENS, CHAT_TOKENS, PromptSizes, text_bytes
from .prompts import (
    COMPRESSION_TEMPLATE,
    HINT_TEMPLATE,
    JUDGE_TEMPLATE,
    candidate_blocks,
    fill,
)

__all__ = ["JUDGE_REPLY_TOKENS", "PAPER_MAX_PROMPT_LENGTH", "ContextLengths", "context_lengths"]

PAPER_MAX_PROMPT_LENGTH = 4096  # the paper's hyperparameter table, "Max prompt length"
JUDGE_REPLY_TOKENS = 512  # the shared judge's output cap (the paper's benchmark appendix)
OPTIONS_TOKENS = 512  # a judge item's answer options
ROUND_TO = 1024


def _round_up(tokens: int) -> int:
    return math.ceil(tokens / ROUND_TO) * ROUND_TO


@dataclass(frozen=True)
class ContextLengths:
    """Token bounds of one rollout step's requests and the server contexts that hold them.

    ``student`` is the student server's ``--max-model-len`` (plain prompt + the longest
    BCQ/NCQ block + completion, rounded up to a multiple of 1,024); ``teacher`` the
    teacher's (the longest of its sampling, compression and judge requests, rounded up).
    ``str()`` is the line the recipe's dry run prints.
    """

    plain_prompt: int
    block: int  # the longest block an augmentation adds to a prompt (0 without augmentations)
    completion: int
    teacher_sampling: int
    compression: int  # the longest rewrite request with its reply: compression, hint, correction or revision
    judge: int

    @property
    def student(self) -> int:
        return _round_up(self.plain_prompt + self.block + self.completion)

    @property
    def teacher(self) -> int:
        return _round_up(max(self.teacher_sampling, self.compression, self.judge))

    def __str__(self) -> str:
        return (
            f"student --max-model-len {self.student:,} (prompt {self.plain_prompt:,} + BCQ/NCQ block <= "
            f"{self.block:,} + completion {self.completion:,}); teacher --max-model-len {self.teacher:,} (sampling "
            f"{self.teacher_sampling:,}, compression {self.compression:,}, judge {self.judge:,})"
        )


def context_lengths(
    *,
    max_prompt_length: int,
    max_completion_length: int,
    num_generations: int,
    augmentations: tuple[str, ...] | list[str],
    compression_max_tokens: int,
    teacher_max_tokens: int,
    compress_candidates: bool = True,
) -> ContextLengths:
    """The :class:`ContextLengths` of a recipe (see the module docstring for the bounds)."""
    for name, value in (
        ("max_prompt_length", max_prompt_length),
        ("max_completion_length", max_completion_length),
        ("num_generations", num_generations),
        ("compression_max_tokens", compression_max_tokens),
        ("teacher_max_tokens", teacher_max_tokens),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    longest_rollout = max(max_completion_length, teacher_max_tokens)
    candidate_text = compression_max_tokens if compress_candidates else longest_rollout
    sizes = PromptSizes(
        max_prompt_length=max_prompt_length,
        max_completion_length=max_completion_length,
        num_generations=num_generations,
        compression_max_tokens=compression_max_tokens,
        teacher_max_tokens=teacher_max_tokens,
        candidate=candidate_text + text_bytes(candidate_blocks([""])) + 1,  # tags, joining newline
    )
    # each augmentation bounds the blocks its kinds add to a prompt, and the request its build sends the teacher
    parts = dict.fromkeys(AUGMENTATIONS[kind] for kind in augmentations)
    blocks = [0, *(size for part in parts for size in part.prompt_blocks(tuple(augmentations), sizes))]
    separators = 2 * text_bytes("\n\n")  # question | block | closer
    block = max(blocks) + (separators if max(blocks) else 0)
    judge_template = text_bytes(fill(JUDGE_TEMPLATE, question="", options="", model_response="", ground_truth=""))
    return ContextLengths(
        plain_prompt=max_prompt_length,
        block=block,
        completion=max_completion_length,
        teacher_sampling=max_prompt_length + teacher_max_tokens,
        compression=max(
            CHAT_TOKENS
            + max(text_bytes(fill(t, response="")) for t in (COMPRESSION_TEMPLATE, HINT_TEMPLATE))
            + longest_rollout
            + compression_max_tokens,
            *(part.teacher_request(sizes) for part in parts),
            0,
        ),
        judge=CHAT_TOKENS
        + judge_template
        + max_prompt_length
        + longest_rollout
        + ANSWER_TOKENS
        + OPTIONS_TOKENS
        + JUDGE_REPLY_TOKENS,
    )
