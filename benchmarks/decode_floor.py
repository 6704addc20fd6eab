"""What one shuffle group of the default store costs to read, decode and copy, way by way
(issue 25: is the in-process default load's 0.8 of the read + decode limit in reach?).

One thread, one group's worth of inner chunks (``--chunks``, picked at random, sorted, read
through the store's own reader: ``read_spans_into``), each way timed ``--repeats`` times
(median CPU seconds, scaled to a whole epoch: the store's chunks / ``--chunks`` groups):

- ``gather``: the loader's gather reader: every chunk decoded into a reused group buffer,
  then each batch one ``np.take`` out of it (the take lane);
- ``scatter``: windows of ``--window`` chunks decoded into a small reused buffer, then every
  row of the window copied to its batch row in one numpy call (a view of rows that starts at
  every byte of the batches' memory): decoding straight into a small buffer, no group buffer;
- ``decode``: the windows decoded only, no copy (the reads' own cost);
- ``bare``: the limit's loop on the group's chunks (one ``os.preadv`` and one
  ``blosc.decompress`` into one small buffer each): reading scattered chunks, no loader.

The batches (``--batch-size`` rows each) are allocated and touched first, so no way pays
fresh pages. The ways' batches are checked equal.

Usage::

    PYTHONPATH=src:benchmarks python benchmarks/decode_floor.py /tmp/bdl/default
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from numcodecs import blosc
from numpy.lib.stride_tricks import as_strided

from shardload.formats.zarr.shards import shard_index
from shardload.store.core import open_store


def bare_loop(
    lay: Any,
    chunks: np.ndarray,
    index: dict[int, tuple[str, np.ndarray]],
    raw: np.ndarray,
    small: np.ndarray,
) -> None:
    """The limit's loop over inner chunks ``chunks`` of array ``x`` (in the given order): one
    ``os.preadv`` into ``raw`` and one ``blosc.decompress`` into ``small`` each; ``index``
    caches each shard's path and index."""
    assert lay.shard is not None
    for c in chunks.tolist():
        k, j = divmod(c, lay.shard.chunks)
        if k not in index:
            p = lay.chunk_path(k)
            with open(p, "rb") as f:
                index[k] = (p, shard_index(lay, "x", k, p, f, f.fileno(), None))
        p, ix = index[k]
        off, size = int(ix[j, 0]), int(ix[j, 1])
        fd = os.open(p, os.O_RDONLY)
        try:
            os.preadv(fd, [raw[:size]], off)
        finally:
            os.close(fd)
        blosc.decompress(raw[:size], small)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--chunks", type=int, default=1353, help="inner chunks of one group")
    ap.add_argument("--window", type=int, default=32, help="chunks decoded per copy")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    st = open_store(args.store)
    rd = st.reader
    lay = rd.layout("x")
    rows = int(st.manifest.arrays["x"].chunk_rows)
    feat = st.manifest.arrays["x"].row_shape
    dtype = np.dtype(st.manifest.arrays["x"].dtype)
    rb = int(np.prod(feat)) * dtype.itemsize
    total_chunks = int(st.manifest.chunk_bounds[-1]) // rows
    rng = np.random.default_rng(0)
    chunks = np.sort(rng.choice(total_chunks, args.chunks, replace=False))
    ranges = [(int(c) * rows, int(c) * rows + rows) for c in chunks]
    n, b = len(chunks) * rows, args.batch_size
    perm = rng.permutation(n)  # the stream position of each group row
    batches = [np.zeros((b, *feat), dtype) for _ in range(-(-n // b))]
    group = np.zeros((n, *feat), dtype)
    w = args.window

    def gather() -> None:
        rd.read_spans_into(
            "x", ranges, [group[i * rows : (i + 1) * rows] for i in range(len(ranges))]
        )
        inv = np.argsort(perm)
        for k, out in enumerate(batches):
            sel = inv[k * b : (k + 1) * b]
            np.take(group, sel, axis=0, out=out[: len(sel)])

    low = min(batches, key=lambda o: o.ctypes.data)
    base = low.ctypes.data
    span = max(o.ctypes.data + o.nbytes for o in batches) - base
    row0 = low.reshape(-1).view(np.uint8)[:rb].view(f"V{rb}")
    targets = as_strided(row0, shape=(span - rb + 1,), strides=(1,))
    addr = np.array([o.ctypes.data for o in batches], np.int64) - base
    dst = addr[perm // b] + (perm % b) * rb  # byte offset of each group row's batch row
    scratch = np.zeros((w * rows, *feat), dtype)
    scratch_rows = scratch.reshape(len(scratch), -1).view(np.uint8).view(f"V{rb}").reshape(-1)

    def windows(copy: bool) -> None:
        for w0 in range(0, len(chunks), w):
            m = min(w, len(chunks) - w0)
            outs = [scratch[i * rows : (i + 1) * rows] for i in range(m)]
            rd.read_spans_into("x", ranges[w0 : w0 + m], outs)
            if copy:
                targets[dst[w0 * rows : (w0 + m) * rows]] = scratch_rows[: m * rows]

    index: dict[int, tuple[str, np.ndarray]] = {}
    small = np.empty(rows * rb, np.uint8)
    raw = np.empty(4 * rows * rb + 4096, np.uint8)

    def bare() -> None:
        bare_loop(lay, chunks, index, raw, small)

    gather()
    want = [o.copy() for o in batches]
    for o in batches:
        o[...] = -1
    windows(True)
    valid = [b] * (len(batches) - 1) + [n - (len(batches) - 1) * b]  # rows of each batch
    same = all(np.array_equal(x[:v], y[:v]) for x, y, v in zip(want, batches, valid, strict=True))
    print(f"scatter batches equal to gather's: {same}")
    ways: dict[str, Callable[[], None]] = {
        "gather": gather,
        "scatter": lambda: windows(True),
        "decode": lambda: windows(False),
        "bare": bare,
    }
    scale = total_chunks / len(chunks)
    for name, fn in ways.items():
        cpu = []
        for _ in range(args.repeats):
            t = time.thread_time()
            fn()
            cpu.append(time.thread_time() - t)
        med = statistics.median(cpu) * scale
        print(
            f"{name:8s} {med:.3f} CPU s an epoch (min {min(cpu) * scale:.3f}, max {max(cpu) * scale:.3f})"
        )


if __name__ == "__main__":
    main()
