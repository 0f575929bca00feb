"""`ZPPOTrainer`: Algorithm 1 of the paper inside TRL's `GRPOTrainer`.

One rollout step (every ``num_partitions * gradient_accumulation_steps`` micro-steps):

1. ``X = X_new + X_replay``: the dataloader's new questions, plus
   ``min(replay_fraction * |X_new|, |B|)`` buffer residents drawn before the refresh.
2. Teacher sampling for every question of ``X`` starts (a Future) ...
3. ... while the student's plain rollouts are generated and scored by TRL.
   Pre-cap (:func:`select_hard`) on the gathered plain accuracies.
4. The teacher's replies are collected and graded, with the wrong plain rollouts of the
   hard questions (:class:`~zppo_trl.augmentation.Evidence`).
5. The trainer's :class:`~zppo_trl.augmentation.Augmentation` plans and post-caps its
   instances and builds them (ZPPO's :class:`~zppo_trl.augmentation.CandidateReformulation`:
   BCQ/NCQ, only their candidates compressed); the student samples a group on every built
   prompt (question + image(s) + block + closer), and TRL scores them like any group.
   Teacher text is only ever prompt.
6. All groups are split, intact, into ``num_partitions`` optimizer mini-batches;
   advantages are two-step per partition; a partition without a non-trivial group
   makes no update at all (no forward, no backward, no optimizer state change). The
   policy objective is ``policy_objective``'s (:meth:`ZPPOTrainer._compute_loss`).
7. The buffer is refreshed from the plain groups only.

The paper's comparison rows (docs/comparison_rows.md) run the same step and change only
what the paper changes: another :class:`~zppo_trl.augmentation.Augmentation` in step 5
(Hint, Prefix; the supervised Correction-SFT and Error-reflection-SFT, whose verified
targets are teacher-forced and fitted with cross-entropy instead of RL), another objective
in step 6 (``policy_objective``), or, for Off-/On-Distill, steps 4-6 replaced by GKD's JSD
against a teacher loaded next to the student (:mod:`zppo_trl.distill`).

Distributed runs: every decision (replay draw, ranking, caps, planning, partitioning,
buffer) is computed from gathered data with the same seeded ``random.Random`` on every
rank. Replay groups and BCQ/NCQ instances are dealt round-robin over ranks; a rank
short of one group generates a *filler* group (never trained, never counted) so that
every rank scores equal row counts, and optimizer mini-batches are padded with
zero-weight rows to equal sizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import random
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer
from trl.models import prepare_deepspeed, prepare_fsdp
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl.trainer.utils import is_async_callable

from . import data
from .advantages import nontrivial_groups, partition_groups, two_step_advantages
from .batches import concat_batches, select_rows
from .callbacks import QuietProgressCallback, RolloutSummaryCallback
from .config import ZPPOConfig
from .model_card import PAPER_CITATION, PAPER_TITLE, CardFacts, render_model_card
from .augmentations import Augmentation, BuiltGroup, BuiltGroups, Evidence, make_augmentation
from .distill import completion_logits, generalized_jsd, load_distill_teacher
from .objectives import cispo_weight_bound, dispo_outside, dispo_per_token_loss
from .prompts import compose_prompt
from .reformulate import augment_limit, select_hard
from .replay import PromptReplayBuffer, replay_count
from .rewards import boxed_accuracy_reward, completion_text
from .teacher import TeacherClient

__all__ = ["ZPPOTrainer", "ZPPO_STATE_NAME"]

logger = logging.getLogger(__name__)

ZPPO_STATE_NAME = "zppo_state.json"
_SKIP = "zppo_skip"  # marks the micro-batches of an empty-signal partition
_FILLER = "filler"  # a group generated only to keep ranks' row counts equal
_TOKEN_TYPE_FIELDS = ("token_type_ids", "mm_token_type_ids")  # per-token multimodal inputs
_CORRECT = 0.5  # rewards are binary accuracies; a rollout is correct above this
# Step metrics that also keep a running total (`<name>_total`), besides each augmentation kind's
# own (`<kind>`, `<kind>_trained`, `_correct`, `_rollouts`, `_signal`).
_TOTALS = ("compression_failures", "dropped", "prompts_over_context", "skipped_partitions", "admitted", "graduated", "evicted")
_KIND_TOTALS = ("", "_trained", "_correct", "_rollouts", "_signal", "_targets")


class _Group(NamedTuple):
    """One group to sample on this rank: its kind, dataset row, prompt block (None: plain) and the
    response prefix its rollouts continue (token ids; the Prefix control only)."""

    kind: str
    row: Mapping
    block: str | None = None
    response_prefix: tuple[int, ...] | None = None


class _Round(NamedTuple):
    """One generation round: TRL's scored batch (None for no round), every rank's rewards
    (rank-major), this rank's completion texts, every rank's (kind, key) group list."""

    out: dict | None
    rewards: torch.Tensor | None
    texts: list[str]
    meta: list


class ZPPOTrainer(GRPOTrainer):
    """GRPO with ZPPO's teacher-in-the-prompt reformulations and prompt replay buffer.

    Takes `trl.GRPOTrainer`'s arguments; ``args`` must be a :class:`zppo_trl.ZPPOConfig`.

    Args:
        model: the student (a model id/path or a loaded model).
        reward_funcs: callable TRL reward functions returning binary accuracies;
            default :func:`zppo_trl.rewards.boxed_accuracy_reward`. The same functions
            grade the teacher's rollouts.
        train_dataset: a map-style dataset in the schema of :mod:`zppo_trl.data`
            (``id``, ``question`` without the closer, ``images``, ``answer``, ...). The
            trainer renders prompts itself: question (+ images), block, closer.
        teacher: a ready :class:`zppo_trl.teacher.TeacherClient`; by default one is
            built from ``args.teacher_*`` when reformulations are on (or for Off-Distill).
        distill_teacher_model: for the distillation rows, a loaded teacher for its logits
            (same tokenizer as the student); by default ``args.distill_teacher`` is loaded.
        dataset_name: how the model card names the training data (a Hub id is linked).
        model_license: the license id for the model card's metadata (the student's).
        **kwargs: any other `GRPOTrainer` argument (``processing_class``, ``callbacks``,
            ``peft_config``, ...). Pass the processor explicitly for VLM students.

    Attributes:
        replay_buffer: the :class:`PromptReplayBuffer` (saved in every checkpoint).
        counters: cumulative ZPPO counters (saved in every checkpoint).
    """

    _tag_names = ["trl", "grpo", "zppo"]
    _name = "ZPPO"
    _paper = {"title": PAPER_TITLE, "id": None, "citation": PAPER_CITATION}

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: ZPPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        *,
        teacher: TeacherClient | None = None,
        distill_teacher_model: Any = None,
        dataset_name: str | None = None,
        model_license: str | None = None,
        **kwargs: Any,
    ):
        if not isinstance(args, ZPPOConfig):
            raise TypeError(f"args must be a ZPPOConfig, got {type(args).__name__}")
        if args.fp16:
            raise ValueError("fp16 is not supported: its GradScaler cannot skip an empty-signal partition; use bf16")
        reward_funcs = boxed_accuracy_reward if reward_funcs is None else reward_funcs
        for func in reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]:
            if not callable(func) or isinstance(func, (str, torch.nn.Module)):
                raise ValueError(f"ZPPO needs verifiable rewards: reward_funcs must be plain callables, got {func!r}")
        row_of = _row_index(train_dataset)
        with _gspo_warning_expected(args):
            super().__init__(model=model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset, **kwargs)
        if args.policy_objective == "cispo":  # TRL's cispo clamps the weight at epsilon_high itself; MiniMax-M1's bound is 1 + eps_high
            self.epsilon_high = cispo_weight_bound(self.epsilon_high)  # args.epsilon_high keeps its meaning

        args.composition(self.accelerator.num_processes)  # raises unless every rank holds whole groups
        self._row_of = row_of  # id -> dataset row, for replayed questions and BCQ/NCQ prompts
        self.replay_buffer = PromptReplayBuffer(capacity=args.replay_capacity, threshold=args.hard_threshold)
        self._rng = random.Random(args.seed)  # identical on every rank: every decision is replicated
        self._admitted_at: dict[Any, float] = {}  # resident -> plain accuracy at admission (for the bin metrics)
        self.counters: dict[str, float] = defaultdict(float)
        self.dataset_name = dataset_name
        self.model_license = model_license
        self.teacher = teacher
        if self.teacher is None and (args.augmentations or args.distillation == "off"):
            self.teacher = TeacherClient.from_config(args)
        # The distillation rows' teacher, loaded next to the student for its per-token distributions.
        self.distill_teacher = self._prepare_distill_teacher(distill_teacher_model) if args.distillation else None
        # Step 5's augmentation: ZPPO's BCQ/NCQ prompts, or a comparison row's; None for GRPO†.
        self.augmentation: Augmentation | None = make_augmentation(
            args.augmentations,
            prefix_fraction=args.prefix_fraction,
            tokenizer=self._tokenizer,
            question_of=lambda key: self._row(key)[data.QUESTION],
            teacher_chat=lambda key, text: self._teacher_conversation(self._row(key), text),
            grade=lambda key, texts: self._grade(self._row(key), texts),
        )
        self._round_prefixes: list | None = None  # the response prefixes of the round being generated
        self._round_given: list | None = None  # the given responses of a supervised targets round
        self._set_up_console()

    def _prepare_distill_teacher(self, model: Any) -> Any:
        """``model`` (or ``args.distill_teacher`` loaded like the student), frozen and placed as TRL places
        its reference model; its vocabulary must cover the student's tokenizer."""
        if model is None:
            from transformers import AutoTokenizer

            if AutoTokenizer.from_pretrained(self.args.distill_teacher).get_vocab() != self._tokenizer.get_vocab():
                raise ValueError(
                    f"distill_teacher {self.args.distill_teacher} has another tokenizer than the student: the distillation rows "
                    "compare next-token distributions token by token, so teacher and student must share one"
                )
        teacher = load_distill_teacher(self.args.distill_teacher, self.model) if model is None else model.eval().requires_grad_(False)
        if teacher.get_output_embeddings().weight.size(0) < len(self._tokenizer):
            raise ValueError(
                f"distill_teacher's vocabulary ({teacher.get_output_embeddings().weight.size(0)}) is smaller than the student's tokenizer "
                f"({len(self._tokenizer)}): the distillation rows need a teacher that shares the student's tokenizer"
            )
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(teacher, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(teacher, self.accelerator)
        return self.accelerator.prepare_model(teacher, evaluation_mode=True)

    def _set_up_console(self) -> None:
        """One line per rollout step on the console; TRL's metrics dict only with ``full_console_logs``."""
        if not self.args.full_console_logs:
            if self.pop_callback(ProgressCallback) is not None:
                self.add_callback(QuietProgressCallback)
            self.pop_callback(PrinterCallback)
        self.add_callback(RolloutSummaryCallback)

    # ------------------------------------------------------------------ TRL hooks

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = list(data.COLUMNS)

    def training_step(self, model, inputs, num_items_in_batch):
        model.train()  # before generating: the rollout step reads the training mode
        start = time.perf_counter()
        batch = self._prepare_inputs(inputs)  # generates at the start of a rollout step
        self._current_train_step_time += time.perf_counter() - start  # TRL's step_time includes generation
        if not batch.get(_SKIP):
            return super().training_step(model, batch, num_items_in_batch)
        # Empty-signal partition: no forward, no backward, so every gradient stays None and the
        # optimizer step that follows leaves parameters and optimizer state untouched.
        self._step += 1
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._metrics["train"]["step_time"].append(self._current_train_step_time)
            self._current_train_step_time = 0.0
        return torch.zeros((), device=self.accelerator.device)

    def _prepare_inputs(self, generation_batch):
        if isinstance(generation_batch, Mapping):  # a micro-batch this trainer already prepared
            return generation_batch
        if not self.model.training:
            return super()._prepare_inputs([self._with_prompt(row) for row in generation_batch])
        spg = self.args.steps_per_generation
        if self._buffered_inputs is None:  # first step of this process: align with a resumed run
            self._step = self.state.global_step * self.args.gradient_accumulation_steps
            if self._step % spg:
                logger.warning(
                    "resumed at global step %d, inside a rollout step (num_partitions=%d): that step's rollouts are "
                    "regenerated and its first partitions are not trained; save checkpoints at multiples of num_partitions",
                    self.state.global_step,
                    self.args.num_partitions,
                )
        if self._step % spg == 0 or self._buffered_inputs is None:
            self._buffered_inputs = self._rollout_step(generation_batch)
        return self._buffered_inputs[self._step % spg]

    def _tokenize_prompts(self, prompts: list):
        # The Prefix control: a group's response prefix ends its generation prompt, so the student
        # continues it and no prefix token is ever sampled or trained (alg:prefix masks them all).
        prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
        prefixes = self._round_prefixes
        if prefixes and any(prefixes):
            prompt_ids = [[*ids, *(prefix or ())] for ids, prefix in zip(prompt_ids, prefixes, strict=True)]
            for name in _TOKEN_TYPE_FIELDS:  # per-token fields (Qwen3.5: mm_token_type_ids): prefix tokens are text
                if name in multimodal_fields:
                    multimodal_fields[name] = [[*types, *[0] * len(prefix or ())] for types, prefix in zip(multimodal_fields[name], prefixes, strict=True)]
        return prompt_ids, images, multimodal_fields

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, compute_aux_loss=False,
        pixel_values=None, image_grid_thw=None, num_images=None, pixel_attention_mask=None, spatial_shapes=None, num_tiles=None,
        image_sizes=None, token_type_ids=None, mm_token_type_ids=None, image_position_ids=None,
    ):  # fmt: skip
        if self._round_given is not None:  # teacher-forced targets: TRL's old log-probs of them are never read
            empty = torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device)
            return empty, (torch.zeros_like(empty) if compute_entropy else None), None
        # TRL re-derives the token types of image prompts from the prompt text, which has no response
        # prefix (the Prefix control): rebuild them from the ids when their width does not match.
        if token_type_ids is not None and token_type_ids.size(1) != input_ids.size(1):
            token_type_ids = self._token_types(input_ids)
        if mm_token_type_ids is not None and mm_token_type_ids.size(1) != input_ids.size(1):
            mm_token_type_ids = self._token_types(input_ids)
        return super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, compute_entropy=compute_entropy,
            compute_aux_loss=compute_aux_loss, pixel_values=pixel_values, image_grid_thw=image_grid_thw, num_images=num_images,
            pixel_attention_mask=pixel_attention_mask, spatial_shapes=spatial_shapes, num_tiles=num_tiles, image_sizes=image_sizes,
            token_type_ids=token_type_ids, mm_token_type_ids=mm_token_type_ids, image_position_ids=image_position_ids,
        )  # fmt: skip

    def _token_types(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Image (1) and video (2) placeholder positions of ``input_ids``, as TRL marks them for tool images."""
        types = torch.zeros_like(input_ids)
        if self._image_pad_token_id is not None:
            types[input_ids == self._image_pad_token_id] = 1
        if self._video_pad_token_id is not None:
            types[input_ids == self._video_pad_token_id] = 2
        return types

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if self._round_given is not None:  # the supervised controls' targets: given, not sampled
            return [list(ids) for ids in self._round_given], None
        # Prefix and continuation share max_completion_length (alg:prefix): a continuation is cut at
        # what its prefix leaves, which samples exactly as a shorter generation limit would.
        completion_ids, logprobs = super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        prefixes = self._round_prefixes
        if prefixes and any(prefixes):
            budget = [self.max_completion_length - len(prefix or ()) for prefix in prefixes]
            completion_ids = [list(ids)[:n] for ids, n in zip(completion_ids, budget, strict=True)]
            if logprobs is not None:
                logprobs = [list(lp)[:n] for lp, n in zip(logprobs, budget, strict=True)]
        return completion_ids, logprobs

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if self._round_given is not None:  # teacher-forced targets: already graded, never judged again (reward unused)
            rewards = torch.zeros(len(prompts) * self.accelerator.num_processes, len(self.reward_funcs), device=self.accelerator.device)
            self._round_rewards, self._round_texts = rewards.sum(dim=1).cpu().double(), []
            return rewards
        # A Prefix group's response is prefix || continuation: that is what gets graded.
        if self._round_prefixes and any(self._round_prefixes):
            completions = [
                _with_text(c, self._tokenizer.decode([*prefix, *ids], skip_special_tokens=True)) if prefix else c
                for c, ids, prefix in zip(completions, completion_ids_list, self._round_prefixes, strict=True)
            ]
        # Keep what the rollout step needs from each scoring round: the gathered rewards and
        # this rank's completion texts.
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        weighted = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
        weighted[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        self._round_rewards = weighted.detach().cpu().double()
        self._round_texts = [completion_text(c) for c in completions]
        return rewards_per_func

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        if self.args.should_save:
            with open(os.path.join(output_dir, ZPPO_STATE_NAME), "w") as f:
                json.dump(self.zppo_state_dict(), f)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, ZPPO_STATE_NAME)
        if os.path.exists(path):
            with open(path) as f:
                self.load_zppo_state_dict(json.load(f))
        else:
            logger.warning("checkpoint %s has no %s: the replay buffer and ZPPO counters start empty", checkpoint, ZPPO_STATE_NAME)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """Write ``output_dir/README.md``: the model card of this run (see :mod:`zppo_trl.model_card`).

        Replaces TRL's card, which links a local student as ``huggingface.co/None`` and cites
        TRL alone: this one names the student and dataset as given, says how the model was
        trained (variant, teacher, data, schedule, settings, final counters) and cites the paper.
        """
        if not self.is_world_process_zero():
            return
        args = self.args
        on_hub = bool(args.push_to_hub and args.hub_model_id)
        facts = CardFacts(
            model_name=model_name or (args.hub_model_id or os.path.basename(os.path.normpath(args.output_dir))).split("/")[-1],
            student=getattr(self.model.config, "_name_or_path", None) or None,
            dataset=dataset_name or self.dataset_name,
            load_from=args.hub_model_id if on_hub else args.output_dir,
            on_hub=on_hub,
            vision=getattr(self.model.config, "vision_config", None) is not None,
            license=self.model_license,
            tags=(*self._tag_names, *([tags] if isinstance(tags, str) else tags or ())),
            optimizer_steps=self.state.global_step,
        )
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "README.md"), "w") as f:
            f.write(render_model_card(args, facts, self.state.log_history))

    # ------------------------------------------------------------------ Step 6: the policy objective

    def _compute_loss(self, model, inputs):
        """Step 6's loss on one micro-batch, for ``args.policy_objective``.

        GRPO (the paper's), GSPO and CISPO are TRL's own loss: ``ZPPOConfig`` sets TRL's fields and
        ``__init__`` CISPO's weight bound. DISPO is ZPPO's
        (:func:`zppo_trl.objectives.dispo_per_token_loss`), aggregated as TRL's ``"dapo"``: a sum
        over the completion tokens divided by the partition's token count.
        """
        if self.augmentation is not None and self.augmentation.supervised:
            return self._supervised_loss(model, inputs)
        if self.distill_teacher is not None:
            return self._distill_loss(model, inputs)
        if self.args.policy_objective == "dispo":
            return self._dispo_loss(model, inputs)
        return super()._compute_loss(model, inputs)

    def _supervised_loss(self, model, inputs):
        """The supervised controls' loss: cross-entropy on the target's response tokens (prompt and tag
        tokens are prompt, so never counted), a token mean over the partition, as the RL rows' DAPO mean."""
        mode = "train" if self.model.training else "eval"
        logps, _, aux_loss = self._completion_logps(model, inputs)
        mask = inputs["completion_mask"]
        nll = -(logps * mask).sum()
        loss = nll / self._dapo_normalizer(inputs, mode)
        if self.aux_loss_enabled:  # as TRL: the MoE router's balancing loss, scaled for gradient accumulation
            loss = loss + self.router_aux_loss_coef * aux_loss / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)
        sums = self.accelerator.reduce(torch.stack([nll.detach(), mask.sum().to(nll.dtype)]), reduction="sum")
        self._metrics[mode]["sft/nll"].append((sums[0] / sums[1].clamp(min=1.0)).item())
        return loss

    def _distill_loss(self, model, inputs):
        """The distillation rows' loss: GKD's generalized JSD against the teacher at every completion
        token (:func:`zppo_trl.distill.generalized_jsd`), a token mean over the partition."""
        mode = "train" if self.model.training else "eval"
        mask = inputs["completion_mask"]
        vocab = len(self._tokenizer)
        with self.accelerator.autocast():
            student = completion_logits(model, inputs, vocab)
            with torch.no_grad():
                teacher = completion_logits(self.distill_teacher, inputs, vocab)
        normalizer = self._dapo_normalizer(inputs, mode)
        loss = generalized_jsd(student.float(), teacher.float(), mask, self.args.distill_beta, normalizer)
        sums = self.accelerator.reduce(torch.stack([(loss * normalizer).detach(), mask.sum().to(loss.dtype)]), reduction="sum")
        self._metrics[mode]["distill/jsd"].append((sums[0] / sums[1].clamp(min=1.0)).item())
        return loss

    def _dispo_loss(self, model, inputs):
        """DISPO's loss (:func:`zppo_trl.objectives.dispo_per_token_loss`), aggregated as TRL's dapo."""
        mode = "train" if self.model.training else "eval"
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        logps, entropies, aux_loss = self._completion_logps(model, inputs)
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old  # as TRL: no stored old log-probs means the sampling policy is this one
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        per_token_loss = dispo_per_token_loss(logps, old, advantages, self.args.dispo_bounds)
        loss = (per_token_loss * mask).sum() / self._dapo_normalizer(inputs, mode)
        if self.aux_loss_enabled:  # as TRL: the MoE router's balancing loss, scaled for gradient accumulation
            loss = loss + self.router_aux_loss_coef * aux_loss / (self.current_gradient_accumulation_steps if mode == "train" else 1.0)
        self._log_dispo(mode, mask.detach(), torch.exp(logps.detach() - old.detach()), advantages, entropies)
        return loss

    def _completion_logps(self, model, inputs):
        """Per-token log-probs, entropies and router aux loss of the completions, as TRL computes them."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        multimodal = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")  # fmt: skip
        return self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, inputs["completion_ids"].size(1), compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled, **{key: inputs.get(key) for key in multimodal},
        )  # fmt: skip

    def _dapo_normalizer(self, inputs, mode: str) -> torch.Tensor:
        """TRL's ``"dapo"`` divisor: ``num_items_in_batch`` rescaled to one accumulation window (ZPPO's
        micro-batches carry their partition's token count x ``num_partitions``, so it is that count)."""
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":  # in eval the batch is neither split across steps nor accumulated
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return normalizer

    def _log_dispo(self, mode: str, mask, ratio, advantages, entropies) -> None:
        """Over every rank's completion tokens: TRL's ``entropy``, and the fraction DISPO's clip stopped per
        regime, ``clip_ratio/{pos,neg}_{low,high}_mean`` (A > 0 or A < 0; weight below 1 - low or above
        1 + high), and ``clip_ratio/region_mean`` (any of the four)."""
        below, above = dispo_outside(ratio, advantages, self.args.dispo_bounds)
        pos, neg = (advantages > 0).expand_as(below), (advantages < 0).expand_as(below)
        values = {
            "entropy": entropies,
            "clip_ratio/pos_low_mean": below & pos,
            "clip_ratio/pos_high_mean": above & pos,
            "clip_ratio/neg_low_mean": below & neg,
            "clip_ratio/neg_high_mean": above & neg,
            "clip_ratio/region_mean": below | above,
        }
        sums = torch.stack([(value.detach().double() * mask).sum() for value in values.values()] + [mask.sum().double()])
        sums = self.accelerator.reduce(sums, reduction="sum")
        for name, total in zip(values, sums[:-1]):
            self._metrics[mode][name].append((total / sums[-1].clamp(min=1.0)).item())

    # ------------------------------------------------------------------ state

    def zppo_state_dict(self) -> dict:
        """The buffer, admission accuracies, counters and ZPPO's RNG state (JSON-serialisable)."""
        version, internal, gauss = self._rng.getstate()
        return {
            "buffer": self.replay_buffer.state_dict(),
            "admitted_at": [[key, r] for key, r in self._admitted_at.items()],
            "counters": dict(self.counters),
            "rng": [version, list(internal), gauss],
        }

    def load_zppo_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`zppo_state_dict` exactly."""
        self.replay_buffer.load_state_dict(state["buffer"])
        self._admitted_at = {key: r for key, r in state["admitted_at"]}
        self.counters = defaultdict(float, state["counters"])
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    # ------------------------------------------------------------------ prompts

    def _with_prompt(self, row: Mapping, block: str | None = None) -> dict:
        """The row with TRL's conversational ``prompt``: question, block, closer (images added by TRL)."""
        text = compose_prompt(row[data.QUESTION], block, self.args.closer)
        return {**row, "prompt": [{"role": "user", "content": text}]}

    def _row(self, key: Any) -> Mapping:
        """The training dataset's row of question ``key``."""
        return self.train_dataset[self._row_of[key]]

    def _teacher_conversation(self, row: Mapping, text: str | None = None) -> list[dict]:
        """A chat for the teacher's server: the row's images, then ``text`` (default: the student's plain prompt)."""
        text = compose_prompt(row[data.QUESTION], None, self.args.closer) if text is None else text
        images = row.get(data.IMAGES) or []
        if not images:
            return [{"role": "user", "content": text}]
        return [{"role": "user", "content": [*({"type": "image", "image": im} for im in images), {"type": "text", "text": text}]}]

    # ------------------------------------------------------------------ the rollout step

    def _score_round(self, groups: Sequence[_Group]) -> tuple[dict, torch.Tensor, list[str], list]:
        """Generate and score ``num_generations`` rollouts per group on this rank.

        Returns TRL's scored batch, the rewards of every rank's rollouts (gathered, rank-major),
        this rank's completion texts, and every rank's (kind, key) group list.
        """
        G = self.num_generations
        rows = [self._with_prompt(g.row, g.block) for g in groups for _ in range(G)]
        self._round_prefixes = [g.response_prefix for g in groups for _ in range(G)]
        try:
            out = super()._generate_and_score_completions(rows)
        finally:
            self._round_prefixes = None
        for name in _TOKEN_TYPE_FIELDS:  # widths as the prompts with their prefixes (see _get_per_token_logps_and_entropies)
            if name in out and out[name].size(1) != out["prompt_ids"].size(1) + out["completion_ids"].size(1):
                out[name] = self._token_types(torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1))
        meta = _gather_groups([(g.kind, g.row[data.ID]) for g in groups])
        unscorable = torch.isnan(self._round_rewards)
        real = torch.tensor([kind != _FILLER for groups_of_rank in meta for kind, _ in groups_of_rank]).repeat_interleave(G)
        self.counters["unscorable_total"] += int((unscorable & real).sum())
        rewards = torch.nan_to_num(self._round_rewards, nan=0.0)  # unscorable rollouts count as wrong
        return out, rewards, self._round_texts, meta

    def _check_context(self, out: Mapping, groups: Sequence[tuple], round_name: str, metrics: dict) -> None:
        """Log the round's longest prompt; warn about prompts that leave the student's context
        (``vllm_max_model_length``) less than ``max_completion_length`` to generate."""
        args, G = self.args, self.num_generations
        lengths = out["prompt_mask"].sum(1)[::G].tolist()  # one prompt per group
        # a response prefix ends the generation prompt but shares max_completion_length: not prompt here
        lengths = [n - len(g.response_prefix or ()) for n, g in zip(lengths, groups) if g.kind != _FILLER]
        context = args.vllm_max_model_length
        over = sum(n + args.max_completion_length > context for n in lengths) if context else 0
        longest, over = max(gather_object([max(lengths, default=0)])), sum(gather_object([over]))
        metrics[f"{round_name}_prompt_tokens_max"] = longest
        metrics["prompts_over_context"] = metrics.get("prompts_over_context", 0) + over
        if over:
            logger.warning(
                "%d %s prompt(s) leave less than max_completion_length=%d tokens to generate in the student's context "
                "(vllm_max_model_length=%d; longest prompt %d tokens): their rollouts are cut short. Start the student "
                "server with a larger --max-model-len and set vllm_max_model_length to it (see ZPPOConfig.context_lengths())",
                over, round_name, args.max_completion_length, context, longest,
            )

    def _rollout_step(self, inputs: list[dict]) -> list[dict]:
        """One rollout step of Algorithm 1; returns this rank's optimizer micro-batches."""
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        augmenting = self.augmentation is not None and bool(self.augmentation.kinds)
        distilling = self.args.distillation is not None

        # 1. X_new from the dataloader (each row repeated G times), X_replay from the buffer.
        new_keys, replay_keys, plain, fillers = self._draw_questions(inputs)
        # 2. Teacher sampling for every question of X starts now, overlapping the student's rollouts.
        sampling = (augmenting and self.augmentation.needs_teacher_rollouts) or self.args.distillation == "off"
        teacher_future = self._start_teacher_sampling(plain) if sampling else None
        # 3. Plain rollouts, scored; plain accuracy r_x per question over all ranks.
        plain_round = self._generate_round(plain, "plain", metrics)
        accuracy = _plain_accuracy(plain_round.meta, plain_round.rewards, self.num_generations, order=new_keys + replay_keys)
        # 4-6. The row's optimizer micro-batches.
        if distilling:
            micro_batches = self._distillation_batches(teacher_future, plain, fillers, plain_round, new_keys, replay_keys, metrics)
        else:
            micro_batches = self._augmented_batches(teacher_future, plain, fillers, plain_round, accuracy, new_keys, replay_keys, metrics)
        # 7. Buffer refresh from the plain groups only.
        self._refresh_buffer(accuracy, metrics)

        metrics["new"], metrics["replayed"] = len(new_keys), len(replay_keys)
        metrics["plain_accuracy"] = sum(accuracy.values()) / max(len(accuracy), 1)
        self._record_step(metrics, start)
        return micro_batches

    def _augmented_batches(self, teacher_future, plain, fillers, plain_round, accuracy, new_keys, replay_keys, metrics) -> list[dict]:
        """Steps 4-6 of ZPPO and the rows built on its step 5 (GRPO†, Hint, Prefix, the SFT controls)."""
        augmenting = self.augmentation is not None and bool(self.augmentation.kinds)
        # 4. The pre-cap; the teacher's replies collected and graded, with the wrong plain rollouts of those questions.
        limit = augment_limit(len(new_keys), self.args.augment_fraction)
        hard = select_hard(accuracy, limit, self.args.hard_threshold, rng=self._rng) if augmenting else []
        evidence = self._gather_evidence(teacher_future, plain, fillers, plain_round, hard, metrics) if augmenting else None
        # 5. Augmented instances planned (post-cap) and built.
        plan = self.augmentation.plan(evidence, limit, self._rng, metrics) if augmenting else []
        built, most = self._build_augmented(plan, metrics)
        if augmenting and self.augmentation.supervised:
            # 5-6, supervised controls: the verified targets, fitted in the partitions of their questions.
            targets = self._target_round(built, plain[0].row, metrics)
            metrics.update(self._target_metrics(plan, built))
            return self._partition_targets(targets, new_keys, replay_keys, metrics)
        # 5. The student's group on each built instance; 6. partitions, two-step advantages, padded micro-batches.
        reform_round = self._augmented_round(built, most, plain[0].row, metrics)
        batch = concat_batches([plain_round.out, reform_round.out], self._tokenizer.pad_token_id)
        micro_batches = self._partition(batch, plain_round.meta, plain_round.rewards, reform_round.meta, reform_round.rewards, metrics)
        if augmenting:
            metrics.update(self._augmentation_metrics(plan, built, reform_round))
        return micro_batches

    def _distillation_batches(self, teacher_future, plain, fillers, plain_round, new_keys, replay_keys, metrics) -> list[dict]:
        """Steps 4-6 of Off-/On-Distill (alg:offpolicy, alg:onpolicy): the sequences to imitate, each in
        its question's partition. On-Distill imitates the teacher on every student rollout; Off-Distill
        on every graded-correct teacher rollout of every question, teacher-forced (a question without
        one contributes no target)."""
        G, world, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        if self.args.distillation == "on":
            meta = [[group for group in groups for _ in range(G)] for groups in plain_round.meta]
            targets = _Round(concat_batches([plain_round.out], self._tokenizer.pad_token_id), None, [], meta)
        else:
            keys = list(dict.fromkeys(new_keys + replay_keys))
            evidence = self._gather_evidence(teacher_future, plain, fillers, plain_round, keys, metrics)
            built = BuiltGroups()
            for key in keys[rank::world]:
                built.groups += [BuiltGroup("off_distill", key, target=text) for text in evidence.teacher_correct.get(key, ())]
            metrics["distill_questions_with_target"] = sum(1 for key in keys if evidence.teacher_correct.get(key))
            targets = self._target_round(built, plain[0].row, metrics)
        return self._partition_targets(targets, new_keys, replay_keys, metrics)

    def _draw_questions(self, inputs: list[dict]) -> tuple[list, list, list[tuple[str, Mapping, None]], int]:
        """Step 1: (new keys, replay keys over all ranks, this rank's plain groups, its filler count).

        Replay draws are dealt round-robin over ranks; a rank short of one generates a filler group
        (never trained, never counted) so every rank scores equal row counts.
        """
        G, world, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        local_new = [inputs[i] for i in range(0, len(inputs), G)]
        for i, row in enumerate(local_new):
            if any(r[data.ID] != row[data.ID] for r in inputs[i * G : (i + 1) * G]):
                raise RuntimeError("the dataloader must repeat each question num_generations times in a row")
        new_keys = [key for part in gather_object([[r[data.ID] for r in local_new]]) for key in part]
        replay_keys = self.replay_buffer.sample(replay_count(len(new_keys), self.args.replay_fraction, len(self.replay_buffer)), rng=self._rng)
        mine = replay_keys[rank::world]
        fillers = math.ceil(len(replay_keys) / world) - len(mine)
        plain = [_Group("new", row) for row in local_new]
        plain += [_Group("replay", self.train_dataset[self._row_of[key]]) for key in mine]
        plain += [_Group(_FILLER, local_new[0])] * fillers
        return new_keys, replay_keys, plain, fillers

    def _start_teacher_sampling(self, plain: Sequence[tuple]) -> Any:
        """Step 2: a Future of the teacher's G_T replies to every real question of this rank."""
        args = self.args
        return self.teacher.sample_async(
            [self._teacher_conversation(g.row) for g in plain if g.kind != _FILLER],
            n=args.teacher_num_generations,
            max_tokens=args.teacher_max_tokens,
            temperature=args.teacher_temperature,
            top_p=args.teacher_top_p,
        )

    def _generate_round(self, groups: Sequence[tuple], round_name: str, metrics: dict) -> _Round:
        """One generation round (`_score_round`), timed, its prompt lengths checked."""
        t0 = time.perf_counter()
        out, rewards, texts, meta = self._score_round(groups)
        metrics[f"time/{round_name}_generation_s"] = time.perf_counter() - t0
        self._check_context(out, groups, round_name, metrics)
        return _Round(out, rewards, texts, meta)

    def _gather_evidence(self, teacher_future: Any, plain: Sequence[tuple], fillers: int, plain_round: _Round,
                         hard: Sequence, metrics: dict) -> Evidence:  # fmt: skip
        """Step 4: the teacher's replies graded, and the wrong plain rollouts, of the hard questions (all ranks)."""
        G, world, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        t0 = time.perf_counter()
        replies = _result_or_empty(teacher_future, len(plain) - fillers) if teacher_future is not None else [[] for _ in range(len(plain) - fillers)]
        metrics["time/teacher_sample_wait_s"] = time.perf_counter() - t0
        wanted = set(hard)
        local_wrong: dict[Any, list[str]] = defaultdict(list)
        local_teacher: dict[Any, list[str]] = defaultdict(list)
        rank_rewards = plain_round.rewards.view(world, -1)[rank]
        for g, (kind, row, *_) in enumerate(plain):
            key = row[data.ID]
            if kind == _FILLER or key not in wanted:
                continue
            local_wrong[key] += [plain_round.texts[i] for i in range(g * G, (g + 1) * G) if rank_rewards[i] <= _CORRECT]
            local_teacher[key] += [text for text, ok in zip(replies[g], self._grade(row, replies[g])) if ok]
        return Evidence(hard, _merge(gather_object([dict(local_teacher)])), _merge(gather_object([dict(local_wrong)])))

    def _build_augmented(self, plan: Sequence, metrics: dict) -> tuple[BuiltGroups, int]:
        """Step 5, first half: this rank's share of the instances (dealt round-robin), built; and the
        most groups any rank built (the plan is the same on every rank, so all take the same path)."""
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        local = self.augmentation.order(plan)[rank::world] if plan else []
        built = self.augmentation.build(local, self.teacher, self.args, metrics) if local else BuiltGroups()
        built_per_rank = gather_object([len(built.groups)])
        metrics["compression_failures"] = sum(gather_object([built.failures]))
        metrics["dropped"] = len(plan) - sum(gather_object([len(built.instances)]))
        for name in self.augmentation.summed_metrics if self.augmentation is not None else ():  # per-rank counts of the build
            metrics[name] = sum(gather_object([metrics.get(name, 0)]))
        return built, max(built_per_rank)

    def _augmented_round(self, built: BuiltGroups, most: int, filler_row: Mapping, metrics: dict) -> _Round:
        """Step 5, second half: one student group per built instance, ranks padded with fillers."""
        if not most:
            return _Round(None, None, [], [[] for _ in range(self.accelerator.num_processes)])
        groups = [_Group(g.kind, self.train_dataset[self._row_of[g.key]], g.block, g.response_prefix) for g in built.groups]
        groups += [_Group(_FILLER, filler_row)] * (most - len(groups))
        return self._generate_round(groups, "reformulated", metrics)

    def _target_round(self, built: BuiltGroups, filler_row: Mapping, metrics: dict) -> _Round:
        """The supervised controls' step 5: every rank's verified targets teacher-forced through TRL's
        scoring (nothing is sampled), each rank padded with filler rows to an equal multiple of G.

        A target is its response's tokens and EOS; one longer than ``max_completion_length`` is cut
        there, without EOS, like a rollout that ran out of room (counted in ``targets_cut``).
        Returns the batch, and every rank's ``(kind, key)`` per row, fillers marked ``filler``.
        """
        G, limit = self.num_generations, self.args.max_completion_length
        rows, responses, meta, cut = [], [], [], 0
        for group in built.groups:
            ids = self._tokenizer(group.target, add_special_tokens=False)["input_ids"]
            cut += len(ids) >= limit
            rows.append(self._with_prompt(self.train_dataset[self._row_of[group.key]], group.block))
            responses.append(ids[:limit] if len(ids) >= limit else [*ids, self.eos_token_ids[0]])
            meta.append((group.kind, group.key))
        most = max(gather_object([len(rows)]))
        metrics["targets_cut"] = sum(gather_object([cut]))
        if not most:
            return _Round(None, None, [], [[] for _ in range(self.accelerator.num_processes)])
        fillers = math.ceil(most / G) * G - len(rows)
        rows += [self._with_prompt(filler_row)] * fillers
        responses += [[self.eos_token_ids[0]]] * fillers
        meta += [(_FILLER, filler_row[data.ID])] * fillers
        t0 = time.perf_counter()
        self._round_given = responses
        try:
            out = super()._generate_and_score_completions(rows)
        finally:
            self._round_given = None
        metrics["time/target_scoring_s"] = time.perf_counter() - t0
        return _Round(concat_batches([out], self._tokenizer.pad_token_id), None, [], _gather_groups(meta))

    def _target_metrics(self, plan, built: BuiltGroups) -> dict:
        """Per supervised kind: instances planned, instances with a verified target, and targets (all ranks)."""
        trained, targets = (sum(gather_object([n])) for n in (len(built.instances), len(built.groups)))
        kind = self.augmentation.kinds[0]
        return {kind: len(plan), f"{kind}_trained": trained, f"{kind}_targets": targets}

    def _partition_targets(self, targets: _Round, new_keys: Sequence[Any], replay_keys: Sequence[Any], metrics: dict) -> list[dict]:
        """Deal the step's questions into ``num_partitions`` (new and replayed evenly, as the RL
        rows are packed); each target trains in its question's partition, and a partition without a
        verified target on any rank makes no update."""
        world, rank, ga = self.accelerator.num_processes, self.accelerator.process_index, self.args.gradient_accumulation_steps
        seed = self._rng.getrandbits(32)
        keys = [*new_keys, *replay_keys]
        strata = ["new"] * len(new_keys) + ["replay"] * len(replay_keys)
        split = partition_groups(list(range(len(keys))), self.args.num_partitions, rng=random.Random(seed), strata=strata)
        part_of = {keys[i]: p for p, part in enumerate(split) for i in part}
        rows = [[[i for i, (kind, key) in enumerate(targets.meta[r]) if kind != _FILLER and part_of.get(key) == p] for r in range(world)] for p in range(len(split))]
        micro_batches: list[dict] = []
        trained = skipped = 0
        for p, members in enumerate(rows):
            if not any(members):
                skipped += 1
                micro_batches += [{_SKIP: True}] * ga
                continue
            local = members[rank]
            tokens = torch.tensor(float(targets.out["completion_mask"][local].sum()), device=self.accelerator.device)
            tokens = float(self.accelerator.reduce(tokens, reduction="sum")) if world > 1 else float(tokens)
            micro_batches += self._pack_partition(targets.out, local, max(len(m) for m in members), [0.0] * len(local), tokens)
            trained += sum(len(m) for m in members)
        metrics["skipped_partitions"], metrics["targets_trained"] = skipped, trained
        return micro_batches

    def _record_step(self, metrics: dict, start: float) -> None:
        """Times and teacher counters over all ranks (the slowest rank's times, summed requests), the
        running totals, and every metric into TRL's log."""
        world = self.accelerator.num_processes
        teacher_wait = metrics.get("time/teacher_sample_wait_s", 0.0) + metrics.get("time/compression_s", 0.0)
        step_time = time.perf_counter() - start
        uses_teacher = self.teacher is not None
        stats = self.teacher.stats(reset=True) if uses_teacher else {"requests": 0, "failed": 0, "latency_mean_s": 0.0}
        local = torch.tensor([step_time, teacher_wait, stats["requests"], stats["failed"], stats["latency_mean_s"]], dtype=torch.float64)
        every = torch.stack([torch.as_tensor(x) for x in gather_object([local])]) if world > 1 else local[None]
        step_time, teacher_wait = float(every[:, 0].max()), float(every[:, 1].max())
        metrics["time/rollout_step_s"] = step_time
        metrics["time/teacher_wait_s"] = teacher_wait
        metrics["teacher_wait_fraction"] = teacher_wait / step_time if step_time else 0.0
        if uses_teacher:
            requests, failed = int(every[:, 2].sum()), int(every[:, 3].sum())
            metrics["teacher/requests"], metrics["teacher/failures"] = requests, failed
            metrics["teacher/latency_s"] = float(every[:, 4].max())
            if failed:
                logger.warning("teacher: %d of %d requests failed this step; the step continues with what came back", failed, requests)
        self.counters["rollout_steps"] += 1
        kinds = self.augmentation.kinds if self.augmentation is not None else ()
        for name in (*_TOTALS, *(kind + suffix for kind in kinds for suffix in _KIND_TOTALS if kind + suffix in metrics)):
            self.counters[f"{name}_total"] += metrics.get(name, 0)
        metrics.update({name: value for name, value in self.counters.items()})
        for name, value in metrics.items():
            self._metrics["train"][f"zppo/{name}"].append(float(value))

    def _grade(self, row: Mapping, texts: Sequence[str]) -> list[bool]:
        """Grade teacher rollouts with the trainer's own reward functions (sync or async, as TRL allows)."""
        if not texts:
            return []
        prompt = self._with_prompt(row)["prompt"]
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        columns = {k: [v] * len(texts) for k, v in row.items() if k != "prompt"}
        total = torch.zeros(len(texts), dtype=torch.float64)
        for func, weight in zip(self.reward_funcs, self.reward_weights.tolist()):
            scores = func(
                prompts=[prompt] * len(texts),
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
        return [bool(score > _CORRECT) for score in total]

    def _partition(self, batch, plain_meta, plain_rewards, reform_meta, reform_rewards, metrics) -> list[dict]:
        """Split every rank's groups into ``num_partitions`` mini-batches; advantages per partition."""
        args, G = self.args, self.num_generations
        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        partitions, ga = args.num_partitions, args.gradient_accumulation_steps
        seed = self._rng.getrandbits(32)
        # rows[r][p]: local row indices of rank r in partition p; rewards and group ids by (rank, row)
        rows: list[list[list[int]]] = []
        reward_of: dict[tuple[int, int], float] = {}
        group_of: dict[tuple[int, int], tuple[int, int]] = {}
        for r in range(world):
            rank_rewards = plain_rewards.view(world, -1)[r].tolist()
            if reform_rewards is not None:
                rank_rewards += reform_rewards.view(world, -1)[r].tolist()
            real, ids, strata = [], [], []  # fillers are never trained: left out of every partition
            for g, (kind, _key) in enumerate([*plain_meta[r], *reform_meta[r]]):
                for i in range(g * G, (g + 1) * G):
                    reward_of[(r, i)], group_of[(r, i)] = rank_rewards[i], (r, g)
                    if kind != _FILLER:
                        real.append(i)
                        ids.append(g)
                        strata.append(kind)
            split = partition_groups(ids, partitions, rng=random.Random(seed + r), strata=strata)
            rows.append([[real[j] for j in part] for part in split])

        loss_mask = batch["completion_mask"] * batch["tool_mask"] if "tool_mask" in batch else batch["completion_mask"]
        local_tokens = torch.tensor([float(loss_mask[rows[rank][p]].sum()) for p in range(partitions)], device=self.accelerator.device)
        tokens = self.accelerator.reduce(local_tokens, reduction="sum").tolist() if world > 1 else local_tokens.tolist()

        micro_batches: list[dict] = []
        skipped = 0
        trained: dict[tuple[int, int], float] = {}  # (rank, row) -> advantage, over every rank's trained rows
        for p in range(partitions):
            members = [(r, i) for r in range(world) for i in rows[r][p]]
            rewards = [reward_of[m] for m in members]
            gids = [group_of[m] for m in members]
            signal = bool(members) and bool(nontrivial_groups(rewards, gids))
            if not signal:
                skipped += 1
                micro_batches += [{_SKIP: True}] * ga
                continue
            adv = two_step_advantages(rewards, gids, args.advantage_normalization, args.advantage_epsilon).float()
            advantage_of = dict(zip(members, adv.tolist()))
            trained.update(advantage_of)
            local = rows[rank][p]
            advantages = [advantage_of[(rank, i)] for i in local]
            micro_batches += self._pack_partition(batch, local, max(len(rows[r][p]) for r in range(world)), advantages, tokens[p])
        metrics["skipped_partitions"] = skipped
        metrics.update(_advantage_stats(list(trained.values())))
        self._log_trained_advantages(trained, [len(plain_meta[0]) * G, len(reform_meta[0]) * G])
        return micro_batches

    def _pack_partition(self, batch: dict, local: list[int], most: int, advantages: list[float], tokens: float) -> list[dict]:
        """One optimizer update's ``gradient_accumulation_steps`` micro-batches of this rank's rows ``local``,
        padded with zero-weight rows to ``most`` (the largest rank's count, rounded up), so every rank
        steps alike; ``tokens`` is the partition's loss-token count over all ranks."""
        ga, partitions = self.args.gradient_accumulation_steps, self.args.num_partitions
        size = max(ga, math.ceil(most / ga) * ga)
        index = local + [local[0] if local else 0] * (size - len(local))
        advantages = advantages + [0.0] * (size - len(local))
        # TRL's dapo loss divides by num_items_in_batch / processes * grad_accum / steps_per_generation;
        # this makes the divisor the partition's own token count: a token mean per optimizer update.
        items = torch.tensor(tokens * partitions, device=self.accelerator.device)
        per_micro = size // ga
        micro_batches = []
        for m in range(ga):
            lo, hi = m * per_micro, (m + 1) * per_micro
            micro = select_rows(batch, index[lo:hi])
            micro["advantages"] = torch.tensor(advantages[lo:hi], device=micro["advantages"].device)
            padding = [j - lo for j in range(max(lo, len(local)), hi)]
            if padding:  # zero-weight padding rows: no loss tokens
                micro["completion_mask"][padding] = 0
            micro["num_items_in_batch"] = items
            micro_batches.append(micro)
        return micro_batches

    def _log_trained_advantages(self, trained: Mapping[tuple[int, int], float], rows_per_round: Sequence[int]) -> None:
        """Put the trained advantages in TRL's completions log in place of TRL's own.

        TRL logs its group-scaled advantages per scoring round (gathered, rank-major);
        ZPPO trains others (two-step, per partition). Rows that were not trained (fillers,
        empty-signal partitions) get 0.
        """
        world = self.accelerator.num_processes
        ours, offset = [], 0
        for rows in rows_per_round:
            ours += [trained.get((r, offset + i), 0.0) for r in range(world) for i in range(rows)]
            offset += rows
        logged = self._logs["advantages"]
        keep = min(len(ours), len(logged))
        for _ in range(keep):
            logged.pop()
        logged.extend(ours[len(ours) - keep :])

    def _refresh_buffer(self, accuracy: Mapping[Any, float], metrics: dict) -> None:
        events = self.replay_buffer.update(accuracy)
        bins = _admission_bins(self.num_generations, self.args.hard_threshold)
        for key in events.admitted:
            self._admitted_at[key] = accuracy[key]
        for name in ("admitted", "graduated", "evicted", "retained"):
            metrics[name] = len(getattr(events, name))
        for name, keys in (("admitted", events.admitted), ("graduated", events.graduated)):
            counts = dict.fromkeys(bins, 0)
            for key in keys:
                label = _bin_label(self._admitted_at.get(key, accuracy[key]), self.num_generations)
                if label in counts:
                    counts[label] += 1
            for label, count in counts.items():
                metrics[f"{name}_bin_{label}"] = count
                self.counters[f"{name}_bin_{label}_total"] += count
        for key in events.graduated + events.evicted:
            self._admitted_at.pop(key, None)
        metrics["buffer_size"] = len(self.replay_buffer)

    def _augmentation_metrics(self, plan, built: BuiltGroups, reform_round: _Round) -> dict:
        """Per kind: instances planned and trained, in-prompt accuracy and groups with signal (all
        ranks); then the augmentation's own audit (e.g. BCQ's candidate match), summed over ranks."""
        G, world = self.num_generations, self.accelerator.num_processes
        out: dict[str, float] = {}
        for kind in self.augmentation.kinds:
            hits = total = signal = 0
            for r in range(world):
                for g, (k, _key) in enumerate(reform_round.meta[r]):
                    if k == kind:
                        correct = int((reform_round.rewards.view(world, -1)[r, g * G : (g + 1) * G] > _CORRECT).sum())
                        hits, total, signal = hits + correct, total + G, signal + int(0 < correct < G)
            out[kind] = sum(1 for inst in plan if inst.kind == kind)
            out[f"{kind}_trained"] = total // G
            out[f"{kind}_accuracy"] = hits / total if total else 0.0
            out[f"{kind}_correct"], out[f"{kind}_rollouts"], out[f"{kind}_signal"] = hits, total, signal
        counts = self.augmentation.audit_counts(built.instances, reform_round.texts, G)
        if counts and world > 1:
            summed = self.accelerator.reduce(torch.tensor(list(counts.values()), dtype=torch.float64, device=self.accelerator.device), reduction="sum")
            counts = dict(zip(counts, summed.cpu().tolist()))
        out.update(self.augmentation.audit_metrics(counts))
        return out


# ---------------------------------------------------------------------- helpers


def _row_index(dataset: Any) -> dict[Any, int]:
    """Check ``dataset`` against the trainer's needs; return its ``{id: row}`` index."""
    if dataset is None:
        raise ValueError("ZPPOTrainer needs a train_dataset")
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "column_names") or not hasattr(dataset, "__len__"):
        raise ValueError("train_dataset must be a map-style datasets.Dataset: replayed questions are looked up by id")
    missing = [c for c in (data.ID, data.QUESTION, data.ANSWER, data.IMAGES) if c not in dataset.column_names]
    if missing:
        raise ValueError(f"train_dataset is missing column(s) {missing}; expected the schema of zppo_trl.data {list(data.COLUMNS)}")
    seen: dict[Any, int] = {}
    for i, key in enumerate(dataset[data.ID]):
        if key in seen:
            raise ValueError(f"train_dataset rows {seen[key]} and {i}: duplicate id {key!r}; ids key the replay buffer and must be unique")
        seen[key] = i
    return seen


