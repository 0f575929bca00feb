"""The rounds of a rollout step inside TRL's generation and scoring, as a mixin of :class:`zppo_trl.ZPPOTrainer`.

A round (:meth:`GenerationHooks._generate_round`: plain, reformulated; :meth:`GenerationHooks._target_round`:
teacher-forced targets) runs TRL's ``_generate_and_score_completions`` with one :class:`~zppo_trl.rollout.RoundRequest`
live (:meth:`GenerationHooks._round_in_flight`), which TRL's hooks overridden here read: response prefixes (Prefix),
given responses (target rows), prompts beyond the student server's context, and where the scoring leaves rewards and
texts. The prompts (question, block, closer) and the grading of teacher replies with the trainer's reward functions
live here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from trl.trainer.utils import is_async_callable

from . import data, host_memory
from .augmentations import BuiltGroups
from .batches import TOKEN_TYPE_FIELDS, concat_batches
from .rewards import completion_text
from .rollout import CORRECT, FILLER, Group, Round, RoundRequest, empty_round
from .student_server import stand_in_for_overlong, student_server_errors

__all__ = ["GenerationHooks"]

logger = logging.getLogger(__name__)


class GenerationHooks:
    """A mixin of :class:`zppo_trl.ZPPOTrainer` (see the module's docstring)."""

    @property
    def rollouts_on_server(self) -> bool:
        """Whether the student's rollouts come from a vLLM server (TRL's server mode), whose context and
        availability the rollout step must then respect (zppo_trl.student_server)."""
        return bool(self.use_vllm and self.vllm_mode == "server")

    def _tokenize_prompts(self, prompts: list):
        # The Prefix control: a group's response prefix ends its generation prompt, so the student
        # continues it and no prefix token is ever sampled or trained (the paper's Prefix masks them all).
        prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
        request = self._active_round
        if request is not None and request.has_prefixes:
            prefixes = request.response_prefixes
            prompt_ids = [[*ids, *(prefix or ())] for ids, prefix in zip(prompt_ids, prefixes, strict=True)]
            for name in TOKEN_TYPE_FIELDS:  # per-token fields (Qwen3.5: mm_token_type_ids): prefix tokens are text
                if name in multimodal_fields:
                    multimodal_fields[name] = [
                        [*types, *[0] * len(prefix or ())]
                        for types, prefix in zip(multimodal_fields[name], prefixes, strict=True)
                    ]
        return prompt_ids, images, multimodal_fields

    def _token_types(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Image (1) and video (2) placeholder positions of ``input_ids``, as TRL marks them for tool images."""
        types = torch.zeros_like(input_ids)
        if self._image_pad_token_id is not None:
            types[input_ids == self._image_pad_token_id] = 1
        if self._video_pad_token_id is not None:
            types[input_ids == self._video_pad_token_id] = 2
        return types

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        request = self._active_round
        if request is not None and request.given_responses is not None:  # the targets: given, not sampled
            return [list(ids) for ids in request.given_responses], None
        # Prefix and continuation share max_completion_length (the paper's Prefix): a continuation is cut at
        # what its prefix leaves, which samples exactly as a shorter generation limit would.
        # Decoding alone allocates from glibc's heap: its many small tensors per token are cheapest there, and
        # the heap is handed back when it ends. The forward passes that score the rollouts keep large tensors
        # in pages of their own (zppo_trl.host_memory).
        overlong = [False] * len(prompt_ids)
        if self.rollouts_on_server and self.args.vllm_max_model_length:
            # one prompt beyond the server's context would fail the whole request: its rollouts are a bare
            # end of sequence each (a group without signal, like an all-wrong one), and _check_context names it
            prompt_ids, overlong = stand_in_for_overlong(prompt_ids, self.args.vllm_max_model_length, images)
        with host_memory.generation_heap(), student_server_errors(self):
            completion_ids, logprobs = super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images
            )
        if any(overlong):
            eos = [self.eos_token_ids[0]]
            completion_ids = [eos if over else ids for ids, over in zip(completion_ids, overlong, strict=True)]
            if logprobs is not None:
                logprobs = [[0.0] if over else lp for lp, over in zip(logprobs, overlong, strict=True)]
        if request is not None and request.has_prefixes:
            budget = [self.max_completion_length - len(prefix or ()) for prefix in request.response_prefixes]
            completion_ids = [list(ids)[:n] for ids, n in zip(completion_ids, budget, strict=True)]
            if logprobs is not None:
                logprobs = [list(lp)[:n] for lp, n in zip(logprobs, budget, strict=True)]
        return completion_ids, logprobs

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        request = self._active_round
        if request is not None and request.given_responses is not None:
            # Teacher-forced targets: already graded, never judged again (their reward is never read).
            return torch.zeros(
                len(prompts) * self.accelerator.num_processes, len(self.reward_funcs), device=self.accelerator.device
            )
        if request is not None and request.has_prefixes:  # a Prefix group's response is prefix || continuation
            completions = [
                _with_text(c, self._tokenizer.decode([*prefix, *ids], skip_special_tokens=True)) if prefix else c
                for c, ids, prefix in zip(completions, completion_ids_list, request.response_prefixes, strict=True)
            ]
        prompts, completions = self.dataset_format.for_rewards(prompts, completions)  # as TRL would give them
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if request is not None:  # hand the round its gathered weighted rewards and this rank's texts
            weighted = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
            weighted[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
            request.rewards = weighted.detach().cpu().double()
            request.rewards_per_func = rewards_per_func.detach().cpu().double()
            request.texts = [completion_text(c) for c in completions]
        return rewards_per_func

    @contextlib.contextmanager
    def _round_in_flight(self, request: RoundRequest) -> Iterator[RoundRequest]:
        """Make ``request`` the round TRL's hooks see while its generation and scoring run."""
        self._active_round = request
        try:
            yield request
        finally:
            self._active_round = None

    def _with_prompt(self, row: Mapping, block: str | None = None) -> dict:
        """The row with TRL's ``prompt`` in the dataset's format: question, block, closer (images added by TRL)."""
        return {**row, "prompt": self.dataset_format.prompt(row, block, self.args.closer)}

    def _row(self, key: Any) -> Mapping:
        """The training dataset's row of question ``key`` (a stream's: of the step being trained)."""
        if self._row_of is None:
            return self._streamed_rows[key]
        return self.train_dataset[self._row_of[key]]

    def _teacher_conversation(self, row: Mapping, text: str | None = None) -> list[dict]:
        """A chat for the teacher's server: the row's images, then ``text`` (default: the student's plain prompt)."""
        return self.dataset_format.chat(row, text, self.args.closer)

    def _grade_many(self, rows: Sequence[Mapping], texts: Sequence[Sequence[str]]) -> list[list[bool]]:
        """Grade teacher rollouts with the trainer's own reward functions (sync or async, as TRL allows):
        ``texts[i]`` are replies to ``rows[i]``'s question. Every reply goes in one call per function, as TRL
        scores a round, so that a judge answers them all concurrently rather than one question at a time."""
        reply_rows = [row for row, replies in zip(rows, texts, strict=True) for _ in replies]
        if not reply_rows:
            return [[] for _ in rows]
        prompts = [self._with_prompt(row)["prompt"] for row in rows]
        completions = [[{"role": "assistant", "content": t}] for replies in texts for t in replies]
        prompts, completions = self.dataset_format.for_rewards(prompts, completions)  # as TRL would give them
        names = dict.fromkeys(name for row in rows for name in row if name != "prompt")
        columns = {name: [row.get(name) for row in reply_rows] for name in names}
        total = torch.zeros(len(reply_rows), dtype=torch.float64)
        for func, weight in zip(self.reward_funcs, self.reward_weights.tolist()):
            scores = func(
                prompts=[prompt for prompt, replies in zip(prompts, texts) for _ in replies],
                completions=completions,
                completion_ids=None,
                trainer_state=self.state,
                log_extra=lambda *a, **k: None,
                log_metric=lambda *a, **k: None,
                **columns,
            )
            if is_async_callable(func):  # TRL runs async reward functions on its own event-loop thread
                scores = asyncio.run_coroutine_threadsafe(scores, self.async_loop).result()
            total += weight * torch.tensor([0.0 if s is None else float(s) for s in scores], dtype=torch.float64)
        correct = iter(bool(score > CORRECT) for score in total)
        return [[next(correct) for _ in replies] for replies in texts]

    def _generate_round(self, groups: Sequence[Group], round_name: str, metrics: dict) -> Round:
        """Generate and score ``num_generations`` rollouts per group on this rank (TRL's generation and
        scoring), timed, its prompt lengths checked. Unscorable rollouts count as wrong."""
        G = self.num_generations
        t0 = time.perf_counter()
        rows = [self._with_prompt(g.row, g.block) for g in groups for _ in range(G)]
        with self._round_in_flight(
            RoundRequest(
                response_prefixes=[g.response_prefix for g in groups for _ in range(G)],
                old_logps=not self.defers_old_logps,
            )
        ) as request:
            batch = super()._generate_and_score_completions(rows)
        for (
            name
        ) in TOKEN_TYPE_FIELDS:  # widths as the prompts with their prefixes (see _get_per_token_logps_and_entropies)
            if name in batch and batch[name].size(1) != batch["prompt_ids"].size(1) + batch["completion_ids"].size(1):
                batch[name] = self._token_types(torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1))
        groups_per_rank = self.ranks.gather([(g.kind, g.row[data.ID]) for g in groups])
        unscorable = torch.isnan(request.rewards)
        real = torch.tensor(
            [kind != FILLER for rank_groups in groups_per_rank for kind, _ in rank_groups]
        ).repeat_interleave(G)
        self.counters["unscorable_total"] += int((unscorable & real).sum())
        groups_per_rank, left_out = _without_unscored(groups_per_rank, unscorable, G)
        metrics["unscored_groups"] = metrics.get("unscored_groups", 0) + left_out
        rewards = torch.nan_to_num(request.rewards, nan=0.0)
        metrics[f"time/{round_name}_generation_s"] = time.perf_counter() - t0
        self._check_context(batch, groups, round_name, metrics)
        return Round(batch, rewards, request.texts, groups_per_rank, request.rewards_per_func)

    def _check_context(self, batch: Mapping, groups: Sequence[Group], round_name: str, metrics: dict) -> None:
        """Log the round's longest prompt; warn about prompts that leave the student's context
        (``vllm_max_model_length``) less than ``max_completion_length`` to generate."""
        args, G = self.args, self.num_generations
        lengths = batch["prompt_mask"].sum(1)[::G].tolist()  # one prompt per group
        # a response prefix ends the generation prompt but shares max_completion_length: not prompt here
        lengths = [n - len(g.response_prefix or ()) for n, g in zip(lengths, groups) if g.kind != FILLER]
        context = args.vllm_max_model_length
        over = sum(n + args.max_completion_length > context for n in lengths) if context else 0
        longest, over = self.ranks.largest(max(lengths, default=0)), self.ranks.total(over)
        metrics[f"{round_name}_prompt_tokens_max"] = longest
        metrics["prompts_over_context"] = metrics.get("prompts_over_context", 0) + over
        if self.rollouts_on_server and context:  # see _generate_single_turn
            sent = batch["prompt_mask"].sum(1)[::G].tolist()
            mine = [g.row[data.ID] for n, g in zip(sent, groups) if g.kind != FILLER and n >= context]
            unserved = [key for rank_keys in self.ranks.gather(mine) for key in rank_keys]
            metrics["prompts_beyond_context"] = metrics.get("prompts_beyond_context", 0) + len(unserved)
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
                args.max_completion_length,
                context,
                longest,
            )

    def _augmented_round(self, built: BuiltGroups, most_built: int, filler_row: Mapping, metrics: dict) -> Round:
        """Step 5, second half: one student group per built instance, ranks padded with fillers."""
        if not most_built:
            return empty_round(self.ranks.world)
        groups = [Group(g.kind, self._row(g.key), g.block, g.response_prefix) for g in built.groups]
        groups += [Group(FILLER, filler_row)] * (most_built - len(groups))
        return self._generate_round(groups, "reformulated", metrics)

    def _target_round(self, built: BuiltGroups, filler_row: Mapping, metrics: dict) -> Round:
        """The target rows' step 5: every rank's targets teacher-forced through TRL's scoring (nothing is
        sampled), each rank padded with filler rows to an equal multiple of G.

        A target is its response's tokens and EOS; one longer than ``max_completion_length`` is cut
        there, without EOS, like a rollout that ran out of room (counted in ``targets_cut``).
        The round's ``groups_per_rank`` holds every rank's ``(kind, key)`` per row.
        """
        G, limit = self.num_generations, self.args.max_completion_length
        rows, responses, row_keys, cut = [], [], [], 0
        for group in built.groups:
            ids = self._tokenizer(group.target, add_special_tokens=False)["input_ids"]
            cut += len(ids) >= limit
            rows.append(self._with_prompt(self._row(group.key), group.block))
            responses.append(ids[:limit] if len(ids) >= limit else [*ids, self.eos_token_ids[0]])
            row_keys.append((group.kind, group.key))
        most_rows = self.ranks.largest(len(rows))
        metrics["targets_cut"] = self.ranks.total(cut)
        if not most_rows:
            return empty_round(self.ranks.world)
        fillers = math.ceil(most_rows / G) * G - len(rows)
        rows += [self._with_prompt(filler_row)] * fillers
        responses += [[self.eos_token_ids[0]]] * fillers
        row_keys += [(FILLER, filler_row[data.ID])] * fillers
        t0 = time.perf_counter()
        with self._round_in_flight(RoundRequest(given_responses=responses, old_logps=not self.defers_old_logps)):
            batch = super()._generate_and_score_completions(rows)
        metrics["time/target_scoring_s"] = time.perf_counter() - t0
        return Round(concat_batches([batch], self._tokenizer.pad_token_id), None, [], self.ranks.gather(row_keys))


def _without_unscored(
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
