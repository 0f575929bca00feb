"""The per-token log-prob paths of :class:`zppo_trl.ZPPOTrainer`, as a mixin: TRL's log-prob hook (padded, or packed
with ``padding_free``), the sampling policy's old log-probs of a step's micro-batches, the distillation rows' and
KDRL/RLAD's teacher signal on a micro-batch, and the loss's divisors and logging.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from trl.trainer.utils import nanmax, nanmin

from .batches import ROUND_ROW, TOKEN_TYPE_FIELDS, num_rows, rows_alone
from .distill import DistillInputs, TeacherTopK, chosen_token_logps, completion_states
from .losses import LossOutput
from .packing import ImageRows, batch_refusal, model_refusal, multimodal_refusal, pack
from .partitioning import is_skipped
from .teacher_scores import TEACHER_LOGPS_FIELD, TEACHER_TOPK_IDS, TEACHER_TOPK_LOGPS

__all__ = ["LogProbPaths"]

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


def _scoring_inputs(inputs) -> tuple:
    """A batch's ``(input_ids, attention_mask, logits_to_keep, multimodal)``, as TRL's log-prob hook takes them."""
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    multimodal = {key: inputs.get(key) for key in _MULTIMODAL_FIELDS}
    return input_ids, attention_mask, inputs["completion_ids"].size(1), multimodal


class LogProbPaths:
    """A mixin of :class:`zppo_trl.ZPPOTrainer` (see the module's docstring)."""

    @property
    def defers_old_logps(self) -> bool:
        """Whether a rollout step's old log-probs wait for its micro-batches (``defer_old_logps``); LENS reads
        every rollout's at scoring time, so it keeps TRL's schedule."""
        return self.args.defer_old_logps and not self.row.needs.sampling_logps_at_scoring

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
        return self._token_logps(
            model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, multimodal
        )

    def _token_logps(
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
        """TRL's per-token log-probs, entropies and aux loss of a batch, packed with ``padding_free``: the hook's
        computation, which reads no round in flight (so a second thread may run it: :meth:`_start_plain_old_logps`)."""
        # TRL re-derives the token types of image prompts from the prompt text, which has no response
        # prefix (the Prefix control): rebuild them from the ids when their width does not match.
        for name in TOKEN_TYPE_FIELDS:
            if multimodal.get(name) is not None and multimodal[name].size(1) != input_ids.size(1):
                multimodal[name] = self._token_types(input_ids)
        batch_size = batch_size or input_ids.size(0)
        if self.args.padding_free:  # the paper's "Padding-free training" (zppo_trl.packing)
            config = self.accelerator.unwrap_model(model).config
            present = sorted(name for name, value in multimodal.items() if value is not None)
            refusal = model_refusal(config) or multimodal_refusal(config, present)
            if refusal is None:
                return self._packed_logps(
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

    def _packed_logps(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, aux, multimodal
    ):
        """TRL's per-token log-probs, entropies and MoE balancing loss, each chunk of ``batch_size`` rows run
        as one packed row (:func:`zppo_trl.packing.pack`); a chunk that cannot be packed runs padded.
        ``multimodal``: a Qwen3.5 VLM's images and token types (:data:`zppo_trl.packing.PACKED_MULTIMODAL_FIELDS`),
        or empty."""
        logps, entropies, aux_losses = [], [], []
        images = ImageRows(multimodal)
        for start in range(0, input_ids.size(0), batch_size):
            end = min(start + batch_size, input_ids.size(0))
            ids, mask = input_ids[start:end], attention_mask[start:end]
            chunk_images = images.rows(start, end)
            refusal = batch_refusal(mask, logits_to_keep)
            if refusal is not None:
                self._count_padded(model, refusal, 1)
                chunk = super()._get_per_token_logps_and_entropies(
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
                inputs = packed.model_inputs(self.accelerator.unwrap_model(model), ids, chunk_images)
                with self.accelerator.autocast():  # no attention mask: the position ids separate the rows
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

    def _count_padded(self, model, reason: str, micro_batches: int) -> None:
        """Count micro-batches that ``padding_free`` could not pack (``zppo/padded_micro_batches_total``,
        this rank's), warning once per reason: they run padded, never packed wrongly."""
        self.counters["padded_micro_batches_total"] += micro_batches
        if reason not in self._padding_free_warned:
            self._padding_free_warned.add(reason)
            model_type = self.accelerator.unwrap_model(model).config.get_text_config().model_type
            logger.warning("padding_free: %s micro-batches run padded: %s", model_type, reason)

    def _completion_logps(self, model, inputs, for_loss: bool = True):
        """Per-token log-probs of the completions, as TRL computes them (through its hook); ``for_loss`` adds what
        only the loss reads: the entropies and the router's aux loss (else None)."""
        input_ids, attention_mask, keep, multimodal = _scoring_inputs(inputs)
        return self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            keep,
            compute_entropy=for_loss,
            compute_aux_loss=for_loss and self.aux_loss_enabled,
            **multimodal,
        )

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

    @property
    def overlaps_old_logps(self) -> bool:
        """Whether the plain rollouts' old log-probs are computed while the rest of the step runs off this device
        (``overlap_old_logps``): the teacher's evidence, the compressions and the student's second round on its
        vLLM server. Only where the second round has something to hide behind and nothing else uses the
        trainer's device meanwhile: a policy objective deferring its old log-probs, an augmentation with a second
        round, rollouts from a server, and parameters every rank holds whole (ZeRO-3's and FSDP's forward passes
        gather parameters collectively, which a second thread must not interleave with the step's own gathers).
        """
        args = self.args
        return (
            args.overlap_old_logps
            and self.defers_old_logps
            and self.objective_loss.reads_old_logps
            and self._augmenting
            and not self.augmentation.supervised
            and self._second_round_off_device
            and not self.terms  # a term may run the student on the main thread meanwhile
            and not self._parameters_sharded
        )

    @property
    def _second_round_off_device(self) -> bool:
        """Whether the student's rollouts are generated off the trainer's device (on its vLLM server)."""
        return self.args.use_vllm and self.args.vllm_mode == "server"

    @property
    def _parameters_sharded(self) -> bool:
        """Whether a forward pass gathers the parameters over ranks (ZeRO-3, FSDP)."""
        return self.is_fsdp_enabled or (
            self.is_deepspeed_enabled and self.accelerator.state.deepspeed_plugin.zero_stage == 3
        )

    def _start_plain_old_logps(self, plain_batch: dict) -> Future | None:
        """Start computing every plain rollout's old log-probs on a second thread (:attr:`overlaps_old_logps`),
        each rollout alone (:meth:`_rollout_logps`); the step's updates wait for them in :meth:`_attach_old_logps`.
        The plain rollouts are fixed and the weights that sampled them are the ones in place until the step's first
        update, so this is the very computation the serial schedule makes later, on the same numbers."""
        if not self.overlaps_old_logps:
            return None
        if self._old_logps_thread is None:
            self._old_logps_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zppo-old-logps")
        rows = list(enumerate(rows_alone(plain_batch)))  # the plain round's batch is in TRL's layout
        device = self.accelerator.device

        def compute() -> tuple[dict[int, torch.Tensor], float]:
            if device.type == "cuda":
                torch.cuda.set_device(device)
            t0 = time.perf_counter()
            return self._rollout_logps(rows), time.perf_counter() - t0

        return self._old_logps_thread.submit(compute)

    def _rollout_logps(self, rows: list[tuple[int, dict]]) -> dict[int, torch.Tensor]:
        """The sampling policy's per-token log-probs of each rollout ``(key, batch of one row)``, the rollout scored
        alone (no padding, no other row): the same numbers whenever and wherever it is computed.

        It only reads the model, so a second thread may run it while the main thread uses the model: gradient
        checkpointing is left as it is (TRL turns it off and on around its own no-grad passes, which changes the
        model for every thread). Without gradients it has nothing to save: transformers (5.24) runs the layers
        as they are, earlier releases through a checkpoint that keeps nothing; the same numbers either way."""
        out = {}
        with torch.no_grad():
            for key, row in rows:  # the hook's computation without its round checks (a second thread may run it)
                input_ids, attention_mask, keep, multimodal = _scoring_inputs(row)
                logps = self._token_logps(self.model, input_ids, attention_mask, keep, None, False, False, multimodal)
                out[key] = logps[0][0]
        return out

    def _attach_old_logps(self, micro_batches: list[dict], metrics: dict, plain: Future | None = None) -> None:
        """The sampling policy's per-token log-probs (``old_per_token_logps``) of the micro-batches that read
        them, on the weights that sampled the rollouts: every trained partition but the first one trained, which
        updates on those very weights (a skipped partition changes none), so its ratio is exactly 1 and its loss
        takes the detached log-probs of its own forward; and only when the loss is a policy objective. Each
        rollout is scored alone (:meth:`_rollout_logps`); ``plain`` holds the plain rollouts' (by merged-batch row,
        from :meth:`_start_plain_old_logps`), computed while the step's second round was generated
        (``time/old_logps_hidden_s``); the rest are computed here (``time/old_logps_s``, with any wait for them).
        With ZeRO-3 every rank runs as many forward passes as the rank with most rows."""
        # each row's index in the merged batch (None where a micro-batch was not dealt from one)
        rows_of = [micro.pop(ROUND_ROW, None) for micro in micro_batches]
        rows_of = [
            [] if is_skipped(m) else [None] * num_rows(m) if r is None else r.tolist()
            for m, r in zip(micro_batches, rows_of, strict=True)
        ]
        t0 = time.perf_counter()
        known: dict[int, torch.Tensor] = {}
        if plain is not None:
            known, metrics["time/old_logps_hidden_s"] = plain.result()
        if not self.defers_old_logps or not self.objective_loss.reads_old_logps:
            return
        ga = self.args.gradient_accumulation_steps  # a partition's micro-batches, all skipped or none
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
        if self._parameters_sharded and reading:
            # ZeRO-3 and FSDP gather parameters in every forward pass: every rank runs as many as the rank with most
            filler = missing[-1] if missing else (None, rows_alone(reading[0][0])[0])
            missing += [filler] * (int(self.ranks.largest(len(missing))) - len(missing))
        fresh = self._rollout_logps(missing)
        for micro, _ in reading:  # set after rows_alone, which would carry the field into the rows it scores
            micro["old_per_token_logps"] = torch.zeros_like(micro["completion_mask"], dtype=torch.float32)
        for i, (micro, j, logps, _) in enumerate(wanted):
            logps = fresh[i] if logps is None else logps
            micro["old_per_token_logps"][j, : logps.size(0)] = logps
        # the rows of the micro-batches that read them: the same on every rank (each rank's passes differ with its
        # rows' lengths, the second thread's with how many plain rows the first partition took)
        rows_read = sum(num_rows(micro) for micro, _ in reading)
        metrics["time/old_logps_s"], metrics["old_logps_rows"] = time.perf_counter() - t0, rows_read
