"""The node cache's trust memo (issue 28): a process remembers the copies it trusted by their
stat, so a new handle on the same cache in the same process (each epoch of
``iter_batches(url, cache_dir=...)``, a store opened again) reads no copy's record and hashes
no copy; a large Blosc chunk file's copy is decoded from a mapping of it, not read into a
buffer; and every change to a copy on disk (rewritten with its mtime put back by
``touch -r``, truncated, grown, renamed over) is still caught, by the same handle and by a new
one, read or mapped: that file alone is fetched again and the right rows are read."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

import shardload
import shardload.formats.zarr.rows as zarr_rows
import shardload.move.cache as cache_mod
from shardload.move.cache import SUM_SUFFIX

sys.path.insert(0, str(Path(__file__).parent))
from _stores import make_store
from conftest import python_env
from test_node_cache import data_files, epoch_rows, serving

STORES = {"npy": dict(fmt="npy"), "zarr-lz4": dict(fmt="zarr", compression="lz4")}
#: ``zarr-lz4`` with every copy mapped (the test store's chunk files are small)
DAMAGED = [*STORES, "zarr-lz4-mapped"]


def map_every_copy(monkeypatch) -> None:
    """Decode every Blosc copy from its mapping, whatever its size (no-op before mappings)."""
    try:
        import shardload.formats.copy_maps as copy_maps
    except ImportError:
        return
    monkeypatch.setattr(copy_maps, "MAP_MIN_BYTES", 0)


def count_mappings(monkeypatch, folder: Path) -> list[int]:
    """The sizes of the files of ``folder`` this process maps from now on."""
    made: list[int] = []

    class Counted(mmap.mmap):
        def __new__(cls, fd: int, length: int, *a: Any, **k: Any) -> Any:
            if fd >= 0 and Path(os.readlink(f"/proc/self/fd/{fd}")).parent == folder:
                made.append(os.fstat(fd).st_size)
            return super().__new__(cls, fd, length, *a, **k)

    monkeypatch.setattr(mmap, "mmap", Counted)
    return made


#: Paths opened by this process while ``_OPENS[0]`` is a Counter (an audit hook: it sees
#: ``open()`` and ``os.open`` alike, whichever module calls them).
_OPENS: list[Counter[str] | None] = [None]


def _audit(event: str, args: tuple[Any, ...]) -> None:
    seen = _OPENS[0]
    if seen is not None and event == "open" and isinstance(args[0], str):
        seen[args[0]] += 1


sys.addaudithook(_audit)


def served_store(tmp_path: Path, kind: str) -> Path:
    make_store(tmp_path / "src", n=203, chunk_rows=7, name="store", **STORES[kind[:8]])
    return tmp_path / "src" / "store"


def copy_of(cache: Path, rel: str) -> Path:
    """The cached copy of the store file ``rel`` (found by its record's URL)."""
    (rec,) = [q for q in cache.glob("*" + SUM_SUFFIX) if f'/{rel}"' in q.read_text()]
    return cache / rec.name.removesuffix(SUM_SUFFIX)


def count_hashes(monkeypatch, digests: set[int]) -> list[int]:
    """Whole-file hashes of the store's data files this process computes from now on (the
    reader's checks and the cache's, whichever function computes them)."""
    hashed: list[int] = []
    real, real_fd = xxhash.xxh3_64_intdigest, cache_mod._digest_fd

    def counted(data: Any, *a: Any, **k: Any) -> int:
        got = real(data, *a, **k)
        hashed.extend([got] if got in digests else [])
        return got

    def counted_fd(fd: int) -> int:
        got = real_fd(fd)
        hashed.extend([got] if got in digests else [])
        return got

    monkeypatch.setattr(xxhash, "xxh3_64_intdigest", counted)
    monkeypatch.setattr(cache_mod, "_digest_fd", counted_fd)
    return hashed


@pytest.mark.parametrize("kind", STORES)
def test_a_new_handle_in_the_same_process_reads_no_record(
    tmp_path: Path, monkeypatch, kind: str
) -> None:
    """Epoch 1 fills the cache; a new handle in the same process reads epoch 2: it opens each
    copy it reads, but no copy's record (each one was read, parsed and compared with the
    copy's stat once per handle before) and hashes no copy; no data request, the right rows."""
    root = served_store(tmp_path, kind)
    want = shardload.open_store(root).read("x", 0, 203)  # before counting: it hashes its files
    digests = {int(xxhash.xxh3_64_intdigest((root / f).read_bytes())) for f in data_files(root)}
    cache = tmp_path / "cache"
    with serving(tmp_path / "src") as srv:
        url = f"{srv.url}/store"
        epoch_rows(shardload.open_store(url, cache_dir=cache), 0)
        filled = len(srv.paths)
        hashed = count_hashes(monkeypatch, digests)
        _OPENS[0] = opened = Counter()
        try:
            store = shardload.open_store(url, cache_dir=cache)
            n, x = epoch_rows(store, 1)
        finally:
            _OPENS[0] = None
        assert srv.data_requests(filled) == []
    assert n == len(want) and np.array_equal(x, want)
    in_cache = {p: c for p, c in opened.items() if Path(p).parent == cache}
    records = {p: c for p, c in in_cache.items() if p.endswith(SUM_SUFFIX)}
    record_bytes = sum(os.path.getsize(p) * c for p, c in records.items())
    copies = sum(c for p, c in in_cache.items() if "." not in Path(p).name)
    assert copies >= len(data_files(root)), in_cache  # every data file read from its copy
    assert not records, f"{len(records)} records opened, {record_bytes} bytes read"
    assert hashed == [], f"{len(hashed)} whole-file hashes of copies"


def touch_r(ref: Path, path: Path) -> None:
    subprocess.run(["touch", "-r", str(ref), str(path)], check=True)


def rewrite_touch_r(path: Path) -> None:
    """The last 8 bytes changed in place, mtime put back by ``touch -r`` (size, inode, mtime
    as they were; ctime moved)."""
    ref = path.with_name("ref")
    ref.touch()
    touch_r(path, ref)
    with open(path, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(bytes(255 - b for b in path.read_bytes()[-8:]))
    touch_r(ref, path)
    ref.unlink()


def truncated(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 8)


def grown(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"\0" * 8)


def renamed_over(path: Path) -> None:
    """Replaced by a file of the same size and mtime holding other bytes, renamed over it."""
    new = path.with_name("replacement")
    data = path.read_bytes()
    new.write_bytes(data[:-8] + bytes(255 - b for b in data[-8:]))
    touch_r(path, new)
    os.replace(new, path)


DAMAGES: dict[str, Callable[[Path], None]] = {
    "rewritten-touch-r": rewrite_touch_r,
    "truncated": truncated,
    "grown": grown,
    "renamed-over": renamed_over,
}


@pytest.mark.parametrize("handle", ["same", "new"])
@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("kind", DAMAGED)
def test_a_copy_changed_after_this_process_trusted_it_is_fetched_again(
    tmp_path: Path, monkeypatch, kind: str, damage: str, handle: str
) -> None:
    """This process fills the cache and reads an epoch from it with a second handle (so it has
    trusted every copy, by the fill and by the record); then one copy is changed on disk. The
    next epoch (the second handle again, or a third) fetches that file alone again and reads the
    right rows: the memo answers only for the stat it trusted."""
    if kind.endswith("-mapped"):
        map_every_copy(monkeypatch)
    root = served_store(tmp_path, kind)
    local = shardload.open_store(root)
    cache = tmp_path / "cache"
    rel = data_files(root)[1]  # a chunk file of x
    with serving(tmp_path / "src") as srv:
        url = f"{srv.url}/store"
        epoch_rows(shardload.open_store(url, cache_dir=cache), 0)
        second = shardload.open_store(url, cache_dir=cache)
        epoch_rows(second, 1)
        DAMAGES[damage](copy_of(cache, rel))
        before = len(srv.paths)
        store = second if handle == "same" else shardload.open_store(url, cache_dir=cache)
        refetched = store.fs.node_cache.stats["refetched"]
        n, x = epoch_rows(store, 2)
        assert n == len(local) and np.array_equal(x, local.read("x", 0, len(local)))
        assert [p.split("/", 2)[-1] for p in srv.data_requests(before)] == [rel]
        assert store.fs.node_cache.stats["refetched"] == refetched + 1


def test_a_blosc_copy_is_decoded_from_its_mapping(tmp_path: Path, monkeypatch) -> None:
    """A warm epoch of an lz4 Zarr store through the cache (every copy large enough to map):
    no copy is read into a buffer (on tmpfs, ``/dev/shm``, a read costs about twice a disk's
    page cache: docs/design.md); the right rows."""
    map_every_copy(monkeypatch)
    root = served_store(tmp_path, "zarr-lz4")
    want = shardload.open_store(root).read("x", 0, 203)
    cache = tmp_path / "cache"
    read: list[int] = []
    real = zarr_rows.read_whole

    def counted(f: Any) -> Any:
        target = os.readlink(f"/proc/self/fd/{f.fileno()}")
        if Path(target).parent == cache:
            read.append(os.fstat(f.fileno()).st_size)
        return real(f)

    with serving(tmp_path / "src") as srv:
        url = f"{srv.url}/store"
        epoch_rows(shardload.open_store(url, cache_dir=cache), 0)
        monkeypatch.setattr(zarr_rows, "read_whole", counted)
        n, x = epoch_rows(shardload.open_store(url, cache_dir=cache), 1)
        assert n == len(want) and np.array_equal(x, want)
        mapped = count_mappings(monkeypatch, cache)
        n, x = epoch_rows(shardload.open_store(url, cache_dir=cache), 2)  # a new handle
    assert n == len(want) and np.array_equal(x, want)
    assert read == [], f"{len(read)} copies read whole into a buffer, {sum(read)} bytes"
    # the process kept the mappings of epoch 1 (an unbounded cache): none mapped again
    assert mapped == [], f"{len(mapped)} copies mapped again, {sum(mapped)} bytes"


def test_a_bounded_cache_keeps_no_mapping(tmp_path: Path, monkeypatch) -> None:
    """With ``cache_bytes`` a copy may be evicted at any time: a mapping kept past its read
    would hold the evicted copy's bytes (in ``/dev/shm``: memory) past the bound, so each
    read maps its copy and unmaps it."""
    from shardload.formats.copy_maps import KEPT

    map_every_copy(monkeypatch)
    root = served_store(tmp_path, "zarr-lz4")
    want = shardload.open_store(root).read("x", 0, 203)
    cache, kept = tmp_path / "cache", KEPT.bytes
    with serving(tmp_path / "src") as srv:
        url = f"{srv.url}/store"
        epoch_rows(shardload.open_store(url, cache_dir=cache, cache_bytes=1 << 30), 0)
        mapped = count_mappings(monkeypatch, cache)
        n, x = epoch_rows(shardload.open_store(url, cache_dir=cache, cache_bytes=1 << 30), 1)
    assert n == len(want) and np.array_equal(x, want)
    assert mapped and KEPT.bytes == kept


#: An epoch in a new process over a warm cache: the modules of interest it imported, its counts.
NEW_PROCESS_EPOCH = """
import json, sys, shardload
LATER = ("numpy.ma", "http.client", "shardload.move.http_get")
store = shardload.open_store(sys.argv[1], cache_dir=sys.argv[2])
for b in shardload.iter_batches(store, batch_size=16, seed=3, epoch=1):
    pass
stats = store.fs.node_cache.stats
mods = sorted(m for m in sys.modules if m.split(".")[0] == "aiohttp" or m in LATER)
print(json.dumps([mods, stats]))
"""


def warm_epoch_in_new_process(tmp_path: Path) -> tuple[list[str], dict[str, int]]:
    """Fill the cache of a served lz4 Zarr store, then read an epoch in a new process: the
    modules of interest it imported (aiohttp's, ``numpy.ma``, ``http.client``) and its cache's counts; asserts
    that it sent no request at all."""
    root = served_store(tmp_path, "zarr-lz4")
    cache = tmp_path / "cache"
    with serving(tmp_path / "src") as srv:
        url = f"{srv.url}/store"
        epoch_rows(shardload.open_store(url, cache_dir=cache), 0)
        filled = len(srv.paths)
        out = subprocess.run(
            [sys.executable, "-c", NEW_PROCESS_EPOCH, url, str(cache)],
            capture_output=True,
            text=True,
            env=python_env(),
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert srv.paths[filled:] == []  # no request at all
    mods, stats = json.loads(out.stdout.splitlines()[-1])
    assert stats["fills"] == 0 and stats["hits"] >= len(data_files(root))
    return mods, stats


def test_a_warm_epoch_in_a_new_process_starts_no_http_client(tmp_path: Path) -> None:
    """A new process (a DataLoader worker without ``persistent_workers``) reading an epoch the
    cache holds whole needs no request, so it imports and starts no HTTP client: importing
    aiohttp cost such a process 0.1-0.2 CPU s, as much as reading 100 MB from the cache."""
    mods, _ = warm_epoch_in_new_process(tmp_path)
    client = [m for m in mods if m.startswith("aiohttp")]
    assert client == [], f"HTTP client imported: {client}"


def test_a_new_process_plans_its_cache_without_numpy_ma(tmp_path: Path) -> None:
    """The cache's plan of a new process sorts its steps without ``np.unique``, whose first
    call imports ``numpy.ma`` (numpy 2: 7 ms of CPU, a few percent of a warm epoch of 200 MB
    in such a process; the local store's epoch imports no ``numpy.ma`` either)."""
    mods, _ = warm_epoch_in_new_process(tmp_path)
    assert "numpy.ma" not in mods


def test_a_new_process_reading_only_copies_imports_no_http_reader(tmp_path: Path) -> None:
    """Nor does it import the shard reader of ``move/http_get.py`` (and ``http.client``, 2.5 ms
    of CPU): the URL filesystem imports it at its first read from the server."""
    mods, _ = warm_epoch_in_new_process(tmp_path)
    assert not {"http.client", "shardload.move.http_get"} & set(mods), mods
