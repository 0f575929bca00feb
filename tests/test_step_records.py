"""`StepRecorder`, without a trainer: a step's metrics land in TRL's log under ``zppo/`` with its time, the server
clients' counts and the running totals; the trained advantages replace TRL's own in its completions log; the group log
gets every real group of the step."""

import collections
import random
from collections import defaultdict

import torch
from accelerate import Accelerator

from zppo_trl.checkpoint_state import ZPPOState
from zppo_trl.group_log import GROUP_LOG_NAME, GroupLog, read_group_log
from zppo_trl.ranks import Ranks
from zppo_trl.rollout import FILLER, Round


class _Client:
    def __init__(self, requests, failed):
        self.counts = {"requests": requests, "failed": failed, "latency_mean_s": 0.5}

    def stats(self, reset=False):
        return dict(self.counts)


def _recorder(**overrides):
    from zppo_trl.step_records import StepRecorder

    state = ZPPOState(capacity=10, threshold=0.5, rng=random.Random(0), group_size=2)
    settings = dict(
        ranks=Ranks(Accelerator(cpu=True)),
        group_size=2,
        num_partitions=2,
        main_process=True,
        state=state,
        trl_metrics={"train": defaultdict(list)},
        trl_logs={"advantages": collections.deque([9.0, 9.0, 9.0, 9.0])},
        clients={"teacher": _Client(4, 1), "judge": None},
        kinds=("bcq",),
        questions=None,
        reward_signal=None,
    )
    settings.update(overrides)
    return StepRecorder(**settings), settings


def test_a_step_lands_in_trl_metrics_with_time_services_and_totals(caplog):
    recorder, settings = _recorder()
    metrics = recorder.begin(global_step=4)
    assert recorder.rollout_step == 3
    recorder.add("dropped", 1)
    recorder.add("dropped", 2)
    metrics["bcq"] = 2
    recorder.finish()
    logged = settings["trl_metrics"]["train"]
    assert (
        logged["zppo/dropped"] == [3.0] and logged["zppo/dropped_total"] == [3.0] and logged["zppo/bcq_total"] == [2.0]
    )
    assert logged["zppo/teacher/requests"] == [4.0] and logged["zppo/teacher/failures"] == [1.0]
    assert logged["zppo/rollout_steps"] == [1.0] and logged["zppo/time/rollout_step_s"][0] >= 0
    assert "teacher: 1 of 4 requests failed this step" in caplog.text
    recorder.begin(global_step=6)
    recorder.finish()
    assert logged["zppo/dropped_total"] == [3.0, 3.0] and settings["state"].counters["rollout_steps"] == 2


def test_trained_advantages_replace_trl_s_and_untrained_rows_get_zero():
    recorder, settings = _recorder()
    recorder.trained_advantages({(0, 0): 0.5, (0, 3): -1.0}, [2, 2])
    assert list(settings["trl_logs"]["advantages"]) == [0.5, 0.0, 0.0, -1.0]


def test_the_group_log_gets_every_real_group_of_the_step(tmp_path):
    log = GroupLog(tmp_path / GROUP_LOG_NAME)
    recorder, _ = _recorder(group_log=log)
    recorder.begin(global_step=2)
    plain = Round(None, torch.tensor([1.0, 0.0, 0.0, 0.0]), [], [[("new", "q1"), (FILLER, "q1")]])
    recorder.groups([plain, Round(None, None, [], [[]])])
    assert read_group_log(tmp_path / GROUP_LOG_NAME) == {2: [{"kind": "new", "id": "q1", "rewards": [1.0, 0.0]}]}
