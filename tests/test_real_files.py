"""Real files: what a plain ``pip install shardload`` opens and writes with default settings,
wide feature axes, GRIB (issue 13, items 6, 7, 12)."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import tomllib
import xarray as xr
from packaging.requirements import Requirement

import shardload
from conftest import CACHE, REPO, SRC
from shardload.errors import ConfigError, SourceError
from shardload.prep.config import load_config
from shardload.prep.sources.open import open_source


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
        capture_output=True,
        text=True,
        timeout=240,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )


def test_optional_modules_are_really_hidden():
    hidden = optional_modules()
    assert "torch" in hidden and "distributed" in hidden  # extras only
    assert "scipy" not in hidden and "hdf5plugin" not in hidden and "cfgrib" not in hidden
    res = _run_plain("import distributed", hidden)
    assert res.returncode != 0 and "hidden: not a base dependency" in res.stderr


def test_every_source_and_output_format_works_with_defaults_in_a_plain_install(tmp_path, request):
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
    try:
        grib = str(request.getfixturevalue("era5_dir") / "era5-levels-members.grib")
    except pytest.skip.Exception:  # no sample GRIB (pip download failed): the other formats
        grib = None
    code = f"""
import numpy as np, shardload
tmp = {str(tmp_path)!r}
for src, fmt in {cases!r}:
    s = shardload.prepare({{"source": tmp + "/" + src, "arrays": {{"x": ["a"]}}, "format": fmt,
                           "sample_dims": ["sample" if src != "plain.h5" else "phony_dim_0"],
                           "out": f"{{tmp}}/out-{{src}}-{{fmt}}"}})
    assert s.manifest.options["compression"] == ("none" if fmt == "npy" else "auto"), s.manifest.options
    np.testing.assert_array_equal(shardload.open_store(s.root).read("x")[:, 0], np.arange({n}))
if {grib!r}:
    s = shardload.prepare({{"source": {{"paths": [{grib!r}], "variables": ["t"]}},
                          "sample_dims": ["number", "time"], "arrays": {{"t": ["t"]}},
                          "out": tmp + "/grib"}})
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
    store = shardload.prepare(
        {
            "source": str(tmp_path / "wide.nc"),
            "sample_dims": ["sample"],
            "arrays": {"x": ["w"]},
            "format": "hdf5",
            "compression": "none",
            "chunk_rows": 5,
            "out": str(tmp_path / "s"),
        }
    )
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
    from shardload.formats.hdf5.write import WRITER
    from shardload.manifest.core import ArraySpec

    bad = {"big": ArraySpec("big", (4, 3), np.dtype("M8[ns]"))}  # no HDF5 type
    with pytest.raises(StoreError, match=re.escape("array 'big'")):
        WRITER.create(tmp_path, bad, (0, 4), FormatOptions("none"))


# -- GRIB ---------------------------------------------------------------------------------------
GRIB_SAMPLES = ("t_on_different_level_types.grib", "uv_on_different_levels.grib")


@pytest.fixture(scope="session")
def grib_dir(era5_dir) -> Path:
    """More GRIB samples from the cfgrib sdist that ``era5_dir`` fetched (never committed)."""
    target = CACHE / "grib"
    if not all((target / n).exists() for n in GRIB_SAMPLES):
        archives = sorted((CACHE / "sdist").glob("cfgrib-*.tar.gz"))
        if not archives:
            pytest.skip(f"no cfgrib sdist in {CACHE / 'sdist'}")
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archives[-1]) as tf:
            for m in tf.getmembers():
                if m.name.endswith(tuple(f"sample-data/{n}" for n in GRIB_SAMPLES)):
                    m.name = Path(m.name).name
                    tf.extract(m, target, filter="data")
    return target


def _source(src):
    """A validated SourceConfig (through the whole config's validation)."""
    src = {"paths": [src]} if isinstance(src, str) else src
    cfg = {"source": src, "sample_dims": ["s"], "arrays": {"x": ["a"]}, "out": "x"}
    return load_config(cfg).source


def _grib_cfg(path: Path, out: Path, **kw) -> dict:
    return {
        "source": {"paths": [str(path)], **kw.pop("source", {})},
        "sample_dims": ["latitude"],
        "arrays": kw.pop("arrays", {"x": ["t"]}),
        "out": str(out),
        **kw,
    }


