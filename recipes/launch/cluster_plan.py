"""What each node of a Slurm allocation runs: the plan `slurm_zppo.sbatch` launches, for any allocation shape.

    python recipes/launch/cluster_plan.py --nodes "n0 n1 n2 n3" --gpus-per-node 8 --layout server \
        --per-device-batch 4 --grad-accum 4 --generations 8 --recipe-ranks 48

prints shell assignments the launch script evaluates (``student_node=n0``, ``trainers=(n2 n3)``, ...) and, on
stderr, nothing; a layout that cannot fit exits 2 with one ``error:`` line naming why. Standard library only: the
launch script runs it before any environment is chosen.

The layouts (the paper's is 8 nodes x 8 GPUs, server layout, 48 ranks):

- ``server``: the first node serves the student's rollouts (vLLM, one data-parallel replica per GPU), the second the
  teacher and judge (likewise), every other node trains, one rank per GPU. Needs 3 nodes. On CPU nodes (0 GPUs) each
  server is vLLM's CPU engine and each training node runs ``cpu_ranks_per_node`` ranks (gloo).
- ``colocate`` (the paper's 6/2 split): every node trains on 3/4 of its GPUs with vLLM colocated in each rank, and
  serves its own teacher on the rest. Needs GPUs, at least 4 per node, a multiple of 4.

The recipe's global batch is kept: a recipe sized for ``num_training_ranks`` ranks (the scale recipes: 48) gets the
gradient accumulation that makes the same new prompts per update on this allocation's ranks, and a layout whose
ranks do not divide that batch is refused. A recipe that names no rank count keeps its own accumulation.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass, field

__all__ = ["Batch", "Plan", "PlanError", "plan"]

LAYOUTS = ("server", "colocate")


class PlanError(ValueError):
    """A layout this allocation cannot run; the message says why."""


@dataclass(frozen=True)
class Batch:
    """What the recipe says of its batch (`ZPPOConfig` fields, and `num_training_ranks` where it is sized)."""

    per_device: int
    grad_accum: int
    generations: int
    recipe_ranks: int | None = None

    def new_prompts_per_update(self, ranks: int, grad_accum: int) -> float:
        return self.per_device * grad_accum * ranks / self.generations


@dataclass
class Plan:
    """Which node runs what, and the training's shape."""

    layout: str
    gpus_per_node: int
    trainers: list[str]
    ranks_per_node: int
    grad_accum: int
    new_prompts_per_update: float
    student_node: str = ""  # server layout: the student's vLLM server
    teacher_nodes: list[str] = field(default_factory=list)  # the teacher (and judge) servers
    server_gpus: str = ""  # CUDA_VISIBLE_DEVICES of each server ("" on CPU nodes)
    server_replicas: int = 1  # data-parallel replicas per server
    trainer_gpus: str = ""  # CUDA_VISIBLE_DEVICES of each training node's ranks ("" on CPU nodes)

    @property
    def ranks(self) -> int:
        return len(self.trainers) * self.ranks_per_node

    @property
    def cpu(self) -> bool:
        return self.gpus_per_node == 0

    def shell(self) -> str:
        """The plan as shell assignments (arrays for node lists), quoted."""
        values = {
            "layout": self.layout,
            "gpus_per_node": self.gpus_per_node,
            "cpu": int(self.cpu),
            "student_node": self.student_node,
            "server_gpus": self.server_gpus,
            "server_replicas": self.server_replicas,
            "trainer_gpus": self.trainer_gpus,
            "per_node": self.ranks_per_node,
            "ranks": self.ranks,
            "grad_accum": self.grad_accum,
        }
        lines = [f"{name}={shlex.quote(str(value))}" for name, value in values.items()]
        for name, nodes in (("trainers", self.trainers), ("teacher_nodes", self.teacher_nodes)):
            lines.append(f"{name}=({' '.join(shlex.quote(n) for n in nodes)})")
        lines.append(f"summary={shlex.quote(self.summary())}")
        return "\n".join(lines)

    def summary(self) -> str:
        where = "CPU" if self.cpu else f"{self.gpus_per_node} GPUs"
        nodes = len(self.trainers) + (2 if self.layout == "server" else 0)
        head = f"{self.layout} layout on {nodes} nodes of {where}: "
        if self.layout == "server":
            replicas = "vLLM CPU engine" if self.cpu else f"{self.server_replicas} replicas"
            head += f"student server on {self.student_node} ({replicas}), teacher on {self.teacher_nodes[0]}, "
        else:
            head += f"a teacher on each node (GPUs {self.server_gpus}), "
        per = "CPU (gloo)" if self.cpu else f"GPUs {self.trainer_gpus}"
        return head + (
            f"{self.ranks} training ranks ({self.ranks_per_node} per node on {per}), gradient accumulation "
            f"{self.grad_accum}: {self.new_prompts_per_update:g} new prompts per update"
        )


def _gpu_list(first: int, count: int) -> str:
    return ",".join(str(i) for i in range(first, first + count))


