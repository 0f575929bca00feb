"""A copy of the student kept next to it (``Needs.student_copies``): GRPO-CARE's reference, the self-teachers."""

from __future__ import annotations

import copy

import torch

__all__ = ["EMAReference"]


class EMAReference:
    """A frozen copy of the student (GRPO-CARE's reference, a self-teacher), moved towards it every ``every``
    optimizer steps by ``theta_ref <- decay theta_ref + (1 - decay) theta`` (decay 1: it never moves)."""

    def __init__(self, model: torch.nn.Module, decay: float, every: int = 1):
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        # The student's forward may be patched per instance (TRL's fused LM head, zppo_trl.lm_head), by closures over
        # the student itself: a deep copy would keep calling the student's weights. The class's forward is the copy's.
        vars(self.model).pop("forward", None)
        self.decay, self.every = decay, every

    @torch.no_grad()
    def after_step(self, model: torch.nn.Module, step: int) -> bool:
        """Move towards ``model`` when ``step`` (optimizer steps taken) is a multiple of ``every``; whether it
        moved."""
        if step <= 0 or step % self.every:
            return False
        for ema, live in zip(self.model.parameters(), model.parameters(), strict=True):
            ema.lerp_(live.detach().to(ema.dtype), 1.0 - self.decay)
        return True

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)
