"""Real files: what a plain ``pip install shardload`` opens and writes with default settings,
wide feature axes, GRIB (issue 13, items 6, 7, 12)."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys

import h5py
import numpy as np
import pytest
import tomllib
import xarray as xr
from packaging.requirements import Requirement

import shardload
from conftest import REPO, SRC


def _closure(reqs: list[str]) -> set[str]:
    """Distribution names reachable from ``reqs`` (their own extras not followed)."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in reqs]
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        try:
            sub = md.requires(req.name) or []
        except md.PackageNotFoundError:
            continue
        for s in sub:
            r = Requirement(s)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r)
    return seen


def optional_modules() -> list[str]:
    """Top-level modules installed only through an extra of pyproject, never by a base
    dependency: a plain install does not have them."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = _closure(list(project["dependencies"]))
    extras = _closure([r for rs in project["optional-dependencies"].values() for r in rs])
    hidden = extras - base
    mods = []
    for mod, dists in md.packages_distributions().items():
        if mod.startswith("_") or not mod.isidentifier():
            continue
        names = {d.lower().replace("_", "-") for d in dists}
        if names and names <= hidden:
            mods.append(mod)
    return sorted(mods)


HIDE = """
import sys, importlib.abc
HIDDEN = set({hidden!r})
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden: not a base dependency)")
        return None
sys.meta_path.insert(0, Hide())
"""


def _run_plain(code: str, hidden: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", HIDE.format(hidden=hidden) + code],
        capture_output=True, text=True, timeout=240, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def test_optional_modules_are_really_hidden():
    hidden = optional_modules()
    assert "torch" in hidden and "distributed" in hidden  # extras only
    assert "scipy" not in hidden and "hdf5plugin" not in hidden and "cfgrib" not in hidden
    res = _run_plain("import distributed", hidden)
    assert res.returncode != 0 and "hidden: not a base dependency" in res.stderr


def test_every_source_and_output_format_works_with_defaults_in_a_plain_install(tmp_path):
    """netCDF-3 (scipy), netCDF-4, HDF5, Zarr and GRIB sources, and every output format with
    its default compression, with every module that only an extra installs hidden."""
    n = 40
    ds = xr.Dataset(
        {"a": ("sample", np.arange(n, dtype="f4")), "b": (("sample", "k"), np.ones((n, 3), "f8"))}
    )
    ds.to_netcdf(tmp_path / "v3.nc", format="NETCDF3_64BIT", engine="scipy")
    ds.to_netcdf(tmp_path / "v4.nc", engine="h5netcdf")
    ds.to_zarr(tmp_path / "src.zarr")
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["a"] = ds.a.values
    # (source, output format): every source and every format at least once
    cases = [("v3.nc", "hdf5"), ("v4.nc", "zarr"), ("src.zarr", "npy"), ("plain.h5", "hdf5")]
    code = f"""
import numpy as np, shardload
tmp = {str(tmp_path)!r}
for src, fmt in {cases!r}:
    s = shardload.prepare({{"source": tmp + "/" + src, "arrays": {{"x": ["a"]}}, "format": fmt,
                           "sample_dims": ["sample" if src != "plain.h5" else "phony_dim_0"],
                           "out": f"{{tmp}}/out-{{src}}-{{fmt}}"}})
    assert s.manifest.options["compression"] == ("none" if fmt == "npy" else "lz4"), s.manifest.options
    np.testing.assert_array_equal(shardload.open_store(s.root).read("x")[:, 0], np.arange({n}))
print("ok")
"""
    res = _run_plain(code, optional_modules())
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


def test_grib_opens_in_a_plain_install(tmp_path, era5_dir):
    grib = str(era5_dir / "era5-levels-members.grib")
    code = f"""
import shardload
s = shardload.prepare({{"source": {{"paths": [{grib!r}], "variables": ["t"]}},
                      "sample_dims": ["number", "time"], "arrays": {{"t": ["t"]}},
                      "out": {str(tmp_path / "grib")!r}}})
assert len(s) == 40 and s.read("t").shape[0] == 40, s
print("ok")
"""
    res = _run_plain(code, optional_modules())
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


def test_hdf5_output_with_more_features_than_an_attribute_holds(tmp_path):
    """Feature names of a wide flat view live in a dataset, not a 64 KiB attribute."""
    n, k = 12, 6000
    rng = np.random.default_rng(0)
    wide = rng.standard_normal((n, k)).astype("f4")
    xr.Dataset({"w": (("sample", "f"), wide)}).to_netcdf(tmp_path / "wide.nc")
    store = shardload.prepare({
        "source": str(tmp_path / "wide.nc"), "sample_dims": ["sample"], "arrays": {"x": ["w"]},
        "format": "hdf5", "compression": "none", "chunk_rows": 5, "out": str(tmp_path / "s"),
    })  # fmt: skip
    np.testing.assert_array_equal(store.read("x"), wide)
    feats = store.manifest.arrays["x"].features
    assert feats is not None and len(feats) == k and feats[:2] == ("w[0]", "w[1]")
    with h5py.File(tmp_path / "s" / "data.h5", "r") as f:
        ref = f["x"].attrs["features"]
        names = f[ref][...].astype(str)
    assert list(names) == list(feats)
    np.testing.assert_allclose(store.manifest.stats["x"].mean, wide.astype("f8").mean(0))


def test_hdf5_create_error_names_the_array(tmp_path):
    from shardload.errors import StoreError
    from shardload.formats.base import FormatOptions
    from shardload.formats.hdf5 import FORMAT
    from shardload.views.base import ArraySpec

    bad = {"big": ArraySpec("big", (4, 3), np.dtype("M8[ns]"))}  # no HDF5 type
    with pytest.raises(StoreError, match=re.escape("array 'big'")):
        FORMAT.create(tmp_path, bad, (0, 4), FormatOptions("none"))
