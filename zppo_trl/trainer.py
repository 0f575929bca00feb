"""`ZPPOTrainer`: Algorithm 1 of the paper ("one executed ZPPO training step") inside TRL's `GRPOTrainer`.

One rollout step (every ``num_partitions * gradient_accumulation_steps`` micro-steps) runs these stages,
each a method of explicit inputs and outputs (:meth:`ZPPOTrainer._rollout_step`):

1. Draw: the dataloader's new questions, plus ``min(replay_fraction * |X_new|, |B|)`` buffer residents
   drawn before the refresh (:func:`zppo_trl.rollout.draw_questions`).
2. Teacher sampling for every question starts (a Future) ...
3. ... while the student's plain rollouts are generated and scored by TRL (a plain round).
4. Pre-cap: the hardest questions (:func:`zppo_trl.reformulate.select_hard`); the teacher's replies to
   them are graded and put with the student's wrong rollouts as evidence.
5. The augmentation plans, post-caps and builds its prompts (ZPPO: BCQ and NCQ, only the selected
   candidates compressed; :mod:`zppo_trl.augmentations`), and the student samples a group on each
   (an augmented round). Teacher text is only ever prompt.
6. Every group is dealt, intact, into ``num_partitions`` optimizer mini-batches with two-step advantages
   per partition (:mod:`zppo_trl.partitioning`); a partition without a learning signal makes no update.
   Each micro-batch's loss is the registered loss of the configuration (:mod:`zppo_trl.losses`).
7. The buffer is refreshed from the plain groups only.

The paper's comparison rows run the same step and change only what the paper changes: another
augmentation in step 5 (Hint, Prefix; the supervised Correction-SFT and Error-reflection-SFT, whose
verified targets are teacher-forced and fitted with cross-entropy), another loss in step 6
(``policy_objective``), or, for Off-/On-Distill, steps 4-6 replaced by GKD's JSD against a teacher
loaded next to the student (:mod:`zppo_trl.distill`).

Distributed runs: every decision is computed from gathered data with the same seeded ``random.Random``
on every rank (:mod:`zppo_trl.ranks`). Replay groups and built instances are dealt round-robin over
ranks; a rank short of one group generates a *filler* group (never trained, never counted) so that every
rank scores equal row counts, and optimizer mini-batches are padded with zero-weight rows to equal sizes.
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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from accelerate.utils import is_peft_model
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import GRPOTrainer
from trl.models import prepare_deepspeed, prepare_fsdp
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import is_async_callable, nanmax, nanmin

from . import data, host_memory
from .augmentations import Augmentation, BuiltGroup, BuiltGroups, Evidence, make_augmentation, teacher_results
from .backbones import backbone_family
from .batches import (
    TOKEN_TYPE_FIELDS,
    concat_batches,
)
from .callbacks import EMAReferenceCallback, QuietProgressCallback, RolloutSummaryCallback
from .config import ZPPOConfig
from .distill import (
    DistillInputs,
    TeacherTopK,
    chosen_token_logps,
    completion_states,
    frozen_distill_teacher,
)
from .evaluation.condition import CONDITION_KEY, record_condition
from .lm_head import score_loss_positions, use_full_logits
from .losses import LossInputs, LossOutput, loss_for
from .model_card import PAPER_CITATION, PAPER_TITLE, CardFacts, render_model_card
from .optim import ANYPRECISION_OPTIM, AnyPrecisionAdamW, anyprecision_kwargs
from .packing import batch_refusal, model_refusal, pack
from .partitioning import deal_targets, is_skipped, policy_partitions
from .prefetch import BatchLookahead, PrefetchedSampling, joined_futures
from .prompts import compose_prompt
from .ranks import Ranks
from .reformulate import augment_limit, select_hard
from .replay import PromptReplayBuffer, replay_count
from .rewards import boxed_accuracy_reward, completion_text
from .rollout import (
    CORRECT,
    FILLER,
    Draw,
    Group,
    Round,
    RoundRequest,
    draw_questions,
    empty_round,
    merge_lists,
    plain_accuracy,
)
from .step_metrics import (
    accumulate_totals,
    admission_bins,
    advantage_stats,
    bin_label,
    kind_metrics,
    memory_metrics,
    service_metrics,
    timing_metrics,
)
from .student_copy import EMAReference
from .student_server import stand_in_for_overlong, student_generation, student_server_errors, weight_syncs
from .teacher import TeacherClient
from .teacher_scores import TEACHER_LOGPS_FIELD, TEACHER_TOPK_IDS, TEACHER_TOPK_LOGPS, attach_teacher_scores
from .terms import PlainStep, Term, TermContext
from .trace_log import TRACE_LOG_NAME, TraceLog

__all__ = ["ZPPO_STATE_NAME", "ZPPOTrainer"]

logger = logging.getLogger(__name__)

ZPPO_STATE_NAME = "zppo_state.json"
_MULTIMODAL_FIELDS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


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
            built from ``args.teacher_*`` when an augmentation is on (or for Off-Distill).
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
        # Large CPU tensors in pages of their own: freed activations leave the process (zppo_trl.host_memory)
        host_memory.keep_heap_small()
        reward_funcs = boxed_accuracy_reward if reward_funcs is None else reward_funcs
        for func in reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]:
            if not callable(func) or isinstance(func, (str, torch.nn.Module)):
                raise ValueError(f"ZPPO needs verifiable rewards: reward_funcs must be plain callables, got {func!r}")
        row_of = data.row_index(train_dataset)
        # TRL's student vLLM generation, or its server mode with weights synced through shared memory
        with _gspo_warning_expected(args), student_generation(args):
            super().__init__(
                model=model,
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=train_dataset,
                eval_dataset=eval_dataset,
                **kwargs,
            )

        args.composition(self.accelerator.num_processes)  # raises unless every rank holds whole groups
        if args.student_family is None:  # a non-Qwen student names its row: "ZPPO (InternVL3.5-2B)"
            args.student_family = backbone_family(self.model.config.name_or_path, self.model.config.model_type)
        student = self.model.get_base_model() if is_peft_model(self.model) else self.model
        if not args.fused_lm_head:  # the reference path (zppo_trl.lm_head): TRL fuses the head unconditionally
            use_full_logits(student, self.temperature)
        else:  # TRL's PyTorch tiles would score the prompts' positions too (zppo_trl.lm_head)
            score_loss_positions(student)
        self.ranks = Ranks(self.accelerator)
        self._row_of = row_of  # id -> dataset row, for replayed questions and augmented prompts
        self.replay_buffer = PromptReplayBuffer(capacity=args.replay_capacity, threshold=args.hard_threshold)
        self._rng = random.Random(args.seed)  # identical on every rank: every decision is replicated
        self._admitted_at: dict[Any, float] = {}  # resident -> plain accuracy at admission (for the bin metrics)
        # prefetch_teacher_samples: the training loop's batches, readable ahead, and the teacher's replies to the
        # next rollout step's new questions once asked for (zppo_trl.prefetch)
        self._lookahead = BatchLookahead()
        self._prefetched: PrefetchedSampling | None = None
        self.counters: dict[str, float] = defaultdict(float)
        # audit_traces: what the trace-overlap audit reads (zppo_trl.trace_log); written by the main process
        self.trace_log = TraceLog(os.path.join(args.output_dir, TRACE_LOG_NAME)) if args.audit_traces else None
        self.dataset_name = dataset_name
        self.model_license = model_license
        self.teacher = teacher
        # The row's parts and the union of what they ask of the run (zppo_trl.row): read here, never re-derived.
        self.row = row = args.row
        # The teacher's scores of the trained rows come from its server, or from the teacher loaded next to the
        # student (its full distributions) when one is given.
        local = bool(row.needs.teacher_scores) and (distill_teacher_model is not None or row.loads_teacher)
        if self.teacher is None and (
            row.needs.teacher_samples or row.needs.teacher_requests or (row.needs.teacher_scores and not local)
        ):
            self.teacher = TeacherClient.from_config(args)
        self.distill_teacher = self._prepare_distill_teacher(distill_teacher_model) if local else None
        # The row's named terms (zppo_trl.terms), each with what the trainer offers it.
        self.terms: list[Term] = [term(args, self._term_context()) for term in row.terms]
        # Step 5's augmentation: ZPPO's BCQ/NCQ prompts, or a comparison row's; None for GRPO†.
        self.augmentation: Augmentation | None = make_augmentation(
            args.augmentations,
            prefix_fraction=args.prefix_fraction,
            tokenizer=self._tokenizer,
            question_of=lambda key: self._row(key)[data.QUESTION],
            teacher_chat=lambda key, text: self._teacher_conversation(self._row(key), text),
            grade=lambda keys, texts: self._grade_many([self._row(key) for key in keys], texts),
            answer_of=lambda key: self._row(key)[data.ANSWER],
            bcq_candidate_content=args.bcq_candidate_content,
        )
        # The condition the checkpoint is evaluated under (Correction-SFT: <correct>), in the config every
        # save and push writes, for `zppo-eval run` to apply; the other rows clear one a base model carried.
        record_condition(self.model.config, getattr(self.augmentation, "evaluation_condition", None))
        supervised = self.augmentation is not None and self.augmentation.supervised
        self.objective_loss = loss_for(args, supervised=supervised)  # step 6's loss (zppo_trl.losses)
        # The generation round in flight: what TRL's hooks read and where its scoring leaves the rewards.
        self._active_round: RoundRequest | None = None
        self._padding_free_warned: set[str] = set()  # the reasons padding_free fell back for, warned once each
        self._set_up_console()

    def _prepare_distill_teacher(self, model: Any) -> Any:
        """``model`` (or ``args.distill_teacher`` loaded like the student), frozen and placed as TRL places
        its reference model; its vocabulary must cover the student's tokenizer."""
        teacher = frozen_distill_teacher(model, self.args.distill_teacher, self.model, self._tokenizer)
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(teacher, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(teacher, self.accelerator)
        return self.accelerator.prepare_model(teacher, evaluation_mode=True)

    def _prepare_ema_copy(self, decay: float, every: int, row: str) -> EMAReference:
        """An EMA copy of the student (GRPO-CARE's reference, the self-teachers): a full copy of its weights on
        this rank's device, moved towards the student after every ``every``-th optimizer step (a callback; none
        when ``decay`` is 1, a frozen copy). FSDP and ZeRO-3 shard the weights it would copy: refused, naming the
        ``row``'s setting."""
        deepspeed = getattr(self.accelerator.state, "deepspeed_plugin", None)
        if self.is_fsdp_enabled or (deepspeed is not None and deepspeed.zero_stage == 3):
            raise ValueError(
                f"{row} keeps a full EMA copy of the student's weights on every rank, which FSDP and ZeRO-3 shard: "
                "launch it with DDP or ZeRO-2 (recipes/accelerate_configs/zero2.yaml)"
            )
        reference = EMAReference(self.model, decay, every)
        reference.model.to(self.accelerator.device)
        if decay < 1.0:
            self.add_callback(EMAReferenceCallback(reference))
        return reference

    def _ema_copies(self) -> list[tuple[str, EMAReference, str]]:
        """The run's copies of the student (the terms'), each with its checkpoint file and what it is."""
        return [copy for term in self.terms for copy in term.copies]

    def _term_context(self) -> TermContext:
        """What the trainer offers a term (zppo_trl.terms.TermContext)."""
        return TermContext(
            args=self.args,
            ranks=self.ranks,
            tokenizer=self._tokenizer,
            group_size=self.num_generations,
            temperature=self.temperature,
            rng=self._rng,
            dataset=self.train_dataset,
            row=self._row,
            teacher_chat=self._teacher_conversation,
            grade=self._grade_many,
            evidence=lambda step, keys: self._gather_evidence(
                step.teacher_future, step.draw, step.round, keys, step.metrics
            ),
            student_copy=self._prepare_ema_copy,
            judge=lambda: TeacherClient.from_config(self.args, role="judge"),
            teacher=self.teacher,
            distill_teacher=self.distill_teacher,
            tokenize_prompts=lambda conversations: self._tokenize_prompts(conversations)[0],
            token_types=self._token_types,
            autocast=self.accelerator.autocast,
        )

    def _set_up_console(self) -> None:
        """One line per rollout step on the console; TRL's metrics dict only with ``full_console_logs``."""
        if not self.args.full_console_logs:
            if self.pop_callback(ProgressCallback) is not None:
                self.add_callback(QuietProgressCallback)
            self.pop_callback(PrinterCallback)
        self.add_callback(RolloutSummaryCallback)

    @property
    def rollouts_on_server(self) -> bool:
        """Whether the student's rollouts come from a vLLM server (TRL's server mode), whose context and
        availability the rollout step must then respect (zppo_trl.student_server)."""
        return bool(self.use_vllm and self.vllm_mode == "server")

    @property
    def defers_old_logps(self) -> bool:
        """Whether a rollout step's old log-probs wait for its micro-batches (``defer_old_logps``); LENS reads
        every rollout's at scoring time, so it keeps TRL's schedule."""
        return self.args.defer_old_logps and not self.row.needs.sampling_logps_at_scoring

    @property
    def _augmenting(self) -> bool:
        return self.augmentation is not None and bool(self.augmentation.kinds)

    # ------------------------------------------------------------------ TRL hooks: the training loop

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = list(data.COLUMNS)

    def training_step(self, model, inputs, num_items_in_batch):
        model.train()  # before generating: the rollout step reads the training mode
        start = time.perf_counter()
        batch = self._prepare_inputs(inputs)  # generates at the start of a rollout step
        self._current_train_step_time += time.perf_counter() - start  # TRL's step_time includes generation
        if not is_skipped(batch):
            loss = super().training_step(model, batch, num_items_in_batch)
            # glibc maps a large tensor only when its heap has no free chunk to hold it, and decoding leaves
            # such chunks (zppo_trl.host_memory): what this micro-batch freed there goes back to the system
            host_memory.release_free_heap()
            return loss
        # A partition without a learning signal: no forward, no backward, so every gradient stays None
        # and the optimizer step that follows leaves parameters and optimizer state untouched.
        self._step += 1
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._metrics["train"]["step_time"].append(self._current_train_step_time)
            self._current_train_step_time = 0.0
        return torch.zeros((), device=self.accelerator.device)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        # The epoch's batches pass through a lookahead so that a rollout step can read the next one's
        # (prefetch_teacher_samples); the loop still gets every batch, in order.
        if self._lookahead.source is not epoch_iterator:  # a new epoch
            self._lookahead = BatchLookahead(epoch_iterator)
        return super().get_batch_samples(self._lookahead, num_batches, device)

    def _prepare_inputs(self, generation_batch):
        if isinstance(generation_batch, Mapping):  # a micro-batch this trainer already prepared
            return generation_batch
        if not self.model.training:
            return super()._prepare_inputs([self._with_prompt(row) for row in generation_batch])
        steps_per_generation = self.args.steps_per_generation
        if self._buffered_inputs is None:  # first step of this process: align with a resumed run
            self._step = self.state.global_step * self.args.gradient_accumulation_steps
            if self._step % steps_per_generation:
                logger.warning(
                    "resumed at global step %d, inside a rollout step (num_partitions=%d): that step's rollouts are "
                    "regenerated and its first partitions are not trained; save checkpoints at multiples of "
                    "num_partitions",
                    self.state.global_step,
                    self.args.num_partitions,
                )
        if self._step % steps_per_generation == 0 or self._buffered_inputs is None:
            self._buffered_inputs = self._rollout_step(generation_batch)
        return self._buffered_inputs[self._step % steps_per_generation]

    # ------------------------------------------------------------------ TRL hooks: inside one generation round

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

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        pixel_values=None,
        image_grid_thw=None,
        num_images=None,
        pixel_attention_mask=None,
        spatial_shapes=None,
        num_tiles=None,
        image_sizes=None,
        token_type_ids=None,
        mm_token_type_ids=None,
        image_position_ids=None,
    ):
        # TRL's signature, spelled out (tests/test_trl_coupling.py compares it with the installed TRL's)
        multimodal = dict(
            pixel_values=pixel_values,
            image_grid_thw=image_grid_thw,
            num_images=num_images,
            pixel_attention_mask=pixel_attention_mask,
            spatial_shapes=spatial_shapes,
            num_tiles=num_tiles,
            image_sizes=image_sizes,
            token_type_ids=token_type_ids,
            mm_token_type_ids=mm_token_type_ids,
            image_position_ids=image_position_ids,
        )
        request = self._active_round
        if request is not None and not request.old_logps:  # TRL's old log-probs: see _attach_old_logps
            return None, None, None
        if request is not None and request.given_responses is not None:
            # Teacher-forced targets: TRL's old log-probs of them are never read (the SFT and JSD losses).
            empty = torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device)
            return empty, (torch.zeros_like(empty) if compute_entropy else None), None
        # TRL re-derives the token types of image prompts from the prompt text, which has no response
        # prefix (the Prefix control): rebuild them from the ids when their width does not match.
        for name in TOKEN_TYPE_FIELDS:
            if multimodal.get(name) is not None and multimodal[name].size(1) != input_ids.size(1):
                multimodal[name] = self._token_types(input_ids)
        batch_size = batch_size or input_ids.size(0)
        if self.args.padding_free:  # the paper's "Padding-free training" (zppo_trl.packing)
            present = sorted(name for name, value in multimodal.items() if value is not None)
            refusal = model_refusal(self.accelerator.unwrap_model(model).config) or (
                f"the batch carries multimodal inputs ({', '.join(present)})" if present else None
            )
            if refusal is None:
                return self._packed_logps(
                    model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss
                )
            self._count_padded(model, refusal, math.ceil(input_ids.size(0) / batch_size))
        return super()._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=batch_size,
            compute_entropy=compute_entropy,
            compute_aux_loss=compute_aux_loss,
            **multimodal,
        )

    def _packed_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, aux):
        """TRL's per-token log-probs, entropies and MoE balancing loss, each chunk of ``batch_size`` rows run
        as one packed row (:func:`zppo_trl.packing.pack`); a chunk that cannot be packed runs padded."""
        logps, entropies, aux_losses = [], [], []
        for start in range(0, input_ids.size(0), batch_size):
            ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
            refusal = batch_refusal(mask, logits_to_keep)
            if refusal is not None:
                self._count_padded(model, refusal, 1)
                chunk = super()._get_per_token_logps_and_entropies(
                    model, ids, mask, logits_to_keep, compute_entropy=compute_entropy, compute_aux_loss=aux
                )
            else:
                packed = pack(ids, mask, logits_to_keep)
                with self.accelerator.autocast():  # no attention mask: the position ids separate the rows
                    out = model(
                        input_ids=packed.input_ids,
                        position_ids=packed.position_ids,
                        labels=packed.labels,
                        fused_lm_head=True,
                        **({"output_router_logits": True} if aux else {}),
                    )
                entropy = packed.unpack(out.entropy) if compute_entropy else None
                chunk = packed.unpack(out.log_probs), entropy, out.aux_loss if aux else None
            logps.append(chunk[0])
            entropies.append(chunk[1])
            aux_losses.append(chunk[2])
        return (
            torch.cat(logps),
            torch.cat(entropies) if compute_entropy else None,
            torch.stack(aux_losses).mean() if aux else None,
        )

    def _count_padded(self, model, reason: str, micro_batches: int) -> None:
        """Count micro-batches that ``padding_free`` could not pack (``zppo/padded_micro_batches_total``,
        this rank's), warning once per reason: they run padded, never packed wrongly."""
        self.counters["padded_micro_batches_total"] += micro_batches
        if reason not in self._padding_free_warned:
            self._padding_free_warned.add(reason)
            model_type = self.accelerator.unwrap_model(model).config.get_text_config().model_type
            logger.warning("padding_free: %s micro-batches run padded: %s", model_type, reason)

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
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if request is not None:  # hand the round its gathered weighted rewards and this rank's texts
            weighted = (rewards_per_func * self.reward_weights.to(rewards_per_func.device).unsqueeze(0)).nansum(dim=1)
            weighted[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
            request.rewards = weighted.detach().cpu().double()
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

    # ------------------------------------------------------------------ TRL hooks: the optimizer

    @staticmethod
    def get_optimizer_cls_and_kwargs(args, model=None):
        """transformers' choice of optimizer, except that ``optim="adamw_anyprecision"`` builds ours.

        The paper trains with AnyPrecisionAdamW (bf16 optimizer state); transformers would import it from
        torchdistx, which cannot be installed here, so :class:`zppo_trl.optim.AnyPrecisionAdamW` takes its
        place with transformers' keyword arguments (lr, betas, eps from ``args``; ``optim_args`` parsed
        by :func:`zppo_trl.optim.anyprecision_kwargs`). ``create_optimizer`` still builds the parameter
        groups and their weight decay; every other ``optim`` is transformers' own.
        """
        if args.optim == ANYPRECISION_OPTIM:
            kwargs = {
                "lr": args.learning_rate,
                "betas": (args.adam_beta1, args.adam_beta2),
                "eps": args.adam_epsilon,
                **anyprecision_kwargs(args.optim_args),
            }
            return AnyPrecisionAdamW, kwargs
        return GRPOTrainer.get_optimizer_cls_and_kwargs(args, model)

    # ------------------------------------------------------------------ TRL hooks: checkpoints and card

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        if self.args.should_save:
            with open(os.path.join(output_dir, ZPPO_STATE_NAME), "w") as f:
                json.dump(self.zppo_state_dict(), f)
            for name, copy, _what in self._ema_copies():  # EMA weights, for an exact resume
                torch.save(copy.state_dict(), os.path.join(output_dir, name))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        path = os.path.join(checkpoint, ZPPO_STATE_NAME)
        if os.path.exists(path):
            with open(path) as f:
                self.load_zppo_state_dict(json.load(f))
        else:
            logger.warning(
                "checkpoint %s has no %s: the replay buffer and ZPPO counters start empty", checkpoint, ZPPO_STATE_NAME
            )
        for name, copy, what in self._ema_copies():
            path = os.path.join(checkpoint, name)
            if os.path.exists(path):
                copy.load_state_dict(torch.load(path, map_location=self.accelerator.device))
            else:
                logger.warning("checkpoint %s has no %s: %s restarts from the resumed weights", checkpoint, name, what)
                copy.load_state_dict(self.model.state_dict())

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
            model_name=model_name
            or (args.hub_model_id or os.path.basename(os.path.normpath(args.output_dir))).split("/")[-1],
            student=getattr(self.model.config, "_name_or_path", None) or None,
            dataset=dataset_name or self.dataset_name,
            load_from=args.hub_model_id if on_hub else args.output_dir,
            on_hub=on_hub,
            vision=getattr(self.model.config, "vision_config", None) is not None,
            license=self.model_license,
            tags=(*self._tag_names, *([tags] if isinstance(tags, str) else tags or ())),
            optimizer_steps=self.state.global_step,
            evaluation_condition=getattr(self.model.config, CONDITION_KEY, None),
        )
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, "README.md"), "w") as f:
            f.write(render_model_card(args, facts, self.state.log_history))

    # ------------------------------------------------------------------ Step 6: the loss

    def _compute_loss(self, model, inputs):
        """Step 6's loss on one micro-batch: the configuration's registered loss (:mod:`zppo_trl.losses`),
        on what it needs (per-token log-probs, or student and teacher logits), plus the MoE router's
        balancing loss as TRL adds it; what the loss reports is logged over every rank."""
        mode = "train" if self.model.training else "eval"
        mask = (
            inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        )
        loss_inputs = LossInputs(
            mask=mask,
            normalizer=self._update_count(inputs, "num_items_in_batch", mode),
            # a batch ZPPO did not partition (TRL's evaluation) averages over its own responses
            sequences=self._update_count(inputs, "num_sequences_in_batch", mode)
            if "num_sequences_in_batch" in inputs
            else (mask.sum(-1) > 0).sum().clamp(min=1),
        )
        aux_loss = None
        if self.objective_loss.computes == "distributions":
            loss_inputs.distill = self._distill_inputs(model, inputs)
        else:
            loss_inputs.logps, loss_inputs.entropies, aux_loss = self._completion_logps(model, inputs)
            loss_inputs.old_logps, loss_inputs.advantages = inputs.get("old_per_token_logps"), inputs.get("advantages")
            for term in self.terms:  # a term's own advantages (token-level on the all-wrong groups)
                advantages = term.advantages(loss_inputs, inputs)
                if advantages is not None:
                    loss_inputs.advantages = advantages
            if self.objective_loss.needs_teacher_logps:  # the teacher's log-prob of each sampled token
                loss_inputs.teacher_logps = self._teacher_token_logps(inputs)
                loss_inputs.step = self.state.global_step
            for term in self.terms:  # what the objective reads of a term (a self-teacher's signal)
                term.prepare_loss(model, inputs, loss_inputs)
        out = self.objective_loss.fn(loss_inputs, self.args)
        for term in self.terms:  # a term added to the objective's loss (a teacher target on the all-wrong questions)
            added = term.loss_term(inputs, loss_inputs, lambda: self._distill_inputs(model, inputs))
            if added is not None:
                out.loss, out.means = out.loss + added[0], {**out.means, **added[1]}
        loss = out.loss
        if self.aux_loss_enabled and aux_loss is not None:  # as TRL: scaled for gradient accumulation
            loss = loss + self.router_aux_loss_coef * aux_loss / (
                self.current_gradient_accumulation_steps if mode == "train" else 1.0
            )
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        self._log_loss(mode, out)
        return loss

    def _distill_inputs(self, model, inputs) -> DistillInputs:
        """The student's completion states and LM head, and the teacher's signal: the top-k its server sent
        for this micro-batch (``teacher_topk_*``), or a local teacher's own states and head."""
        vocab = len(self._tokenizer)
        with self.accelerator.autocast():
            states, head = completion_states(model, inputs, vocab, fused=self.args.fused_lm_head)
            if self.distill_teacher is None:
                topk = TeacherTopK(inputs[TEACHER_TOPK_IDS], inputs[TEACHER_TOPK_LOGPS])
                return DistillInputs(states, head, vocab, topk=topk)
            with torch.no_grad():
                teacher_states, teacher_head = completion_states(self.distill_teacher, inputs, vocab)
        return DistillInputs(states, head, vocab, teacher_states=teacher_states, teacher_head=teacher_head)

    def _teacher_token_logps(self, inputs) -> torch.Tensor:
        """The teacher's log-prob of each sampled completion token of a micro-batch (B, C), from its raw
        distribution: what its server sent for it (``teacher_logps``), or the local teacher's, a chunk of positions
        at a time (``distill_chunk_size``)."""
        if self.distill_teacher is None:
            return inputs[TEACHER_LOGPS_FIELD]
        vocab = len(self._tokenizer)
        with torch.no_grad(), self.accelerator.autocast():
            states, head = completion_states(self.distill_teacher, inputs, vocab)
            return chosen_token_logps(states, head, vocab, inputs["completion_ids"], self.args.distill_chunk_size)

    def _completion_logps(self, model, inputs, for_loss: bool = True):
        """Per-token log-probs of the completions, as TRL computes them; ``for_loss`` adds what only the loss
        reads: the entropies and the router's aux loss (else None)."""
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        return self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            inputs["completion_ids"].size(1),
            compute_entropy=for_loss,
            compute_aux_loss=for_loss and self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _MULTIMODAL_FIELDS},
        )

    def _update_count(self, inputs, key: str, mode: str) -> torch.Tensor:
        """A loss divisor as TRL's ``"dapo"`` divisor rescales ``num_items_in_batch``: to one accumulation
        window and one rank. ZPPO's micro-batches carry their partition's token count (``num_items_in_batch``)
        and response count (``num_sequences_in_batch``) x ``num_partitions``, so it is that count / processes
        (gradients are averaged over ranks)."""
        count = inputs[key].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":  # in eval the batch is neither split across steps nor accumulated
            count = count * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return count

    def _log_loss(self, mode: str, out: LossOutput) -> None:
        """What the loss reports, over every rank: token means, and per-response minima or maxima."""
        for name, (total, count) in out.means.items():
            totals = self.accelerator.reduce(torch.stack([total, count]), reduction="sum")
            self._metrics[mode][name].append((totals[0] / totals[1].clamp(min=1.0)).item())
        for name, (values, how) in out.extremes.items():
            gathered = self.accelerator.gather(values)
            self._metrics[mode][name].append((nanmin if how == "min" else nanmax)(gathered).item())

    # ------------------------------------------------------------------ ZPPO state

    def zppo_state_dict(self) -> dict:
        """The buffer, admission accuracies, counters and ZPPO's RNG state (JSON-serialisable)."""
        version, internal, gauss = self._rng.getstate()
        return {
            "buffer": self.replay_buffer.state_dict(),
            "admitted_at": [[key, r] for key, r in self._admitted_at.items()],
            "counters": dict(self.counters),
            "rng": [version, list(internal), gauss],
            **{key: value for term in self.terms for key, value in term.state_dict().items()},
        }

    def load_zppo_state_dict(self, state: Mapping) -> None:
        """Restore :meth:`zppo_state_dict` exactly."""
        self.replay_buffer.load_state_dict(state["buffer"])
        self._admitted_at = dict(state["admitted_at"])
        self.counters = defaultdict(float, state["counters"])
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))
        for term in self.terms:
            term.load_state_dict(state)

    # ------------------------------------------------------------------ prompts and grading

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
        return [
            {
                "role": "user",
                "content": [*({"type": "image", "image": im} for im in images), {"type": "text", "text": text}],
            }
        ]

    def _grade_many(self, rows: Sequence[Mapping], texts: Sequence[Sequence[str]]) -> list[list[bool]]:
        """Grade teacher rollouts with the trainer's own reward functions (sync or async, as TRL allows):
        ``texts[i]`` are replies to ``rows[i]``'s question. Every reply goes in one call per function, as TRL
        scores a round, so that a judge answers them all concurrently rather than one question at a time."""
        reply_rows = [row for row, replies in zip(rows, texts, strict=True) for _ in replies]
        if not reply_rows:
            return [[] for _ in rows]
        prompts = [self._with_prompt(row)["prompt"] for row in rows]
        completions = [[{"role": "assistant", "content": t}] for replies in texts for t in replies]
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

    # ------------------------------------------------------------------ the rollout step (Algorithm 1)

    def _rollout_step(self, inputs: list[dict]) -> list[dict]:
        """One rollout step of Algorithm 1; returns this rank's optimizer micro-batches."""
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        args = self.args
        # 1. X_new from the dataloader (each row repeated G times), X_replay from the buffer.
        draw = self._draw_questions(inputs)
        # 2. Teacher sampling for every question of X starts now, overlapping the student's rollouts.
        sampling = self.row.needs.teacher_samples
        teacher_future = self._start_teacher_sampling(draw.plain, metrics) if sampling else None
        # 3. Plain rollouts, scored; plain accuracy r_x per question over all ranks. TRL sends the student's
        # server the weights as the round starts (timed where the shared-memory client sends them).
        syncs = weight_syncs(self)
        synced_before = len(syncs) if syncs is not None else 0
        plain_round = self._generate_round(draw.plain, "plain", metrics)
        if syncs is not None:
            metrics["time/weight_sync_s"] = sum(s["write"] + s["reload"] for s in syncs[synced_before:])
        accuracy = plain_accuracy(
            plain_round.groups_per_rank,
            plain_round.rewards,
            self.num_generations,
            order=draw.new_keys + draw.replay_keys,
        )
        # 4-6. The row's optimizer micro-batches.
        if args.distillation is not None:
            micro_batches = self._distillation_batches(teacher_future, draw, plain_round, metrics)
        else:
            micro_batches = self._augmented_batches(teacher_future, draw, plain_round, accuracy, metrics)
        if self.defers_old_logps:
            self._attach_old_logps(micro_batches, metrics)
        if self.trace_log is not None:  # before step 7, while the graduates' admission bins are known
            self._log_graduations(draw, plain_round, accuracy)
        # 7. Buffer refresh from the plain groups only.
        metrics.update(self._refresh_buffer(accuracy))
        if sampling and args.prefetch_teacher_samples:  # the teacher samples the next step during these updates
            self._prefetch_teacher_sampling()

        metrics["new"], metrics["replayed"] = len(draw.new_keys), len(draw.replay_keys)
        metrics["plain_accuracy"] = sum(accuracy.values()) / max(len(accuracy), 1)
        self._record_step(metrics, start)
        return micro_batches

    def _augmented_batches(
        self, teacher_future: Any, draw: Draw, plain_round: Round, accuracy: Mapping, metrics: dict
    ) -> list[dict]:
        """Steps 4-6 of ZPPO and of the rows built on its step 5 (GRPO†, Hint, Prefix, the SFT controls)."""
        augmenting = self._augmenting
        # 4. The pre-cap; the teacher's replies collected and graded, with the wrong plain rollouts of those questions.
        limit = augment_limit(len(draw.new_keys), self.args.augment_fraction)
        hard = select_hard(accuracy, limit, self.args.hard_threshold, rng=self._rng) if augmenting else []
        evidence = self._gather_evidence(teacher_future, draw, plain_round, hard, metrics) if augmenting else None
        # 5. Augmented instances planned (post-cap) and built.
        plan = self.augmentation.plan(evidence, limit, self._rng, metrics) if augmenting else []
        built, most_built = self._build_augmented(plan, metrics)
        if self.trace_log is not None:
            self._log_references(built, accuracy)
        if augmenting and self.augmentation.supervised:
            # 5-6, supervised controls: the verified targets, fitted in the partitions of their questions.
            targets = self._target_round(built, draw.plain[0].row, metrics)
            metrics.update(self._target_metrics(plan, built))
            return self._target_batches(targets, draw, metrics)
        # 5. The student's group on each built instance; 6. partitions, two-step advantages, padded micro-batches.
        augmented_round = self._augmented_round(built, most_built, draw.plain[0].row, metrics)
        plain_round, targets = self._with_terms(PlainStep(draw, plain_round, teacher_future, metrics))
        micro_batches = self._policy_batches(plain_round, augmented_round, metrics, targets)
        scores = self.row.teacher_scores_from_server
        if scores and self.distill_teacher is None:  # the teacher server's scores of the trained rows
            only = next((term.scores_only for term in self.terms if term.scores_only), None)
            attach_teacher_scores(self.teacher, micro_batches, scores, self.args.distill_top_k, metrics, only)
        if augmenting:
            metrics.update(self._augmentation_metrics(plan, built, augmented_round))
        return micro_batches

    def _with_terms(self, step: PlainStep) -> tuple[Round, Round | None]:
        """The plain round with every term's contribution (:meth:`zppo_trl.terms.Term.after_plain`, in registry
        order, each on the correctness rewards): their rewards added for the advantages (never the plain accuracy or
        the buffer), their fields put on the plain batch; and the target round of their teacher-forced rows."""
        plain_round, batch, rewards, targets = step.round, None, step.round.rewards, None
        for term in self.terms:
            contribution = term.after_plain(step)
            if contribution is None:
                continue
            step.metrics.update(contribution.metrics)
            if contribution.rewards is not None:
                rewards = rewards + contribution.rewards
            if contribution.fields:
                batch = {**(batch or plain_round.batch), **contribution.fields}
            if contribution.targets is not None:
                targets = self._target_round(contribution.targets, step.draw.plain[0].row, step.metrics)
        shaped = Round(batch or plain_round.batch, rewards, plain_round.texts, plain_round.groups_per_rank)
        return shaped, targets

    def _distillation_batches(self, teacher_future: Any, draw: Draw, plain_round: Round, metrics: dict) -> list[dict]:
        """Steps 4-6 of Off-/On-Distill: the sequences to imitate, each in its question's partition.
        On-Distill imitates the teacher on every student rollout; Off-Distill on every graded-correct
        teacher rollout of every question, teacher-forced (a question without one contributes no target)."""
        G = self.num_generations
        if self.args.distillation == "on":
            rows_per_rank = [[group for group in groups for _ in range(G)] for groups in plain_round.groups_per_rank]
            targets = Round(concat_batches([plain_round.batch], self._tokenizer.pad_token_id), None, [], rows_per_rank)
        else:
            keys = list(dict.fromkeys(draw.new_keys + draw.replay_keys))
            evidence = self._gather_evidence(teacher_future, draw, plain_round, keys, metrics)
            built = BuiltGroups()
            for key in self.ranks.share(keys):
                built.groups += [
                    BuiltGroup("off_distill", key, target=text) for text in evidence.teacher_correct.get(key, ())
                ]
            metrics["distill_questions_with_target"] = sum(1 for key in keys if evidence.teacher_correct.get(key))
            targets = self._target_round(built, draw.plain[0].row, metrics)
        micro_batches = self._target_batches(targets, draw, metrics)
        if self.distill_teacher is None:  # the teacher's signal comes from its server
            scores = self.row.needs.teacher_scores
            attach_teacher_scores(self.teacher, micro_batches, scores, self.args.distill_top_k, metrics)
        return micro_batches

    # 1.

    def _draw_questions(self, inputs: list[dict]) -> Draw:
        """Step 1: the new questions and a replay draw from the buffer, dealt over ranks."""

        def sample_replay(new_count: int) -> list:
            count = replay_count(new_count, self.args.replay_fraction, len(self.replay_buffer))
            return self.replay_buffer.sample(count, rng=self._rng)

        return draw_questions(inputs, self.num_generations, sample_replay, self.ranks, self._row)

    # 2.

    def _start_teacher_sampling(self, plain: Sequence[Group], metrics: dict) -> Any:
        """Step 2: a Future of the teacher's G_T replies to every real question of this rank, in order. The new
        questions' replies were asked for during the previous step's updates where it could read this step's
        batch ahead (:meth:`_prefetch_teacher_sampling`); then only the replayed ones are asked for now."""
        real = [g for g in plain if g.kind != FILLER]  # new questions first, then replayed ones
        new_keys = [g.row[data.ID] for g in real if g.kind == "new"]
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched.keys != new_keys:
            logger.warning(
                "the teacher samples asked for ahead were for questions %s, this step draws %s: asking again",
                prefetched.keys,
                new_keys,
            )
            prefetched = None
        if prefetched is not None and prefetched.failed():
            logger.warning("the teacher samples asked for ahead failed (%s): asking again", prefetched.errors)
            prefetched = None
        metrics["teacher_prefetched"] = len(new_keys) if prefetched is not None else 0
        if prefetched is None:
            return self._sample_teacher([g.row for g in real])
        rest = [g.row for g in real[len(new_keys) :]]
        return joined_futures([prefetched.future] + ([self._sample_teacher(rest)] if rest else []))

    def _prefetch_teacher_sampling(self) -> None:
        """Ask the teacher for the next rollout step's new questions on this rank: the dataloader's batch after
        this step's ``steps_per_generation`` (this update's are taken already), read ahead. Nothing is asked past
        ``max_steps`` or the epoch's end, nor in a step a resumed run entered in its middle."""
        args, steps = self.args, self.args.steps_per_generation
        if self._step % steps or self.state.global_step + args.num_partitions >= self.state.max_steps:
            return
        batch = self._lookahead.peek(steps - self.current_gradient_accumulation_steps)
        if batch is None:
            return
        rows = [batch[i] for i in range(0, len(batch), self.num_generations)]
        errors: list = []
        future = self._sample_teacher(rows, errors)
        self._prefetched = PrefetchedSampling([row[data.ID] for row in rows], future, errors)

    def _sample_teacher(self, rows: Sequence[Mapping], errors: list | None = None) -> Any:
        """A Future of the teacher's G_T replies to each row's plain question (``errors``: as ``sample_async``'s)."""
        args = self.args
        return self.teacher.sample_async(
            [self._teacher_conversation(row) for row in rows],
            n=args.teacher_num_generations,
            max_tokens=args.teacher_max_tokens,
            temperature=args.teacher_temperature,
            top_p=args.teacher_top_p,
            errors=errors,
        )

    # 3. and 5.: generation rounds

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
        rewards = torch.nan_to_num(request.rewards, nan=0.0)
        metrics[f"time/{round_name}_generation_s"] = time.perf_counter() - t0
        self._check_context(batch, groups, round_name, metrics)
        return Round(batch, rewards, request.texts, groups_per_rank)

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

    # 4.

    def _gather_evidence(
        self, teacher_future: Any, draw: Draw, plain_round: Round, hard: Sequence, metrics: dict
    ) -> Evidence:
        """Step 4: the teacher's replies graded, and the wrong plain rollouts, of the hard questions (all ranks)."""
        G = self.num_generations
        t0 = time.perf_counter()
        questions = len(draw.plain) - draw.fillers
        no_replies = [[] for _ in range(questions)]
        replies = teacher_results(teacher_future, no_replies) if teacher_future is not None else no_replies
        metrics["time/teacher_sample_wait_s"] = time.perf_counter() - t0
        wanted = set(hard)
        local_wrong: dict[Any, list[str]] = defaultdict(list)
        local_teacher: dict[Any, list[str]] = defaultdict(list)
        rank_rewards = plain_round.rewards.view(self.ranks.world, -1)[self.ranks.rank]
        graded = [(g, group) for g, group in enumerate(draw.plain) if group.kind != FILLER]
        graded = [(g, group) for g, group in graded if group.row[data.ID] in wanted]
        grades = self._grade_many([group.row for _, group in graded], [replies[g] for g, _ in graded])
        for (g, group), ok in zip(graded, grades):
            key = group.row[data.ID]
            local_wrong[key] += [plain_round.texts[i] for i in range(g * G, (g + 1) * G) if rank_rewards[i] <= CORRECT]
            local_teacher[key] += [text for text, right in zip(replies[g], ok) if right]
        teacher_correct = merge_lists(self.ranks.gather(dict(local_teacher)))
        student_wrong = merge_lists(self.ranks.gather(dict(local_wrong)))
        return Evidence(hard, teacher_correct, student_wrong)

    # 5.

    def _build_augmented(self, plan: Sequence, metrics: dict) -> tuple[BuiltGroups, int]:
        """Step 5, first half: this rank's share of the instances (dealt round-robin), built; and the
        most groups any rank built (the plan is the same on every rank, so all take the same path)."""
        local = self.ranks.share(self.augmentation.order(plan)) if plan else []
        built = self.augmentation.build(local, self.teacher, self.args, metrics) if local else BuiltGroups()
        most_built = self.ranks.largest(len(built.groups))
        metrics["compression_failures"] = self.ranks.total(built.failures)
        metrics["dropped"] = len(plan) - self.ranks.total(len(built.instances))
        for name in (
            self.augmentation.summed_metrics if self.augmentation is not None else ()
        ):  # per-rank counts of the build
            metrics[name] = self.ranks.total(metrics.get(name, 0))
        return built, most_built

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

    # 6.

    def _partition_signal(self, rewards, group_ids, confidences):
        """One partition's ``(marked rows, extra advantages)`` from the terms' signals (None: none has one)."""
        for term in self.terms:
            signal = term.partition_signal(rewards, group_ids, confidences)
            if signal is not None:
                return signal
        return None

    def _policy_batches(
        self, plain_round: Round, augmented_round: Round, metrics: dict, targets: Round | None = None
    ) -> list[dict]:
        """Step 6 for the RL rows: every rank's plain and augmented groups dealt into partitions, two-step
        advantages per partition, this rank's micro-batches; ReLIFT's ``targets`` rows, after them, each in its
        question's partition."""
        world, G = self.ranks.world, self.num_generations
        rounds = [r for r in (plain_round, augmented_round) if r.batch is not None]
        extra = [targets.batch] if targets is not None and targets.batch is not None else []
        batch = concat_batches([r.batch for r in rounds] + extra, self._tokenizer.pad_token_id)
        kinds_per_rank = [[kind for r in rounds for kind, _key in r.groups_per_rank[rank]] for rank in range(world)]
        rewards_per_rank = [
            [x for r in rounds for x in r.rewards.view(world, -1)[rank].tolist()] for rank in range(world)
        ]
        # what a term's partition signal reads of each rollout (LENS: its sampling log-prob), gathered like the rewards
        reads = [values for term in self.terms if (values := term.partition_reads(batch)) is not None]
        confidences = self.ranks.gather(reads[0]) if reads else None
        targets_per_rank = None
        if extra:  # each target row anchored to its question's plain group (rank, group)
            anchor = {
                key: (r, g)
                for r, groups in enumerate(plain_round.groups_per_rank)
                for g, (kind, key) in enumerate(groups)
                if kind != FILLER
            }
            targets_per_rank = [
                [(len(kinds) * G + i, anchor[key]) for i, (kind, key) in enumerate(rows) if kind != FILLER]
                for kinds, rows in zip(kinds_per_rank, targets.groups_per_rank)
            ]
        result = policy_partitions(
            batch,
            kinds_per_rank,
            rewards_per_rank,
            G,
            self.args,
            self.ranks,
            self._rng.getrandbits(32),
            confidences,
            targets_per_rank,
            signal=self._partition_signal if self.terms else None,
            dense=self.row.needs.trains_zero_advantage,
        )
        metrics["skipped_partitions"] = result.skipped
        metrics.update(advantage_stats(list(result.trained.values())))
        self._log_trained_advantages(
            result.trained, [len(r.groups_per_rank[0]) * G for r in (plain_round, augmented_round)]
        )
        return result.micro_batches

    def _target_batches(self, targets: Round, draw: Draw, metrics: dict) -> list[dict]:
        """Step 6 for the target rows: each target in its question's partition (:func:`deal_targets`)."""
        seed = self._rng.getrandbits(32)
        micro_batches, skipped_count, trained = deal_targets(
            targets.batch, targets.groups_per_rank, draw.new_keys, draw.replay_keys, self.args, self.ranks, seed
        )
        metrics["skipped_partitions"], metrics["targets_trained"] = skipped_count, trained
        return micro_batches

    def _attach_old_logps(self, micro_batches: list[dict], metrics: dict) -> None:
        """The sampling policy's per-token log-probs (``old_per_token_logps``) of the micro-batches that read
        them, computed before the step's first update (so on the weights that sampled the rollouts): every
        trained partition but the first one trained, which updates on those very weights (a skipped partition
        changes none), so its ratio is exactly 1 and its loss takes the detached log-probs of its own forward;
        and only when the loss is a policy objective. Every rank runs the same number of forward passes
        (partition sizes and skips agree over ranks), as ZeRO-3's parameter gathering requires."""
        if not self.objective_loss.reads_old_logps:
            return
        t0, rows = time.perf_counter(), 0
        ga = self.args.gradient_accumulation_steps  # a partition's micro-batches, all skipped or none
        first_trained = next((i for i in range(0, len(micro_batches), ga) if not is_skipped(micro_batches[i])), 0)
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            for micro in micro_batches[first_trained + ga :]:
                if not is_skipped(micro):
                    micro["old_per_token_logps"] = self._completion_logps(self.model, micro, for_loss=False)[0]
                    rows += micro["completion_ids"].size(0)
        metrics["time/old_logps_s"], metrics["old_logps_rows"] = time.perf_counter() - t0, rows

    def _log_trained_advantages(self, trained: Mapping[tuple[int, int], float], rows_per_round: Sequence[int]) -> None:
        """Put the trained advantages in TRL's completions log in place of TRL's own.

        TRL logs its group-scaled advantages per scoring round (gathered, rank-major); ZPPO trains
        others (two-step, per partition). Rows that were not trained (fillers, partitions without a
        learning signal) get 0.
        """
        ours, offset = [], 0
        for rows in rows_per_round:
            ours += [trained.get((r, offset + i), 0.0) for r in range(self.ranks.world) for i in range(rows)]
            offset += rows
        logged = self._logs["advantages"]
        keep = min(len(ours), len(logged))
        for _ in range(keep):
            logged.pop()
        logged.extend(ours[len(ours) - keep :])

    # 7.

    def _refresh_buffer(self, accuracy: Mapping[Any, float]) -> dict[str, float]:
        """Step 7: the buffer refreshed from the plain accuracies; its events and admission bins as metrics."""
        metrics: dict[str, float] = {}
        events = self.replay_buffer.update(accuracy)
        bins = admission_bins(self.num_generations, self.args.hard_threshold)
        for key in events.admitted:
            self._admitted_at[key] = accuracy[key]
        for name in ("admitted", "graduated", "evicted", "retained"):
            metrics[name] = len(getattr(events, name))
        for name, keys in (("admitted", events.admitted), ("graduated", events.graduated)):
            counts = dict.fromkeys(bins, 0)
            for key in keys:
                label = bin_label(self._admitted_at.get(key, accuracy[key]), self.num_generations)
                if label in counts:
                    counts[label] += 1
            for label, count in counts.items():
                metrics[f"{name}_bin_{label}"] = count
                self.counters[f"{name}_bin_{label}_total"] += count
        for key in events.graduated + events.evicted:
            self._admitted_at.pop(key, None)
        metrics["buffer_size"] = len(self.replay_buffer)
        return metrics

    # the trace-overlap audit's file (audit_traces)

    def _in_zero_bin(self, key: Any, accuracy: Mapping) -> bool:
        """Admitted at plain accuracy 0 (a resident), or about to be (a non-resident at 0 this step)."""
        return self._admitted_at.get(key, accuracy.get(key)) == 0.0

    def _log_references(self, built: BuiltGroups, accuracy: Mapping) -> None:
        """The teacher candidate each of this step's BCQ prompts showed, for questions of the 0% bin, over
        all ranks; the file keeps a question's first (its fixed reference)."""
        local = [
            (inst.key, self._row(inst.key)[data.QUESTION], shown[inst.teacher_position])
            for inst, shown in zip(built.instances, built.shown)
            if inst.kind == "bcq" and self._in_zero_bin(inst.key, accuracy)
        ]
        items = [item for rank_items in self.ranks.gather(local) for item in rank_items]
        if self.is_world_process_zero():
            self.trace_log.references(self.state.global_step, items)

    def _log_graduations(self, draw: Draw, plain_round: Round, accuracy: Mapping) -> None:
        """The plain rollouts and rewards of the questions graduating from the 0% bin this step (residents
        admitted at 0 whose plain group reaches the threshold), over all ranks."""
        G = self.num_generations
        rewards = plain_round.rewards.view(self.ranks.world, -1)[self.ranks.rank].tolist()
        local = [
            (key, g.row[data.QUESTION], plain_round.texts[i * G : (i + 1) * G], rewards[i * G : (i + 1) * G])
            for i, g in enumerate(draw.plain)
            if g.kind != FILLER
            and (key := g.row[data.ID]) in self.replay_buffer
            and self._admitted_at.get(key) == 0.0
            and accuracy[key] >= self.replay_buffer.threshold
        ]
        items = {item[0]: item for rank_items in self.ranks.gather(local) for item in rank_items}
        if self.is_world_process_zero():
            self.trace_log.graduations(self.state.global_step, items.values())

    # metrics

    def _augmentation_metrics(self, plan: Sequence, built: BuiltGroups, augmented_round: Round) -> dict:
        """Per kind: instances planned and trained, in-prompt accuracy and groups with signal (all ranks);
        then the augmentation's own audit (e.g. BCQ's candidate match), summed over ranks."""
        G = self.num_generations
        out = kind_metrics(
            self.augmentation.kinds,
            [inst.kind for inst in plan],
            augmented_round.groups_per_rank,
            augmented_round.rewards,
            G,
        )
        counts = self.augmentation.audit_counts(built.instances, augmented_round.texts, G)
        if counts and self.ranks.world > 1:
            totals = torch.tensor(list(counts.values()), dtype=torch.float64, device=self.accelerator.device)
            counts = dict(zip(counts, self.ranks.reduce_sum(totals).cpu().tolist()))
        out.update(self.augmentation.audit_metrics(counts))
        return out

    def _target_metrics(self, plan: Sequence, built: BuiltGroups) -> dict:
        """Per supervised kind: instances planned, instances with a verified target, and targets (all ranks)."""
        trained, targets = self.ranks.total(len(built.instances)), self.ranks.total(len(built.groups))
        kind = self.augmentation.kinds[0]
        return {kind: len(plan), f"{kind}_trained": trained, f"{kind}_targets": targets}

    def _record_step(self, metrics: dict, start: float) -> None:
        """Times and teacher counters over all ranks, the running totals, and every metric into TRL's log."""
        teacher_wait = metrics.get("time/teacher_sample_wait_s", 0.0) + metrics.get("time/compression_s", 0.0)
        step_time = time.perf_counter() - start
        judges = [client for term in self.terms for role, client in term.clients if role == "judge"]
        clients = {"teacher": self.teacher, "judge": judges[0] if judges else None}
        services = []
        for client in clients.values():
            stats = client.stats(reset=True) if client is not None else {"requests": 0, "failed": 0}
            services += [stats["requests"], stats["failed"], stats.get("latency_mean_s", 0.0)]
        local = torch.tensor(
            [step_time, teacher_wait, *services] + list(host_memory.process_memory_gb()), dtype=torch.float64
        )
        per_rank = (
            torch.stack([torch.as_tensor(x) for x in self.ranks.gather(local)])
            if self.ranks.world > 1
            else local[None]
        )
        metrics.update(timing_metrics(per_rank[:, :5], clients["teacher"] is not None))
        if clients["judge"] is not None:  # a row's own judge (Perception-R1, RLKD), counted like the teacher
            metrics.update(service_metrics("judge", per_rank[:, 5:8]))
        metrics.update(memory_metrics(per_rank[:, 8:]))
        for role, client in clients.items():
            if client is not None and metrics[f"{role}/failures"]:
                logger.warning(
                    "%s: %d of %d requests failed this step; the step continues with what came back",
                    role,
                    metrics[f"{role}/failures"],
                    metrics[f"{role}/requests"],
                )
        self.counters["rollout_steps"] += 1
        accumulate_totals(self.counters, metrics, self.augmentation.kinds if self.augmentation is not None else ())
        metrics.update(self.counters)
        for name, value in metrics.items():
            self._metrics["train"][f"zppo/{name}"].append(float(value))


