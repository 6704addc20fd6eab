"""Stores built by anemoi-datasets itself, and anemoi's own reading of them, for tests.

anemoi-datasets needs zarr 2 while shardload uses zarr 3, so it lives in its own venv: the repo
root's ``.venv-anemoi`` (``make anemoi-venv``, pinned in constraints-anemoi.txt), or the python
named by the environment variable ``SHARDLOAD_ANEMOI_PYTHON``. Everything that needs anemoi runs
in a subprocess of that python; a test that needs it calls :func:`require_anemoi` (or uses
:func:`build_store`, which calls it) and skips, saying why, when it is absent.

Typical use::

    spec = GriddedSpec(length=8, missing=("2020-01-01T12:00:00",), members=2)
    store_path = build_store(tmp_path, spec)          # anemoi-datasets create
    ref = read_reference(store_path)                  # anemoi.datasets.open_dataset(path)[i]
    ref.rows[i], ref.dates, ref.variables, ref.statistics["mean"], ref.missing
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

REPO = Path(__file__).resolve().parents[1]
ANEMOI_VENV = REPO / ".venv-anemoi"
ENV_VAR = "SHARDLOAD_ANEMOI_PYTHON"
TIMEOUT_S = 300


def anemoi_python() -> Path:
    """The python of the anemoi venv (it may not exist: see :func:`require_anemoi`)."""
    override = os.environ.get(ENV_VAR)
    return Path(override) if override else ANEMOI_VENV / "bin" / "python"


@functools.cache
def _anemoi_problem() -> str | None:
    py = anemoi_python()
    if not py.exists():
        if os.environ.get(ENV_VAR):
            return f"anemoi-datasets not found: {ENV_VAR}={py} does not exist"
        return f"anemoi-datasets venv not found: {py} is absent (build it with `make anemoi-venv`)"
    res = subprocess.run(
        [str(py), "-c", "import anemoi.datasets, netCDF4"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if res.returncode != 0:
        return f"{py} cannot import anemoi.datasets: {res.stderr.strip()[-400:]}"
    return None


def require_anemoi() -> Path:
    """The anemoi venv's python; skips the calling test (saying why) when it is unusable."""
    problem = _anemoi_problem()
    if problem is not None:
        pytest.skip(problem)
    return anemoi_python()


@dataclass(frozen=True)
class GriddedSpec:
    """A small gridded netCDF source and the anemoi recipe that reads it.

    ``missing`` lists dates (ISO strings) that the recipe declares missing: anemoi keeps their
    rows (NaN, chunks never written) and lists them in the store's ``missing_dates``. The source
    still holds finite values for them, so NaN in a batch means a missing row was served.
    ``members`` adds an ensemble dimension ``number`` of that size. ``recipe_extra`` is merged
    into the recipe's top level (e.g. ``{"statistics": {"end": "2020-01-02"}}``).
    """

    start: str = "2020-01-01T00:00:00"
    frequency: str = "6h"
    length: int = 8
    variables: tuple[str, ...] = ("t2m", "msl")
    grid: tuple[int, int] = (3, 4)
    members: int | None = None
    missing: tuple[str, ...] = ()
    seed: int = 0
    recipe_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def dates(self) -> np.ndarray:
        step = np.timedelta64(_frequency_seconds(self.frequency), "s")
        return np.datetime64(self.start, "s") + step * np.arange(self.length)


