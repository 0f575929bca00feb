"""The old-log-prob schedule, without a trainer: which micro-batches read the sampling policy's log-probs (none of the
partitions up to the first trained one), which rollouts are scored (those with tokens, each alone, and only those the
second thread did not score already), and when the plain rollouts' are hidden behind the second round."""

from concurrent.futures import Future
from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator

from zppo_trl.logp_paths import OldLogProbs, overlaps_old_logps
from zppo_trl.ranks import Ranks


def _micro(completions, rows):
    ids = torch.tensor(completions)
    return dict(
        prompt_ids=torch.ones(len(completions), 2, dtype=torch.long),
        prompt_mask=torch.ones(len(completions), 2, dtype=torch.long),
        completion_ids=ids,
        completion_mask=(ids > 0).long(),
        zppo_round_row=torch.tensor(rows),
    )


def _old_logps(accumulation=1):
    scored = []

    def scorer(model, input_ids, attention_mask, keep, batch_size, entropy, aux, multimodal):
        scored.append(input_ids[0, -keep:].tolist())
        return -input_ids[:, -keep:].float() / 10, None, None

    recorder = SimpleNamespace(metrics={})
    old = OldLogProbs(
        scorer, model=lambda: None, ranks=Ranks(Accelerator(cpu=True)), recorder=recorder,
        accumulation=accumulation, deferred=True, read=True, overlap=False, sharded=False,
    )  # fmt: skip
    return old, scored, recorder.metrics


def test_only_partitions_after_the_first_trained_one_read_old_logps_each_row_scored_alone():
    old, scored, metrics = _old_logps()
    first, second, third = _micro([[1, 2]], [0]), _micro([[3, 4]], [1]), _micro([[5, 6], [0, 0]], [2, 3])
    old.attach([{"zppo_skip": True}, first, second, third])
    assert "old_per_token_logps" not in first  # the first trained partition updates on the sampling weights
    assert scored == [[3, 4], [5, 6]]  # the padding row (no tokens) is not scored
    torch.testing.assert_close(third["old_per_token_logps"], torch.tensor([[-0.5, -0.6], [0.0, 0.0]]))
    assert metrics["old_logps_rows"] == 3 and "zppo_round_row" not in third


def test_rollouts_the_second_thread_scored_are_not_scored_again():
    old, scored, metrics = _old_logps()
    done = Future()
    done.set_result(({1: torch.tensor([-1.0, -2.0])}, 0.25))
    second, third = _micro([[3, 4]], [1]), _micro([[5, 6]], [2])
    old.attach([_micro([[1, 2]], [0]), second, third], done)
    assert scored == [[5, 6]] and second["old_per_token_logps"].tolist() == [[-1.0, -2.0]]
    assert metrics["time/old_logps_hidden_s"] == 0.25


@pytest.mark.parametrize(
    "change, expected",
    [({}, True), ({"overlap_old_logps": False}, False), ({"vllm_mode": "colocate"}, False), ({"terms": True}, False),
     ({"sharded": True}, False), ({"second_round": False}, False), ({"reads": False}, False)],
)  # fmt: skip
def test_the_plain_old_logps_are_hidden_only_where_the_second_round_runs_off_this_device(change, expected):
    args = SimpleNamespace(overlap_old_logps=True, use_vllm=True, vllm_mode="server")
    flags = dict(defers=True, reads=True, second_round=True, terms=False, sharded=False)
    for name, value in change.items():
        setattr(args, name, value) if hasattr(args, name) else flags.__setitem__(name, value)
    assert overlaps_old_logps(args, **flags) is expected