def _grad_accum(batch: Batch, ranks: int) -> int:
    """The accumulation that keeps the recipe's new prompts per update on ``ranks`` ranks (its own, unsized)."""
    if not batch.recipe_ranks or batch.recipe_ranks == ranks:
        return batch.grad_accum
    total = batch.grad_accum * batch.recipe_ranks
    if total % ranks:
        per_update = batch.new_prompts_per_update(batch.recipe_ranks, batch.grad_accum)
        raise PlanError(
            f"the recipe's batch ({batch.per_device} rows x {batch.grad_accum} micro-batches x {batch.recipe_ranks} "
            f"ranks / {batch.generations} rollouts = {per_update:g} new prompts per update) does not divide over "
            f"{ranks} training ranks: gradient_accumulation_steps would be {total}/{ranks}; choose an allocation "
            f"whose rank count divides {total}, or set --num_training_ranks and --gradient_accumulation_steps"
        )
    return total // ranks


def plan(
    nodes: list[str], gpus_per_node: int, layout: str, batch: Batch, cpu_ranks_per_node: int = 1
) -> Plan:  # fmt: skip
    """The plan for ``nodes`` (in the allocation's order) of ``gpus_per_node`` GPUs each (0: CPU nodes)."""
    if layout not in LAYOUTS:
        raise PlanError(f"LAYOUT must be server or colocate, got {layout!r}")
    if gpus_per_node < 0:
        raise PlanError(f"GPUs per node must be 0 (CPU nodes) or more, got {gpus_per_node}")
    if len(set(nodes)) != len(nodes):
        raise PlanError(f"the node list names a node twice: {' '.join(nodes)}")
    if cpu_ranks_per_node < 1:
        raise PlanError(f"CPU_RANKS_PER_NODE must be 1 or more, got {cpu_ranks_per_node}")
    if layout == "server":
        if len(nodes) < 3:
            raise PlanError(
                f"the server layout needs 3 nodes or more (the student's server, the teacher's, then the trainers), "
                f"got {len(nodes)}: on fewer, run recipes/launch/train.sh on one node"
            )
        trainers, per_node = nodes[2:], (gpus_per_node or cpu_ranks_per_node)
        ranks = len(trainers) * per_node
        grad_accum = _grad_accum(batch, ranks)
        return Plan(
            layout=layout,
            gpus_per_node=gpus_per_node,
            trainers=trainers,
            ranks_per_node=per_node,
            grad_accum=grad_accum,
            new_prompts_per_update=batch.new_prompts_per_update(ranks, grad_accum),
            student_node=nodes[0],
            teacher_nodes=[nodes[1]],
            server_gpus=_gpu_list(0, gpus_per_node),
            server_replicas=max(gpus_per_node, 1),
            trainer_gpus=_gpu_list(0, gpus_per_node),
        )
    if gpus_per_node == 0:
        raise PlanError(
            "the colocate layout needs GPUs (vLLM runs inside each training rank); CPU nodes: LAYOUT=server"
        )
    if gpus_per_node < 4 or gpus_per_node % 4:
        raise PlanError(
            f"the colocate layout splits each node 3:1 between training ranks and its teacher (the paper's 6/2 of 8), "
            f"which needs a multiple of 4 GPUs per node, got {gpus_per_node}: use LAYOUT=server"
        )
    teacher = gpus_per_node // 4
    per_node = gpus_per_node - teacher
    ranks = len(nodes) * per_node
    grad_accum = _grad_accum(batch, ranks)
    return Plan(
        layout=layout,
        gpus_per_node=gpus_per_node,
        trainers=list(nodes),
        ranks_per_node=per_node,
        grad_accum=grad_accum,
        new_prompts_per_update=batch.new_prompts_per_update(ranks, grad_accum),
        teacher_nodes=list(nodes),
        server_gpus=_gpu_list(per_node, teacher),
        server_replicas=teacher,
        trainer_gpus=_gpu_list(0, per_node),
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", required=True, help="the allocation's nodes, space-separated, in order")
    parser.add_argument("--gpus-per-node", type=int, required=True, help="0 for CPU nodes")
    parser.add_argument("--layout", default="server", help="server or colocate")
    parser.add_argument("--cpu-ranks-per-node", type=int, default=1)
    parser.add_argument("--per-device-batch", type=_positive, required=True)
    parser.add_argument("--grad-accum", type=_positive, required=True)
    parser.add_argument("--generations", type=_positive, required=True)
    parser.add_argument("--recipe-ranks", default="", help="the recipe's num_training_ranks (empty: not sized)")
    options = parser.parse_args(argv)
    batch = Batch(
        options.per_device_batch,
        options.grad_accum,
        options.generations,
        int(options.recipe_ranks) if options.recipe_ranks else None,
    )
    try:
        result = plan(options.nodes.split(), options.gpus_per_node, options.layout, batch, options.cpu_ranks_per_node)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(result.shell())
    return 0


if __name__ == "__main__":
    sys.exit(main())