def _frequency_seconds(text: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text[-1] not in units or not text[:-1].isdigit():
        raise ValueError(f"frequency {text!r}: expected a number and one of s, m, h, d")
    return int(text[:-1]) * units[text[-1]]


def write_gridded_netcdf(path: Path, spec: GriddedSpec) -> xr.Dataset:
    """Write the netCDF source of ``spec`` (dims time[, number], latitude, longitude); return it.

    Variable k at date i holds ``1000 * k + i + noise`` so that a row is easy to place.
    """
    ny, nx = spec.grid
    rng = np.random.default_rng(spec.seed)
    dims: tuple[str, ...] = ("time", "latitude", "longitude")
    shape: tuple[int, ...] = (spec.length, ny, nx)
    coords: dict[str, Any] = {
        "time": spec.dates.astype("datetime64[ns]"),
        "latitude": np.linspace(60.0, 30.0, ny),
        "longitude": np.linspace(0.0, 30.0, nx, endpoint=False),
    }
    if spec.members is not None:
        dims = ("time", "number", "latitude", "longitude")
        shape = (spec.length, spec.members, ny, nx)
        coords["number"] = np.arange(spec.members)
    base = np.arange(spec.length).reshape((-1,) + (1,) * (len(shape) - 1))
    data_vars = {
        name: (dims, (1000.0 * k + base + rng.random(shape)).astype("float32"))
        for k, name in enumerate(spec.variables)
    }
    ds = xr.Dataset(data_vars, coords=coords)
    ds["latitude"].attrs.update(units="degrees_north", standard_name="latitude")
    ds["longitude"].attrs.update(units="degrees_east", standard_name="longitude")
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.to_netcdf(path)
    return ds


def recipe_for(spec: GriddedSpec, netcdf: Path) -> dict[str, Any]:
    """The anemoi-datasets recipe reading ``netcdf`` over the dates of ``spec``."""
    dates = spec.dates
    recipe: dict[str, Any] = {
        "dates": {
            "start": str(dates[0]),
            "end": str(dates[-1]),
            "frequency": spec.frequency,
        },
        "input": {"netcdf": {"path": str(netcdf)}},
    }
    if spec.missing:
        recipe["dates"]["missing"] = list(spec.missing)
    recipe.update(spec.recipe_extra)
    return recipe


def build_store(tmp: Path, spec: GriddedSpec, *, name: str = "anemoi.zarr") -> Path:
    """``anemoi-datasets create`` a store from a netCDF source written here; return its path.

    Skips the calling test when the anemoi venv is unusable.
    """
    py = require_anemoi()
    tmp.mkdir(parents=True, exist_ok=True)
    netcdf = tmp / f"{Path(name).stem}.nc"
    write_gridded_netcdf(netcdf, spec)
    recipe = tmp / f"{Path(name).stem}.yaml"
    # JSON is YAML: no yaml writer needed on this side.
    recipe.write_text(json.dumps(recipe_for(spec, netcdf), indent=2))
    out = tmp / name
    res = subprocess.run(
        [str(py.parent / "anemoi-datasets"), "create", str(recipe), str(out)],
        capture_output=True,
        text=True,
        cwd=tmp,
        timeout=TIMEOUT_S,
    )
    if res.returncode != 0:
        raise RuntimeError(f"anemoi-datasets create {recipe} failed:\n{res.stderr[-3000:]}")
    return out


@dataclass(frozen=True)
class Reference:
    """What ``anemoi.datasets.open_dataset(path)`` says about a store.

    ``rows[i]`` is ``ds[i]`` for every date that is not missing; a missing row (anemoi raises
    MissingDateError for it) is all NaN here and its index is in ``missing``.
    """

    rows: np.ndarray
    dates: np.ndarray
    missing: frozenset[int]
    variables: list[str]
    statistics: dict[str, np.ndarray]
    latitudes: np.ndarray
    longitudes: np.ndarray
    frequency_s: int
    field_shape: tuple[int, ...]
    #: the store's ``statistics_tendencies_*`` arrays by name, when its recipe asked for them
    tendencies: dict[str, np.ndarray] = field(default_factory=dict)


_READ_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from anemoi.datasets import open_dataset
    from anemoi.datasets import MissingDateError

    path, out = sys.argv[1], sys.argv[2]
    ds = open_dataset(path)
    rows = np.full(ds.shape, np.nan, dtype=ds.dtype)
    missing = []
    for i in range(len(ds)):
        try:
            rows[i] = ds[i]
        except MissingDateError:
            missing.append(i)
    stats = ds.statistics
    import zarr
    group = zarr.open_group(path, mode="r")
    tendencies = {
        k: group[k][...] for k in group.array_keys() if k.startswith("statistics_tendencies_")
    }
    np.savez(
        out,
        rows=rows,
        dates=ds.dates.astype("datetime64[s]"),
        latitudes=ds.latitudes,
        longitudes=ds.longitudes,
        **{"stat_" + k: np.asarray(v) for k, v in stats.items()},
        **{"tend_" + k: np.asarray(v) for k, v in tendencies.items()},
    )
    meta = dict(
        missing=sorted(int(i) for i in ds.missing),
        raised=missing,
        variables=list(ds.variables),
        frequency_s=int(ds.frequency.total_seconds()),
        field_shape=list(ds.field_shape),
    )
    with open(out + ".json", "w") as f:
        json.dump(meta, f)
    """
)


def read_reference(path: Path) -> Reference:
    """Read every row of the store at ``path`` with ``anemoi.datasets.open_dataset(path)[i]``."""
    py = require_anemoi()
    out = Path(str(path).rstrip("/") + ".reference.npz")
    res = subprocess.run(
        [str(py), "-c", _READ_SCRIPT, str(path), str(out)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    if res.returncode != 0:
        raise RuntimeError(f"anemoi open_dataset({path}) failed:\n{res.stderr[-3000:]}")
    meta = json.loads(Path(str(out) + ".json").read_text())
    if meta["missing"] != meta["raised"]:
        raise AssertionError(f"anemoi's missing {meta['missing']} != rows raising {meta['raised']}")
    with np.load(out) as z:
        stats = {k[len("stat_") :]: z[k] for k in z.files if k.startswith("stat_")}
        tend = {k[len("tend_") :]: z[k] for k in z.files if k.startswith("tend_")}
        return Reference(
            rows=z["rows"],
            dates=z["dates"],
            missing=frozenset(meta["missing"]),
            variables=meta["variables"],
            statistics=stats,
            latitudes=z["latitudes"],
            longitudes=z["longitudes"],
            frequency_s=meta["frequency_s"],
            field_shape=tuple(meta["field_shape"]),
            tendencies=tend,
        )
