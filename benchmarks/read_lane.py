"""One shuffle group's read lane against a bare loop of the same system calls (issue 25): the
store's ``read_spans_into`` of ``--chunks`` random whole inner chunks (in a shuffled order, as a
group hands them) into a pre-touched group buffer, and the bare loop of ``decode_floor.py``
(per chunk: ``os.open``, one ``os.preadv``, ``os.close``, one ``blosc.decompress`` into one
small buffer), timed alternately ``--repeats`` times in one thread (median CPU seconds, scaled
to an epoch); first the profile events (Python calls and returns, in every module) of one read
per chunk.

Usage::

    PYTHONPATH=src python benchmarks/read_lane.py /tmp/bdl/default
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from decode_floor import bare_loop

from shardload.store.core import open_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--chunks", type=int, default=1353, help="inner chunks of one group")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    st = open_store(args.store)
    rd, info = st.reader, st.manifest.arrays["x"]
    lay = rd.layout("x")  # type: ignore[attr-defined]
    assert lay.shard is not None
    rows, dtype = int(info.chunk_rows), np.dtype(info.dtype)
    total = int(st.manifest.chunk_bounds[-1]) // rows
    chunks = np.random.default_rng(0).choice(total, args.chunks, replace=False)
    ranges = [(int(c) * rows, int(c) * rows + rows) for c in chunks]
    group = np.zeros((len(chunks) * rows, *info.row_shape), dtype)
    outs = [group[i * rows : (i + 1) * rows] for i in range(len(ranges))]
    index: dict[int, tuple[str, np.ndarray]] = {}
    small = np.empty(rows * lay.row_bytes, np.uint8)
    raw = np.empty(1 << 22, np.uint8)

    def read() -> None:
        rd.read_spans_into("x", ranges, outs)  # type: ignore[attr-defined]

    def bare() -> None:
        bare_loop(lay, np.sort(chunks), index, raw, small)

    read()
    bare()
    events = [0]

    def prof(frame: object, event: str, arg: object) -> None:
        events[0] += 1

    sys.setprofile(prof)
    read()
    sys.setprofile(None)
    r, b = [], []
    for _ in range(args.repeats):
        t = time.thread_time()
        read()
        r.append(time.thread_time() - t)
        t = time.thread_time()
        bare()
        b.append(time.thread_time() - t)
    sc = total / len(chunks)
    mr, mb = statistics.median(r), statistics.median(b)
    print(
        f"profile events per chunk {events[0] / len(chunks):.1f}; read {mr * sc:.3f}, bare "
        f"{mb * sc:.3f} CPU s an epoch; read / bare {mr / mb:.2f}; load average "
        f"{os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
