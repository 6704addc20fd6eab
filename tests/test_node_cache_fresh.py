"""A new process reading a store by URL from a warm, complete node cache (issue 28) reads it
as a local store: it imports no URL filesystem (fsspec, aiohttp, the HTTP reader), sends no
request, and still checks each copy (its record) before trusting it. A copy that is missing,
damaged, or a manifest not cached, sends that process to the server for just that file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.move.cache import SUM_SUFFIX, cache_name

sys.path.insert(0, str(Path(__file__).parent))
from _stores import make_store
from conftest import python_env
from test_node_cache import epoch_rows, serving

#: What a read from the server needs and a read from a complete cache must not import.
URL_MODULES = ("fsspec", "aiohttp", "shardload.move.http_get", "http.client", "ssl", "asyncio")
STORES = {
    "zarr-lz4": dict(fmt="zarr", compression="lz4"),
    "zarr-raw": dict(fmt="zarr", compression="none"),
    "npy": dict(fmt="npy"),
}

CHILD = """
import json, sys
import numpy as np
import shardload
url, cache, out = sys.argv[1:4]
store = shardload.open_store(url, cache_dir=cache)
x = np.full((len(store), 4), np.nan, dtype="f4")
for b in shardload.iter_batches(store, batch_size=16, epoch=1, seed=3):
    x[b["index"]] = b["x"]
np.save(out, x)
stats = store.fs.node_cache.stats
print(json.dumps({"modules": sorted(sys.modules), "stats": stats}))
"""


def epoch_in_new_process(url: str, cache: Path, tmp: Path) -> tuple[np.ndarray, set[str], dict]:
    """One full epoch of ``url`` through ``cache`` in a new Python process: the x values of
    each row, the modules that process imported, its node cache counters."""
    out = tmp / "x.npy"
    res = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(cache), str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        env=python_env(),
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    return np.load(out), set(got["modules"]), got["stats"]


def filled(tmp: Path, kind: str, srv) -> tuple[str, Path, np.ndarray]:
    """The store's URL, its node cache filled by one epoch here, and its x values."""
    make_store(tmp / "src", n=203, chunk_rows=7, name="store", **STORES[kind])
    url, cache = f"{srv.url}/store", tmp / "cache"
    epoch_rows(shardload.open_store(url, cache_dir=cache), 0)
    return url, cache, shardload.open_store(tmp / "src" / "store").read("x", 0, 203)


@pytest.mark.parametrize("kind", STORES)
def test_a_new_process_reads_a_warm_cache_without_the_url_filesystem(tmp_path, kind) -> None:
    with serving(tmp_path / "src") as srv:
        url, cache, want = filled(tmp_path, kind, srv)
        before = len(srv.paths)
        x, modules, stats = epoch_in_new_process(url, cache, tmp_path)
        assert srv.paths[before:] == []  # not even the manifest
    assert np.array_equal(x, want)
    assert stats["hits"] > 0 and stats["fills"] == stats["refetched"] == 0
    assert [m for m in URL_MODULES if m in modules] == []
    if kind == "npy":  # nor a codec library an npy stack never needs (as from its folder)
        assert "numcodecs" not in modules


def copy_of(cache: Path, url: str) -> Path:
    return Path(cache_name(cache, url))


@pytest.mark.parametrize(
    ("kind", "how"), [("zarr-lz4", "missing"), ("npy", "damaged"), ("zarr-raw", "manifest")]
)
def test_a_new_process_fetches_what_the_cache_lacks(tmp_path, kind, how) -> None:
    """A chunk file's copy removed or its bytes changed, or the manifest's copy removed: the
    new process fetches that file (and only that one), checks it, and reads the right rows."""
    with serving(tmp_path / "src") as srv:
        url, cache, want = filled(tmp_path, kind, srv)
        store = Path(tmp_path / "src" / "store")
        chunk = next(
            p.relative_to(store).as_posix()
            for p in sorted((store / "x").rglob("*"))
            if p.is_file() and p.name not in ("zarr.json", ".zarray")
        )
        name = "shardload.json" if how == "manifest" else chunk
        local = copy_of(cache, f"{url}/{name}")
        if how == "damaged":
            data = bytearray(local.read_bytes())
            data[-1] ^= 0xFF
            st = os.stat(local)
            local.write_bytes(bytes(data))
            os.utime(local, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime
        else:
            local.unlink()
            Path(str(local) + SUM_SUFFIX).unlink()
        before = len(srv.paths)
        x, _, stats = epoch_in_new_process(url, cache, tmp_path)
        asked = [p.split("/store/", 1)[-1] for p in srv.paths[before:]]
    assert np.array_equal(x, want)
    assert asked == [name]
    assert stats["refetched"] == (1 if how == "damaged" else 0)
    assert copy_of(cache, f"{url}/{name}").read_bytes() == (store / name).read_bytes()
