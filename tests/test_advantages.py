import math
import random

import pytest
import torch

from zppo_trl.advantages import nontrivial_groups, partition_groups, two_step_advantages


def random_partition(seed, num_groups=12, group_size=8, trivial_share=0.4):
    rng = random.Random(seed)
    rewards, ids = [], []
    for g in range(num_groups):
        if rng.random() < trivial_share:
            value = rng.choice([0.0, 1.0])
            rewards += [value] * group_size
        else:
            k = rng.randint(1, group_size - 1)
            rewards += rng.sample([1.0] * k + [0.0] * (group_size - k), group_size)
        ids += [f"g{g}"] * group_size
    return torch.tensor(rewards), ids


@pytest.mark.parametrize("seed", range(5))
def test_step1_centres_every_group_to_zero(seed):
    rewards, ids = random_partition(seed)
    a1 = two_step_advantages(rewards, ids, normalization="none")
    for g in set(ids):
        rows = [i for i, x in enumerate(ids) if x == g]
        assert abs(a1[rows].sum().item()) < 1e-6
        expected = rewards[rows] - rewards[rows].mean()
        torch.testing.assert_close(a1[rows], expected)


@pytest.mark.parametrize("normalization", ["without_zero", "with_zero", "none"])
def test_trivial_groups_get_exactly_zero(normalization):
    rewards = torch.tensor([1.0] * 4 + [0.0] * 4 + [1, 0, 0, 0] + [0.3] * 4)
    ids = ["a"] * 4 + ["b"] * 4 + ["c"] * 4 + ["d"] * 4
    adv = two_step_advantages(rewards, ids, normalization=normalization)
    assert adv[:8].eq(0).all() and adv[12:].eq(0).all()  # exact, not approximate
    assert adv[8:12].ne(0).all()


@pytest.mark.parametrize("normalization", ["without_zero", "with_zero", "none"])
def test_all_trivial_partition_is_all_zeros(normalization):
    rewards = [0.0] * 8 + [1.0] * 8
    adv = two_step_advantages(rewards, ["x"] * 8 + ["y"] * 8, normalization=normalization)
    assert adv.eq(0).all() and adv.shape == (16,)


def test_without_zero_statistics_are_over_nontrivial_rollouts_only():
    rewards, ids = random_partition(3)
    a1 = two_step_advantages(rewards, ids, normalization="none").double()
    keep = torch.tensor([g in nontrivial_groups(rewards, ids) for g in ids])
    sigma = a1[keep].std(correction=0)
    expected = torch.where(keep, a1 / (sigma + 1e-6), torch.zeros_like(a1))
    torch.testing.assert_close(two_step_advantages(rewards, ids).double(), expected, rtol=1e-6, atol=1e-7)
    # normalised non-trivial advantages have population std ~1 and mean 0
    adv = two_step_advantages(rewards, ids)[keep].double()
    assert abs(adv.mean().item()) < 1e-6 and abs(adv.std(correction=0).item() - 1) < 1e-4


@pytest.mark.parametrize("seed", range(5))
def test_sigma_shrink_identity(seed):
    """eq. sigma-shrink: sigma_G = sqrt(f_nt) sigma_G*; eq. wzero-amplify for the advantages."""
    rewards, ids = random_partition(seed, num_groups=10)
    nontrivial = nontrivial_groups(rewards, ids)
    f_nt = len(nontrivial) / len(set(ids))
    assert 0 < f_nt < 1
    a1 = two_step_advantages(rewards, ids, normalization="none").double()
    keep = torch.tensor([g in nontrivial for g in ids])
    sigma_all, sigma_nt = a1.std(correction=0), a1[keep].std(correction=0)
    assert math.isclose(sigma_all.item(), math.sqrt(f_nt) * sigma_nt.item(), rel_tol=1e-9)

    eps = 1e-6
    without = two_step_advantages(rewards, ids, "without_zero", eps).double()
    with_zero = two_step_advantages(rewards, ids, "with_zero", eps).double()
    factor = (sigma_nt + eps) / (math.sqrt(f_nt) * sigma_nt + eps)
    torch.testing.assert_close(with_zero[keep], factor * without[keep], rtol=1e-5, atol=1e-6)
    assert 1 <= factor <= 1 / math.sqrt(f_nt) + 1e-9


def test_group_order_and_interleaving_do_not_matter():
    rewards = [1, 0, 0, 1, 1, 1, 0, 0]
    ids = ["a", "b", "a", "b", "a", "b", "a", "b"]
    adv = two_step_advantages(rewards, ids)
    grouped = two_step_advantages([1, 0, 1, 0, 0, 1, 1, 0], ["a"] * 4 + ["b"] * 4)
    torch.testing.assert_close(adv[[0, 2, 4, 6, 1, 3, 5, 7]], grouped)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="normalization"):
        two_step_advantages([1.0, 0.0], ["a", "a"], normalization="batch")
    with pytest.raises(ValueError, match="group ids"):
        two_step_advantages([1.0, 0.0], ["a"])
    with pytest.raises(ValueError, match="finite"):
        two_step_advantages([float("nan"), 0.0], ["a", "a"])


def test_partition_keeps_groups_intact_and_balanced():
    ids = [g for g in range(37) for _ in range(8)]  # 37 groups of 8
    parts = partition_groups(ids, 4, rng=0)
    assert sorted(i for p in parts for i in p) == list(range(len(ids)))
    for p in parts:
        assert len({ids[i] for i in p}) * 8 == len(p)  # only whole groups
    sizes = sorted(len(p) for p in parts)
    assert sizes[-1] - sizes[0] <= 8  # within one group
    assert partition_groups(ids, 4, rng=0) == parts  # deterministic given the seed
    assert partition_groups(ids, 4, rng=1) != parts


def test_partition_spreads_each_stratum_evenly():
    kinds = ["new"] * 384 + ["replay"] * 96 + ["bcq"] * 40 + ["ncq"] * 56
    ids = [f"{k}{i}" for i, k in enumerate(kinds)]
    rows = [g for g in ids for _ in range(8)]
    strata = [k for k in kinds for _ in range(8)]
    parts = partition_groups(rows, 4, rng=7, strata=strata)
    for kind, total in [("new", 384), ("replay", 96), ("bcq", 40), ("ncq", 56)]:
        per = [sum(1 for i in p if strata[i] == kind) // 8 for p in parts]
        assert sum(per) == total and max(per) - min(per) <= 1, (kind, per)
    with pytest.raises(ValueError, match="spans strata"):
        partition_groups(["a", "a"], 2, strata=["new", "bcq"])


def test_fewer_groups_than_partitions_leaves_empty_partitions():
    parts = partition_groups(["a"] * 8 + ["b"] * 8, 4, rng=0)
    assert sorted(len(p) for p in parts) == [0, 0, 8, 8]
