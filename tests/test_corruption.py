"""The corruption matrix: a damaged chunk is an error naming its file, on every read path, and
never wrong values.

(deleted, truncated, same-size garbage, wrong dtype, flipped bit) x (npy, Zarr uncompressed,
Zarr zstd, sharded Zarr, HDF5) x (Store.read, iter_batches, StreamingDataLoader with 2 workers,
MapDataset). Every batch or row served before the error is checked against the data as
written. A representative subset runs by default; the whole matrix is marked ``slow``.

Each cell runs with the default ``verify="auto"``, which checks every chunk before its rows are
used (raw rows too: once per node, see shardload/formats/ledger.py), set in no environment.

HDF5 keeps every chunk inside ``data.h5``, so "deleted" deletes that file and "truncated" cuts
it at the damaged chunk; a dataset's dtype is one for all its chunks, so "wrong dtype" (which
cannot happen to one chunk in place) is the nearest thing that can: the chunk's bytes replaced
by the same rows as int32 (same size, written with ``write_direct_chunk``).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import ShardloadError

N, CHUNK_ROWS, SHARD_CHUNKS, BAD_CHUNK = 1000, 50, 3, 4
FORMATS = {
    "npy": {"format": "npy", "compression": "none"},
    "zarr-none": {"format": "zarr", "compression": "none"},
    "zarr-zstd": {"format": "zarr", "compression": "zstd"},
    "zarr-sharded": {"format": "zarr", "compression": "lz4", "shard_chunks": SHARD_CHUNKS},
    # the default layout of values lz4 cannot shrink: shards of raw inner chunks (scatter reads)
    "zarr-sharded-raw": {"format": "zarr", "compression": "none", "shard_chunks": SHARD_CHUNKS},
    "hdf5": {"format": "hdf5", "compression": "none"},
}
CORRUPTIONS = ("deleted", "truncated", "garbage", "dtype", "bitflip")
PATHS = ("store_read", "iter_batches", "dataloader_w2", "map_dataset")
#: Run by default: every format, every path and all but one kind of damage (truncation, which
#: the old code caught too, is in the slow matrix); a 2-worker DataLoader costs seconds per
#: case (its shutdown after an error): one of them.
FAST = {
    ("npy", "dtype"),
    ("zarr-none", "bitflip"),
    ("zarr-zstd", "garbage"),
    ("zarr-sharded", "deleted"),
    ("zarr-sharded-raw", "bitflip"),
    ("hdf5", "bitflip"),
}
FAST_DATALOADER = {("zarr-sharded", "deleted")}
#: an error, never a hang: generous, a 2-worker DataLoader shuts down slowly under load
LIMIT_S = 60.0


def _prepare(out: Path, src: Path, options: dict) -> None:
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    prepare(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["a", "b"], "y": ["c"]},
            "chunk_rows": CHUNK_ROWS,
            "out": str(out),
            **options,
        }
    )


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    """One good store per format (copied by each test before it is damaged)."""
    root = tmp_path_factory.mktemp("pristine")
    rng = np.random.default_rng(0)
    src = root / "src.nc"
    xr.Dataset(
        {
            "a": ("sample", np.arange(N, dtype="f4")),
            "b": (("sample", "lev"), rng.standard_normal((N, 3)).astype("f4")),
            "c": ("sample", np.arange(N, dtype="i8") * 10),
        }
    ).to_netcdf(src)
    out = {}
    for name, options in FORMATS.items():
        _prepare(root / name, src, options)
        out[name] = root / name
    return out


def _expected(root: Path) -> dict[str, np.ndarray]:
    with shardload.open_store(root, verify="always") as s:
        return {a: s.read(a) for a in s.arrays}


# -- damaging one chunk ---------------------------------------------------------------------------
def unit_file(root: Path, fmt: str) -> Path:
    """The file holding chunk BAD_CHUNK of array x."""
    if fmt == "npy":
        return root / "x" / f"{BAD_CHUNK:06d}.npy"
    if fmt.startswith("zarr-sharded"):
        return root / "x" / "c" / str(BAD_CHUNK // SHARD_CHUNKS) / "0"
    if fmt.startswith("zarr"):
        return root / "x" / "c" / str(BAD_CHUNK) / "0"
    return root / "data.h5"


def _h5_chunk(root: Path) -> tuple[int, int]:
    import h5py

    with h5py.File(root / "data.h5", "r") as f:
        info = f["x"].id.get_chunk_info_by_coord((BAD_CHUNK * CHUNK_ROWS, 0))
        return int(info.byte_offset), int(info.size)


def _rows_as_int32(fmt: str, root: Path, expected: np.ndarray) -> None:
    """Rewrite the unit holding BAD_CHUNK validly, with the same rows as int32 (same size)."""
    path = unit_file(root, fmt)
    if fmt == "npy":
        rows = expected[BAD_CHUNK * CHUNK_ROWS : (BAD_CHUNK + 1) * CHUNK_ROWS]
        np.save(path, rows.astype("i4"))
        return
    if fmt == "hdf5":
        import h5py

        rows = expected[BAD_CHUNK * CHUNK_ROWS : (BAD_CHUNK + 1) * CHUNK_ROWS]
        with h5py.File(path, "r+") as f:
            f["x"].id.write_direct_chunk((BAD_CHUNK * CHUNK_ROWS, 0), rows.astype("i4").tobytes())
        return
    import zarr

    # an array like x (same chunks, shards, codecs) of int32: its file for the same unit
    src = zarr.open_array(store=str(root), path="x", mode="r")
    scratch = root.parent / "scratch.zarr"
    arr = zarr.create_array(
        store=str(scratch),
        shape=src.shape,
        chunks=src.chunks,
        shards=src.shards,
        dtype="i4",
        compressors=src.compressors,
        fill_value=0,
        overwrite=True,
    )
    arr[:] = expected.astype("i4")
    shutil.copyfile(scratch / path.relative_to(root / "x"), path)


def corrupt(fmt: str, kind: str, root: Path, expected: np.ndarray) -> Path:
    """Damage chunk BAD_CHUNK of array x; returns the file an error must name."""
    path = unit_file(root, fmt)
    rng = np.random.default_rng(1)
    if fmt == "hdf5":
        lo, size = _h5_chunk(root)
    elif fmt == "npy":
        lo = path.stat().st_size - CHUNK_ROWS * 4 * 4  # the rows; the header stays valid
        size = CHUNK_ROWS * 4 * 4
    else:
        lo, size = 0, path.stat().st_size
    if kind == "deleted":
        path.unlink()
    elif kind == "truncated":
        with open(path, "r+b") as f:
            f.truncate(lo + size // 2)
    elif kind == "garbage":  # same size; keeps a header in front (npy header, Blosc header)
        start = lo + min(16, size // 4)
        with open(path, "r+b") as f:
            f.seek(start)
            f.write(rng.integers(0, 256, lo + size - start, dtype=np.uint8).tobytes())
    elif kind == "dtype":
        _rows_as_int32(fmt, root, expected)
    elif kind == "bitflip":
        at = lo + size // 2
        with open(path, "r+b") as f:
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ 0x10]))
    else:  # pragma: no cover
        raise ValueError(kind)
    return path


# -- reading it back, every path ------------------------------------------------------------------
def _check_batch(batch, expected: dict[str, np.ndarray]) -> None:
    idx = np.asarray(batch["index"])
    for a, full in expected.items():
        np.testing.assert_array_equal(np.asarray(batch[a]), full[idx])


def read_all(path: str, root: Path, expected: dict[str, np.ndarray]) -> None:
    """Read everything of the store at ``root`` through ``path``, checking what is served."""
    if path == "store_read":
        s = shardload.open_store(root)
        for a, full in expected.items():
            np.testing.assert_array_equal(s.read(a), full)
    elif path in ("iter_batches", "iter_batches_gather"):
        for batch in shardload.iter_batches(root, batch_size=64, seed=3):
            _check_batch(batch, expected)
    elif path == "dataloader_w2":
        from shardload.torch import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(root, batch_size=64, seed=3)
        for batch in StreamingDataLoader(ds, num_workers=2):
            _check_batch(batch, expected)
    elif path == "map_dataset":
        from shardload.torch import MapDataset

        ds = MapDataset(root)
        for i in range(len(ds)):
            row = ds[i]
            g = int(row["index"])
            for a, full in expected.items():
                np.testing.assert_array_equal(row[a].numpy(), full[g])
    else:  # pragma: no cover
        raise ValueError(path)


def _cases():
    for fmt in FORMATS:
        for kind in CORRUPTIONS:
            for path in PATHS:
                fast = (fmt, kind) in (FAST_DATALOADER if path == "dataloader_w2" else FAST)
                marks = () if fast else (pytest.mark.slow,)
                yield pytest.param(fmt, kind, path, marks=marks, id=f"{fmt}-{kind}-{path}")
    # raw stores read by scatter in iter_batches by default: the gather path too
    for fmt in ("npy", "zarr-none", "zarr-sharded-raw"):
        for kind in CORRUPTIONS:
            marks = () if (fmt, kind) in FAST else (pytest.mark.slow,)
            yield pytest.param(
                fmt,
                kind,
                "iter_batches_gather",
                marks=marks,
                id=f"{fmt}-{kind}-iter_batches_gather",
            )


@pytest.mark.parametrize(("fmt", "kind", "path"), list(_cases()))
def test_corrupt_chunk_is_an_error_naming_its_file(
    pristine, tmp_path, monkeypatch, fmt, kind, path
):
    root = tmp_path / "store"
    shutil.copytree(pristine[fmt], root)
    expected = _expected(root)
    bad_file = corrupt(fmt, kind, root, expected["x"])
    if path == "iter_batches_gather":
        from shardload.load import scatter

        # as on a platform without preadv: read into group buffers, then gather
        monkeypatch.setattr(scatter, "_preadv", lambda errno=False: None)
    t0 = time.perf_counter()
    with pytest.raises(ShardloadError) as err:
        read_all(path, root, expected)
    assert time.perf_counter() - t0 < LIMIT_S
    assert str(bad_file) in str(err.value), str(err.value)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_pristine_store_reads_on_every_path(pristine, fmt):
    """The same checks pass on an undamaged store (so the matrix's errors come from damage),
    whose every chunk has a recorded checksum."""
    from shardload.formats.checksums import read_checksums

    s = shardload.open_store(pristine[fmt])
    assert s.manifest.checksums == "xxh3_64"
    units = -(-N // (CHUNK_ROWS * (SHARD_CHUNKS if fmt.startswith("zarr-sharded") else 1)))
    assert {k: len(v) for k, v in read_checksums(s.fs, s.root).items()} == {"x": units, "y": units}
    expected = _expected(pristine[fmt])
    for path in PATHS:
        read_all(path, pristine[fmt], expected)


@pytest.mark.parametrize("fmt", ["npy", "zarr-none", "zarr-zstd", "zarr-sharded"])
def test_read_chunk_of_a_deleted_chunk_is_an_error(pristine, tmp_path, fmt):
    root = tmp_path / "store"
    shutil.copytree(pristine[fmt], root)
    path = unit_file(root, fmt)
    path.unlink()
    s = shardload.open_store(root, verify="never")
    with pytest.raises(ShardloadError, match="missing") as err:
        s.read_chunk("x", BAD_CHUNK)
    assert str(path) in str(err.value)
    s.read_chunk("y", BAD_CHUNK)  # the other array's chunk is there


def test_fortran_order_npy_chunk_is_refused(pristine, tmp_path):
    """A valid npy header in Fortran order (same dtype, same shape) is not served as C rows."""
    root = tmp_path / "store"
    shutil.copytree(pristine["npy"], root)
    expected = _expected(root)
    path = unit_file(root, "npy")
    rows = expected["x"][BAD_CHUNK * CHUNK_ROWS : (BAD_CHUNK + 1) * CHUNK_ROWS]
    np.save(path, np.asfortranarray(rows))
    for how in ("store_read", "iter_batches", "map_dataset"):
        with pytest.raises(ShardloadError, match="Fortran order") as err:
            read_all(how, root, expected)
        assert str(path) in str(err.value)


def test_auto_verifies_every_format(pristine, tmp_path):
    """``verify="auto"`` (the default) checks every format's chunks: local chunk files once per
    node (the ledger), HDF5 chunks once per process."""
    for fmt, node in [
        ("zarr-zstd", True),
        ("zarr-sharded", True),
        ("hdf5", False),
        ("npy", True),
        ("zarr-none", True),
    ]:
        s = shardload.open_store(pristine[fmt])
        assert s.verify == "auto"
        verifier = s.reader.verifier  # type: ignore[attr-defined]
        assert verifier.enabled and verifier.mode == "first-epoch", fmt
        assert verifier.node == node, fmt


def test_verify_never_still_refuses_structural_damage(pristine, tmp_path):
    """``verify="never"`` skips checksums only: a missing chunk is still an error."""
    root = tmp_path / "store"
    shutil.copytree(pristine["zarr-zstd"], root)
    expected = _expected(root)
    path = corrupt("zarr-zstd", "deleted", root, expected["x"])
    s = shardload.open_store(root, verify="never")
    with pytest.raises(ShardloadError, match="missing") as err:
        s.read("x")
    assert str(path) in str(err.value)


@pytest.mark.parametrize("fmt", ["zarr-zstd", "hdf5"])
def test_checksum_file_gone_after_open_names_the_chunk_being_read(pristine, tmp_path, fmt):
    """The digests load on the first check (in a DataLoader worker, after the store was
    opened): when that load fails, the error still says which chunk was being read."""
    from shardload.layout import CHECKSUMS_NAME

    root = tmp_path / "store"
    shutil.copytree(pristine[fmt], root)
    s = shardload.open_store(root, verify="always")
    (root / CHECKSUMS_NAME).unlink()
    with pytest.raises(ShardloadError, match=r"cannot verify chunk \d+.*of array 'x'") as err:
        s.read("x")
    assert CHECKSUMS_NAME in str(err.value) and "missing" in str(err.value)


@pytest.mark.parametrize("mode", ["always", "first-epoch"])
def test_verify_modes_catch_a_flipped_bit(pristine, tmp_path, mode):
    root = tmp_path / "store"
    shutil.copytree(pristine["zarr-none"], root)
    expected = _expected(root)
    s = shardload.open_store(root, verify=mode)
    np.testing.assert_array_equal(s.read("x"), expected["x"])  # verified, now trusted
    corrupt("zarr-none", "bitflip", root, expected["x"])
    if mode == "always":
        with pytest.raises(ShardloadError, match="corrupt"):
            s.read("x")
    else:  # first-epoch: this process checked the chunk once already
        assert not np.array_equal(s.read("x"), expected["x"])
        with pytest.raises(ShardloadError, match="corrupt"):
            shardload.open_store(root, verify=mode).read("x")  # a new process / handle


@pytest.mark.parametrize("fmt", ["npy", "zarr-sharded", "hdf5"])
def test_verify_cli_names_every_bad_chunk(pristine, tmp_path, capsys, fmt):
    from shardload.cli.app import main

    root = tmp_path / "store"
    shutil.copytree(pristine[fmt], root)
    assert main(["verify", str(root)]) == 0
    assert "all good" in capsys.readouterr().out
    expected = _expected(root)
    bad = [corrupt(fmt, "bitflip", root, expected["x"])]
    if fmt == "npy":  # a second bad chunk, in another array
        (root / "y" / "000007.npy").unlink()
        bad.append(root / "y" / "000007.npy")
    assert main(["verify", str(root)]) == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("BAD")]
    assert len(lines) == len(bad), out
    for path in bad:
        assert any(str(path) in ln for ln in lines), out
    assert f"{len(bad)} bad" in out


def test_verify_cli_store_that_cannot_be_opened(tmp_path, capsys):
    from shardload.cli.app import main

    assert main(["verify", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_store_without_checksums_still_reads(pristine, tmp_path):
    """Stores written before checksums existed (no sidecar, no manifest field) read as before."""
    import json

    root = tmp_path / "store"
    shutil.copytree(pristine["zarr-zstd"], root)
    expected = _expected(root)
    (root / "checksums.npz").unlink()
    m = json.loads((root / "shardload.json").read_text())
    m.pop("checksums")
    (root / "shardload.json").write_text(json.dumps(m))
    s = shardload.open_store(root, verify="always")
    assert s.manifest.checksums == ""
    np.testing.assert_array_equal(s.read("x"), expected["x"])


def test_blosc_chunk_of_another_item_size_is_refused_without_checksums(pristine, tmp_path):
    """A valid Blosc chunk whose header says 8-byte items (float64) in a float32 array: same
    decoded size, so only the header tells; refused even with ``verify="never"``."""
    from numcodecs import Blosc

    root = tmp_path / "store"
    shutil.copytree(pristine["zarr-zstd"], root)
    expected = _expected(root)
    rows = expected["x"][BAD_CHUNK * CHUNK_ROWS : (BAD_CHUNK + 1) * CHUNK_ROWS]
    path = unit_file(root, "zarr-zstd")
    path.write_bytes(Blosc(cname="zstd", clevel=3).encode(rows.view("f8")))
    s = shardload.open_store(root, verify="never")
    with pytest.raises(ShardloadError, match="items of 8 bytes") as err:
        s.read("x")
    assert str(path) in str(err.value)


def test_plain_zarr_keeps_zarr_fill_value_semantics(tmp_path):
    """Plain Zarr written by others (no shardload.json): a missing chunk is the fill value, as
    zarr-python reads it (documented in docs/loading.md)."""
    import zarr

    group = zarr.open_group(str(tmp_path / "plain"), mode="w")
    arr = group.create_array("data", shape=(40, 2), chunks=(10, 2), dtype="f4", fill_value=-1)
    arr[:] = np.arange(80, dtype="f4").reshape(40, 2)
    (tmp_path / "plain" / "data" / "c" / "1" / "0").unlink()
    s = shardload.open_store(tmp_path / "plain")
    assert s.manifest.checksums == ""
    got = s.read("data")
    np.testing.assert_array_equal(got[10:20], -1)
    np.testing.assert_array_equal(got[20:], np.arange(40, 80, dtype="f4").reshape(20, 2))


@pytest.mark.parametrize("fmt", ["zarr-zstd", "hdf5"])
def test_checksums_survive_a_resumed_prepare(tmp_path, monkeypatch, fmt):
    """Checksums travel in the blocks' progress records: a prepare that fails half-way and is
    resumed records every chunk's checksum, including those written before the failure."""
    import errno

    from shardload.formats.checksums import read_checksums
    from shardload.formats.registry import get_writer

    src = tmp_path / "src.nc"
    xr.Dataset(
        {
            "a": ("sample", np.arange(300, dtype="f4")),
            "b": (("sample", "lev"), np.ones((300, 3), "f4")),
            "c": ("sample", np.arange(300, dtype="i8")),
        }
    ).to_netcdf(src)
    cls = type(get_writer(FORMATS[fmt]["format"]))
    real = cls.write_block

    def flaky(self, root, name, chunk_index, start, data, *, bounds):
        if chunk_index == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, root, name, chunk_index, start, data, bounds=bounds)

    options = {**FORMATS[fmt], "execution": {"scheduler": "sync"}}
    monkeypatch.setattr(cls, "write_block", flaky)
    with pytest.raises(ShardloadError, match="is full"):
        _prepare(tmp_path / "s", src, options)
    monkeypatch.setattr(cls, "write_block", real)
    _prepare(tmp_path / "s", src, options)
    s = shardload.open_store(tmp_path / "s", verify="always")
    sums = read_checksums(s.fs, s.root)
    assert {k: len(v) for k, v in sums.items()} == {"x": 6, "y": 6}
    assert s.read("x").shape == (300, 4)
    from shardload.cli.app import main

    assert main(["verify", str(tmp_path / "s")]) == 0