def test_grib_recognised_by_content_and_opened_once(tmp_path, era5_dir, monkeypatch):
    renamed = tmp_path / "era5.data"  # no GRIB extension
    shutil.copy(era5_dir / "era5-levels-members.grib", renamed)
    opened: list[str] = []
    real = xr.open_dataset

    def counting(target, *a, **kw):
        opened.append(str(target))
        return real(target, *a, **kw)

    monkeypatch.setattr(xr, "open_dataset", counting)
    store = shardload.prepare(
        {
            "source": str(renamed),
            "sample_dims": ["number", "time"],
            "arrays": {"t": ["t"]},
            "chunk_rows": 8,
            "out": str(tmp_path / "s"),
        }
    )
    assert opened == [str(renamed)]  # one scan of the file, though prepare builds the view twice
    opened.clear()
    second = tmp_path / "era5-copy.grb"
    shutil.copy(renamed, second)
    two = shardload.prepare(
        {
            "source": {
                "paths": [str(renamed), str(second)],
                "combine": "nested",
                "concat_dim": "number",
            },
            "sample_dims": ["number", "time"],
            "arrays": {"t": ["t"]},
            "chunk_rows": 8,
            "out": str(tmp_path / "two"),
        }
    )
    assert opened == [str(second)]  # each file once per process: the first one is known
    assert len(two) == 80
    ref = real(
        era5_dir / "era5-levels-members.grib", engine="cfgrib", backend_kwargs={"indexpath": ""}
    )
    want = ref["t"].transpose("number", "time", ...).values.reshape(40, -1)
    np.testing.assert_array_equal(store.read("t"), want)


def test_grib_filter_key_and_the_error_that_asks_for_it(tmp_path, grib_dir):
    path = grib_dir / "t_on_different_level_types.grib"
    with pytest.raises(
        SourceError, match=r"source\.filter, one of: \{'typeOfLevel': 'isobaricInhPa'\}"
    ):
        shardload.prepare(_grib_cfg(path, tmp_path / "a"))
    store = shardload.prepare(
        _grib_cfg(path, tmp_path / "b", source={"filter": {"typeOfLevel": "isobaricInhPa"}})
    )
    ref = xr.open_dataset(
        path,
        engine="cfgrib",
        backend_kwargs={"indexpath": "", "filter_by_keys": {"typeOfLevel": "isobaricInhPa"}},
    )
    np.testing.assert_array_equal(
        store.read("x"), ref["t"].transpose("latitude", ...).values.reshape(len(store), -1)
    )
    with pytest.raises(ConfigError, match=r"source\.filter"):
        load_config(_grib_cfg(path, tmp_path / "c", source={"filter": "typeOfLevel"}))
    (tmp_path / "v3.nc").write_bytes(b"CDF\x01")
    with pytest.raises(SourceError, match=r"source\.filter selects GRIB messages"):
        open_source(
            _source({"paths": [str(tmp_path / "v3.nc")], "engine": "scipy", "filter": {"a": 1}})
        )


def test_grib_skipped_variables_are_reported_once_without_tracebacks(tmp_path, grib_dir):
    path = grib_dir / "uv_on_different_levels.grib"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(_grib_cfg(path, tmp_path / "s", arrays={"x": ["u"]})))
    res = subprocess.run(
        [sys.executable, "-m", "shardload", "prepare", str(cfg)],
        capture_output=True,
        text=True,
        timeout=240,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert res.stderr.count("cfgrib skipped GRIB variable(s) 'v'") == 1, res.stderr
    assert "filter: {shortName: v}" in res.stderr
    with pytest.raises(SourceError, match=r"cfgrib skipped 'v' .*source\.filter"):
        open_source(_source({"paths": [str(path)], "variables": ["v"]}))
    ok = open_source(
        _source({"paths": [str(path)], "variables": ["v"], "filter": {"shortName": "v"}})
    )
    assert ok["v"].sizes["isobaricInhPa"] == 3


# -- what is missing: a group, or combine: nested --------------------------------------------------
def test_missing_group_is_named(tmp_path):
    path = tmp_path / "grouped.nc"
    xr.Dataset({"a": ("sample", np.arange(5.0))}).to_netcdf(path, group="inner", engine="h5netcdf")
    with pytest.raises(SourceError, match=r"groups \['inner'\]: set source\.group"):
        open_source(_source(str(path)))
    with pytest.raises(SourceError, match=r"not found .*groups \['inner'\]: is source\.group"):
        open_source(_source({"paths": [str(path)], "variables": ["a"]}))
    ds = open_source(_source({"paths": [str(path)], "group": "inner"}))
    assert ds["a"].values.tolist() == [0, 1, 2, 3, 4]


def test_missing_combine_nested_is_named(tmp_path):
    for i in range(2):  # no coordinate variable: nothing orders the files
        xr.Dataset({"a": ("sample", np.arange(3.0) + 3 * i)}).to_netcdf(tmp_path / f"p{i}.nc")
    paths = [str(tmp_path / "p0.nc"), str(tmp_path / "p1.nc")]
    with pytest.raises(SourceError, match=r"set source\.combine: nested and source\.concat_dim"):
        open_source(_source({"paths": paths}))
    ds = open_source(_source({"paths": paths, "combine": "nested", "concat_dim": "sample"}))
    assert ds["a"].values.tolist() == [0, 1, 2, 3, 4, 5]
