"""The per-token log-prob paths: TRL's log-prob computation, padded or packed with ``padding_free``
(:class:`TokenLogProbs`); the sampling policy's old log-probs of a step's micro-batches, on a second thread where
``overlap_old_logps`` hides them behind the second round (:class:`OldLogProbs`, :func:`overlaps_old_logps`); and the
teacher's signal on a micro-batch for the distillation rows and KDRL/RLAD (:class:`TeacherSignal`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from . import shared_prompts
from .batches import ROUND_ROW, TOKEN_TYPE_FIELDS, concat_batches, num_rows, rows_alone
from .distill import DistillInputs, TeacherTopK, chosen_token_logps, completion_states
from .packing import ImageRows, batch_refusal, model_refusal, multimodal_refusal, pack
from .partitioning import is_skipped
from .shared_prompts import share_prompts, shared_refusal
from .teacher_scores import TEACHER_LOGPS_FIELD, TEACHER_TOPK_IDS, TEACHER_TOPK_LOGPS

__all__ = [
    "OldLogProbs",
    "TeacherSignal",
    "TokenLogProbs",
    "completion_logps",
    "overlaps_old_logps",
    "rollouts_off_device",
    "scoring_inputs",
]

logger = logging.getLogger(__name__)

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


def scoring_inputs(inputs) -> tuple:
    """A batch's ``(input_ids, attention_mask, logits_to_keep, multimodal)``, as TRL's log-prob hook takes them."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    multimodal = {key: inputs.get(key) for key in _MULTIMODAL_FIELDS}
    return input_ids, attention_mask, inputs["completion_ids"].size(1), multimodal


