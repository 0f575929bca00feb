"""The student's vLLM server without CUDA: TRL's server mode with weights synced through shared memory.

TRL's server mode (``use_vllm: true, vllm_mode: server``) generates over HTTP and moves the
weights over NCCL, which needs CUDA. With ``vllm_weight_transfer: shm`` (the default where CUDA
is absent) the same server receives them as one safetensors file in ``/dev/shm`` instead, reloaded
by :class:`zppo_trl.vllm_worker.SharedMemoryWeightReload` through vLLM's ``POST /collective_rpc``.
Everything else is TRL's: its ``sync_weights`` gathers ZeRO-3 / FSDP shards and names the tensors,
its client generates, its prefix-cache reset runs after every sync.

The trainer and the server must share a file system for ``vllm_weight_transfer_dir`` (one host);
across nodes, use NCCL.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import struct
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import requests
import torch
import trl.generation.vllm_client as trl_vllm_client
import trl.trainer.grpo_trainer as trl_grpo_trainer
from trl.generation.vllm_client import VLLMClient
from trl.generation.vllm_generation import VLLMGeneration

logger = logging.getLogger(__name__)

__all__ = [
    "RELOAD_METHOD",
    "WORKER_EXTENSION",
    "SharedMemoryVLLMClient",
    "SharedMemoryVLLMGeneration",
    "stand_in_for_overlong",
    "stood_in",
    "student_generation",
    "student_server_errors",
    "weight_syncs",
    "write_safetensors",
    "rank_client",
]

WORKER_EXTENSION = "zppo_trl.vllm_worker.SharedMemoryWeightReload"  # the server's --worker-extension-cls
RELOAD_METHOD = "zppo_reload_weights"  # its method, called through /collective_rpc

_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def write_safetensors(
    path: str,
    metadata: Sequence[tuple[str, str, list[int]]],
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype | None = None,
) -> int:
    """Write ``named_tensors`` to ``path`` in the safetensors format, one tensor in memory at a time.

    ``metadata`` announces them as TRL's weight sync does (``(name, dtype name, shape)`` in stream
    order), so the header is written first and each tensor streamed after it: under ZeRO-3 each
    parameter is gathered only while it is written. Floating-point tensors are cast to ``dtype``
    (the server's) when given. Returns the bytes written; raises ``ValueError`` when the stream
    does not match the announcement.
    """
    dtypes = []
    header, offset = {}, 0
    for name, dtype_name, shape in metadata:
        announced = getattr(torch, dtype_name)
        target = dtype if dtype is not None and announced.is_floating_point else announced
        size = math.prod(shape) * torch.empty((), dtype=target).element_size()
        span = [offset, offset + size]
        header[name] = {"dtype": _SAFETENSORS_DTYPES[target], "shape": list(shape), "data_offsets": span}
        dtypes.append(target)
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the format aligns the data to 8 bytes
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for (name, _, shape), target, (got, tensor) in zip(metadata, dtypes, named_tensors, strict=True):
            if got != name or list(tensor.shape) != list(shape):
                announced = f"{name} {list(shape)}"
                raise ValueError(f"weight stream out of order: announced {announced}, got {got} {list(tensor.shape)}")
            data = tensor.detach().to(device="cpu", dtype=target).contiguous().reshape(-1)
            file.write(data.view(torch.uint8).numpy())
    return 8 + len(encoded) + offset


def stand_in_for_overlong(
    prompt_ids: Sequence[Sequence[int]], context: int, images: Sequence | None = None
) -> tuple[list[list[int]], list[bool]]:
    """The prompts to send to a student server whose context is ``context`` tokens, and which of them
    stand in for a prompt that leaves no room to generate (``len >= context``).

    vLLM fails a whole request when one prompt is that long, so such a prompt is replaced by its
    last token (the request keeps its shape on every rank); the caller drops what it generates.
    A prompt with images cannot be replaced (its image tokens would be lost): that raises.
    """
    sent, overlong = [], []
    for index, ids in enumerate(prompt_ids):
        over = len(ids) >= context
        if over and images is not None and images[index]:
            raise ValueError(
                f"a prompt with images is {len(ids)} tokens, at or over the student server's context ({context}, "
                "vllm_max_model_length): restart the server with a larger --max-model-len and set "
                "vllm_max_model_length to it"
            )
        sent.append(list(ids[-1:]) if over else list(ids))
        overlong.append(over)
    return sent, overlong


def stood_in(completion_ids: list, logprobs: list | None, overlong: Sequence[bool], eos: int) -> tuple:
    """What a stand-in prompt of :func:`stand_in_for_overlong` generated, dropped: its rollouts are a bare end of
    sequence each (log-prob 0), a group without signal like an all-wrong one."""
    if not any(overlong):
        return completion_ids, logprobs
    completion_ids = [[eos] if over else ids for ids, over in zip(completion_ids, overlong, strict=True)]
    if logprobs is not None:
        logprobs = [[0.0] if over else lp for lp, over in zip(logprobs, overlong, strict=True)]
    return completion_ids, logprobs


@contextlib.contextmanager
def _vllm_import_check_waived() -> Iterator[None]:
    """TRL's client refuses to start unless ``vllm`` imports, which only its NCCL transfer needs; the
    student server's vLLM pins a transformers the trainer cannot use, so it lives elsewhere."""
    check = trl_vllm_client.is_vllm_available
    trl_vllm_client.is_vllm_available = lambda *args, **kwargs: True
    try:
        yield
    finally:
        trl_vllm_client.is_vllm_available = check


class SharedMemoryVLLMClient(VLLMClient):
    """TRL's ``VLLMClient`` whose weight updates travel as a safetensors file in ``weight_dir``.

    Generation, prefix-cache resets and the server checks are TRL's. :meth:`init_communicator`
    opens no NCCL group: it checks that the server can reload (dev mode, the worker extension)
    and reads the dtype it serves in and its context. ``sync_seconds`` records each update's write and reload times.
    """

    def __init__(self, *args, weight_dir: str = "/dev/shm", **kwargs):
        with _vllm_import_check_waived():
            super().__init__(*args, **kwargs)
        self.weight_dir = weight_dir
        self.weight_dtype: torch.dtype | None = None
        self.max_model_len: int | None = None  # the server's context, read by init_communicator
        self.sync_seconds: list[dict[str, float]] = []

    def init_communicator(self, device: torch.device | str | int = 0) -> None:
        info = self.get_server_info()  # raises, naming VLLM_SERVER_DEV_MODE=1, when dev mode is off
        extension = info.get("parallel_config", {}).get("worker_extension_cls")
        if extension != WORKER_EXTENSION:
            raise RuntimeError(
                f"The student vLLM server at {self.base_url} runs worker extension {extension!r}, so it cannot reload "
                f"weights from shared memory. Restart it with `--worker-extension-cls {WORKER_EXTENSION}` and this "
                "repository on its PYTHONPATH (recipes/launch/serve_student.sh --cpu does both), or set "
                "vllm_weight_transfer: nccl on CUDA."
            )
        if not os.path.isdir(self.weight_dir):
            raise RuntimeError(f"vllm_weight_transfer_dir {self.weight_dir!r} is not a directory")
        self.weight_dtype = getattr(torch, str(info["model_config"]["dtype"]).removeprefix("torch."))
        self.max_model_len = int(info["model_config"]["max_model_len"])

    # One file is one whole update: the server's start/finish endpoints belong to its NCCL engine.
    def _start_weight_update(self) -> None:
        pass

    def _finish_weight_update(self) -> None:
        pass

    def update_named_params(
        self, metadata: list[tuple[str, str, list[int]]], named_params: Iterator[tuple[str, torch.Tensor]]
    ) -> None:
        """Write the announced tensors to one file in ``weight_dir`` (in the server's dtype), have every
        server worker reload it, and delete it."""
        path = os.path.join(self.weight_dir, f"zppo-student-weights-{uuid.uuid4().hex}.safetensors")
        try:
            start = time.perf_counter()
            size = write_safetensors(path, metadata, named_params, dtype=self.weight_dtype)
            written = time.perf_counter()
            results = self._post(f"{self.base_url}/collective_rpc", json={"method": RELOAD_METHOD, "args": [path]})
            reloaded = time.perf_counter()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        counts = {result["tensors"] for result in results["results"]}
        if counts != {len(metadata)}:
            raise RuntimeError(f"the student server reloaded {sorted(counts)} tensors of the {len(metadata)} sent")
        self.sync_seconds.append({"write": written - start, "reload": reloaded - written, "bytes": size})
        logger.debug("weights synced to %s: %.1f MB, write %.2f s, reload %.2f s", self.base_url, size / 1e6,
                     written - start, reloaded - written)  # fmt: skip


class SharedMemoryVLLMGeneration(VLLMGeneration):
    """TRL's ``VLLMGeneration`` in server mode, connected through :class:`SharedMemoryVLLMClient`."""

    def __init__(self, *args, weight_dir: str = "/dev/shm", **kwargs):
        self.weight_dir = weight_dir
        super().__init__(*args, **kwargs)

    def _init_vllm(self) -> None:
        if self.mode != "server":
            raise ValueError(f"vllm_weight_transfer 'shm' serves vllm_mode 'server', got '{self.mode}'")
        if self.accelerator.is_main_process:
            base_url = self.server_base_url or f"http://{self.server_host}:{self.server_port}"
            self.vllm_client = SharedMemoryVLLMClient(
                base_url=base_url,
                group_port=self.group_port,
                connection_timeout=self.server_timeout,
                weight_dir=self.weight_dir,
            )
            self.vllm_client.init_communicator(self.accelerator.device)
            served = self.vllm_client.max_model_len
            if self.max_model_length is not None and served < self.max_model_length:
                raise ValueError(
                    f"the student server at {base_url} was started with --max-model-len {served}, below "
                    f"vllm_max_model_length ({self.max_model_length}): its requests would fail; restart it with "
                    f"--max-model-len {self.max_model_length} or set vllm_max_model_length to {served}"
                )
        self.accelerator.wait_for_everyone()  # as TRL does: the main process connects, the others wait


@contextlib.contextmanager
def student_generation(args) -> Iterator[None]:
    """While ``GRPOTrainer.__init__`` runs, build the student's vLLM generation the way ``args`` says:
    TRL's own (NCCL, colocate, transformers) or, with ``vllm_weight_transfer: shm``,
    :class:`SharedMemoryVLLMGeneration`. TRL builds it by its module-level name, the narrowest hook."""
    if not (args.use_vllm and args.vllm_weight_transfer == "shm"):
        yield
        return
    original = trl_grpo_trainer.VLLMGeneration
    directory = args.vllm_weight_transfer_dir
    trl_grpo_trainer.VLLMGeneration = functools.partial(SharedMemoryVLLMGeneration, weight_dir=directory)
    try:
        yield
    finally:
        trl_grpo_trainer.VLLMGeneration = original


@contextlib.contextmanager
def student_server_errors(trainer) -> Iterator[None]:
    """Name the student's server when it stops answering mid-run (after TRL's client has retried,
    about a minute), instead of a bare connection error from deep inside a weight sync or a generation."""
    try:
        yield
    except requests.exceptions.ConnectionError as exc:
        if not trainer.rollouts_on_server:
            raise
        client = getattr(trainer.vllm_generation, "vllm_client", None)
        where = client.base_url if client is not None else "its address"
        raise RuntimeError(
            f"the student vLLM server at {where} stopped answering (at rollout step "
            f"{trainer.state.global_step // trainer.args.num_partitions + 1}); no rollout can be generated without "
            "it. Restart it (recipes/launch/serve_student.sh) and resume from the last checkpoint"
        ) from exc


def rank_client(generation: Any, main_process: bool) -> VLLMClient:
    """This rank's client of the student's server: the main process's, which TRL's server mode made (it also syncs the
    weights), or on another rank a client of its own, for generation only (a pipelined second round,
    :mod:`zppo_trl.early_rollouts`, sends every rank's prompts from that rank)."""
    if main_process:
        return generation.vllm_client
    base_url = generation.server_base_url or f"http://{generation.server_host}:{generation.server_port}"
    with _vllm_import_check_waived():
        return VLLMClient(base_url=base_url, connection_timeout=generation.server_timeout)


def weight_syncs(trainer) -> list[dict[str, float]] | None:
    """The timed weight syncs of this process's shared-memory client (:attr:`SharedMemoryVLLMClient.sync_seconds`),
    or None where this process has none (NCCL transfer, rollouts in the trainer, a rank other than the first)."""
    client = getattr(getattr(trainer, "vllm_generation", None), "vllm_client", None)
    return client.sync_seconds if isinstance(client, SharedMemoryVLLMClient) else None
