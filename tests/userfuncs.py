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


def ragged_tokens(ds: xr.Dataset, max_len: int = 13) -> dict:
    """A variable-length array: sample i holds the first (i * 7) % max_len values of row i
    of ``x`` (some empty), beside a fixed-shape array ``y``."""
    x = ds.x.values
    return {
        "tok": [x[i, : (i * 7) % max_len] for i in range(len(x))],
        "y": ds.y,
    }


def ragged_2d(ds: xr.Dataset) -> dict:
    """Not 1-D per sample: refused."""
    x = ds.x.values
    return {"tok": [x[i, :4].reshape(2, 2) for i in range(len(x))]}


def geometric_rows(ds: xr.Dataset) -> dict:
    """``tok``: row i is ``i, i + 1, ...`` of a geometric length (mean 20), beside ``y``."""
    import numpy as np

    lengths = np.random.default_rng(1).geometric(0.05, size=ds.sizes["s"])
    return {"tok": [np.arange(n, dtype=np.int32) + i for i, n in enumerate(lengths)], "y": ds.y}


def ragged_from_b(ds: xr.Dataset) -> dict:
    """``tok``: row i holds ``(i * 5) % 11`` values drawn from ``c`` (the kill campaign's
    source), beside ``y`` = ``b``."""
    import numpy as np

    c = ds.c.values.T.reshape(-1)
    n = ds.sizes["sample"]
    return {"tok": [np.roll(c, i)[: (i * 5) % 11] for i in range(n)], "y": ds.b}
