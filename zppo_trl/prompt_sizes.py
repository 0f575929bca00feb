"""Token bounds without a tokenizer, shared by :mod:`zppo_trl.context` and the parts that size their own prompts.

Template text is counted in UTF-8 bytes, which bounds its token count under a byte-level BPE (every token is at
least one byte); what a template wraps gets an allowance. :class:`PromptSizes` is a recipe's lengths as an
augmentation reads them to bound the block it adds to a student prompt and the request it sends the teacher
(:meth:`zppo_trl.augmentations.Augmentation.prompt_blocks` and ``teacher_request``).
This module is pure: no TRL, no trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ANSWER_TOKENS", "CHAT_TOKENS", "PromptSizes", "text_bytes"]

CHAT_TOKENS = 64  # role markers and generation prompt of one chat turn
ANSWER_TOKENS = 64  # one listed NCQ wrong answer, or a ground-truth answer


def text_bytes(text: str) -> int:
    """A bound on ``text``'s tokens: its UTF-8 bytes."""
    return len(text.encode("utf-8"))


@dataclass(frozen=True)
class PromptSizes:
    """A recipe's lengths, as the parts bound their prompts with them.

    ``candidate``: one candidate block of a BCQ/NCQ prompt, its text (a compression of at most
    ``compression_max_tokens``, or with ``compress_candidates`` off a whole rollout) with its tags and newline.
    """

    max_prompt_length: int
    max_completion_length: int
    num_generations: int
    compression_max_tokens: int
    teacher_max_tokens: int
    candidate: int