class TokenLogProbs:
    """TRL's per-token log-probs, entropies and aux loss of a batch, each chunk of rows packed into one row with
    ``padding_free`` (the paper's "Padding-free training", :mod:`zppo_trl.packing`) or run padded by TRL's own
    computation. It reads no round in flight, so a second thread may run it (:class:`OldLogProbs`).

    Args:
        padded: TRL's ``_get_per_token_logps_and_entropies`` (the padded computation).
        unwrap_model: the accelerator's ``unwrap_model``; ``autocast``: its autocast context.
        args: the configuration (its ``padding_free``, read at every call).
        counters: this rank's tally of its own work (``padded_micro_batches_total``, ``unshared_micro_batches_total``,
            ``shared_prompt_tokens_saved_total``): the run's :attr:`~zppo_trl.checkpoint_state.ZPPOState.rank_tally`,
            summed over the ranks into the run's counters after every update.
        token_types: token ids -> the image/video placeholder types TRL marks.
    """

    def __init__(
        self,
        padded: Callable,
        *,
        unwrap_model: Callable,
        autocast: Callable,
        args: Any,
        counters: Any,
        token_types: Callable[[torch.Tensor], torch.Tensor],
    ):
        self.padded, self.unwrap_model, self.autocast = padded, unwrap_model, autocast
        self.args, self.counters, self.token_types = args, counters, token_types
        self._warned: set[str] = set()  # the reasons padding_free or shared_prompt_forward fell back for, warned once

    def __call__(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size,
        compute_entropy,
        compute_aux_loss,
        multimodal,
    ):
        """As TRL's hook: ``(log-probs, entropies or None, aux loss or None)`` of the completions."""
        # TRL re-derives the token types of image prompts from the prompt text, which has no response
        # prefix (the Prefix control): rebuild them from the ids when their width does not match.
        for name in TOKEN_TYPE_FIELDS:
            if multimodal.get(name) is not None and multimodal[name].size(1) != input_ids.size(1):
                multimodal[name] = self.token_types(input_ids)
        batch_size = batch_size or input_ids.size(0)
        if self.args.shared_prompt_forward:  # each distinct prompt through the model once (zppo_trl.shared_prompts)
            present = sorted(name for name, value in multimodal.items() if value is not None)
            refusal = shared_refusal(self.unwrap_model(model).config)
            if refusal is None and present:
                refusal = f"the batch carries multimodal inputs ({', '.join(present)})"
            if refusal is None and compute_aux_loss:
                refusal = "the loss takes the router's aux loss"
            if refusal is None:
                return self._shared(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy)
            self._count_unshared(model, refusal, math.ceil(input_ids.size(0) / batch_size))
        if self.args.padding_free:  # the paper's "Padding-free training" (zppo_trl.packing)
            config = self.unwrap_model(model).config
            present = sorted(name for name, value in multimodal.items() if value is not None)
            refusal = model_refusal(config) or multimodal_refusal(config, present)
            if refusal is None:
                return self._packed(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size,
                    compute_entropy,
                    compute_aux_loss,
                    {name: multimodal[name] for name in present},
                )
            self._count_padded(model, refusal, math.ceil(input_ids.size(0) / batch_size))
        return self.padded(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=batch_size,
            compute_entropy=compute_entropy,
            compute_aux_loss=compute_aux_loss,
            **multimodal,
        )

    def _packed(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, aux, multimodal):
        """Each chunk of ``batch_size`` rows run as one packed row (:func:`zppo_trl.packing.pack`); a chunk that
        cannot be packed runs padded. ``multimodal``: a Qwen3.5 VLM's images and token types
        (:data:`zppo_trl.packing.PACKED_MULTIMODAL_FIELDS`), or empty."""
        logps, entropies, aux_losses = [], [], []
        images = ImageRows(multimodal)
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            ids, mask = input_ids[start:end], attention_mask[start:end]
            chunk_images = images.rows(start, end)
            refusal = batch_refusal(mask, logits_to_keep)
            if refusal is not None:
                self._count_padded(model, refusal, 1)
                chunk = self.padded(
                    model,
                    ids,
                    mask,
                    logits_to_keep,
                    compute_entropy=compute_entropy,
                    compute_aux_loss=aux,
                    **chunk_images,
                )
            else:
                packed = pack(ids, mask, logits_to_keep)
                inputs = packed.model_inputs(self.unwrap_model(model), ids, chunk_images)
                with self.autocast():  # no attention mask: the position ids separate the rows
                    out = model(**inputs, fused_lm_head=True, **({"output_router_logits": True} if aux else {}))
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

    def _shared(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy):
        """Each chunk of ``batch_size`` rows run with each distinct prompt once (:func:`share_prompts`); a chunk
        that cannot be laid out so runs packed with ``padding_free`` (where packing takes it), else padded."""
        logps, entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            ids, mask = input_ids[start:end], attention_mask[start:end]
            refusal = batch_refusal(mask, logits_to_keep)
            # a rank's micro-batch of zero-weight rows only (every rollout empty): there is nothing to lay out, and the
            # model must still run (DDP reduces every rank's gradients), so it runs padded
            empty = not bool(mask[:, mask.size(1) - logits_to_keep :].any())
            if refusal is None and empty:
                refusal = "no row holds a completion token"
            shared = share_prompts(ids, mask, logits_to_keep) if refusal is None else None
            if isinstance(shared, int):
                refusal = f"a shared row would hold more than {shared_prompts.MAX_SHARED_TOKENS:,} tokens"
            if refusal is not None:
                self._count_unshared(model, refusal, 1)
                if self.args.padding_free and not empty:
                    chunk = self._packed(model, ids, mask, logits_to_keep, end - start, compute_entropy, False, {})
                else:
                    chunk = self.padded(model, ids, mask, logits_to_keep, compute_entropy=compute_entropy)
            else:
                # the tokens the prompts' repeats would have cost, padding not counted (zppo/..., this rank's)
                self.counters["shared_prompt_tokens_saved_total"] += int(mask.sum()) - shared.input_ids.size(1)
                with self.autocast():
                    out = model(**shared.model_inputs(), fused_lm_head=True)
                entropy = shared.unpack(out.entropy) if compute_entropy else None
                chunk = shared.unpack(out.log_probs), entropy, None
            logps.append(chunk[0])
            entropies.append(chunk[1])
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def _count_unshared(self, model, reason: str, micro_batches: int) -> None:
        """Count micro-batches that ``shared_prompt_forward`` could not lay out with their prompts shared
        (``zppo/unshared_micro_batches_total``, all ranks'), warning once per reason: they run as they would without
        it, never wrongly."""
        self.counters["unshared_micro_batches_total"] += micro_batches
        if f"shared: {reason}" not in self._warned:
            self._warned.add(f"shared: {reason}")
            model_type = self.unwrap_model(model).config.get_text_config().model_type
            logger.warning("shared_prompt_forward: %s micro-batches run unshared: %s", model_type, reason)

    def _count_padded(self, model, reason: str, micro_batches: int) -> None:
        """Count micro-batches that ``padding_free`` could not pack (``zppo/padded_micro_batches_total``,
        all ranks'), warning once per reason: they run padded, never packed wrongly."""
        self.counters["padded_micro_batches_total"] += micro_batches
        if reason not in self._warned:
            self._warned.add(reason)
            model_type = self.unwrap_model(model).config.get_text_config().model_type
            logger.warning("padding_free: %s micro-batches run padded: %s", model_type, reason)


