"""One partitioner for every row (zppo_trl.partitioning), and the values a rollout step passes along
(zppo_trl.rollout), on a single real process (accelerate's CPU Accelerator). Multi-rank behaviour runs in
tests/test_distributed.py with two real processes."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator

from zppo_trl.objectives import policy_objectives
from zppo_trl.partitioning import SKIP, deal_targets, is_skipped, pack_partition, policy_partitions
from zppo_trl.ranks import Ranks
from zppo_trl.rollout import FILLER, Group, draw_questions, merge_lists, plain_accuracy
from zppo_trl.step_metrics import accumulate_totals, admission_bins, bin_label, kind_metrics

ARGS = SimpleNamespace(
    num_partitions=2, gradient_accumulation_steps=1, advantage_normalization="without_zero", advantage_epsilon=1e-6
)


@pytest.fixture(scope="module")
def ranks():
    return Ranks(Accelerator(cpu=True))


def _batch(rows: int, tokens: list[int] | None = None) -> dict:
    tokens = tokens or [3] * rows
    width = max(tokens)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in tokens])
    return {
        "prompt_ids": torch.ones(rows, 2, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 2, dtype=torch.long),
        "completion_ids": torch.arange(rows)[:, None].repeat(1, width),
        "completion_mask": mask,
        "advantages": torch.zeros(rows),
    }


def test_single_rank_arithmetic(ranks):
    assert (ranks.world, ranks.rank) == (1, 0)
    assert ranks.share("abc") == ["a", "b", "c"] and ranks.shortfall(3) == 0
    assert ranks.gather(5) == [5] and ranks.total(5) == 5 and ranks.largest(5) == 5


def test_pack_pads_with_zero_weight_rows_and_carries_the_partition_token_count():
    micro = pack_partition(
        _batch(4),
        [1, 3],
        largest=4,
        advantages=[0.5, -0.5],
        tokens=6.0,
        sequences=2.0,
        grad_accum=2,
        num_partitions=2,
        device="cpu",
    )
    assert len(micro) == 2
    assert micro[0]["completion_ids"][:, 0].tolist() == [1, 3] and micro[0]["advantages"].tolist() == [0.5, -0.5]
    assert micro[1]["completion_mask"].sum() == 0 and micro[1]["advantages"].tolist() == [0.0, 0.0]  # padding rows
    assert micro[0]["num_items_in_batch"].item() == 12.0  # 6 tokens x 2 partitions: TRL's divisor becomes 6
    assert micro[1]["num_sequences_in_batch"].item() == 4.0  # 2 responses x 2 partitions, on every micro-batch


def test_policy_partitions_keep_groups_whole_and_skip_partitions_without_signal(ranks):
    G = 2
    kinds = [["new", "new", "replay", FILLER]]
    rewards = [[1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]]  # groups 0 and 2 have a signal, group 1 is all right
    result = policy_partitions(_batch(8), kinds, rewards, G, ARGS, ranks, seed=7)
    assert len(result.micro_batches) == 2
    trained_groups = {row // G for _rank, row in result.trained}
    assert 3 not in trained_groups  # the filler is never trained
    for (_, row), adv in result.trained.items():
        partner = row + 1 if row % G == 0 else row - 1
        assert (0, partner) in result.trained  # a group is never split
        assert (
            adv == pytest.approx(-result.trained[(0, partner)]) if rewards[0][row] != rewards[0][partner] else adv == 0
        )
    # the new groups 0 and 1 are dealt into different partitions (each kind spread evenly)
    groups_in = [
        {row // G for row in m["completion_ids"][:, 0].tolist()} for m in result.micro_batches if not is_skipped(m)
    ]
    assert result.skipped == sum(is_skipped(m) for m in result.micro_batches)
    assert not any({0, 1} <= groups for groups in groups_in)
    for m in result.micro_batches:  # one micro-batch per partition here: its responses x num_partitions
        if not is_skipped(m):
            responses = int((m["completion_mask"].sum(-1) > 0).sum())
            assert m["num_sequences_in_batch"].item() == responses * ARGS.num_partitions


def test_a_step_without_any_signal_makes_no_update(ranks):
    result = policy_partitions(_batch(4), [["new", "new"]], [[1.0, 1.0, 0.0, 0.0]], 2, ARGS, ranks, seed=0)
    assert result.skipped == 2 and all(m == {SKIP: True} for m in result.micro_batches) and result.trained == {}


def test_under_kdrl_a_step_without_a_mixed_group_still_trains_every_rollout(ranks):
    """KDRL's reverse KL acts on every rollout, so the partitions of a step without a mixed group are trained,
    at zero advantage, rather than skipped; RLAD's teacher acts only through the advantage, so they are skipped."""
    kdrl = SimpleNamespace(**vars(ARGS), policy_objective="kdrl")
    dense = policy_objectives()["kdrl"].needs.trains_zero_advantage
    result = policy_partitions(
        _batch(4), [["new", "new"]], [[1.0, 1.0, 0.0, 0.0]], 2, kdrl, ranks, seed=0, dense=dense
    )
    assert result.skipped == 0 and sorted(row for _, row in result.trained) == [0, 1, 2, 3]
    assert all(m["advantages"].abs().sum() == 0 for m in result.micro_batches)
    rlad = SimpleNamespace(**vars(ARGS), policy_objective="rlad")
    dense = policy_objectives()["rlad"].needs.trains_zero_advantage
    assert (
        policy_partitions(
            _batch(4), [["new", "new"]], [[1.0, 1.0, 0.0, 0.0]], 2, rlad, ranks, seed=0, dense=dense
        ).skipped
        == 2
    )


