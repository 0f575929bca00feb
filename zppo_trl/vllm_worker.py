"""The student's vLLM server side of the shared-memory weight sync (``vllm_weight_transfer: shm``).

This module runs inside the vLLM server, not the trainer: start the server with
``--worker-extension-cls zppo_trl.vllm_worker.SharedMemoryWeightReload`` and
``VLLM_SERVER_DEV_MODE=1`` (``recipes/launch/serve_student.sh`` does both), with this repository
on its ``PYTHONPATH``. It imports only torch, safetensors and vLLM, so the server's environment
needs neither TRL nor the trainer's transformers.

The trainer (:class:`zppo_trl.student_server.SharedMemoryVLLMClient`) writes the student's weights
as one safetensors file (``/dev/shm`` by default) and calls :meth:`SharedMemoryWeightReload.zppo_reload_weights`
on every worker through vLLM's ``POST /collective_rpc``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

__all__ = ["SharedMemoryWeightReload"]


def _tensors(path: str) -> Iterator[tuple]:
    """``(name, tensor)`` for every tensor of the safetensors file at ``path``, one at a time."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as checkpoint:
        for name in checkpoint.keys():  # noqa: SIM118 (safe_open is not a mapping)
            yield name, checkpoint.get_tensor(name)


class SharedMemoryWeightReload:
    """A vLLM worker extension: reload the model's weights in place from a safetensors file.

    Mixed into vLLM's worker class (``--worker-extension-cls``), so ``self`` is the worker and
    ``self.model_runner`` its model runner.
    """

    def zppo_reload_weights(self, path: str) -> dict:
        """Load every tensor of the safetensors file at ``path`` into the served model (checkpoint
        names, as the trainer's ``named_parameters`` gives them), then re-derive the embedding layers'
        kernel copies. Returns ``{"tensors": n, "seconds": s}``.

        vLLM's in-place reload re-processes each layer whose weights it loaded. A tied LM head loads
        nothing (its weight *is* the embedding's), so on CPU it would keep the packed copy of the old
        output layer its kernel multiplies with, and the server would sample from the previous policy.
        An unquantized vocabulary layer's post-processing keeps its weight, so running it again is safe.
        """
        start = time.perf_counter()
        count = 0

        def counted() -> Iterator[tuple]:
            nonlocal count
            for item in _tensors(path):
                count += 1
                yield item

        self.model_runner.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
        self._refresh_vocabulary_layers()
        return {"tensors": count, "seconds": time.perf_counter() - start}

    def _refresh_vocabulary_layers(self) -> None:
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

        for module in self.model_runner.get_model().modules():
            if isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
                module.quant_method.process_weights_after_loading(module)
