from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
CACHE = Path(os.environ.get("SHARDLOAD_TEST_CACHE", Path.home() / ".cache" / "shardload-tests"))
CFGRIB_SDIST = "cfgrib==0.9.15.1"
SRC = str(REPO / "src")
ECRAD = SHARED_DATA / "ecrad"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (../shared/data beside the repo)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def era5_dir() -> Path:
    """ERA5 sample files from the cfgrib source distribution (fetched once with pip)."""
    target = CACHE / "era5"
    names = ("era5-levels-members.nc", "era5-levels-members.grib")
    if all((target / n).exists() for n in names):
        return target
    dl = CACHE / "sdist"
    dl.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            CFGRIB_SDIST,
            "-d",
            str(dl),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    archives = sorted(dl.glob("cfgrib-*.tar.gz"))
    if not archives:
        pytest.skip(f"cannot fetch the ERA5 sample ({CFGRIB_SDIST} sdist): {res.stderr[-500:]}")
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archives[-1]) as tf:
        for m in tf.getmembers():
            if m.name.endswith(tuple(f"sample-data/{n}" for n in names)):
                m.name = Path(m.name).name
                tf.extract(m, target, filter="data")
    return target


def make_dataset(
    n: int = 50, *, seed: int = 0, nan_at: tuple[int, int] | None = None
) -> xr.Dataset:
    """A small dataset with sample dim 'sample' and several variable shapes."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n,)).astype("float32")
    b = rng.normal(size=(n, 3)).astype("float32")
    c = rng.normal(size=(4, n)).astype("float64")  # sample dim not first
    if nan_at is not None:
        b[nan_at] = np.nan
    return xr.Dataset(
        {"a": (("sample",), a), "b": (("sample", "feat"), b), "c": (("level", "sample"), c)},
        coords={"feat": ["u", "v", "w"]},
    )


@pytest.fixture()
def small_nc(tmp_path: Path) -> Path:
    path = tmp_path / "small.nc"
    make_dataset(50).to_netcdf(path)
    return path


@pytest.fixture(scope="session")
def ecrad_inputs() -> Path:
    """The real ecRad input file (MAELSTROM input schema)."""
    path = ECRAD / "ecrad_meridian.nc"
    if not path.exists():
        pytest.skip(f"real data absent: {path} (see ../shared/data/README.md)")
    return path


@pytest.fixture(scope="session")
def ecrad_outputs() -> Path:
    """ecRad's Tripleclouds flux output for the real input file."""
    path = ECRAD / "ecrad_meridian_tripleclouds_out.nc"
    if not path.exists():
        pytest.skip(f"real data absent: {path} (see ../shared/data/README.md)")
    return path


@pytest.fixture(scope="session")
def radiation_sample(tmp_path_factory) -> list[Path]:
    """Two timesteps x two patches of small generated MAELSTROM files."""
    from shardload.samples.radiation import write_radiation_sample

    out = tmp_path_factory.mktemp("radiation_sample")
    return write_radiation_sample(
        out, columns=300, timesteps=(0, 125), patches=(0, 7), seed=3, block_columns=256
    )


def make_store(path: Path, *, num_chunks: int = 3, chunk_bytes: int = 4096, complete=True) -> Path:
    """A fake npy-stack store: ``shardload.json`` plus ``x/00000N.npy`` files of random bytes."""
    path.mkdir(parents=True)
    manifest = {"format": "npy", "length": 10 * num_chunks, "complete": complete, "arrays": []}
    (path / "shardload.json").write_text(json.dumps(manifest))
    (path / "x").mkdir()
    for i in range(num_chunks):
        (path / "x" / f"{i:06d}.npy").write_bytes(os.urandom(chunk_bytes + i))
    return path


def tree_bytes(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (relative POSIX name -> content)."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def python_env() -> dict[str, str]:
    """The environment for subprocesses running ``python -m shardload`` from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn(*args: str, **kwargs) -> subprocess.Popen:
    """Start ``python -m shardload ARGS`` with stdout/stderr piped as text."""
    return subprocess.Popen(
        [sys.executable, "-m", "shardload", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(),
        **kwargs,
    )


@pytest.fixture
def stores(tmp_path: Path) -> Path:
    """A served folder: a complete npy store, an incomplete one, a zarr v3 and a zarr v2 group,
    a folder that is not a store, and a file."""
    root = tmp_path / "served"
    root.mkdir()
    make_store(root / "alpha")
    make_store(root / "partial", num_chunks=1, complete=False)
    (root / "plainzarr").mkdir()
    (root / "plainzarr" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    (root / "zarr2").mkdir()
    (root / "zarr2" / ".zgroup").write_text('{"zarr_format": 2}')
    (root / "notastore").mkdir()
    (root / "README").write_text("hello")
    return root


@pytest.fixture
def young_gc():
    """``gc.collect()`` in the test walks only what was made since it began.

    A pytest-xdist worker runs many files in one process: the objects their imports and
    fixtures left (over half a million) made each full collection take seconds there, and tests
    that collect often (to run the finalizers of dropped batches) took minutes. They are frozen
    (``gc.freeze``) for the test's duration; the test's own garbage, cycles included, is still
    collected, and the frozen objects go back to the collector afterwards."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


from hypothesis import settings  # noqa: E402

settings.register_profile("shardload", deadline=None, max_examples=60)
settings.load_profile("shardload")


@pytest.fixture(autouse=True, scope="session")
def _workspace_of_the_tests(tmp_path_factory):
    """Commands run in-process by the tests log into a workspace of their own, not the user's
    ``~/.shardload`` (subprocess tests set ``SHARDLOAD_HOME`` themselves)."""
    if "SHARDLOAD_HOME" not in os.environ:
        os.environ["SHARDLOAD_HOME"] = str(tmp_path_factory.mktemp("shardload-home"))
    # the node's ledger of verified chunks (formats/ledger.py): the tests', not the user's
    if "SHARDLOAD_VERIFY_LEDGER" not in os.environ:
        os.environ["SHARDLOAD_VERIFY_LEDGER"] = str(tmp_path_factory.mktemp("verified"))
    yield