def test_targets_train_in_their_questions_partition(ranks):
    rows = [("correction", "q1"), ("correction", "q1"), ("correction", "q3"), (FILLER, "q1")]
    micro, skipped_count, trained = deal_targets(_batch(4), [rows], ["q1", "q2", "q3", "q4"], [], ARGS, ranks, seed=3)
    assert trained == 3 and skipped_count + sum(not is_skipped(m) for m in micro) == 2
    split = [set(m["completion_ids"][:, 0].tolist()) for m in micro if not is_skipped(m)]
    assert {0, 1} in [s & {0, 1} for s in split]  # q1's two targets share a partition
    assert all(3 not in s for s in split)  # the filler is never trained
    assert all(m["advantages"].abs().sum() == 0 for m in micro if not is_skipped(m))


def test_draw_deals_replays_and_checks_the_dataloader_repeats(ranks):
    batch = [{"id": "a"}] * 2 + [{"id": "b"}] * 2
    draw = draw_questions(batch, 2, lambda n: ["r1", "r2"][:n], ranks, lambda key: {"id": key})
    assert (draw.new_keys, draw.replay_keys, draw.fillers) == (["a", "b"], ["r1", "r2"], 0)
    assert [g.kind for g in draw.plain] == ["new", "new", "replay", "replay"] and draw.plain[2] == Group(
        "replay", {"id": "r1"}
    )
    with pytest.raises(RuntimeError, match="repeat each question"):
        draw_questions([{"id": "a"}, {"id": "b"}], 2, lambda n: [], ranks, lambda key: {})


def test_plain_accuracy_pools_per_key_and_ignores_fillers():
    groups = [[("new", "a"), ("replay", "b"), (FILLER, "a")], [("new", "b")]]
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    assert plain_accuracy(groups, rewards, 2, order=["a", "b"]) == {"a": 0.5, "b": 0.5}
    assert merge_lists([{"a": [1]}, {"a": [2], "b": [3]}]) == {"a": [1, 2], "b": [3]}


def test_step_metrics():
    assert admission_bins(8, 0.5) == ["0of8", "1of8", "2of8", "3of8"] and bin_label(0.375, 8) == "3of8"
    out = kind_metrics(
        ["bcq", "ncq"], ["bcq", "bcq", "ncq"], [[("bcq", "a"), ("ncq", "b")]], torch.tensor([1.0, 0.0, 0.0, 0.0]), 2
    )
    assert (out["bcq"], out["bcq_trained"], out["bcq_accuracy"], out["bcq_signal"]) == (2, 1, 0.5, 1)
    assert (out["ncq"], out["ncq_correct"], out["ncq_signal"]) == (1, 0, 0)
    # every planned instance dropped (say, the teacher was down): no round, nothing trained, nothing raised
    empty = kind_metrics(["bcq"], ["bcq", "bcq"], [[], []], None, 2)
    assert (empty["bcq"], empty["bcq_trained"], empty["bcq_accuracy"], empty["bcq_rollouts"]) == (2, 0, 0.0, 0)
    counters = defaultdict(float, {"dropped_total": 1.0, "bcq_total": 0.0})
    accumulate_totals(counters, {"dropped": 2, "bcq": 3}, ["bcq"])
    assert counters["dropped_total"] == 3.0 and counters["bcq_total"] == 3.0 and counters["evicted_total"] == 0.0