def _with_text(completion: Any, text: str) -> Any:
    """``completion`` (a string, or TRL's conversational ``[{"role": "assistant", ...}]``) with ``text``."""
    if isinstance(completion, str):
        return text
    return [{**completion[0], "content": text}, *completion[1:]]


@contextlib.contextmanager
def _gspo_warning_expected(args: ZPPOConfig):
    """Drop TRL's construction-time warning that a sequence-level ratio under ``loss_type="dapo"``
    weights each rollout by its length (it points to ``loss_type="grpo"``): ZPPO's GSPO keeps DAPO's
    token aggregation on purpose, as tab:appendix:backbones does ("every other setting follows
    tab:appendix:hyperparameters"). Any other warning, and every other objective's, passes."""
    trl_logger = logging.getLogger(GRPOTrainer.__module__)

    def expected(record: logging.LogRecord) -> bool:
        # accelerate's logger prefixes the rank ("[RANK 0] "), hence `in`
        return not (args.policy_objective == "gspo" and "When using `importance_sampling_level='sequence'`" in record.getMessage())

    trl_logger.addFilter(expected)
    try:
        yield
    finally:
        trl_logger.removeFilter(expected)


def _gather_groups(local: list[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
    """Every rank's (kind, key) group list, indexed by rank."""
    return [list(part) for part in gather_object([local])]


def _plain_accuracy(meta: list[list[tuple[str, Any]]], rewards: torch.Tensor, G: int, order: Sequence[Any]) -> dict:
    """``{key: r_x}`` over the plain groups of all ranks, pooled per key, in ``X`` order (new, then replay)."""
    sums: dict[Any, float] = defaultdict(float)
    counts: dict[Any, int] = defaultdict(int)
    offset = 0
    for groups in meta:
        for kind, key in groups:
            if kind != _FILLER:
                sums[key] += float(rewards[offset : offset + G].sum())
                counts[key] += G
            offset += G
    return {key: min(max(sums[key] / counts[key], 0.0), 1.0) for key in dict.fromkeys(order)}


def _merge(parts: Sequence[Mapping[Any, list]]) -> dict[Any, list]:
    merged: dict[Any, list] = defaultdict(list)
    for part in parts:
        for key, values in part.items():
            merged[key].extend(values)
    return dict(merged)


def _result_or_empty(future, count: int, single: bool = False) -> list:
    """A teacher Future's result; on an unexpected error, an empty result (logged), never a crash."""
    try:
        return future.result()
    except Exception as err:  # noqa: BLE001 - an outage must degrade the step, not stop training
        logger.warning("teacher request failed (%s); continuing without it", err)
        return [None] * count if single else [[] for _ in range(count)]


def _advantage_stats(values: Sequence[float]) -> dict[str, float]:
    """``advantages/*`` over the rollouts an optimizer update trained (fillers and padding excluded)."""
    t = torch.tensor(values or [0.0], dtype=torch.float64)  # nothing trained: zeros, so every step logs every key
    return {
        "advantages/trained_rollouts": len(values),
        "advantages/mean": float(t.mean()),
        "advantages/std": float(t.std(unbiased=False)),
        "advantages/min": float(t.min()),
        "advantages/max": float(t.max()),
        "advantages/nonzero_fraction": float((t != 0).double().mean()),
        "positive_advantage_fraction": float((t > 0).double().mean()),
    }


def _admission_bins(G: int, threshold: float) -> list[str]:
    """Plain-accuracy bins of hard questions at group size G: 0/G, 1/G, ... below the threshold."""
    return [f"{k}of{G}" for k in range(G + 1) if k / G < threshold]


def _bin_label(r: float, G: int) -> str:
    return f"{math.floor(r * G + 1e-9)}of{G}"
