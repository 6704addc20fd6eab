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


@pytest.mark.slow  # three interpreters: about 10 s
def test_an_iterator_left_open_at_exit_does_not_hang_the_interpreter(tmp_path):
    """A script that takes one batch and exits with the store and the iterator in globals:
    the interpreter's teardown closes the iterator after its daemon threads are frozen (one
    may hold the pool's lock), so the shutdown must not wait for them (it hung for ever)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import shardload
    from _stores import make_store

    store = make_store(tmp_path, fmt="zarr", compression="zstd", n=20000, chunk_rows=1000)
    script = (
        "import shardload, sys\n"
        "s = shardload.open_store(sys.argv[1])\n"
        "it = shardload.iter_batches(s, batch_size=10000)\n"  # gathers of 320 KB: in threads
        "print(len(next(it)['index']))\n"
    )
    src = str(Path(shardload.__file__).parents[1])  # this checkout's package, not another
    env = {**os.environ, "PYTHONPATH": src}
    for _ in range(3):  # a race: it hung in 2 of 3 runs
        try:
            got = subprocess.run(
                [sys.executable, "-c", script, str(store.url)],
                capture_output=True,
                text=True,
                timeout=30,
                env=env,
            )
        except subprocess.TimeoutExpired:
            pytest.fail("the interpreter hung at exit, closing an open iterator")
        assert got.returncode == 0, got.stderr
        assert got.stdout.split() == ["10000"]
