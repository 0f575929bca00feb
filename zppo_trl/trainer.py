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
(``policy_objective``), a named term (:mod:`zppo_trl.terms`: what it adds after the plain round, to the
partitions and to the loss), or, for Off-/On-Distill, steps 4-6 replaced by GKD's JSD against the teacher
(:mod:`zppo_trl.distill`). What a row asks of the run (teacher samples or scores, a judge, copies of the
student) is its parts' declared needs (:mod:`zppo_trl.row`), read here and never re-derived from names.

The class is TRL's hooks and Algorithm 1's stages. The rounds inside TRL's generation and scoring, the
per-token log-prob paths, the teacher's sampling and evidence, the checkpoint state, the step's records and
what the trainer offers its row's parts are mixins in modules of their own (:mod:`zppo_trl.generation_hooks`,
:mod:`zppo_trl.logp_paths`, :mod:`zppo_trl.teacher_sampling`, :mod:`zppo_trl.checkpoint_state`,
:mod:`zppo_trl.step_records`, :mod:`zppo_trl.row_parts`).

Distributed runs: every decision is computed from gathered data with the same seeded ``random.Random``
on every rank (:mod:`zppo_trl.ranks`). Replay groups and built instances are dealt round-robin over
ranks; a rank short of one group generates a *filler* group (never trained, never counted) so that every
rank scores equal row counts, and optimizer mini-batches are padded with zero-weight rows to equal sizes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from accelerate.utils import is_peft_model
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from . import data, host_memory
from .augmentations import Augmentation, BuiltGroup, BuiltGroups
from .backbones import backbone_family
from .batches import concat_batches
from .callbacks import QuietProgressCallback, RolloutSummaryCallback
from .checkpoint_state import ZPPO_STATE_NAME, CheckpointState, last_complete_checkpoint
from .config import ZPPOConfig
from .dataset_formats import IMAGE, PROMPT, prepare_datasets
from .evaluation.condition import record_condition
from .generation_hooks import GenerationHooks
from .group_log import GROUP_LOG_NAME, GroupLog
from .lm_head import score_loss_positions, use_full_logits
from .logp_paths import LogProbPaths
from .losses import LossInputs
from .model_card import PAPER_CITATION, PAPER_TITLE
from .optim import optimizer_cls_and_kwargs
from .packing import segment_packed_sequences
from .partitioning import deal_targets, generated_tokens, is_skipped, policy_partitions
from .prefetch import BatchLookahead, PrefetchedSampling
from .ranks import Ranks
from .reformulate import augment_limit, select_hard
from .replay import PromptReplayBuffer, replay_count
from .reward_signal import RewardSignalWatch
from .rewards import boxed_accuracy_reward
from .rollout import FILLER, Draw, Round, RoundRequest, draw_questions, plain_accuracy
from .row_parts import RowParts
from .run_lock import run_lock
from .step_metrics import admission_bins, advantage_stats, bin_label
from .step_records import StepRecords
from .student_server import student_generation, weight_syncs
from .teacher import TeacherClient
from .teacher_sampling import TeacherSampling
from .teacher_scores import attach_teacher_scores
from .terms import PlainStep, Term
from .trace_log import TRACE_LOG_NAME, TraceLog

__all__ = ["ZPPO_STATE_NAME", "ZPPOTrainer"]

logger = logging.getLogger(__name__)


