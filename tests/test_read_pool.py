"""``ReadPool``: the one thread pool of a loader iterator (``load/pool.py``)."""

from __future__ import annotations

import threading
import time

import pytest

from shardload.load.pool import ReadPool


def test_lanes_keep_their_thread_limits_and_their_own_order():
    pool = ReadPool({"read": 2, "take": 1})
    running = {"read": 0, "take": 0}
    most = {"read": 0, "take": 0}
    order: list[int] = []
    lock = threading.Lock()

    def task(lane: str, i: int) -> int:
        with lock:
            running[lane] += 1
            most[lane] = max(most[lane], running[lane])
            if lane == "take":
                order.append(i)
        time.sleep(0.01)
        with lock:
            running[lane] -= 1
        return i

    futs = [pool.submit(lane, task, lane, i) for i in range(8) for lane in ("read", "take")]
    assert [f.result() for f in futs] == [i for i in range(8) for _ in range(2)]
    pool.shutdown()
    assert most == {"read": 2, "take": 1} and order == list(range(8))


def test_errors_reach_the_future_and_shutdown_cancels_what_has_not_started():
    pool = ReadPool({"read": 1})
    gate = threading.Event()
    first = pool.submit("read", gate.wait)
    bad = pool.submit("read", lambda: 1 / 0)
    later = pool.submit("read", lambda: None)
    gate.set()
    first.result()
    with pytest.raises(ZeroDivisionError):
        bad.result()
    later.result()
    started = threading.Event()
    slow = pool.submit("read", lambda: (started.set(), time.sleep(0.05)))
    queued = pool.submit("read", time.sleep, 0)
    started.wait()
    pool.shutdown()  # waits for the running task, cancels the queued one
    assert slow.done() and not slow.cancelled() and queued.cancelled()
    assert not [t for t in threading.enumerate() if t.name.startswith("shardload-read_")]
    with pytest.raises(RuntimeError, match="after shutdown"):
        pool.submit("read", time.sleep, 0)


def test_a_close_does_not_wait_for_a_detached_lane():
    pool = ReadPool({"read": 1, "take": 1}, detach=("read",))
    gate = threading.Event()
    pool.submit("read", gate.wait)
    t = time.perf_counter()
    pool.shutdown()
    assert time.perf_counter() - t < 1
    gate.set()
