"""User view functions for tests (imported by path 'userfuncs:...')."""

import xarray as xr


def mean_over_lev(ds: xr.Dataset) -> dict:
    m = ds.t.mean("lev")
    return {
        "m": m.stack(f=("lat", "lon"))
        .transpose("time", "f")
        .drop_vars(["f", "lat", "lon"], errors="ignore")
    }


def unequal(ds: xr.Dataset) -> dict:
    return {"a": ds.a, "b": ds.b}