class ZPPOTrainer(GenerationHooks, LogProbPaths, TeacherSampling, StepRecords, CheckpointState, RowParts, GRPOTrainer):
    """GRPO with ZPPO's teacher-in-the-prompt reformulations and prompt replay buffer.

    Takes `trl.GRPOTrainer`'s arguments; ``args`` must be a :class:`zppo_trl.ZPPOConfig`.

    Args:
        model: the student (a model id/path or a loaded model).
        reward_funcs: callable TRL reward functions returning binary accuracies, called as TRL calls
            them (prompts and completions in the dataset's format, every column by name);
            default :func:`zppo_trl.rewards.boxed_accuracy_reward`. The same functions
            grade the teacher's rollouts.
        args: a :class:`zppo_trl.ZPPOConfig`; None builds the default one (the ZPPO row) with
            ``output_dir`` ``"<model name>-ZPPO"``, as GRPOTrainer builds its own.
        train_dataset: a dataset in the schema of :mod:`zppo_trl.data` (``id``, ``question``
            without the closer, ``images``, ``answer``, ...) or in TRL's standard or
            conversational prompt-only format (:mod:`zppo_trl.dataset_formats`); streaming
            (``IterableDataset``) in rows without replay. The trainer renders prompts
            itself: question (+ images), block, closer.
        teacher: a ready :class:`zppo_trl.teacher.TeacherClient`; by default one is
            built from ``args.teacher_*`` where the row talks to the teacher server.
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
        if args is None:  # as GRPOTrainer: a default config named after the model
            args = ZPPOConfig(f"{_model_name(model)}-ZPPO")
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
        # TRL's dataset formats or ZPPO's schema, checked against what the reward functions and the row read
        train_dataset, self.dataset_format, row_of = prepare_datasets(train_dataset, eval_dataset, reward_funcs, args)
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
        self._row_of = row_of  # id -> dataset row, for replayed questions and augmented prompts (None: a stream)
        self._streamed_rows: dict[Any, Mapping] = {}  # a stream's rows of the step, by id
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
        # log_groups: every scored group of every step (zppo_trl.group_log); written by the main process
        self.group_log = GroupLog(os.path.join(args.output_dir, GROUP_LOG_NAME)) if args.log_groups else None
        self.dataset_name = dataset_name
        self.model_license = model_license
        # The row's parts and the union of what they ask of the run (zppo_trl.row): read here, never re-derived.
        self.row = row = args.row
        self.teacher, self.distill_teacher = self._prepare_teachers(teacher, distill_teacher_model)
        # The row's named terms (zppo_trl.terms), each with what the trainer offers it.
        self.terms: list[Term] = [term(args, self._term_context()) for term in row.terms]
        # Step 5's augmentation: ZPPO's BCQ/NCQ prompts, or a comparison row's; None for GRPO†.
        self.augmentation: Augmentation | None = self._make_augmentation()
        # The condition the checkpoint is evaluated under (Correction-SFT: <correct>), in the config every
        # save and push writes, for `zppo-eval run` to apply; the other rows clear one a base model carried.
        record_condition(self.model.config, getattr(self.augmentation, "evaluation_condition", None))
        self.objective_loss = row.objective  # step 6's loss (zppo_trl.losses)
        # The generation round in flight: what TRL's hooks read and where its scoring leaves the rewards.
        self._active_round: RoundRequest | None = None
        # Reward functions whose rewards carry no signal, warned once each (zppo_trl.reward_signal)
        self.reward_signal = RewardSignalWatch(
            self.reward_func_names, "lists of chat messages" if self.dataset_format.messages_for_rewards else "strings"
        )
        self._padding_free_warned: set[str] = set()  # the reasons padding_free fell back for, warned once each
        # where the plain rollouts' old log-probs run during steps 4-5 (overlap_old_logps)
        self._old_logps_thread = None
        if args.padding_free:  # the layers that would see across packed sequences, run per sequence (zppo_trl.packing)
            segment_packed_sequences(self.accelerator.unwrap_model(self.model))
        self._set_up_console()

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None):
        """TRL's training loop, holding ``output_dir``'s lock (:mod:`zppo_trl.run_lock`: one run per folder);
        ``resume_from_checkpoint=True`` resumes from the newest *complete* checkpoint (one a kill left half written
        is skipped, named: :func:`zppo_trl.checkpoint_state.last_complete_checkpoint`)."""
        with run_lock(self.args.output_dir, active=self.args.should_save):
            if resume_from_checkpoint is True:
                resume_from_checkpoint = last_complete_checkpoint(self.args.output_dir)
                if resume_from_checkpoint is None:
                    raise ValueError(f"no complete checkpoint in output_dir {self.args.output_dir} to resume from")
            return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval)

    def _set_up_console(self) -> None:
        """One line per rollout step on the console; TRL's metrics dict only with ``full_console_logs``."""
        if not self.args.full_console_logs:
            if self.pop_callback(ProgressCallback) is not None:
                self.add_callback(QuietProgressCallback)
            self.pop_callback(PrinterCallback)
        self.add_callback(RolloutSummaryCallback)

    @property
    def _augmenting(self) -> bool:
        return self.augmentation is not None and bool(self.augmentation.kinds)

    # ------------------------------------------------------------------ TRL hooks: the training loop

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:  # ZPPO's schema and TRL's prompt-only formats
            self._signature_columns = [*data.COLUMNS, PROMPT, IMAGE]

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

    # ------------------------------------------------------------------ TRL hooks: the optimizer

    @staticmethod
    def get_optimizer_cls_and_kwargs(args, model=None):
        """transformers' choice of optimizer, except that ``optim="adamw_anyprecision"`` builds ours
        (:func:`zppo_trl.optim.optimizer_cls_and_kwargs`)."""
        return optimizer_cls_and_kwargs(args, model, GRPOTrainer.get_optimizer_cls_and_kwargs)

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
        self._check_reward_signal(plain_round)  # a reward function that cannot teach, said in the step it shows
        # The plain rollouts' old log-probs, computed while steps 4-5 run off this device (overlap_old_logps).
        plain_logps = self._start_plain_old_logps(plain_round.batch)
        # 4-6. The row's optimizer micro-batches, with the old log-probs the updates read.
        if args.distillation is not None:
            micro_batches = self._distillation_batches(teacher_future, draw, plain_round, metrics)
        else:
            micro_batches = self._augmented_batches(teacher_future, draw, plain_round, accuracy, metrics)
        self._attach_old_logps(micro_batches, metrics, plain_logps)
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
        if self.group_log is not None:
            self._log_groups((plain_round, augmented_round))
        self._score_on_teacher_server(micro_batches, metrics)
        if augmenting:
            metrics.update(self._augmentation_metrics(plan, built, augmented_round))
        return micro_batches

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
        self._score_on_teacher_server(micro_batches, metrics)
        return micro_batches

    def _score_on_teacher_server(self, micro_batches: list[dict], metrics: dict) -> None:
        """The teacher server's scores of the trained rows, where the row's needs ask for them and no teacher is
        loaded next to the student (only the rows a term marks, where one does)."""
        scores = self.row.scores_from_server(self.distill_teacher is not None)
        if scores:
            only = next((term.scores_only for term in self.terms if term.scores_only), None)
            attach_teacher_scores(self.teacher, micro_batches, scores, self.args.distill_top_k, metrics, only)

    # 1.

    def _draw_questions(self, inputs: list[dict]) -> Draw:
        """Step 1: the new questions and a replay draw from the buffer, dealt over ranks."""

        def sample_replay(new_count: int) -> list:
            count = replay_count(new_count, self.args.replay_fraction, len(self.replay_buffer))
            return self.replay_buffer.sample(count, rng=self._rng)

        if self._row_of is None:  # a stream: this step's questions, from every rank, are the ones looked up
            local = [inputs[i] for i in range(0, len(inputs), self.num_generations)]
            self._streamed_rows = {row[data.ID]: row for part in self.ranks.gather(local) for row in part}
        return draw_questions(inputs, self.num_generations, sample_replay, self.ranks, self._row)

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
        # what the step cost in student tokens: every response it sampled, and those its updates trained on
        metrics["generated_tokens"] = self.ranks.total(generated_tokens(batch, kinds_per_rank[self.ranks.rank], G))
        metrics["trained_tokens"] = result.trained_tokens
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


# ---------------------------------------------------------------------- helpers


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


def _model_name(model: Any) -> str:
    """The model's name for a default ``output_dir``, as GRPOTrainer names it: its id's last part."""
    return (model if isinstance(model, str) else get_config_model_id(model.config)).split("/")[-1]
