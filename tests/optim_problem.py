"""The small regression `test_optim.py` trains its optimizers on, and one FSDP2 rank of it.

A 2-layer tanh MLP fits ``sin(sum x)`` on 256 fixed points, full batch, from a seeded
initialisation rounded to bf16 (so the fp32 and bf16 runs start from the same point). It lives
apart from the tests so that the spawned FSDP2 ranks import torch and the optimizer only.
"""

from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist

from zppo_trl.optim import AnyPrecisionAdamW

HYPER = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
FP32_MOMENTS = dict(momentum_dtype=torch.float32, variance_dtype=torch.float32)
FSDP2_STEPS = 5  # before and after the checkpoint round trip


def make_net(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The MLP, seeded, its initial weights bf16-representable whatever ``dtype`` it is trained in."""
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    return net.to(torch.bfloat16).to(dtype)


def flat(net: torch.nn.Module) -> torch.Tensor:
    """All parameters as one fp32 vector."""
    return torch.cat([p.detach().float().flatten() for p in net.parameters()])


def train(net: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> float:
    """``steps`` full-batch steps of mean squared error; returns the last loss."""
    x = torch.randn(256, 8, generator=torch.Generator().manual_seed(1))
    y = torch.sin(x.sum(1, keepdim=True))
    dtype = next(net.parameters()).dtype
    for _ in range(steps):
        optimizer.zero_grad()
        loss = ((net(x.to(dtype)).float() - y) ** 2).mean()
        loss.backward()
        optimizer.step()
    return loss.item()


def fsdp2_rank(rank: int, world: int, port: int, out: str) -> None:
    """One gloo rank: FSDP2-shard the net, train, round-trip the optimizer through DCP, train on.

    The round trip is the one accelerate makes for FSDP2 checkpoints (DCP's optimizer state dict
    loaded into a fresh optimizer). Rank 0 saves to ``out`` whether every resumed buffer is a bf16
    DTensor equal to the one saved, and the final full parameters.

    The sharded module and its optimizers hold the process group (through their device mesh), so they are
    freed before the group is destroyed: freed after, they would join gloo's worker threads under the GIL or
    at interpreter exit, which aborted a rank ("terminate called without an active exception"); see
    ``zppo_trl.recipe.release_distributed``.
    """
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _fsdp2_train_and_resume(rank, out)
        gc.collect()
    finally:
        dist.destroy_process_group()


def _fsdp2_train_and_resume(rank: int, out: str) -> None:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    net = make_net()
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    settings = {**HYPER, "lr": 1e-2}
    optimizer = AnyPrecisionAdamW(net.parameters(), **settings)
    train(net, optimizer, FSDP2_STEPS)
    resumed = AnyPrecisionAdamW(net.parameters(), **settings)
    set_optimizer_state_dict(net, resumed, get_optimizer_state_dict(net, optimizer))
    exact = all(
        isinstance(value, DTensor)
        and resumed.state[p][name].dtype == torch.bfloat16
        and torch.equal(resumed.state[p][name].full_tensor(), value.full_tensor())
        for p in optimizer.state
        for name, value in optimizer.state[p].items()
        if name != "step"
    )
    train(net, resumed, FSDP2_STEPS)
    params = [p.full_tensor() for p in net.parameters()]
    if rank == 0:
        torch.save({"exact": exact, "params": params}, out)
