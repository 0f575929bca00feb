"""`ZPPOTrainer`: Algorithm 1 of the paper ("one executed ZPPO training step") inside TRL's `GRPOTrainer`.

One rollout step (every ``num_partitions * gradient_accumulation_steps`` micro-steps) runs these stages,
each a method of explicit inputs and outputs (:meth:`ZPPOTrainer._rollout_step`):

1. Draw: the dataloader's new questions, plus ``min(replay_fraction * |X_new|, |B|)`` buffer residents
   drawn before the refresh (:func:`zppo_trl.rollout.draw_questions`).
2. Teacher sampling for every question starts (a Future) ...
3. ... while the student's plain rollouts are generated and scored by TRL (a plain round).
4. Pre-cap: the hardest questions (:func:`zppo_trl.reformulate.select_hard`); the teacher's replies to
   them are graded and put with the student's wrong rollouts as evidence.
5. The row's step-5 part plans, post-caps and builds its instances (ZPPO: BCQ and NCQ prompts, only the
   selected candidates compressed; :mod:`zppo_trl.augmentations`), and the student samples a group on each
   (a second round). Teacher text is only ever prompt.
6. Every group is dealt, intact, into ``num_partitions`` optimizer mini-batches with two-step advantages
   per partition (:mod:`zppo_trl.partitioning`); a partition without a learning signal makes no update.
   Each micro-batch's loss is the registered loss of the configuration (:mod:`zppo_trl.losses`).
7. The buffer is refreshed from the plain groups only.

The paper's comparison rows run the same stages and change only what the paper changes: another step-5 part
(:class:`~zppo_trl.augmentations.Source`: Hint, Prefix; none for GRPO\u2020; or a target source, whose targets are
teacher-forced and fitted with its loss in their questions' partitions: the SFT controls' cross-entropy, or
Off-/On-Distill's JSD against the teacher, :mod:`zppo_trl.distill`), another loss in step 6
(``policy_objective``), or a named term (:mod:`zppo_trl.terms`: what it adds after the plain round, to the
partitions and to the loss). What a row asks of the run (teacher samples or scores, a judge, copies of the
student) is its parts' declared needs (:mod:`zppo_trl.row`), read here and never re-derived from names.

The class is TRL's hooks and Algorithm 1's stages. Everything else is an object it builds in ``__init__`` from
explicit arguments and calls, none of which knows the trainer: the questions and their grading
(:mod:`zppo_trl.questions`), the teacher's sampling and evidence (:class:`~zppo_trl.teacher_sampling.TeacherSampler`),
the generation rounds (:class:`~zppo_trl.rounds.Rounds`), the log-prob paths and old log-probs
(:mod:`zppo_trl.logp_paths`), the state checkpoints hold (:class:`~zppo_trl.checkpoint_state.ZPPOState`) and the
step's records (:class:`~zppo_trl.step_records.StepRecorder`). The one value TRL's hooks share is the round in flight,
set by :meth:`ZPPOTrainer.generate_and_score` and read by the hooks in this file.

Distributed runs: every decision is computed from gathered data with the same seeded ``random.Random``
on every rank (:mod:`zppo_trl.ranks`). Replay groups and built instances are dealt round-robin over
ranks; a rank short of one group generates a *filler* group (never trained, never counted) so that every
rank scores equal row counts, and optimizer mini-batches are padded with zero-weight rows to equal sizes.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from accelerate.utils import is_peft_model
from trl import GRPOTrainer
from trl.trainer.utils import get_config_model_id

from . import data, host_memory
from .augmentations import AugmentationInputs, BuiltGroups, Source
from .backbones import backbone_family
from .callbacks import console_callbacks
from .checkpoint_state import ZPPO_STATE_NAME, RankTallyCallback, ZPPOState, checkpoint_written, resume_checkpoint
from .config import ZPPOConfig
from .dataset_formats import IMAGE, PROMPT, prepare_datasets
from .deprecations import trl_deprecated_calls
from .early_rollouts import early_rollouts
from .evaluation.condition import record_condition
from .group_log import GROUP_LOG_NAME, GroupLog
from .lm_head import score_loss_positions, use_full_logits
from .logp_paths import OldLogProbs, TeacherSignal, TokenLogProbs, completion_logps, overlaps_old_logps
from .losses import LossInputs, log_loss, sequence_level_warning_expected
from .model_card import PAPER_CITATION, PAPER_TITLE, write_run_card
from .optim import optimizer_cls_and_kwargs
from .packing import segment_packed_sequences
from .partitioning import is_skipped
from .preemption import Preemption, PreemptionCallback, StepSnapshot
from .prefetch import BatchLookahead
from .questions import Grader, Questions
from .ranks import Ranks
from .reformulate import augment_limit
from .replay import PromptReplayBuffer, replay_count
from .reward_signal import RewardSignalWatch
from .rewards import boxed_accuracy_reward
from .rollout import Draw, Round, RoundRequest, draw_questions, plain_accuracy
from .rounds import Rounds, cut_to_budget, hand_back, prompts_with_prefixes, responses_with_prefixes, token_types
from .row_parts import apply_terms, judge_client, prepare_teachers, student_copy_maker
from .run_lock import run_lock
from .step_batches import StepBatches
from .step_records import StepRecorder
from .student_server import stand_in_for_overlong, stood_in, student_generation, student_server_errors, weight_syncs
from .teacher import TeacherClient
from .teacher_sampling import TeacherSampler
from .teacher_scores import attach_teacher_scores
from .terms import PlainStep, Term, TermContext
from .trace_log import TRACE_LOG_NAME, TraceLog

__all__ = ["ZPPO_STATE_NAME", "ZPPOTrainer"]

logger = logging.getLogger(__name__)


class ZPPOTrainer(GRPOTrainer):
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
        zppo_state: the :class:`~zppo_trl.checkpoint_state.ZPPOState` holding both, the admission accuracies, the
            shared RNG and the terms' state.
        preemption: the :class:`~zppo_trl.preemption.Preemption` watch of the stop signals (SIGTERM, SIGUSR1):
            ``preemption.preempted`` after a ``train()`` that one ended at a checkpoint.
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
        args, reward_funcs = _checked_arguments(model, reward_funcs, args)
        host_memory.keep_heap_small()  # large CPU tensors in pages of their own, which leave when freed
        # TRL's dataset formats or ZPPO's schema, checked against what the reward functions and the row read
        train_dataset, self.dataset_format, row_of = prepare_datasets(train_dataset, eval_dataset, reward_funcs, args)
        # TRL's student vLLM generation, or its server mode with weights synced through shared memory
        with sequence_level_warning_expected(args.row.objective, GRPOTrainer.__module__), student_generation(args):
            super().__init__(model, reward_funcs, args, train_dataset, eval_dataset, **kwargs)
        self._prepare_student(args)
        self.ranks = Ranks(self.accelerator)
        self.dataset_name, self.model_license = dataset_name, model_license
        self._lookahead = BatchLookahead()  # the loop's batches, readable ahead (prefetch_teacher_samples)
        # audit_traces / log_groups: the trace-overlap audit's and every scored group's files (main process)
        self.trace_log = TraceLog(os.path.join(args.output_dir, TRACE_LOG_NAME)) if args.audit_traces else None
        self.group_log = GroupLog(os.path.join(args.output_dir, GROUP_LOG_NAME)) if args.log_groups else None
        self.questions = Questions(self.train_dataset, row_of, self.dataset_format, args.closer)
        weights, state, loop = self.reward_weights.tolist(), lambda: self.state, lambda: self.async_loop
        self.grader = Grader(self.questions, self.reward_funcs, weights, state, loop)
        # The row's parts and the union of what they ask of the run (zppo_trl.row): read here, never re-derived.
        self.row = args.row
        self._build_row_parts(args, teacher, distill_teacher_model, random.Random(args.seed))
        self._build_step_collaborators(args)
        console_callbacks(self.callback_handler, args.full_console_logs)  # one line per rollout step
        self.add_callback(RankTallyCallback(self.zppo_state, self.ranks.gather))  # before a preemption's checkpoint
        agree, save = lambda flag: bool(self.ranks.largest(flag)), lambda: self._save_checkpoint(self.model, None)
        self.preemption = Preemption(args.preemption_grace_seconds, agree, StepSnapshot(self.zppo_state), save)
        self.add_callback(PreemptionCallback(self.preemption, args.num_partitions))

    def _prepare_student(self, args: ZPPOConfig) -> None:
        """The loaded student made ready for ZPPO's passes: whole groups on every rank, its row's backbone name, the
        LM head's scored positions, and packed sequences kept apart."""
        args.composition(self.accelerator.num_processes)  # raises unless every rank holds whole groups
        if args.student_family is None:  # a non-Qwen student names its row: "ZPPO (InternVL3.5-2B)"
            args.student_family = backbone_family(self.model.config.name_or_path, self.model.config.model_type)
        student = self.model.get_base_model() if is_peft_model(self.model) else self.model
        if not args.fused_lm_head:  # the reference path (zppo_trl.lm_head): TRL fuses the head unconditionally
            use_full_logits(student, self.temperature)
        else:  # TRL's PyTorch tiles would score the prompts' positions too (zppo_trl.lm_head)
            score_loss_positions(student)
        if args.padding_free:  # the layers that would see across packed sequences, run per sequence (zppo_trl.packing)
            segment_packed_sequences(self.accelerator.unwrap_model(self.model))

    def _build_row_parts(self, args: ZPPOConfig, teacher: Any, distill_teacher_model: Any, rng: random.Random) -> None:
        """The row's parts at run time: its teachers, its named terms, the state checkpoints hold, its step-5 part."""
        row, questions = self.row, self.questions
        self.teacher, self.distill_teacher = prepare_teachers(
            row, args, teacher, distill_teacher_model, student=self.model, tokenizer=self._tokenizer,
            accelerator=self.accelerator, deepspeed=self.is_deepspeed_enabled, fsdp=self.is_fsdp_enabled,
        )  # fmt: skip
        # The row's named terms (zppo_trl.terms), each with what the trainer offers it.
        self.terms: list[Term] = [term(args, self._term_context(self._parameters_sharded, rng)) for term in row.terms]
        # The replay buffer, admission accuracies, counters, the shared RNG (identical on every rank: every decision
        # is replicated) and the terms' state: what checkpoints hold
        self.zppo_state = ZPPOState(args.replay_capacity, args.hard_threshold, rng, self.num_generations, self.terms)
        # Steps 4-5's part: ZPPO's BCQ/NCQ prompts, a comparison row's augmentation or target source; GRPO†: none.
        self.source: Source = row.source.create(tuple(args.augmentations), AugmentationInputs(
            args.prefix_fraction, self._tokenizer, question_of=lambda key: questions.question(questions.row(key)),
            teacher_chat=lambda key, text: questions.teacher_chat(questions.row(key), text),
            grade=self.grader.grade_keys, answer_of=lambda key: questions.row(key)[data.ANSWER],
            bcq_candidate_content=args.bcq_candidate_content,
        ))  # fmt: skip
        # The condition the checkpoint is evaluated under (Correction-SFT: <correct>), in the config every
        # save and push writes, for `zppo-eval run` to apply; the other rows clear one a base model carried.
        record_condition(self.model.config, self.source.evaluation_condition)
        self.objective_loss = row.objective  # step 6's loss (zppo_trl.losses)

    def _build_step_collaborators(self, args: ZPPOConfig) -> None:
        """The objects one rollout step calls: the recorder, the teacher sampler, the rounds, the log-prob paths and
        step 6's batches, each from explicit arguments."""
        ranks, G, row, state = self.ranks, self.num_generations, self.row, self.zppo_state
        sharded = self._parameters_sharded
        # The generation round in flight: what TRL's hooks read and where its scoring leaves the rewards.
        self._active_round: RoundRequest | None = None
        # reward functions whose rewards carry no signal, warned once each (zppo_trl.reward_signal)
        reward_form = "lists of chat messages" if self.dataset_format.messages_for_rewards else "strings"
        self.recorder = StepRecorder(
            ranks=ranks, group_size=G, num_partitions=args.num_partitions, main_process=self.is_world_process_zero(),
            state=state, trl_metrics=self._metrics, trl_logs=self._logs,
            clients={"teacher": self.teacher, "judge": judge_client(self.terms, self.reward_funcs)},
            kinds=self.source.kinds, questions=self.questions,
            reward_signal=RewardSignalWatch(self.reward_func_names, reward_form),
            trace_log=self.trace_log, group_log=self.group_log,
        )  # fmt: skip
        self.teacher_sampler = TeacherSampler(
            self.teacher, self.questions, self.grader, ranks, G, self.recorder, n=args.teacher_num_generations,
            max_tokens=args.teacher_max_tokens, temperature=args.teacher_temperature, top_p=args.teacher_top_p,
        )  # fmt: skip
        # old log-probs wait for the step's micro-batches (defer_old_logps) unless a term reads them at scoring (LENS)
        defers = args.defer_old_logps and not row.needs.sampling_logps_at_scoring
        self.rounds = Rounds(
            self.generate_and_score, questions=self.questions, ranks=ranks, group_size=G, recorder=self.recorder,
            counters=state.counters, tokenizer=self._tokenizer, eos_token_id=self.eos_token_ids[0],
            max_completion_length=self.max_completion_length, context=args.vllm_max_model_length,
            on_server=self.rollouts_on_server, defers_old_logps=defers, token_types=self._token_types,
        )  # fmt: skip
        self.early_rollouts = early_rollouts(  # pipeline_second_round: each BCQ/NCQ prompt sent once it is built
            args, self.vllm_generation if self.rollouts_on_server else None, self.accelerator.is_main_process,
            sampled=self.source.second_round_sampled, tokenize=self._tokenize_prompts, row=self.rounds.built_row,
            custom=bool(self.rollout_func or self.tools or self.environment_factories), group_size=G,
        )  # fmt: skip
        self.token_logps = TokenLogProbs(
            super()._get_per_token_logps_and_entropies, unwrap_model=self.accelerator.unwrap_model,
            autocast=self.accelerator.autocast, args=args, counters=state.rank_tally, token_types=self._token_types,
        )  # fmt: skip
        reads = self.objective_loss.reads_old_logps
        self.old_logps = OldLogProbs(
            self.token_logps, model=lambda: self.model, ranks=ranks, recorder=self.recorder,
            accumulation=args.gradient_accumulation_steps, deferred=defers, read=reads,
            overlap=overlaps_old_logps(args, defers=defers, reads=reads, second_round=self.source.second_round_sampled,
                                       terms=bool(self.terms), sharded=sharded),
            sharded=sharded, shared=args.shared_prompt_forward,
        )  # fmt: skip
        self.batches = StepBatches(
            args, ranks, G, self._tokenizer.pad_token_id, terms=self.terms, dense=row.needs.trains_zero_advantage,
            rng=state.rng, recorder=self.recorder,
        )  # fmt: skip
        self.teacher_signal = TeacherSignal(
            self.distill_teacher, vocab=len(self._tokenizer), autocast=self.accelerator.autocast,
            fused_lm_head=args.fused_lm_head, chunk_size=args.distill_chunk_size,
        )  # fmt: skip

    @property
    def replay_buffer(self) -> PromptReplayBuffer:
        """The prompt replay buffer (:attr:`zppo_state`'s)."""
        return self.zppo_state.replay_buffer

    @property
    def counters(self) -> dict[str, float]:
        """The cumulative ZPPO counters (:attr:`zppo_state`'s)."""
        return self.zppo_state.counters

    @property
    def rollouts_on_server(self) -> bool:
        """Whether the student's rollouts come from a vLLM server (TRL's server mode), whose context and
        availability the rollout step must then respect (zppo_trl.student_server)."""
        return bool(self.use_vllm and self.vllm_mode == "server")

    @property
    def _parameters_sharded(self) -> bool:
        """Whether a forward pass gathers the parameters over ranks (ZeRO-3, FSDP)."""
        deepspeed = getattr(self.accelerator.state, "deepspeed_plugin", None)
        return self.is_fsdp_enabled or (self.is_deepspeed_enabled and deepspeed.zero_stage == 3)

    def _term_context(self, sharded: bool, rng: random.Random) -> TermContext:
        """What the trainer offers a term (zppo_trl.terms.TermContext)."""
        return TermContext(
            args=self.args, ranks=self.ranks, tokenizer=self._tokenizer, group_size=self.num_generations,
            temperature=self.temperature, rng=rng, dataset=self.train_dataset, row=self.questions.row,
            question=self.questions.question, teacher_chat=self.questions.teacher_chat, grade=self.grader.grade,
            evidence=lambda s, keys: self.teacher_sampler.evidence(s.teacher_future, s.draw, s.round, keys),
            student_copy=student_copy_maker(
                self.model, self.accelerator.device, sharded=sharded, add_callback=self.add_callback
            ),
            judge=lambda: TeacherClient.from_config(self.args, role="judge"), teacher=self.teacher,
            distill_teacher=self.distill_teacher, token_types=self._token_types, autocast=self.accelerator.autocast,
            tokenize_prompts=lambda conversations: self._tokenize_prompts(conversations)[0],
        )  # fmt: skip

    def _token_types(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Image (1) and video (2) placeholder positions of ``input_ids``, as TRL marks them for tool images."""
        return token_types(input_ids, self._image_pad_token_id, self._video_pad_token_id)

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None):
        """TRL's training loop, holding ``output_dir``'s lock (:mod:`zppo_trl.run_lock`: one run per folder) and the
        stop signals (:mod:`zppo_trl.preemption`: SIGTERM/SIGUSR1 end the run at a whole rollout step, checkpointed);
        ``resume_from_checkpoint=True`` resumes from the newest *complete* checkpoint (one a kill left half written
        is skipped, named: :func:`zppo_trl.checkpoint_state.last_complete_checkpoint`)."""
        with run_lock(self.args.output_dir, active=self.args.should_save):
            checkpoint = resume_checkpoint(self.args.output_dir, resume_from_checkpoint)
            with self.preemption.installed(self.args.output_dir):
                return super().train(checkpoint, trial, ignore_keys_for_eval)

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
        if self.state.global_step >= self.state.max_steps:  # resumed at max_steps: HF would train one update more
            self.control.should_training_stop = True
            return [], None
        # through a lookahead, so that a rollout step can read the next one's batch (prefetch_teacher_samples)
        if self._lookahead.source is not epoch_iterator:  # a new epoch
            self._lookahead = BatchLookahead(epoch_iterator)
        return super().get_batch_samples(self._lookahead, num_batches, device)

    def _prepare_inputs(self, generation_batch):
        if isinstance(generation_batch, Mapping):  # a micro-batch this trainer already prepared
            return generation_batch
        if not self.model.training:
            return super()._prepare_inputs([self.questions.with_prompt(row) for row in generation_batch])
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

    # ------------------------------------------------------------------ TRL hooks: generation and scoring

    def generate_and_score(self, rows: list[dict], request: RoundRequest) -> dict:
        """TRL's generation and scoring of ``rows`` (its batch) with ``request`` the round in flight, which the hooks
        below read: response prefixes, given responses, and where the scoring leaves rewards and texts."""
        self._active_round = request
        try:
            with trl_deprecated_calls():  # TRL's own calls of transformers' renamed checkpointing API
                return super()._generate_and_score_completions(rows)
        finally:
            self._active_round = None

    def _tokenize_prompts(self, prompts: list):
        prompt_ids, images, multimodal_fields = super()._tokenize_prompts(prompts)
        prompt_ids, multimodal_fields = prompts_with_prefixes(prompt_ids, multimodal_fields, self._active_round)
        return prompt_ids, images, multimodal_fields

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        request = self._active_round
        if request is not None and request.given_responses is not None:  # the targets: given, not sampled
            return [list(ids) for ids in request.given_responses], None
        overlong = [False] * len(prompt_ids)
        if self.rollouts_on_server and self.args.vllm_max_model_length:
            # one prompt beyond the server's context would fail the whole request: its rollouts are a bare
            # end of sequence each (a group without signal, like an all-wrong one), and Rounds.check_context names it
            prompt_ids, overlong = stand_in_for_overlong(prompt_ids, self.args.vllm_max_model_length, images)
        # Decoding alone allocates from glibc's heap: its many small tensors per token are cheapest there, and
        # the heap is handed back when it ends. The forward passes that score the rollouts keep large tensors
        # in pages of their own (zppo_trl.host_memory).
        with host_memory.generation_heap(), student_server_errors(self):
            if request is not None and request.early is not None:  # a pipelined round: sent as its prompts were built
                completion_ids, logprobs = request.early.take(prompt_ids, images)
            else:
                completion_ids, logprobs = super()._generate_single_turn(
                    prompt_ids, images, multimodal_fields, num_generations, has_tool_images
                )
        completion_ids, logprobs = stood_in(completion_ids, logprobs, overlong, self.eos_token_ids[0])
        return cut_to_budget(completion_ids, logprobs, request, self.max_completion_length)

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        request = self._active_round
        if request is not None and request.given_responses is not None:
            # Teacher-forced targets: already graded, never judged again (their reward is never read).
            return torch.zeros(
                len(prompts) * self.accelerator.num_processes, len(self.reward_funcs), device=self.accelerator.device
            )
        decode = lambda ids: self._tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        completions = responses_with_prefixes(completions, completion_ids_list, request, decode)
        prompts, completions = self.dataset_format.for_rewards(prompts, completions)  # as TRL would give them
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        hand_back(request, rewards_per_func, self.reward_weights, completions)
        return rewards_per_func

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, pixel_values=None, image_grid_thw=None, num_images=None, pixel_attention_mask=None,
        spatial_shapes=None, num_tiles=None, image_sizes=None, token_type_ids=None, mm_token_type_ids=None,
        image_position_ids=None,
    ):  # fmt: skip
        # TRL's signature, spelled out (tests/test_trl_coupling.py compares it with the installed TRL's)
        multimodal = dict(
            pixel_values=pixel_values, image_grid_thw=image_grid_thw, num_images=num_images,
            pixel_attention_mask=pixel_attention_mask, spatial_shapes=spatial_shapes, num_tiles=num_tiles,
            image_sizes=image_sizes, token_type_ids=token_type_ids, mm_token_type_ids=mm_token_type_ids,
            image_position_ids=image_position_ids,
        )  # fmt: skip
        request = self._active_round
        if request is not None and not request.old_logps:  # TRL's old log-probs: see OldLogProbs.attach
            return None, None, None
        if request is not None and request.given_responses is not None:
            # Teacher-forced targets: TRL's old log-probs of them are never read (the SFT and JSD losses).
            empty = torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device)
            return empty, (torch.zeros_like(empty) if compute_entropy else None), None
        return self.token_logps(
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, multimodal
        )

    # ------------------------------------------------------------------ TRL hooks: checkpoints and the card

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        if self.args.should_save:
            self.zppo_state.save(output_dir)

    def _save_checkpoint(self, model, trial) -> None:
        checkpoint = os.path.join(self._get_output_dir(trial), f"checkpoint-{self.state.global_step}")
        with checkpoint_written(checkpoint, main=self.args.should_save):  # a full disk: one error, named
            if self.args.save_only_model and self.args.should_save:  # transformers then skips _save_rng_state
                self.zppo_state.save(checkpoint)
            super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            self.zppo_state.load(checkpoint, self.accelerator.device, self.model.state_dict)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """Write ``output_dir/README.md``: the model card of this run (:func:`zppo_trl.model_card.write_run_card`),
        in place of TRL's, which links a local student as ``huggingface.co/None`` and cites TRL alone."""
        if self.is_world_process_zero():
            tags = (*self._tag_names, *([tags] if isinstance(tags, str) else tags or ()))
            dataset, steps, history = dataset_name or self.dataset_name, self.state.global_step, self.state.log_history
            write_run_card(self.args, self.model.config, model_name, dataset, self.model_license, tags, steps, history)

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
            loss_inputs.distill = self.teacher_signal.distributions(model, inputs)
        else:
            loss_inputs.logps, loss_inputs.entropies, aux_loss = completion_logps(  # through TRL's hook, as TRL's loss
                self._get_per_token_logps_and_entropies, model, inputs, self.aux_loss_enabled
            )
            loss_inputs.old_logps, loss_inputs.advantages = inputs.get("old_per_token_logps"), inputs.get("advantages")
            for term in self.terms:  # a term's own advantages (token-level on the all-wrong groups)
                advantages = term.advantages(loss_inputs, inputs)
                if advantages is not None:
                    loss_inputs.advantages = advantages
            if self.objective_loss.needs_teacher_logps:  # the teacher's log-prob of each sampled token
                loss_inputs.teacher_logps = self.teacher_signal.token_logps(inputs)
                loss_inputs.step = self.state.global_step
            for term in self.terms:  # what the objective reads of a term (a self-teacher's signal)
                term.prepare_loss(model, inputs, loss_inputs)
        out = self.objective_loss.fn(loss_inputs, self.args)
        for term in self.terms:  # a term added to the objective's loss (a teacher target on the all-wrong questions)
            added = term.loss_term(inputs, loss_inputs, lambda: self.teacher_signal.distributions(model, inputs))
            if added is not None:
                out.loss, out.means = out.loss + added[0], {**out.means, **added[1]}
        loss = out.loss
        if self.aux_loss_enabled and aux_loss is not None:  # as TRL: scaled for gradient accumulation
            loss = loss + self.router_aux_loss_coef * aux_loss / (
                self.current_gradient_accumulation_steps if mode == "train" else 1.0
            )
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())
        log_loss(out, self.accelerator, self._metrics[mode])
        return loss

    def _update_count(self, inputs, key: str, mode: str) -> torch.Tensor:
        """A loss divisor as TRL's ``"dapo"`` divisor rescales ``num_items_in_batch``: to one accumulation
        window and one rank. ZPPO's micro-batches carry their partition's token count (``num_items_in_batch``)
        and response count (``num_sequences_in_batch``) x ``num_partitions``, so it is that count / processes
        (gradients are averaged over ranks)."""
        count = inputs[key].clamp(min=1.0) / self.accelerator.num_processes
        if mode == "train":  # in eval the batch is neither split across steps nor accumulated
            count = count * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return count

    # ------------------------------------------------------------------ the rollout step (Algorithm 1)

    def _rollout_step(self, inputs: list[dict]) -> list[dict]:
        """One rollout step of Algorithm 1; returns this rank's optimizer micro-batches."""
        metrics = self.recorder.begin(self.state.global_step)
        self.preemption.begin_rollout_step()  # its start, kept in case a stop signal makes it leave the step
        args = self.args
        # 1. X_new from the dataloader (each row repeated G times), X_replay from the buffer.
        draw = self._draw_questions(inputs)
        # 2. Teacher sampling for every question of X starts now, overlapping the student's rollouts.
        sampling = self.row.needs.teacher_samples
        teacher_future = self.teacher_sampler.start(draw.plain) if sampling else None
        # 3. Plain rollouts, scored; plain accuracy r_x per question over all ranks. TRL sends the student's
        # server the weights as the round starts (timed where the shared-memory client sends them).
        syncs = weight_syncs(self)
        synced_before = len(syncs) if syncs is not None else 0
        plain_round = self.rounds.play(draw.plain, "plain")
        if syncs is not None:
            metrics["time/weight_sync_s"] = sum(s["write"] + s["reload"] for s in syncs[synced_before:])
        accuracy = plain_accuracy(
            plain_round.groups_per_rank,
            plain_round.rewards,
            self.num_generations,
            order=draw.new_keys + draw.replay_keys,
        )
        self.recorder.reward_signal_check(plain_round)  # a reward function that cannot teach, said in that step
        self.preemption.leave_rollout_step(self.state.global_step)  # a stop signal the rest would not fit: leave now
        # The plain rollouts' old log-probs, computed while steps 4-5 run off this device (overlap_old_logps).
        plain_logps = self.old_logps.start(plain_round.batch)
        # 4-6. The row's optimizer micro-batches (its step-5 part's stages), with the old log-probs the updates read.
        micro_batches = self._steps_4_to_6(teacher_future, draw, plain_round, accuracy)
        self.old_logps.attach(micro_batches, plain_logps)
        if self.trace_log is not None:  # before step 7, while the graduates' admission bins are known
            self.recorder.graduations(draw, plain_round, accuracy)
        # 7. Buffer refresh from the plain groups only.
        metrics.update(self.zppo_state.refresh(accuracy))
        if sampling and args.prefetch_teacher_samples:  # the teacher samples the next step during these updates
            self._prefetch_next_questions()

        metrics["new"], metrics["replayed"] = len(draw.new_keys), len(draw.replay_keys)
        metrics["plain_accuracy"] = sum(accuracy.values()) / max(len(accuracy), 1)
        self.recorder.finish()
        return micro_batches

    def _steps_4_to_6(self, teacher_future: Any, draw: Draw, plain_round: Round, accuracy: Mapping) -> list[dict]:
        """Steps 4-6, the same stages for every row; its step-5 part (:class:`~zppo_trl.augmentations.Source`) says
        what each makes: ZPPO's BCQ/NCQ groups, a comparison row's, none (GRPO†), or targets to fit."""
        source, metrics, rng = self.source, self.recorder.metrics, self.zppo_state.rng
        # 4. The questions it takes evidence on (ZPPO: the pre-cap), with the teacher's graded replies to them and
        # their wrong plain rollouts.
        limit = augment_limit(len(draw.new_keys), self.args.augment_fraction)
        keys = source.evidence_keys(accuracy, draw, limit, self.args.hard_threshold, rng)
        evidence = None if keys is None else self.teacher_sampler.evidence(teacher_future, draw, plain_round, keys)
        # 5. Its instances planned (post-cap, the same on every rank) and built; then the second round: the student's
        # group on each built instance, or the targets teacher-forced.
        plan = source.plan(evidence, limit, rng, metrics)
        built, most_built = self._build(plan)
        if self.trace_log is not None:
            self.recorder.references(built, accuracy)
        second_round = source.second_round(self.rounds, built, most_built, draw.plain[0].row, plain_round)
        # Before step 6: the named terms' contributions to the scored plain round, and their targets.
        plain_round, term_targets = self._with_terms(PlainStep(draw, plain_round, teacher_future, metrics))
        # 6. Sampled groups partitioned with the plain ones (two-step advantages), or targets in their questions'
        # partitions; the teacher server's scores where the row's loss reads them.
        if source.supervised:
            micro_batches = self.batches.targets(second_round, draw)
        else:
            micro_batches = self.batches.policy(plain_round, second_round, term_targets)
        source.record(self.recorder, plan, built, plain_round, second_round)
        self._score_on_teacher_server(micro_batches)
        return micro_batches

    def _with_terms(self, step: PlainStep) -> tuple[Round, Round | None]:
        """The plain round with the terms' contributions, and their target round
        (:func:`~zppo_trl.row_parts.apply_terms`)."""
        return apply_terms(self.terms, step, self.rounds.targets)

    def _score_on_teacher_server(self, micro_batches: list[dict]) -> None:
        """The teacher server's scores of the trained rows, where the row's needs ask for them and no teacher is
        loaded next to the student (only the rows a term marks, where one does)."""
        scores = self.row.scores_from_server(self.distill_teacher is not None)
        if scores:
            only = next((term.scores_only for term in self.terms if term.scores_only), None)
            top_k, metrics = self.args.distill_top_k, self.recorder.metrics
            attach_teacher_scores(self.teacher, micro_batches, scores, top_k, metrics, only)

    # 1.

    def _draw_questions(self, inputs: list[dict]) -> Draw:
        """Step 1: the new questions and a replay draw from the buffer, dealt over ranks."""

        def sample_replay(new_count: int) -> list:
            count = replay_count(new_count, self.args.replay_fraction, len(self.replay_buffer))
            return self.replay_buffer.sample(count, rng=self.zppo_state.rng)

        if self.questions.streamed:  # a stream: this step's questions, from every rank, are the ones looked up
            local = [inputs[i] for i in range(0, len(inputs), self.num_generations)]
            self.questions.take_stream([row for part in self.ranks.gather(local) for row in part])
        return draw_questions(inputs, self.num_generations, sample_replay, self.ranks, self.questions.row)

    # 2., ahead

    def _prefetch_next_questions(self) -> None:
        """Ask the teacher for the next rollout step's new questions on this rank: the dataloader's batch after
        this step's ``steps_per_generation`` (this update's are taken already), read ahead. Nothing is asked past
        ``max_steps`` or the epoch's end, nor in a step a resumed run entered in its middle."""
        steps = self.args.steps_per_generation
        if self._step % steps or self.state.global_step + self.args.num_partitions >= self.state.max_steps:
            return
        batch = self._lookahead.peek(steps - self.current_gradient_accumulation_steps)
        if batch is not None:
            self.teacher_sampler.prefetch([batch[i] for i in range(0, len(batch), self.num_generations)])

    # 5.

    def _build(self, plan: Sequence) -> tuple[BuiltGroups, int]:
        """Step 5, first half: this rank's share of the instances (dealt round-robin), built; and the
        most groups any rank built (the plan is the same on every rank, so all take the same path)."""
        metrics = self.recorder.metrics
        local = self.ranks.share(self.source.order(plan)) if plan else []
        early = self.early_rollouts and self.early_rollouts.open()  # every rank's, or none (pipeline_second_round)
        ready = early.send if early is not None else None
        built = self.source.build(local, self.teacher, self.args, metrics, ready=ready) if local else BuiltGroups()
        built.early = early
        most_built = self.ranks.largest(len(built.groups))
        metrics.update(self.source.build_metrics(plan, built, self.ranks, metrics))
        return built, most_built


# ---------------------------------------------------------------------- helpers


def _checked_arguments(model: Any, reward_funcs: Any, args: ZPPOConfig | None) -> tuple[ZPPOConfig, Any]:
    """The configuration (as GRPOTrainer, a default one named after the model) and the reward functions (default: the
    boxed grader), refused where ZPPO cannot train with them."""
    if args is None:
        args = ZPPOConfig(f"{_model_name(model)}-ZPPO")
    if not isinstance(args, ZPPOConfig):
        raise TypeError(f"args must be a ZPPOConfig, got {type(args).__name__}")
    if args.fp16:
        raise ValueError("fp16 is not supported: its GradScaler cannot skip an empty-signal partition; use bf16")
    reward_funcs = boxed_accuracy_reward if reward_funcs is None else reward_funcs
    for func in reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]:
        if not callable(func) or isinstance(func, (str, torch.nn.Module)):
            raise ValueError(f"ZPPO needs verifiable rewards: reward_funcs must be plain callables, got {func!r}")
    return args, reward_funcs


def _model_name(model: Any) -> str:
    """The model's name for a default ``output_dir``, as GRPOTrainer names it: its id's last part."""
    return (model if isinstance(model, str) else get_config_model_id(model.config)).split("/")[-1]