def completion_logps(score: Callable, model, inputs, aux_loss: bool = False) -> tuple:
    """A micro-batch's per-token log-probs, entropies and (with ``aux_loss``) the router's aux loss, from ``score``:
    TRL's log-prob hook (``trainer._get_per_token_logps_and_entropies``), called as TRL's loss calls it."""
    input_ids, attention_mask, keep, multimodal = scoring_inputs(inputs)
    return score(model, input_ids, attention_mask, keep, compute_entropy=True, compute_aux_loss=aux_loss, **multimodal)


def rollouts_off_device(args: Any) -> bool:
    """Whether the student's rollouts are generated off the trainer's device (on its vLLM server)."""
    return bool(args.use_vllm and args.vllm_mode == "server")


def overlaps_old_logps(
    args: Any, *, defers: bool, reads: bool, second_round: bool, terms: bool, sharded: bool
) -> bool:
    """Whether the plain rollouts' old log-probs are computed while the rest of the step runs off this device
    (``overlap_old_logps``): the teacher's evidence, the compressions and the student's second round on its vLLM
    server. Only where the second round has something to hide behind and nothing else uses the trainer's device
    meanwhile: a policy objective deferring its old log-probs (``defers``, ``reads``), an augmentation with a sampled
    second round (``second_round``), rollouts from a server, no term (a term may run the student on the main thread
    meanwhile), and parameters every rank holds whole (ZeRO-3's and FSDP's forward passes gather parameters
    collectively, which a second thread must not interleave with the step's own gathers: ``sharded``)."""
    return (
        args.overlap_old_logps
        and defers
        and reads
        and second_round
        and rollouts_off_device(args)
        and not terms
        and not sharded
    )