# ---------------------------------------------------------------------- helpers


def _with_text(completion: Any, text: str) -> Any:
    """``completion`` (a string, or TRL's conversational ``[{"role": "assistant", ...}]``) with ``text``."""
    if isinstance(completion, str):
        return text
    return [{**completion[0], "content": text}, *completion[1:]]


@contextlib.contextmanager
def _gspo_warning_expected(args: ZPPOConfig):
    """Drop TRL's construction-time warning that a sequence-level ratio under ``loss_type="dapo"``
    weights each rollout by its length (it points to ``loss_type="grpo"``): TRL's loss does not train
    ZPPO's GSPO, whose registered loss averages per response as the GSPO paper does (or, with
    ``gspo_settings="zppo_table"``, keeps DAPO's token mean on purpose). Any other warning, and every other
    objective's, passes."""
    trl_logger = logging.getLogger(GRPOTrainer.__module__)

    def expected(record: logging.LogRecord) -> bool:
        # accelerate's logger prefixes the rank ("[RANK 0] "), hence `in`
        return not (
            args.policy_objective == "gspo"
            and "When using `importance_sampling_level='sequence'`" in record.getMessage()
        )

    trl_logger.addFilter(expected)
    try:
        yield
    finally:
        trl_logger.removeFilter(expected)
