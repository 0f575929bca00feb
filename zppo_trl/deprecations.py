"""The deprecation warnings raised by other libraries' calls that ZPPO makes through them, quieted where they arise.

transformers 5 renamed gradient checkpointing to activation checkpointing and warns on every call of the old
names. TRL's ``GRPOTrainer`` still calls them around each generation and each no-grad scoring pass
(``is_gradient_checkpointing``, ``gradient_checkpointing_disable``, ``gradient_checkpointing_enable``), so a run
would print three ``FutureWarning``\\ s per rollout step that nobody using ZPPO can act on. ZPPO's own code uses the
new names; :func:`trl_deprecated_calls` ignores exactly these three messages for the length of a call into TRL
(every other warning, and these from any other call, still shows).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

__all__ = ["TRL_DEPRECATED_CALLS", "trl_deprecated_calls"]

# transformers' messages for the names TRL calls: "`gradient_checkpointing_disable` is deprecated and will be ..."
TRL_DEPRECATED_CALLS = (
    r"`(is_gradient_checkpointing|gradient_checkpointing_disable|gradient_checkpointing_enable)` is deprecated"
)


@contextlib.contextmanager
def trl_deprecated_calls() -> Iterator[None]:
    """Ignore transformers' deprecation warnings for the checkpointing names TRL calls, for the block's length."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TRL_DEPRECATED_CALLS, category=FutureWarning)
        yield