class OldLogProbs:
    """The sampling policy's per-token log-probs (``old_per_token_logps``) of a step's micro-batches, each rollout
    scored alone (:meth:`rollouts`), or with ``shared_prompt_forward`` with the other rollouts of its prompt that are
    scored at the same time, the prompt once: the same numbers wherever it is computed (up to float rounding where
    prompts are shared, since the row then runs beside different rows).

    Args:
        scorer: the :class:`TokenLogProbs` (the model's computation).
        model: () -> the student as the trainer holds it now.
        ranks: :class:`zppo_trl.ranks.Ranks`; ``recorder``: the :class:`zppo_trl.step_records.StepRecorder`.
        accumulation: ``gradient_accumulation_steps`` (a partition's micro-batches).
        deferred: whether a step's old log-probs wait for its micro-batches (``defer_old_logps``, and the row
            not reading them at scoring time); ``read``: whether the loss reads them at all.
        overlap: whether the plain rollouts' are computed on a second thread (:func:`overlaps_old_logps`).
        sharded: whether a forward pass gathers parameters over ranks (ZeRO-3, FSDP).
        shared: whether the rollouts of one prompt are scored together, the prompt once (``shared_prompt_forward``).
    """

    def __init__(
        self,
        scorer: TokenLogProbs,
        *,
        model: Callable[[], Any],
        ranks: Any,
        recorder: Any,
        accumulation: int,
        deferred: bool,
        read: bool,
        overlap: bool,
        sharded: bool,
        shared: bool = False,
    ):
        self.scorer, self.model, self.ranks, self.recorder = scorer, model, ranks, recorder
        self.accumulation, self.deferred, self.read, self.overlap, self.sharded = (
            accumulation,
            deferred,
            read,
            overlap,
            sharded,
        )
        self.shared = shared
        self._thread: ThreadPoolExecutor | None = None

    def start(self, plain_batch: dict) -> Future | None:
        """Start computing every plain rollout's old log-probs on a second thread (where :attr:`overlap`), each
        rollout alone; :meth:`attach` waits for them. The plain rollouts are fixed and the weights that sampled them
        are the ones in place until the step's first update, so this is the very computation the serial schedule
        makes later, on the same numbers."""
        if not self.overlap:
            return None
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zppo-old-logps")
        rows = list(enumerate(rows_alone(plain_batch)))  # the plain round's batch is in TRL's layout
        device = self.ranks.device

        def compute() -> tuple[dict[int, torch.Tensor], float]:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            t0 = time.perf_counter()
            return self.rollouts(rows), time.perf_counter() - t0

        return self._thread.submit(compute)

    def rollouts(self, rows: list[tuple[int, dict]]) -> dict[int, torch.Tensor]:
        """The sampling policy's per-token log-probs of each rollout ``(key, batch of one row)``, the rollout scored
        alone (no padding, no other row), or one pass per prompt with ``shared_prompt_forward`` (:meth:`_passes`).

        It only reads the model, so a second thread may run it while the main thread uses the model: gradient
        checkpointing is left as it is (TRL turns it off and on around its own no-grad passes, which changes the
        model for every thread). Without gradients it has nothing to save: transformers (5.24) runs the layers
        as they are, earlier releases through a checkpoint that keeps nothing; the same numbers either way."""
        out, model = {}, self.model()
        with torch.no_grad():
            for members, batch in self._passes(rows):
                input_ids, attention_mask, keep, multimodal = scoring_inputs(batch)
                logps = self.scorer(model, input_ids, attention_mask, keep, None, False, False, multimodal)[0]
                for j, (key, width) in enumerate(members):
                    out[key] = logps[j, :width]
        return out

    def _passes(self, rows: list[tuple[int, dict]]) -> list[tuple[list[tuple[int, int]], dict]]:
        """The forward passes that score ``rows``: each ``(its rows' (key, completion width), its batch)``. A row
        alone, or with ``shared_prompt_forward`` every text row of one prompt together, so that the prompt runs
        once (:mod:`zppo_trl.shared_prompts`; not where parameters are sharded, whose ranks must run as many passes
        each, nor for rows with images, which are not shared)."""
        alone = [([(key, row["completion_ids"].size(1))], row) for key, row in rows]
        if not self.shared or self.sharded:
            return alone
        groups: dict[tuple, list[tuple[int, dict]]] = {}
        for key, row in rows:
            if any(row.get(name) is not None for name in _MULTIMODAL_FIELDS):
                groups[("alone", key)] = [(key, row)]
            else:
                groups.setdefault(tuple(row["prompt_ids"][row["prompt_mask"].bool()].tolist()), []).append((key, row))
        return [
            (
                [(key, row["completion_ids"].size(1)) for key, row in members],
                concat_batches([r for _, r in members], 0),
            )
            for members in groups.values()
        ]

    def attach(self, micro_batches: list[dict], plain: Future | None = None) -> None:
        """The sampling policy's per-token log-probs (``old_per_token_logps``) of the micro-batches that read
        them, on the weights that sampled the rollouts: every trained partition but the first one trained, which
        updates on those very weights (a skipped partition changes none), so its ratio is exactly 1 and its loss
        takes the detached log-probs of its own forward; and only when the loss is a policy objective. Each
        rollout is scored alone or with its prompt's (:meth:`rollouts`); ``plain`` holds the plain rollouts' (by
        merged-batch row, from :meth:`start`), computed while the step's second round was generated
        (``time/old_logps_hidden_s``); the rest are computed here (``time/old_logps_s``, with any wait for them).
        With ZeRO-3 every rank runs as many forward passes as the rank with most rows."""
        # each row's index in the merged batch (None where a micro-batch was not dealt from one)
        rows_of = [micro.pop(ROUND_ROW, None) for micro in micro_batches]
        rows_of = [
            [] if is_skipped(m) else [None] * num_rows(m) if r is None else r.tolist()
            for m, r in zip(micro_batches, rows_of, strict=True)
        ]
        t0, metrics = time.perf_counter(), self.recorder.metrics
        known: dict[int, torch.Tensor] = {}
        if plain is not None:
            known, metrics["time/old_logps_hidden_s"] = plain.result()
        if not self.deferred or not self.read:
            return
        ga = self.accumulation  # a partition's micro-batches, all skipped or none
        first_trained = next((i for i in range(0, len(micro_batches), ga) if not is_skipped(micro_batches[i])), 0)
        reading = [
            (micro, rows)
            for micro, rows in zip(micro_batches[first_trained + ga :], rows_of[first_trained + ga :])
            if not is_skipped(micro)
        ]
        # (micro-batch, row, its logps if the second thread scored it, the row alone) for every row with tokens
        # (zero-weight padding rows have none)
        wanted = []
        for micro, rows in reading:
            has_tokens = (micro["completion_mask"].sum(dim=1) > 0).tolist()
            for j, (key, alone) in enumerate(zip(rows, rows_alone(micro), strict=True)):
                if has_tokens[j]:
                    wanted.append((micro, j, known.get(key), alone))
        missing = [(i, alone) for i, (_, _, logps, alone) in enumerate(wanted) if logps is None]
        if self.sharded and reading:
            # ZeRO-3 and FSDP gather parameters in every forward pass: every rank runs as many as the rank with most
            filler = missing[-1] if missing else (None, rows_alone(reading[0][0])[0])
            missing += [filler] * (int(self.ranks.largest(len(missing))) - len(missing))
        fresh = self.rollouts(missing)
        for micro, _ in reading:  # set after rows_alone, which would carry the field into the rows it scores
            micro["old_per_token_logps"] = torch.zeros_like(micro["completion_mask"], dtype=torch.float32)
        for i, (micro, j, logps, _) in enumerate(wanted):
            logps = fresh[i] if logps is None else logps
            micro["old_per_token_logps"][j, : logps.size(0)] = logps
        # the rows of the micro-batches that read them: the same on every rank (each rank's passes differ with its
        # rows' lengths, the second thread's with how many plain rows the first partition took)
        rows_read = sum(num_rows(micro) for micro, _ in reading)
        metrics["time/old_logps_s"], metrics["old_logps_rows"] = time.perf_counter() - t0, rows_read


