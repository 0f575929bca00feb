"""The Slurm launch plan for any allocation shape (`recipes/launch/cluster_plan.py`): who runs what on 2, 4, 8 and 16
nodes of 0 (CPU), 4 and 8 GPUs, in both layouts, the recipe's batch kept, and the layouts that cannot fit refused
with the reason. The launch script's own dry runs are in test_launch.py."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLANNER = REPO / "recipes" / "launch" / "cluster_plan.py"
_spec = importlib.util.spec_from_file_location("cluster_plan", PLANNER)
cluster_plan = importlib.util.module_from_spec(_spec)
sys.modules["cluster_plan"] = cluster_plan  # dataclasses look their module up by name
_spec.loader.exec_module(cluster_plan)

PAPER = cluster_plan.Batch(per_device=4, grad_accum=4, generations=8, recipe_ranks=48)  # recipes/qwen35_*.yaml
DEMO = cluster_plan.Batch(per_device=4, grad_accum=2, generations=4)  # recipes/demo.yaml: not sized for ranks


def nodes(n):
    return [f"n{i:02d}" for i in range(n)]


@pytest.mark.parametrize("count", [2, 4, 8, 16])
@pytest.mark.parametrize("gpus", [0, 4, 8])
def test_server_layout(count, gpus):
    allocation = nodes(count)
    if count < 3:
        with pytest.raises(cluster_plan.PlanError, match="server layout needs 3 nodes or more.*got 2"):
            cluster_plan.plan(allocation, gpus, "server", PAPER)
        return
    per_node = gpus or 1
    ranks = (count - 2) * per_node
    if (4 * 48) % ranks:  # the paper's 96 new prompts per update cannot be split over these ranks
        with pytest.raises(cluster_plan.PlanError, match=f"does not divide over {ranks} training ranks"):
            cluster_plan.plan(allocation, gpus, "server", PAPER)
        return
    plan = cluster_plan.plan(allocation, gpus, "server", PAPER)
    assert plan.student_node == "n00" and plan.teacher_nodes == ["n01"] and plan.trainers == allocation[2:]
    assert plan.ranks_per_node == per_node and plan.ranks == ranks and plan.cpu == (gpus == 0)
    assert plan.grad_accum * plan.ranks == 4 * 48 and plan.new_prompts_per_update == 96
    assert plan.server_replicas == max(gpus, 1)
    assert plan.server_gpus == plan.trainer_gpus == ",".join(map(str, range(gpus)))
    # unsized recipes keep their own accumulation on any allocation
    assert cluster_plan.plan(allocation, gpus, "server", DEMO).grad_accum == 2


@pytest.mark.parametrize("count", [2, 4, 8, 16])
@pytest.mark.parametrize("gpus", [0, 4, 8])
def test_colocate_layout(count, gpus):
    allocation = nodes(count)
    if gpus == 0:
        with pytest.raises(cluster_plan.PlanError, match="colocate layout needs GPUs"):
            cluster_plan.plan(allocation, gpus, "colocate", PAPER)
        return
    per_node, teacher = gpus * 3 // 4, gpus // 4
    ranks = count * per_node
    if (4 * 48) % ranks:
        with pytest.raises(cluster_plan.PlanError, match=f"does not divide over {ranks} training ranks"):
            cluster_plan.plan(allocation, gpus, "colocate", PAPER)
        return
    plan = cluster_plan.plan(allocation, gpus, "colocate", PAPER)
    assert plan.trainers == plan.teacher_nodes == allocation and plan.student_node == ""
    assert plan.trainer_gpus == ",".join(map(str, range(per_node)))
    assert plan.server_gpus == ",".join(map(str, range(per_node, gpus))) and plan.server_replicas == teacher
    assert plan.ranks * plan.grad_accum == 4 * 48 and plan.new_prompts_per_update == 96


def test_the_papers_allocation_is_the_papers_layout():
    server = cluster_plan.plan(nodes(8), 8, "server", PAPER)
    assert (server.ranks, server.grad_accum, server.server_replicas) == (48, 4, 8)
    colocate = cluster_plan.plan(nodes(8), 8, "colocate", PAPER)
    assert (colocate.ranks, colocate.grad_accum, colocate.server_gpus) == (48, 4, "6,7")


def test_refusals_name_the_reason():
    for args, message in [
        ((nodes(4), 6, "colocate", PAPER), "multiple of 4 GPUs per node, got 6"),
        ((nodes(4), 2, "colocate", PAPER), "multiple of 4 GPUs per node, got 2"),
        ((nodes(4), 8, "mixed", PAPER), "LAYOUT must be server or colocate, got 'mixed'"),
        ((["a", "b", "a"], 8, "server", PAPER), "names a node twice"),
        ((nodes(4), -1, "server", PAPER), "must be 0 \\(CPU nodes\\) or more"),
        # 5 training nodes x 8 GPUs = 40 ranks: 192 micro-batches of the recipe do not split over them
        ((nodes(7), 8, "server", PAPER), "gradient_accumulation_steps would be 192/40"),
    ]:
        with pytest.raises(cluster_plan.PlanError, match=message):
            cluster_plan.plan(*args)
    with pytest.raises(cluster_plan.PlanError, match="CPU_RANKS_PER_NODE"):
        cluster_plan.plan(nodes(4), 0, "server", DEMO, cpu_ranks_per_node=0)


def test_cpu_nodes_can_run_several_ranks_each():
    plan = cluster_plan.plan(nodes(4), 0, "server", PAPER, cpu_ranks_per_node=3)
    assert (plan.ranks, plan.ranks_per_node, plan.grad_accum, plan.trainer_gpus) == (6, 3, 32, "")


def test_the_command_line_prints_shell_the_launch_script_evaluates():
    command = [sys.executable, str(PLANNER), "--nodes", "zn1 zn2 zn3 zn4", "--gpus-per-node", "0"]
    command += ["--per-device-batch", "4", "--grad-accum", "2", "--generations", "4"]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    script = printed + '\necho "$student_node|${teacher_nodes[*]}|${trainers[*]}|$ranks|$grad_accum|$cpu|$summary"'
    shown = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    assert shown.startswith("zn1|zn2|zn3 zn4|2|2|1|server layout on 4 nodes of CPU: student server on zn1")
    refused = subprocess.run(command[:3] + ["zn1"] + command[4:], capture_output=True, text=True)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("error: the server layout needs 3 nodes or more")
