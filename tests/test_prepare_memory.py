"""Memory of a prepare of wide rows (N320-sized weather states: 32.5 M features a row): what
it holds must not grow with the features beyond a few per-feature arrays. Measured with
tracemalloc (numpy reports its buffers to it), so the bounds are exact, not timing-dependent."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np

from shardload.manifest.core import ArraySpec
from shardload.manifest.names import GridNames
from shardload.prep.coords import COORD_CHUNK_BYTES, SampleCoords, write_zarr_metadata
from shardload.prep.stats.dated import tendency_partial


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_feature_name_coordinate_is_written_in_slabs(tmp_path: Path) -> None:
    """The ``NAME_feature`` coordinate of 1 M grid names: never the whole array of fixed-length
    strings (here 1 M x 4 bytes x 31 characters = 124 MB; xarray's copies of it made the N320
    prepare run out of memory), at most a few chunks of :data:`COORD_CHUNK_BYTES`."""
    names = GridNames("t_1", [[f"{x:.3f}" for x in range(1000)], [f"{y:.3f}" for y in range(1000)]])
    spec = ArraySpec("state", (4, len(names)), np.dtype("float32"), features=names)
    coords = SampleCoords(values={"time": np.arange(4)})
    import dask.array  # noqa: F401  (imports: not what is measured)
    import xarray as xr
    import zarr  # noqa: F401

    peak = _peak_bytes(lambda: write_zarr_metadata(tmp_path, {"state": spec}, coords, chunk_rows=1))
    assert peak < 4 * COORD_CHUNK_BYTES, peak

    got = xr.open_zarr(tmp_path)["state_feature"].values
    assert len(got) == len(names)
    assert got[0] == names[0] and got[-1] == names[-1] and got[123_456] == names[123_456]


def test_tendency_partial_merges_in_place() -> None:
    """Tendency statistics of 16 wide rows: the increments' partials merged into one set of
    running arrays, not by :func:`merge` (a dozen fresh row-sized float64 arrays a merge): at
    most 8 float64 values a feature at once. Values as numpy's."""
    nf = 1 << 20
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, nf), dtype=np.float32)
    use = np.ones(16, bool)
    out = []
    peak = _peak_bytes(lambda: out.append(tendency_partial(x, x[:0], 1, use)))
    assert peak < 8 * 8 * nf, peak / nf
    d = (x[1:] - x[:-1]).astype(np.float64)
    p = out[0]
    np.testing.assert_allclose(p.mean, d.mean(axis=0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(p.m2 / 15, d.var(axis=0), rtol=1e-9)
    np.testing.assert_array_equal(np.asarray(p.min, np.float64), d.min(axis=0))
    np.testing.assert_array_equal(np.asarray(p.max, np.float64), d.max(axis=0))


def test_one_increment_is_its_own_partial() -> None:
    """A one-row block's tendency (k = 1, the halo row after it): one increment, whose partial
    is the increment itself (float32), not copied into float64 running arrays (780 MB a
    tendency a block at N320)."""
    nf = 1 << 20
    x = np.arange(2 * nf, dtype=np.float32).reshape(2, nf)
    out = []
    peak = _peak_bytes(lambda: out.append(tendency_partial(x[:1], x[1:], 1, np.ones(2, bool))))
    assert peak < 3 * 4 * nf, peak / nf
    np.testing.assert_array_equal(out[0].mean, x[1] - x[0])


def test_partial_of_no_rows_holds_nothing_per_feature() -> None:
    """A dated block outside the statistics period gives the partial of no rows: broadcast
    constants, not six arrays of a value per feature; merged, it changes nothing."""
    from shardload.prep.stats import OrderedMerge, merge, partial

    nf = 1 << 20
    out = []
    peak = _peak_bytes(lambda: out.append(partial(np.empty((0, nf), np.float32))))
    assert peak < nf, peak
    x = np.arange(3 * nf, dtype=np.float32).reshape(3, nf)
    m = OrderedMerge()
    m.add(0, {"x": partial(x)})
    m.add(1, {"x": out[0]})
    got = m.finalize()["x"]
    assert got.count == 3
    np.testing.assert_array_equal(got.mean, x.astype(np.float64).mean(axis=0))
    np.testing.assert_array_equal(got.min, x[0])
    np.testing.assert_array_equal(got.max, x[2])
    both = merge(out[0], partial(x))
    np.testing.assert_array_equal(both.mean, x.astype(np.float64).mean(axis=0))


def test_feature_file_of_wide_names_is_written_in_pieces(tmp_path: Path) -> None:
    """The feature file of 1 M lazy names (two variables' grids, as a state's flat row): the
    names are written to the file piece by piece and checked for NUL piece by piece, never
    joined whole (here 1 M x ~20 bytes = 20 MB, and a NUL mask of as many bytes; at N320's
    32.5 M features 1.3 GB each, the last peak of its prepare). The file reads back the same."""
    from shardload.manifest.features import decode_features, write_features
    from shardload.manifest.names import ChainedNames

    lab = lambda n: [f"{x:.3f}" for x in range(n)]  # noqa: E731
    names = ChainedNames([GridNames("t_1", [lab(500), lab(1000)]), GridNames("q", [lab(500)])])
    names = ChainedNames([names, GridNames("z", [lab(10), lab(50), lab(998)])])
    joined = "\0".join(names).encode()
    assert len(joined) > 20_000_000
    path = tmp_path / "state.npz"
    with open(path, "wb") as f:
        peak = _peak_bytes(lambda: write_features(f, array="state", names=names, stats=None))
    assert peak < len(joined) // 10, peak

    got, _ = decode_features(path.read_bytes(), where=str(path))
    assert got is not None and len(got) == len(names)
    assert "\0".join(got).encode() == joined


def test_a_nul_in_a_name_is_refused_piece_by_piece(tmp_path: Path) -> None:
    """The NUL check, chunkwise: a NUL inside a name (plain or lazy) is an error naming the
    array, whichever piece holds it."""
    import pytest

    from shardload.errors import StoreError
    from shardload.manifest.features import write_features
    from shardload.manifest.names import ChainedNames

    plain = [f"v{i}" for i in range(100_000)]
    plain[70_000] = "bad\0name"
    lazy = ChainedNames([GridNames("t", [["a", "b"], ["c\0d", "e"]])])
    for names in (plain, lazy):
        with open(tmp_path / "x.npz", "wb") as f, pytest.raises(StoreError, match="'state'"):
            write_features(f, array="state", names=names, stats=None)
