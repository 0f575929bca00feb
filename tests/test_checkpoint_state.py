"""`ZPPOState`, built and checked without a trainer: step 7's refresh and its admission bins, the state a checkpoint
holds (restored exactly and in place, since the collaborators hold the same counters and RNG), and the files."""

import json
import logging
import random

import pytest

from zppo_trl.checkpoint_state import ZPPO_STATE_NAME, RankTallyCallback, ZPPOState


class _Term:
    """A term with a state of its own and no student copy."""

    copies = ()

    def __init__(self):
        self.seen = {}

    def state_dict(self):
        return {"term_state": dict(self.seen)}

    def load_state_dict(self, state):
        self.seen = dict(state["term_state"])


def test_refresh_admits_graduates_and_counts_the_admission_bins():
    state = ZPPOState(capacity=10, threshold=0.5, rng=random.Random(0), group_size=4)
    metrics = state.refresh({"a": 0.0, "b": 0.25, "c": 1.0})
    assert (metrics["admitted"], metrics["graduated"], metrics["buffer_size"]) == (2, 0, 2)
    assert metrics["admitted_bin_0of4"] == 1 and metrics["admitted_bin_1of4"] == 1
    assert state.admitted_at == {"a": 0.0, "b": 0.25}
    metrics = state.refresh({"a": 0.75})  # graduates from the bin it was admitted at, not the one it leaves at
    assert metrics["graduated"] == 1 and metrics["graduated_bin_0of4"] == 1
    assert state.counters["graduated_bin_0of4_total"] == 1 and "a" not in state.admitted_at


def test_state_round_trips_exactly_and_in_place(tmp_path):
    term = _Term()
    state = ZPPOState(capacity=10, threshold=0.5, rng=random.Random(3), group_size=4, terms=[term])
    state.refresh({"a": 0.0, "b": 0.25})
    state.counters["rollout_steps"] = 7
    term.seen = {"a": "trace"}
    state.rng.random()
    saved = json.loads(json.dumps(state.state_dict()))
    expected_draws = [state.rng.random() for _ in range(3)]

    fresh_term = _Term()
    other = ZPPOState(capacity=10, threshold=0.5, rng=random.Random(99), group_size=4, terms=[fresh_term])
    counters, rng, admitted = other.counters, other.rng, other.admitted_at
    other.load_state_dict(saved)
    assert other.counters is counters and other.rng is rng and other.admitted_at is admitted  # in place
    assert other.counters["rollout_steps"] == 7 and other.admitted_at == {"a": 0.0, "b": 0.25}
    assert other.replay_buffer.residents() == ["a", "b"] and fresh_term.seen == {"a": "trace"}
    assert [other.rng.random() for _ in range(3)] == expected_draws

    state.save(str(tmp_path))
    assert json.loads((tmp_path / ZPPO_STATE_NAME).read_text())["counters"]["rollout_steps"] == 7


def test_a_checkpoint_without_zppo_state_starts_empty_and_says_so(tmp_path, caplog):
    state = ZPPOState(capacity=10, threshold=0.5, rng=random.Random(0), group_size=4)
    state.counters["rollout_steps"] = 2
    with caplog.at_level(logging.WARNING):
        state.load(str(tmp_path), "cpu", dict)
    assert f"has no {ZPPO_STATE_NAME}" in caplog.text and state.counters["rollout_steps"] == 2


@pytest.mark.parametrize("threshold", [0.5, 0.75])
def test_refresh_reads_the_buffer_threshold(threshold):
    state = ZPPOState(capacity=10, threshold=threshold, rng=random.Random(0), group_size=4)
    assert state.refresh({"q": 0.5})["admitted"] == (1 if threshold > 0.5 else 0)


def test_every_ranks_own_counts_are_summed_into_the_counters_after_each_update():
    """The counts of a rank's own micro-batches differ by rank: the callback folds every rank's tally into the
    counters at each update's end, so that every rank's counters (and its checkpoint) hold the same totals."""
    state = ZPPOState(capacity=4, threshold=0.5, rng=random.Random(0), group_size=4)
    state.counters["rollout_steps"] = 1.0
    state.rank_tally["shared_prompt_tokens_saved_total"] += 300
    other_rank = {"shared_prompt_tokens_saved_total": 280.0, "padded_micro_batches_total": 2.0}
    gathered = []
    callback = RankTallyCallback(state, lambda mine: gathered.append(mine) or [mine, other_rank])
    callback.on_step_end(None, None, None)
    assert gathered == [{"shared_prompt_tokens_saved_total": 300.0}]
    assert dict(state.counters) == {
        "rollout_steps": 1.0, "shared_prompt_tokens_saved_total": 580.0, "padded_micro_batches_total": 2.0,
    }  # fmt: skip
    assert not state.rank_tally  # counted once
    callback.on_step_end(None, None, None)
    assert state.counters["shared_prompt_tokens_saved_total"] == 860.0  # the other rank's second tally
