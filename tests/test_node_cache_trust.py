"""The node cache's trust rule (issue 28): a copy checked once against the store's checksum is
not hashed again in every later process while its record proves it is the very bytes checked;
a copy rewritten since is fetched again, never served. Rows are read in place from the copies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import xxhash

import shardload

sys.path.insert(0, str(Path(__file__).parent))
from _stores import make_store
from conftest import python_env
from test_node_cache import assert_damaged_copy_fetched_again, data_files, epoch_rows, serving

#: A later epoch in a new process (as a new DataLoader worker or rank): the hashes of whole
#: data files it computes (any caller: the reader's check, the cache's), its rows' digest.
LATER_EPOCH = textwrap.dedent(
    """
    import json, sys, numpy as np, xxhash, shardload
    import shardload.move.cache as cache
    url, folder, digests = sys.argv[1], sys.argv[2], set(json.loads(sys.argv[3]))
    hashed = []
    real, real_fd = xxhash.xxh3_64_intdigest, cache._digest_fd
    def counted(data, *a, **k):
        got = real(data, *a, **k)
        hashed.extend([got] if got in digests else [])
        return got
    def counted_fd(fd):
        got = real_fd(fd)
        hashed.extend([got] if got in digests else [])
        return got
    xxhash.xxh3_64_intdigest, cache._digest_fd = counted, counted_fd
    store = shardload.open_store(url, cache_dir=folder)
    x = np.full((len(store), 4), np.nan, dtype="f4")
    for b in shardload.iter_batches(store, batch_size=16, seed=3, epoch=1):
        x[b["index"]] = b["x"]
    print(json.dumps([len(hashed), store.fs.node_cache.stats["fills"], x.tolist()]))
    """
)


def test_a_later_epoch_in_a_new_process_hashes_no_copy(tmp_path: Path) -> None:
    """Epoch 2 in a new process: every copy's record vouches for it (no whole-file hash, where
    the reader by URL hashed each file once per process), no data request, the right rows."""
    make_store(tmp_path / "src", n=203, chunk_rows=7, name="store")
    root = tmp_path / "src" / "store"
    hashed = later_epoch_hashes(tmp_path, root)
    assert hashed == 0, f"{hashed} whole-file hashes of cached copies in a later process"


def later_epoch_hashes(tmp_path: Path, root: Path) -> int:
    """The store at ``root`` (under ``tmp_path / "src"``) served, one epoch by URL filling the
    cache, then an epoch in a new process: it made no data request and no cache fill and read
    the right rows; returns how many cached copies it hashed whole."""
    local = shardload.open_store(root)
    digests = [int(xxhash.xxh3_64_intdigest((root / f).read_bytes())) for f in data_files(root)]
    with serving(tmp_path / "src") as srv:
        url, cache = f"{srv.url}/store", tmp_path / "cache"
        epoch_rows(shardload.open_store(url, cache_dir=cache), 0)  # fills the cache
        before = len(srv.paths)
        out = subprocess.run(
            [sys.executable, "-c", LATER_EPOCH, url, str(cache), json.dumps(digests)],
            capture_output=True,
            text=True,
            env=python_env(),
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        hashed, fills, x = json.loads(out.stdout.splitlines()[-1])
        assert srv.data_requests(before) == []
    assert np.array_equal(np.asarray(x, dtype="f4"), local.read("x", 0, len(local)))
    assert fills == 0
    return int(hashed)


def test_a_copy_rewritten_with_its_mtime_put_back_is_fetched_again(tmp_path: Path) -> None:
    """A copy changed in place after it was recorded, its size and mtime restored (as a copy
    tool preserving times would leave it): its ctime moved, so the record no longer vouches
    for it; it is hashed, dropped and fetched again, never served."""

    def rewrite_in_place(path: Path) -> None:
        st = os.stat(path)
        with open(path, "r+b") as f:  # the same inode, the same size
            f.seek(-8, os.SEEK_END)
            f.write(b"\xff" * 8)  # the last row's bytes: a wrong value if served
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        after = os.stat(path)
        assert (after.st_size, after.st_ino, after.st_mtime_ns) == (
            st.st_size,
            st.st_ino,
            st.st_mtime_ns,
        )

    assert_damaged_copy_fetched_again(tmp_path, rewrite_in_place)


def held_deleted(folder: Path) -> int:
    """Descriptors of this process on files of ``folder`` that were deleted (evicted copies)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += target.startswith(str(folder)) and target.endswith(" (deleted)")
    return n


def test_a_bounded_cache_holds_no_evicted_copy_open_for_the_epoch(tmp_path: Path) -> None:
    """Rows are read in place from the copies, but with ``cache_bytes`` a copy's descriptor
    serves one read task, not the epoch: an evicted copy kept open would hold its bytes (in
    ``/dev/shm``: memory) past the bound until the epoch ends."""
    from shardload.move.cache import HELD_FILES

    make_store(tmp_path / "src", n=203, chunk_rows=7, name="store")
    local = shardload.open_store(tmp_path / "src" / "store")
    folder = tmp_path / "cache"
    with serving(tmp_path / "src") as srv:
        store = shardload.open_store(f"{srv.url}/store", cache_dir=folder, cache_bytes=3000)
        x = np.full((len(local), 4), np.nan, dtype="f4")
        most = 0
        for b in shardload.iter_batches(store, batch_size=16, seed=3, threads=1, prefetch=1):
            x[b["index"]] = b["x"]
            most = max(most, held_deleted(folder))
        stats = store.fs.node_cache.stats
        assert stats["evicted"] + stats["bypassed"] > HELD_FILES + 4, stats  # copies dropped
    assert np.array_equal(x, local.read("x", 0, len(local)))
    # one read task (threads=1: one per array and group, here the whole epoch) holds the copies
    # of its own files, which may be evicted meanwhile; beyond them only HELD_FILES. Before the
    # per-task limit every copy read in the epoch stayed open (60 here)
    one_task = -(-len(local) // 7)  # an array's chunk files
    assert most <= HELD_FILES + one_task, (most, one_task)
