"""By URL, compressed shards decoded straight into their batches from each shard's checked
bytes (formats/zarr/url_rows.py, issues 25 and 28): no group buffer and no gather pass, as
locally (tests/test_decode_rows.py), the batches byte for byte the local read's and the gather
reader's (what an install without the compiled kernel reads), and a damaged chunk named as the
gather reader names it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.errors import ChunkReadError
from shardload.move.serve import serving
from test_decode_rows import (  # noqa: F401 (fixtures)
    ROWS,
    N,
    _counting,
    _damage,
    _epoch,
    _kernel,
    _same,
    stores,
    values,
)

pytestmark = pytest.mark.timeout(300)


def _served(root: Path) -> Iterator[str]:
    with serving(root.parent) as base:
        yield f"{base}/{root.name}"


@pytest.fixture
def url(stores: Path) -> Iterator[str]:  # noqa: F811 (the fixture imported above)
    yield from _served(stores)


def _counted_kernel(mod: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The chunks each ``decode_rows_buf`` call was asked for (the kernel's own calls kept)."""
    calls: list[int] = []
    real = mod.KERNEL

    class Counted:
        def decode_rows(self, *a: Any) -> int:
            return int(real.decode_rows(*a))

        def decode_rows_buf(self, *a: Any) -> int:
            calls.append(a[6] - a[5])
            return int(real.decode_rows_buf(*a))

    monkeypatch.setattr(mod, "KERNEL", Counted())
    return calls


@pytest.mark.parametrize(
    "options",
    [{}, {"shuffle_chunks": 5}, {"shuffle": False}],
    ids=["default", "small-groups", "in-order"],
)
def test_compressed_shards_by_url_are_decoded_into_the_batches(
    stores: Path,  # noqa: F811
    url: str,
    values: dict[str, np.ndarray],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    options: dict,
) -> None:
    """A first epoch by URL (every shard fetched whole and checked): each inner chunk of x and
    y decoded once by the kernel from the checked bytes into its rows (of the default groups;
    small groups decode the chunks kept for later groups from those), no group buffer taken
    and no gather run; a later epoch (chunks by range requests, kept ones) gathers nothing
    either; every batch byte for byte the local read's and the gather reader's."""
    mod = _kernel()
    local = [_epoch(stores, e, **options) for e in (0, 1)]
    calls = _counted_kernel(mod, monkeypatch)
    seen = _counting(monkeypatch)
    store = shardload.open_store(url)
    got = [_epoch(store, 0, **options)]
    # every chunk of x and y decoded by the kernel, once: as its shard is checked, or (small
    # groups) from its bytes kept for a later group (formats/zarr/kept.py) where they lie
    assert sum(calls) == 2 * -(-N // ROWS)
    got.append(_epoch(store, 1, **options))
    assert seen == {"buffers": 0, "gathers": 0}
    for e in (0, 1):
        _same(got[e], local[e])
        for b in got[e]:
            for k in ("x", "y"):
                np.testing.assert_array_equal(b[k], values[k][b["index"]].reshape(b[k].shape))
    monkeypatch.setattr(mod, "KERNEL", None)
    gathered = shardload.open_store(url)
    for e in (0, 1):
        _same(got[e], _epoch(gathered, e, **options))
    assert seen["buffers"] and seen["gathers"]


@pytest.mark.parametrize("how", ["header", "shuffle", "body"])
def test_a_damaged_chunk_by_url_is_named_as_the_gather_reader_names_it(
    stores: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """Checksums not verified (``verify="never"``), one group of every chunk (each shard
    fetched whole): a chunk whose header or compressed bytes are damaged is left by the kernel
    to the URL path, which stops the epoch with the gather reader's error, word for word."""
    mod = _kernel()
    root = tmp_path / "lz4"
    shutil.copytree(stores, root)
    shard = _damage(root, 21, how)
    calls = _counted_kernel(mod, monkeypatch)
    errors = []
    for url in _served(root):
        for kernel in (mod.KERNEL, None):
            monkeypatch.setattr(mod, "KERNEL", kernel)
            with pytest.raises(ChunkReadError) as err:
                _epoch(shardload.open_store(url, verify="never"), shuffle_chunks=256)
            errors.append(str(err.value))
    assert calls  # the kernel read the damaged shard's bytes and left the chunk
    assert errors[0] == errors[1]
    where = f"{root.name}/{shard.relative_to(root).as_posix()}"
    assert "chunk 21 (inner chunk 5 of shard 1)" in errors[0] and where in errors[0]


def test_a_shard_decoded_as_it_arrives_is_decoded_into_the_batches(
    stores: Path,  # noqa: F811
    url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shards decoded while their GET ahead brings them (formats/zarr/streamed.py, here from
    any size, the answer read 4 KiB at a time): the kernel decodes each chunk once, into its
    rows, from the bytes in so far, and that stands once the shard's digest matched; no chunk
    decoded into a staging buffer and copied, no group buffer, no gather; the local batches."""
    import shardload.formats.zarr.shard_fetch as shard_fetch
    import shardload.formats.zarr.streamed as streamed
    import shardload.move.http_get as http_get

    mod = _kernel()
    local = _epoch(stores)
    monkeypatch.setattr(streamed, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(http_get, "PIECE_BYTES", 4096)
    stood: list[bool] = []
    real_from = streamed.decoded_from

    def counted(*a: Any) -> bool:
        stood.append(real_from(*a))
        return stood[-1]

    monkeypatch.setattr(shard_fetch, "decoded_from", counted)
    from shardload.formats.zarr import url_rows

    copied: list[int] = []  # chunks decoded elsewhere, their rows then copied into place
    real_copy = url_rows.RowSink.copy_rest

    def counted_copy(self: Any, staging: Any) -> None:
        copied.append(int((~self.served).sum()))
        real_copy(self, staging)

    monkeypatch.setattr(url_rows.RowSink, "copy_rest", counted_copy)
    calls = _counted_kernel(mod, monkeypatch)
    seen = _counting(monkeypatch)
    _same(_epoch(shardload.open_store(url)), local)
    assert any(stood)
    assert sum(calls) >= 2 * -(-N // ROWS) and copied and sum(copied) == 0
    assert seen == {"buffers": 0, "gathers": 0}
