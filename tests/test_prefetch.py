"""The read-ahead that lets the teacher sample the next rollout step early (zppo_trl.prefetch)."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from zppo_trl.prefetch import BatchLookahead, PrefetchedSampling, joined_futures


def test_a_lookahead_serves_every_item_in_order_whatever_it_looked_at():
    ahead = BatchLookahead(iter(range(5)))
    assert next(ahead) == 0
    assert ahead.peek(2) == 3  # items 1, 2, 3 are now held
    assert ahead.peek(0) == 1
    assert next(ahead) == 1
    assert ahead.peek(10) is None  # past the end: what was there is still served
    assert list(ahead) == [2, 3, 4]
    assert ahead.peek(0) is None
    with pytest.raises(ValueError, match="offset"):
        ahead.peek(-1)


def test_a_lookahead_without_a_source_is_empty():
    ahead = BatchLookahead()
    assert ahead.peek(0) is None
    assert list(ahead) == []


def test_joined_futures_keep_their_order_whichever_finishes_first():
    first, second = concurrent.futures.Future(), concurrent.futures.Future()
    joined = joined_futures([first, second])
    second.set_result([["c"]])
    assert not joined.done()
    first.set_result([["a"], ["b"]])
    assert joined.result(timeout=1) == [["a"], ["b"], ["c"]]
    assert joined_futures([]).result(timeout=1) == []


def test_joined_futures_finish_once_when_their_parts_finish_on_other_threads():
    parts = [concurrent.futures.Future() for _ in range(64)]
    joined = joined_futures(parts)
    threads = [threading.Thread(target=part.set_result, args=([i],)) for i, part in enumerate(parts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert joined.result(timeout=5) == list(range(64))


def test_joined_futures_fail_as_a_part_does():
    first, second = concurrent.futures.Future(), concurrent.futures.Future()
    joined = joined_futures([first, second])
    first.set_exception(ConnectionError("teacher down"))
    second.set_result([])
    with pytest.raises(ConnectionError, match="teacher down"):
        joined.result(timeout=1)


def test_a_prefetch_failed_only_where_the_server_failed_a_request():
    done = concurrent.futures.Future()
    done.set_result([[], ["x"]])
    assert PrefetchedSampling(["q1", "q2"], done, ["Connection refused", None]).failed()
    # a refused request would be refused again; a clean one needs nothing
    assert not PrefetchedSampling(["q1", "q2"], done, ["rejected: too long", None]).failed()
    assert not PrefetchedSampling(["q1", "q2"], done, [None, None]).failed()
    # still in flight: the step waits for it
    assert not PrefetchedSampling(["q1"], concurrent.futures.Future(), ["Connection refused"]).failed()
