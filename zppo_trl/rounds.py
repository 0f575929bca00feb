"""The generation rounds of a rollout step (:class:`Rounds`): the plain round, the augmented round and the
teacher-forced target round, each one run of TRL's generation and scoring with a
:class:`~zppo_trl.rollout.RoundRequest` in flight; and what TRL's hooks do with that request
(:func:`prompts_with_prefixes`, :func:`cut_to_budget`, :func:`responses_with_prefixes`, :func:`hand_back`): response
prefixes (Prefix), given responses (targets), and where the scoring leaves rewards and texts.

The request is an argument everywhere: :class:`zppo_trl.ZPPOTrainer` holds the one in flight while TRL's hooks run
(:meth:`zppo_trl.ZPPOTrainer.generate_and_score`) and hands it to these functions.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from . import data
from .augmentations import BuiltGroups
from .batches import TOKEN_TYPE_FIELDS, concat_batches
from .rewards import completion_text
from .rollout import FILLER, Group, Round, RoundRequest, empty_round

__all__ = [
    "Rounds",
    "cut_to_budget",
    "hand_back",
    "prompts_with_prefixes",
    "responses_with_prefixes",
    "token_types",
]

logger = logging.getLogger(__name__)


class Rounds:
    """Runs a step's rounds through TRL's generation and scoring.

    Args:
        generate_and_score: ``(rows, request) -> batch``: TRL's ``_generate_and_score_completions`` on ``rows`` with
            ``request`` the round in flight (the trainer's :meth:`~zppo_trl.ZPPOTrainer.generate_and_score`).
        questions: the :class:`zppo_trl.questions.Questions`.
        ranks: :class:`zppo_trl.ranks.Ranks`; ``group_size``: G_S.
        recorder: the :class:`zppo_trl.step_records.StepRecorder`; ``counters``: the run's cumulative counters.
        tokenizer: the student's; ``eos_token_id``: the end of a target.
        max_completion_length: ``max_completion_length``; ``context``: ``vllm_max_model_length`` (None: unknown).
        on_server: whether the student's rollouts come from its vLLM server (a prompt filling its context gets none).
        defers_old_logps: whether TRL's scoring skips the old log-probs (the trainer computes them later).
        token_types: token ids -> the image/video placeholder types TRL marks.
    """

    def __init__(
        self,
        generate_and_score: Callable[[list[dict], RoundRequest], dict],
        *,
        questions: Any,
        ranks: Any,
        group_size: int,
        recorder: Any,
        counters: Any,
        tokenizer: Any,
        eos_token_id: int,
        max_completion_length: int,
        context: int | None,
        on_server: bool,
        defers_old_logps: bool,
        token_types: Callable[[torch.Tensor], torch.Tensor],
    ):
        self.generate_and_score, self.questions, self.ranks, self.group_size = (
            generate_and_score, questions, ranks, group_size
        )  # fmt: skip
        self.recorder, self.counters, self.tokenizer, self.eos_token_id = recorder, counters, tokenizer, eos_token_id
        self.max_completion_length, self.context, self.on_server = max_completion_length, context, on_server
        self.defers_old_logps, self.token_types = defers_old_logps, token_types

    def play(self, groups: Sequence[Group], round_name: str, early: Any = None) -> Round:
        """Generate and score ``group_size`` rollouts per group on this rank, timed (``time/<round>_generation_s``),
        its prompt lengths checked. A group with a rollout no reward function scored is left out (a filler).
        ``early``: the :class:`~zppo_trl.early_rollouts.EarlyBatch` some of its prompts went out through already."""
        G, metrics = self.group_size, self.recorder.metrics
        t0 = time.perf_counter()
        rows = [self.questions.with_prompt(g.row, g.block) for g in groups for _ in range(G)]
        request = RoundRequest(
            response_prefixes=[g.response_prefix for g in groups for _ in range(G)],
            old_logps=not self.defers_old_logps,
            early=early,
        )
        batch = self.generate_and_score(rows, request)
        for name in TOKEN_TYPE_FIELDS:  # widths as the prompts with their prefixes (see the trainer's log-prob hook)
            if name in batch and batch[name].size(1) != batch["prompt_ids"].size(1) + batch["completion_ids"].size(1):
                batch[name] = self.token_types(torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1))
        groups_per_rank = self.ranks.gather([(g.kind, g.row[data.ID]) for g in groups])
        unscorable = torch.isnan(request.rewards)
        real = torch.tensor(
            [kind != FILLER for rank_groups in groups_per_rank for kind, _ in rank_groups]
        ).repeat_interleave(G)
        self.counters["unscorable_total"] += int((unscorable & real).sum())
        groups_per_rank, left_out = without_unscored(groups_per_rank, unscorable, G)
        self.recorder.add("unscored_groups", left_out)
        rewards = torch.nan_to_num(request.rewards, nan=0.0)
        metrics[f"time/{round_name}_generation_s"] = time.perf_counter() - t0
        self.check_context(batch, groups, round_name)
        return Round(batch, rewards, request.texts, groups_per_rank, request.rewards_per_func)

    def augmented(self, built: BuiltGroups, most_built: int, filler_row: Mapping) -> Round:
        """Step 5, second half: one student group per built instance, ranks padded with fillers to ``most_built``."""
        if not most_built:
            return empty_round(self.ranks.world)
        groups = [Group(g.kind, self.questions.row(g.key), g.block, g.response_prefix) for g in built.groups]
        groups += [Group(FILLER, filler_row)] * (most_built - len(groups))
        early, started = built.early, time.perf_counter()
        played = self.play(groups, "reformulated", early)
        if early is not None:  # the groups whose rollouts came from requests sent as they were built, and how early
            self.recorder.metrics["second_round_sent_early"] = self.ranks.total(early.taken)
            self.recorder.metrics["time/second_round_early_s"] = started - (early.first_sent or started)
        return played

    def built_row(self, group: Any) -> dict:
        """The dataset row the augmented round samples a built group (``BuiltGroup``) with: its question's row under
        the group's block, as :meth:`augmented` and :meth:`play` make it."""
        return self.questions.with_prompt(self.questions.row(group.key), group.block)

    def targets(self, built: BuiltGroups, filler_row: Mapping) -> Round:
        """The target rows' step 5: every rank's targets teacher-forced through TRL's scoring (nothing is
        sampled), each rank padded with filler rows to an equal multiple of G.

        A target is its response's tokens and EOS; one longer than ``max_completion_length`` is cut
        there, without EOS, like a rollout that ran out of room (counted in ``targets_cut``).
        The round's ``groups_per_rank`` holds every rank's ``(kind, key)`` per row.
        """
        G, limit, eos = self.group_size, self.max_completion_length, self.eos_token_id
        rows, responses, row_keys, cut = [], [], [], 0
        for group in built.groups:
            ids = self.tokenizer(group.target, add_special_tokens=False)["input_ids"]
            cut += len(ids) >= limit
            rows.append(self.questions.with_prompt(self.questions.row(group.key), group.block))
            responses.append(ids[:limit] if len(ids) >= limit else [*ids, eos])
            row_keys.append((group.kind, group.key))
        most_rows = self.ranks.largest(len(rows))
        self.recorder.metrics["targets_cut"] = self.ranks.total(cut)
        if not most_rows:
            return empty_round(self.ranks.world)
        fillers = math.ceil(most_rows / G) * G - len(rows)
        rows += [self.questions.with_prompt(filler_row)] * fillers
        responses += [[eos]] * fillers
        row_keys += [(FILLER, filler_row[data.ID])] * fillers
        t0 = time.perf_counter()
        batch = self.generate_and_score(
            rows, RoundRequest(given_responses=responses, old_logps=not self.defers_old_logps)
        )
        self.recorder.metrics["time/target_scoring_s"] = time.perf_counter() - t0
        return Round(concat_batches([batch], self.tokenizer.pad_token_id), None, [], self.ranks.gather(row_keys))

    def rollouts_as_targets(self, plain: Round) -> Round:
        """The scored plain round's rollouts as targets (On-Distill imitates the teacher on them): its batch as it
        is, every row keyed by its group's ``(kind, key)``, nothing scored again."""
        G = self.group_size
        per_rank = [[group for group in groups for _ in range(G)] for groups in plain.groups_per_rank]
        return Round(concat_batches([plain.batch], self.tokenizer.pad_token_id), None, [], per_rank)

    def check_context(self, batch: Mapping, groups: Sequence[Group], round_name: str) -> None:
        """Log the round's longest prompt; warn about prompts that leave the student's context
        (``vllm_max_model_length``) less than ``max_completion_length`` to generate."""
        G, context, metrics = self.group_size, self.context, self.recorder.metrics
        lengths = batch["prompt_mask"].sum(1)[::G].tolist()  # one prompt per group
        # a response prefix ends the generation prompt but shares max_completion_length: not prompt here
        lengths = [n - len(g.response_prefix or ()) for n, g in zip(lengths, groups) if g.kind != FILLER]
        over = sum(n + self.max_completion_length > context for n in lengths) if context else 0
        longest, over = self.ranks.largest(max(lengths, default=0)), self.ranks.total(over)
        metrics[f"{round_name}_prompt_tokens_max"] = longest
        self.recorder.add("prompts_over_context", over)
        if self.on_server and context:  # see the trainer's _generate_single_turn
            sent = batch["prompt_mask"].sum(1)[::G].tolist()
            mine = [g.row[data.ID] for n, g in zip(sent, groups) if g.kind != FILLER and n >= context]
            unserved = [key for rank_keys in self.ranks.gather(mine) for key in rank_keys]
            self.recorder.add("prompts_beyond_context", len(unserved))
            if unserved:
                logger.warning(
                    "%d %s prompt(s) fill the student server's whole context (vllm_max_model_length=%d) and got no "
                    "rollouts (their groups carry no signal): question ids %s. Start the student server with a "
                    "larger --max-model-len and set vllm_max_model_length to it",
                    len(unserved), round_name, context, unserved,
                )  # fmt: skip
        if over:
            logger.warning(
                "%d %s prompt(s) leave less than max_completion_length=%d tokens to generate in the student's context "
                "(vllm_max_model_length=%d; longest prompt %d tokens): their rollouts are cut short. Start the "
                "student server with a larger --max-model-len and set vllm_max_model_length to it (see "
                "ZPPOConfig.context_lengths())",
                over,
                round_name,
                self.max_completion_length,
                context,
                longest,
            )


# ---------------------------------------------------------------------- what TRL's hooks do with the request


def prompts_with_prefixes(
    prompt_ids: list, multimodal_fields: dict, request: RoundRequest | None
) -> tuple[list, dict]:
    """The Prefix control: a group's response prefix ends its generation prompt, so the student continues it and no
    prefix token is ever sampled or trained (the paper's Prefix masks them all). Per-token fields (Qwen3.5:
    ``mm_token_type_ids``) mark prefix tokens as text."""
    if request is None or not request.has_prefixes:
        return prompt_ids, multimodal_fields
    prefixes = request.response_prefixes
    prompt_ids = [[*ids, *(prefix or ())] for ids, prefix in zip(prompt_ids, prefixes, strict=True)]
    for name in TOKEN_TYPE_FIELDS:
        if name in multimodal_fields:
            multimodal_fields[name] = [
                [*types, *[0] * len(prefix or ())]
                for types, prefix in zip(multimodal_fields[name], prefixes, strict=True)
            ]
    return prompt_ids, multimodal_fields


def cut_to_budget(completion_ids: list, logprobs: list | None, request: RoundRequest | None, limit: int) -> tuple:
    """Prefix and continuation share ``max_completion_length`` (the paper's Prefix): a continuation is cut at what its
    prefix leaves, which samples exactly as a shorter generation limit would."""
    if request is None or not request.has_prefixes:
        return completion_ids, logprobs
    budget = [limit - len(prefix or ()) for prefix in request.response_prefixes]
    completion_ids = [list(ids)[:n] for ids, n in zip(completion_ids, budget, strict=True)]
    if logprobs is not None:
        logprobs = [list(lp)[:n] for lp, n in zip(logprobs, budget, strict=True)]
    return completion_ids, logprobs


def responses_with_prefixes(
    completions: list, completion_ids: list, request: RoundRequest | None, decode: Callable[[list[int]], str]
) -> list:
    """A Prefix group's response, as its reward functions read it: prefix || continuation."""
    if request is None or not request.has_prefixes:
        return completions
    return [
        _with_text(c, decode([*prefix, *ids])) if prefix else c
        for c, ids, prefix in zip(completions, completion_ids, request.response_prefixes, strict=True)
    ]


def hand_back(
    request: RoundRequest | None, rewards_per_func: torch.Tensor, weights: torch.Tensor, completions
) -> None:
    """Hand the round its gathered weighted rewards (NaN where no function scored a rollout), its rewards per
    function, and this rank's completion texts."""
    if request is None:
        return
    weighted = (rewards_per_func * weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
    weighted[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    request.rewards = weighted.detach().cpu().double()
    request.rewards_per_func = rewards_per_func.detach().cpu().double()
    request.texts = [completion_text(c) for c in completions]


def token_types(input_ids: torch.Tensor, image_pad_id: int | None, video_pad_id: int | None) -> torch.Tensor:
    """Image (1) and video (2) placeholder positions of ``input_ids``, as TRL marks them for tool images."""
    types = torch.zeros_like(input_ids)
    if image_pad_id is not None:
        types[input_ids == image_pad_id] = 1
    if video_pad_id is not None:
        types[input_ids == video_pad_id] = 2
    return types


def without_unscored(
    groups_per_rank: list[list[tuple[str, Any]]], unscorable: torch.Tensor, group_size: int
) -> tuple[list[list[tuple[str, Any]]], int]:
    """Every group with a rollout no reward function scored (a judge that did not answer) left out of the step:
    marked a filler, so that it trains nothing and its question gets no accuracy (no admission, graduation or
    hard-question selection from it); and how many real groups were. A missing verdict is not a wrong answer."""
    out, left_out, offset = [], 0, 0
    for rank_groups in groups_per_rank:
        kept = []
        for kind, key in rank_groups:
            if kind != FILLER and bool(unscorable[offset : offset + group_size].any()):
                kind, left_out = FILLER, left_out + 1
            kept.append((kind, key))
            offset += group_size
        out.append(kept)
    return out, left_out


def _with_text(completion: Any, text: str) -> Any:
    """``completion`` (a string, or TRL's conversational ``[{"role": "assistant", ...}]``) with ``text``."""
    if isinstance(completion, str):
        return text
    return [{**completion[0], "content": text}, *completion[1:]]
