"""Shared-prompt micro-batches: the rows of a micro-batch that share a prompt run it through the model once.

A GRPO group is ``G`` rollouts of one prompt, and TRL scores a micro-batch as a ``(B, L)`` grid in which each row
carries its prompt again: ``G`` times the prompt's tokens through every layer, forward and backward, for the
same keys and values each time. Here a micro-batch becomes one row of ``T`` tokens: each distinct prompt once, then
each of its rollouts' completions, and a 4D attention mask that lets every completion see its own prompt and
itself, causally, and nothing else. A group of ``G`` rollouts of ``C`` tokens on a prompt of ``P`` costs
``P + G (C + 1)`` tokens instead of ``G (P + C)``; on the CPU demo's BCQ/NCQ groups (``G = 4``, prompts of 240-400
tokens, 48-token completions) that is about a third.

It is exact, for the same reasons as packing (:mod:`zppo_trl.packing`):

- a completion token attends to exactly the keys it attends to in its padded row: its prompt's and its own
  completion's earlier tokens, each computed from the same tokens at the same distances;
- RoPE depends only on the distance between tokens, so positions that start at 0 give what the padded row's
  positions (which start after its left padding) give;
- the prompt's last token predicts each completion's first token, so it is repeated at the head of each
  completion's segment, at its own position, attending to the prompt before it as the original does: ``G`` extra
  tokens for one shared prompt of ``P - 1``.

Gradients flow into the shared prompt's tokens from every completion that attends to them, summed, as in the
padded grid where each row's copy takes its own share and the weights sum them.

:func:`shared_refusal` says why a model cannot take such a mask: only softmax-attention models under sdpa, checked
against the padded path in ``tests/test_shared_prompts.py`` (a linear-attention layer carries its state through
the row and sees no mask; the hybrid Qwen3.5 students are refused). :func:`packing.batch_refusal` says why one
micro-batch cannot be laid out this way. ``ZPPOConfig.shared_prompt_forward`` turns it on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .packing import PACKED_MODEL_TYPES, unpack_scored

__all__ = ["MAX_SHARED_TOKENS", "SHARED_ATTENTION", "SharedPromptBatch", "share_prompts", "shared_refusal"]

# The attention implementation whose 4D boolean mask the shared layout passes as it is (transformers returns a 4D
# mask unchanged, and sdpa reads True as "attends"). Eager attention adds its mask as floats; flash-attention takes
# none: both are refused.
SHARED_ATTENTION = ("sdpa",)
# The longest shared row laid out: its mask holds a flag per pair of tokens (256 MB at this length) and attention
# runs over the whole row, so a longer micro-batch (the paper's 12k-token rollouts, several to a micro-batch) runs
# as without sharing instead.
MAX_SHARED_TOKENS = 16_384


def shared_refusal(config) -> str | None:
    """Why a model of ``config`` (a transformers config; a VLM's text config is read) cannot run shared-prompt
    micro-batches exactly here, or None when it can."""
    text = config.get_text_config()
    if text.model_type not in PACKED_MODEL_TYPES:
        checked = ", ".join(PACKED_MODEL_TYPES)
        return f"model type {text.model_type!r} is not one shared prompts were checked on ({checked})"
    if text._attn_implementation not in SHARED_ATTENTION:
        return f"attention implementation {text._attn_implementation!r} is not sdpa"
    other = sorted({kind for kind in getattr(text, "layer_types", None) or () if kind != "full_attention"})
    if other:
        return f"layers of type {other} were not checked with shared prompts (only full_attention)"
    return None


@dataclass(frozen=True)
class SharedPromptBatch:
    """One padded micro-batch laid out with each distinct prompt once (see :func:`share_prompts`).

    Attributes:
        input_ids: ``(1, T)``: per distinct prompt, its tokens but the last, then per rollout of it that prompt's
            last token and the rollout's completion tokens.
        position_ids: ``(1, T)``, each token's position in its own sequence (prompt then completion), from 0.
        labels: ``(1, T)``, the token at completion positions and -100 everywhere else.
        attention_mask: ``(1, 1, T, T)`` bool, True where a query token attends to a key token.
        scored: ``(B, logits_to_keep)`` bool, the completion cells that hold a real token.
        sources: for each True cell of ``scored`` in row-major order, the index of the output that predicts it
            among the ``T - 1`` shifted per-position outputs of the fused LM head.
        prompts: how many distinct prompts the micro-batch held; ``rows``: how many rows with a completion.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    attention_mask: torch.Tensor
    scored: torch.Tensor
    sources: torch.Tensor
    prompts: int
    rows: int

    def model_inputs(self) -> dict:
        """The keywords of the shared forward pass: the tokens, their positions, the mask and the labels the fused
        LM head scores; no cache (a scoring pass)."""
        return dict(
            use_cache=False,
            input_ids=self.input_ids,
            position_ids=self.position_ids,
            attention_mask=self.attention_mask,
            labels=self.labels,
        )

    def unpack(self, per_position: torch.Tensor) -> torch.Tensor:
        """``per_position`` (``(1, T - 1)``: output ``p`` is about token ``p + 1``, as the fused LM head returns
        ``log_probs`` and ``entropy``) as TRL's ``(B, logits_to_keep)`` grid, zeros at padding. Differentiable."""
        return unpack_scored(per_position, self.scored, self.sources)


def share_prompts(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int
) -> SharedPromptBatch | int:
    """Lay out the ``(B, L)`` micro-batch ``input_ids``/``attention_mask`` (left-padded prompts, right-padded
    completions in the last ``logits_to_keep`` columns) with each distinct prompt once.

    Rows share a prompt when their prompt columns hold the same real tokens. A row without a completion token
    (a zero-weight padding row) is left out: its cells stay zero. Call :func:`zppo_trl.packing.batch_refusal`
    first: a row with padding between its tokens, or a completion with no prompt token before it, would be laid
    out wrongly. Returns the row's length instead where it would pass :data:`MAX_SHARED_TOKENS`.
    """
    width = input_ids.size(1) - logits_to_keep
    real = attention_mask.bool()
    prompt_real, completion_real = real[:, :width], real[:, width:]
    order: dict[tuple[int, ...], list[int]] = {}  # each distinct prompt's tokens -> its rows, in row order
    for row in range(input_ids.size(0)):
        if completion_real[row].any():
            order.setdefault(tuple(input_ids[row, :width][prompt_real[row]].tolist()), []).append(row)
    ids, positions, labels, spans, sources = [], [], [], [], {}
    start = 0
    for prompt, rows in order.items():
        shared = len(prompt) - 1
        ids.append(torch.tensor(prompt[:-1], dtype=input_ids.dtype))
        positions.append(torch.arange(shared))
        labels.append(torch.full((shared,), -100))
        members = []
        for row in rows:
            completion = input_ids[row, width:][completion_real[row]]
            ids += [torch.tensor(prompt[-1:], dtype=input_ids.dtype), completion]
            positions.append(torch.arange(shared, shared + 1 + completion.size(0)))
            labels += [torch.tensor([-100]), completion.cpu()]
            head = start + shared + sum(n for _, n in members)  # the repeated last prompt token
            members.append((head, 1 + completion.size(0)))
            # the output at p predicts the token at p + 1: the head predicts the first completion token
            sources[row] = torch.arange(head, head + completion.size(0))
        spans.append((start, shared, members))
        start += shared + sum(n for _, n in members)
    total = start
    if total > MAX_SHARED_TOKENS:
        return total
    mask = torch.zeros(total, total, dtype=torch.bool)
    for begin, shared, members in spans:
        mask[begin : begin + shared, begin : begin + shared] = torch.ones(shared, shared, dtype=torch.bool).tril()
        for head, length in members:
            mask[head : head + length, begin : begin + shared] = True
            mask[head : head + length, head : head + length] = torch.ones(length, length, dtype=torch.bool).tril()
    device = input_ids.device
    flat = torch.cat(ids).to(device)
    return SharedPromptBatch(
        input_ids=flat[None],
        position_ids=torch.cat(positions).to(device)[None],
        labels=torch.cat(labels).to(device=device, dtype=input_ids.dtype)[None],
        attention_mask=mask.to(device)[None, None],
        scored=completion_real,
        sources=torch.cat([sources[row] for row in sorted(sources)]).to(device),
        prompts=len(order),
        rows=len(sources),
    )
