"""What :class:`zppo_trl.ZPPOTrainer` keeps in a checkpoint beyond TRL's, as a mixin: ``zppo_state.json`` (the replay
buffer, admission accuracies, counters, the shared RNG and every term's state), the copies of the student the row's
terms keep, and the run's model card.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Mapping

import torch

from .evaluation.condition import CONDITION_KEY
from .model_card import CardFacts, render_model_card
from .student_copy import EMAReference

__all__ = ["ZPPO_STATE_NAME", "CheckpointState", "last_complete_checkpoint"]

logger = logging.getLogger(__name__)

ZPPO_STATE_NAME = "zppo_state.json"
TRAINER_STATE_NAME = "trainer_state.json"  # transformers writes it last of a checkpoint's files
# A checkpoint's weights: a full model (one file or an index), a PEFT adapter, or DeepSpeed's own folder.
_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
    "adapter_model.bin",
)


def checkpoint_gaps(checkpoint: str) -> list[str]:
    """What a checkpoint folder lacks of a whole one (TRL's trainer state, the weights, the ZPPO state)."""
    names = set(os.listdir(checkpoint))
    gaps = [name for name in (TRAINER_STATE_NAME, ZPPO_STATE_NAME) if name not in names]
    if not names & set(_WEIGHTS) and not any(name.startswith("global_step") for name in names):
        gaps.append("weights")
    return gaps


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-N`` of ``output_dir`` that is whole (:func:`checkpoint_gaps`), or None; each newer one
    that is not (a run killed while saving it) is skipped with a warning naming what it lacks."""
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for name in os.listdir(output_dir):
        number = name.removeprefix("checkpoint-")
        if number != name and number.isdigit() and os.path.isdir(os.path.join(output_dir, name)):
            steps.append(int(number))
    for step in sorted(steps, reverse=True):
        checkpoint = os.path.join(output_dir, f"checkpoint-{step}")
        gaps = checkpoint_gaps(checkpoint)
        if not gaps:
            return checkpoint
        logger.warning("skipping %s: an incomplete checkpoint (no %s), left by a run stopped while saving it",
                       checkpoint, ", no ".join(gaps))  # fmt: skip
    return None


class CheckpointState:
    """A mixin of :class:`zppo_trl.ZPPOTrainer` (see the module's docstring)."""

    def _ema_copies(self) -> list[tuple[str, EMAReference, str]]:
        """The run's copies of the student (the terms'), each with its checkpoint file and what it is."""
        return [copy for term in self.terms for copy in term.copies]

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        self._save_zppo_state(output_dir)

    def _save_checkpoint(self, model, trial) -> None:
        if self.args.save_only_model:  # transformers then skips _save_rng_state, where ZPPO's state is written
            self._save_zppo_state(os.path.join(self._get_output_dir(trial), f"checkpoint-{self.state.global_step}"))
        super()._save_checkpoint(model, trial)

    def _save_zppo_state(self, output_dir: str) -> None:
        """``zppo_state.json`` and the student copies' weights, before TRL's trainer state (written last): a
        checkpoint with its trainer state has them (:func:`last_complete_checkpoint`)."""
        if self.args.should_save:
            os.makedirs(output_dir, exist_ok=True)
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
