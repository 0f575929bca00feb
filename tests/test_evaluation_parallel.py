"""`run_all`, the evaluation's one way to send requests in parallel: every item runs once, and a failure stops the
queued items at once, sets the abort flag the running ones check, and is raised."""

import threading
import time

import pytest

from zppo_trl.evaluation.parallel import run_all


class _Bar:
    def __init__(self):
        self.n = 0

    def update(self, k):
        self.n += k


def test_every_item_runs_once_and_is_counted():
    done, lock = [], threading.Lock()

    def work(item):
        with lock:
            done.append(item)

    bar = _Bar()
    run_all(work, range(20), concurrency=4, abort=threading.Event(), progress=bar)
    assert sorted(done) == list(range(20)) and bar.n == 20


def test_a_failure_sets_abort_cancels_the_queue_and_is_raised():
    abort, started = threading.Event(), []

    def work(item):
        started.append(item)
        if item == 0:
            raise RuntimeError("endpoint gone")
        time.sleep(0.05)

    with pytest.raises(RuntimeError, match="endpoint gone"):
        run_all(work, range(200), concurrency=2, abort=abort)
    assert abort.is_set() and len(started) < 200  # the queued items never started
