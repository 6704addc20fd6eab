"""A real full or read-only disk (a small tmpfs; needs root): HDF5 staging and merge, and
compute, end in one clean DiskFullError and resume to the right values once space is freed
(issue #26 row 4); pack and stage into a read-only folder, and stage into a disk that fills
while copying, give one clear error naming the folder (rows 7 and 9)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from conftest import python_env
from shardload.errors import DiskFullError

ROWS, FEATURES = 50_000, 8  # 1.6 MB of float32


@contextlib.contextmanager
def small_disk(path: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (skips the test when mounting is not allowed)."""
    path.mkdir()
    ro = ",ro" if read_only else ""
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}{ro}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(
            f"a full disk is simulated by mounting a small tmpfs, not allowed here: {r.stderr}"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def grow(path: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


@pytest.fixture()
def source(tmp_path: Path) -> tuple[Path, np.ndarray]:
    values = np.random.default_rng(0).standard_normal((ROWS, FEATURES)).astype("f4")
    src = tmp_path / "src.nc"
    xr.Dataset({"a": (("sample", "f"), values)}).to_netcdf(src)
    return src, values


def config(src: Path, out: Path) -> dict:
    return {
        "source": {"paths": [str(src)]},
        "sample_dims": ["sample"],
        "view": "flat",
        "arrays": {"x": ["a"]},
        "chunk_rows": 2500,
        "format": "hdf5",
        "compression": "none",
        "out": str(out),
        "execution": {"scheduler": "sync"},
    }


def prepare_in_a_process(cfg: dict) -> subprocess.CompletedProcess:
    """``prepare`` in its own interpreter: a crash (it was a segfault) must not take pytest."""
    code = textwrap.dedent(
        f"""
        import shardload
        from shardload.errors import DiskFullError
        prepare = shardload.prepare
        prepare = getattr(prepare, "prepare", prepare)
        try:
            prepare({cfg!r})
        except DiskFullError as exc:
            print("DiskFullError:", exc)
        """
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=python_env(), timeout=300
    )


def _check_resumes(cfg: dict, disk: Path, values: np.ndarray) -> None:
    grow(disk, "20m")
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    store = prepare(cfg)
    np.testing.assert_array_equal(store.read("x", 0, ROWS), values)


@pytest.mark.parametrize(
    "size, where",
    [("1m", "staging"), ("2700k", "merge")],  # staged blocks fit in 2.7 MB, data.h5 does not
)
def test_hdf5_on_a_full_disk_is_one_clean_error_and_resumes(
    tmp_path: Path, source, size: str, where: str
) -> None:
    src, values = source
    with small_disk(tmp_path / "disk", size) as disk:
        cfg = config(src, disk / "s")
        run = prepare_in_a_process(cfg)
        assert run.returncode == 0, run.stderr[-2000:]  # not a crash
        assert "DiskFullError: the disk holding" in run.stdout, run.stdout + run.stderr[-2000:]
        assert "requested and" not in run.stdout
        assert "Traceback" not in run.stderr, run.stderr[-2000:]
        staged = list((disk / "s.partial" / "_staged").glob("*.npy"))
        assert (len(staged) == 20) == (where == "merge")  # the failure came where it should
        _check_resumes(cfg, disk, values)


def test_compute_on_a_full_disk_is_a_disk_full_error_and_resumes(tmp_path: Path) -> None:
    zarr = pytest.importorskip("zarr")
    cube = np.random.default_rng(1).standard_normal((40, 100, 100)).astype("f4")  # 1.6 MB
    g = zarr.open_group(store=str(tmp_path / "cube.zarr"), mode="w", zarr_format=3)
    g.create_array("amp", shape=cube.shape, chunks=(5, 100, 100), dtype="f4")[...] = cube
    with small_disk(tmp_path / "disk", "1m") as disk:
        cfg = {
            "source": {"paths": [str(tmp_path / "cube.zarr")], "variable": "amp"},
            "attributes": {"a": {"function": "compute_funcs:box", "depth": 1}},
            "chunks": {0: 5},
            "out": str(disk / "attrs"),
            "execution": {"scheduler": "sync"},
        }
        with pytest.raises(DiskFullError, match=r"the disk holding .*attrs is full"):
            shardload.compute(cfg)
        grow(disk, "20m")
        shardload.compute(cfg)
        store = shardload.open_store(disk / "attrs")
        assert store.read("a", 0, 40).shape[0] == 40


def test_pack_and_stage_into_a_read_only_folder_name_it(tmp_path: Path) -> None:
    import shutil as sh

    from conftest import make_store
    from shardload.errors import ImageError, StagingError
    from shardload.move.pack import pack
    from shardload.move.staging import stage

    src = make_store(tmp_path / "store")
    with small_disk(tmp_path / "ro", "1m", read_only=True) as ro:
        if sh.which("mksquashfs"):
            for image in (ro / "x.sqfs", ro / "sub" / "x.sqfs"):
                with pytest.raises(ImageError, match=rf"cannot write the image {image}"):
                    pack(src, image)
        for to in (ro, ro / "sub"):
            with pytest.raises(StagingError, match=rf"cannot stage {src} into {to}: .*Read-only"):
                stage(src, to)


def test_a_disk_that_fills_while_staging_is_a_staging_error(tmp_path: Path, monkeypatch) -> None:
    """Two stores staged at once into room for one both pass the free-space check; the one
    that runs out of space while copying says so (it was a raw OSError traceback)."""
    import shutil as sh
    from collections import namedtuple

    from shardload.errors import StagingError
    from shardload.move.staging import stage

    src = tmp_path / "big"
    src.mkdir()
    (src / "blob.bin").write_bytes(np.random.default_rng(0).bytes(3 << 20))
    with small_disk(tmp_path / "small", "1m") as disk:
        usage = namedtuple("usage", "total used free")
        monkeypatch.setattr(sh, "disk_usage", lambda _: usage(10**9, 0, 10**9))  # the other
        with pytest.raises(StagingError, match=rf"not enough space in {disk} to stage {src}"):
            stage(src, disk)
        assert not [p for p in disk.iterdir() if p.name.startswith(("big-", ".big-"))]
