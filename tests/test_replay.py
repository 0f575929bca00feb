import json
import random
from fractions import Fraction

import pytest

from zppo_trl.replay import PromptReplayBuffer, replay_count


def test_admission_bins_at_g8_tau_half():
    """At G=8, tau=0.5 admits exactly the bins 0, 1/8, 2/8, 3/8."""
    buf = PromptReplayBuffer(threshold=0.5)
    events = buf.update({k: k / 8 for k in range(9)})
    assert events.admitted == [0, 1, 2, 3]
    assert buf.residents() == [0, 1, 2, 3]


def test_retain_in_place_graduate_and_fifo_evict():
    buf = PromptReplayBuffer(capacity=3, threshold=0.5)
    buf.update({"a": 0.0, "b": 0.125, "c": 0.25})
    events = buf.update({"a": 0.375, "d": 0.0})  # a stays hard: keeps its place; d pushes a out
    assert events.retained == ["a"] and events.admitted == ["d"] and events.evicted == ["a"]
    assert buf.residents() == ["b", "c", "d"]
    events = buf.update({"c": 0.5, "e": 1.0})  # c graduates at exactly tau; e was never resident
    assert events.graduated == ["c"] and events.admitted == [] and events.evicted == []
    assert buf.residents() == ["b", "d"] and "c" not in buf and "e" not in buf


def test_capacity_zero_admits_then_evicts_everything():
    buf = PromptReplayBuffer(capacity=0)
    events = buf.update({1: 0.0, 2: 0.0})
    assert events.admitted == [1, 2] and events.evicted == [1, 2] and len(buf) == 0


def test_replay_count_is_min_of_quota_and_buffer():
    assert replay_count(384, 0.25, 10_000) == 96
    assert replay_count(384, 0.25, 40) == 40
    assert replay_count(384, 0.0, 40) == 0
    assert replay_count(100, 0.29, 1000) == 29  # no float flooring surprise
    for n, f, b in [(10, 0.25, 1), (7, 0.5, 9), (384, 0.25, 0)]:
        assert replay_count(n, f, b) == min(int(Fraction(f).limit_denominator() * n), b)


def test_sample_is_uniform_distinct_and_seeded():
    buf = PromptReplayBuffer()
    buf.update(dict.fromkeys(range(10), 0.0))
    draw = buf.sample(4, rng=3)
    assert len(set(draw)) == 4 and set(draw) <= set(range(10))
    assert buf.sample(4, rng=3) == draw
    assert sorted(buf.sample(50, rng=1)) == list(range(10))  # min(k, len)
    counts = [0] * 10
    rng = random.Random(0)
    for _ in range(4000):
        for k in buf.sample(3, rng):
            counts[k] += 1
    assert all(abs(c - 1200) < 150 for c in counts), counts  # 4000 * 3 / 10 each


def test_state_dict_round_trips_exactly_through_json():
    buf = PromptReplayBuffer(capacity=5, threshold=0.4)
    buf.update({3: 0.0, "q-7": 0.1, 11: 0.2})
    buf.update({3: 0.0, 12: 0.0})
    restored = PromptReplayBuffer()
    restored.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert restored.residents() == buf.residents() == [3, "q-7", 11, 12]
    assert (restored.capacity, restored.threshold) == (5, 0.4)
    # the restored buffer behaves identically from here on
    assert restored.update({13: 0.0, 14: 0.0}).evicted == buf.update({13: 0.0, 14: 0.0}).evicted == [3]


def test_bad_input_is_refused_with_a_clear_error():
    buf = PromptReplayBuffer()
    with pytest.raises(TypeError, match="int or str"):
        buf.update({(1, 2): 0.0})
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        buf.update({1: 1.5})
    with pytest.raises(ValueError, match="twice"):
        buf.load_state_dict({"capacity": 3, "threshold": 0.5, "residents": [1, 1]})
    with pytest.raises(ValueError, match="capacity"):
        PromptReplayBuffer(capacity=-1)