class TeacherSignal:
    """The teacher's signal on a micro-batch: its top-k distributions with the student's states and head for GKD's
    JSD (:meth:`distributions`), or its log-prob of each sampled token (:meth:`token_logps`, KDRL and RLAD): from what
    its server sent for the micro-batch, or from the teacher loaded next to the student.

    Args:
        distill_teacher: the teacher loaded next to the student, or None (its server's scores are on the batch).
        vocab: the student tokenizer's size; ``autocast``: the accelerator's autocast context.
        fused_lm_head: ``ZPPOConfig.fused_lm_head``; ``chunk_size``: ``distill_chunk_size``.
    """

    def __init__(self, distill_teacher: Any, *, vocab: int, autocast: Callable, fused_lm_head: bool, chunk_size: int):
        self.distill_teacher, self.vocab, self.autocast = distill_teacher, vocab, autocast
        self.fused_lm_head, self.chunk_size = fused_lm_head, chunk_size

    def distributions(self, model, inputs) -> DistillInputs:
        """The student's completion states and LM head, and the teacher's signal: the top-k its server sent
        for this micro-batch (``teacher_topk_*``), or a local teacher's own states and head."""
        with self.autocast():
            states, head = completion_states(model, inputs, self.vocab, fused=self.fused_lm_head)
            if self.distill_teacher is None:
                topk = TeacherTopK(inputs[TEACHER_TOPK_IDS], inputs[TEACHER_TOPK_LOGPS])
                return DistillInputs(states, head, self.vocab, topk=topk)
            with torch.no_grad():
                teacher_states, teacher_head = completion_states(self.distill_teacher, inputs, self.vocab)
        return DistillInputs(states, head, self.vocab, teacher_states=teacher_states, teacher_head=teacher_head)

    def token_logps(self, inputs) -> torch.Tensor:
        """The teacher's log-prob of each sampled completion token of a micro-batch (B, C), from its raw
        distribution: what its server sent for it (``teacher_logps``), or the local teacher's, a chunk of positions
        at a time (``distill_chunk_size``)."""
        if self.distill_teacher is None:
            return inputs[TEACHER_LOGPS_FIELD]
        with torch.no_grad(), self.autocast():
            states, head = completion_states(self.distill_teacher, inputs, self.vocab)
            return chosen_token_logps(states, head, self.vocab, inputs["completion_ids"], self.chunk_size)
