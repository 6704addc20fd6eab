"""Lazy feature names of wide grids (views/names.py): the same names as strings would give,
and the same feature file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.manifest.features import decode_features, encode_features
from shardload.prep.views.flat import feature_name_seq, feature_names
from shardload.prep.views.names import ChainedNames, GridNames

LABELS = [
    [["a", "b"], ["0", "1", "22"]],
    [[str(i) for i in range(12)], [str(i) for i in range(105)], ["x", "yy"]],
    [["ü", "2"], ["é"]],
    [["1"], []],
]


@pytest.mark.parametrize("labels", LABELS)
def test_grid_names_are_the_strings(labels):
    g = GridNames("v", labels)
    want = [f"v[{','.join(t)}]" for t in __import__("itertools").product(*labels)]
    assert list(g) == want and len(g) == len(want)
    assert [g[i] for i in range(len(g))] == want
    if want:
        assert g[-1] == want[-1] and g[1:3] == tuple(want[1:3])
    assert g.utf8_joined() == "\0".join(want).encode()
    c = ChainedNames([("p", "q"), g, ("r",)])
    assert list(c) == ["p", "q", *want, "r"] and [c[i] for i in range(len(c))] == list(c)
    assert c.utf8_joined() == "\0".join(c).encode()
    with pytest.raises(IndexError):
        g[len(g)]


def test_feature_file_keeps_a_grid_as_its_rule():
    """A grid's names are stored as its name and labels (kilobytes for millions of names) and
    read back as the same lazy grid; the same names as strings still round-trip as strings."""
    g = GridNames("lc", [[str(i) for i in range(100)], [str(i) for i in range(300)], ["a", "ü"]])
    as_rule = encode_features("x", g, None)
    as_strings = encode_features("x", list(g), None)
    assert len(as_rule) < 4_000 and len(as_strings) > 100 * len(as_rule)
    names, _ = decode_features(as_rule, where="x")
    assert isinstance(names, GridNames) and names == g and len(names) == len(g)
    assert names[12345] == g[12345] and names[-1] == "lc[99,299,ü]"
    again, _ = decode_features(as_strings, where="x")
    assert isinstance(again, tuple) and again == tuple(g)
    c = ChainedNames([("p",), g])  # other sequences: names joined by NUL, as before
    names, _ = decode_features(encode_features("x", c, None), where="x")
    assert names == tuple(c)


@pytest.mark.parametrize(
    "rule", [b"[1]", b'{"name": "v", "labels": [[1]]}', b"{", b'{"name": "v", "labels": []}']
)
def test_a_bad_grid_rule_is_a_corrupt_feature_file(rule):
    import io

    from shardload.errors import StoreError

    buf = io.BytesIO()
    np.savez(
        buf, format=np.array(2), num_names=np.array(1), names_grid=np.frombuffer(rule, np.uint8)
    )
    with pytest.raises(StoreError, match=r"feature file _features/x\.npz is corrupt"):
        decode_features(buf.getvalue(), where="_features/x.npz")


def test_feature_files_of_the_first_format_still_decode():
    """Files written by the first format (names joined by NUL, float64 / int64 statistics;
    tests/data/features, written by shardload before the grid rule and compact statistics)."""
    from shardload.manifest.features import FeatureStats

    data = Path(__file__).parent / "data" / "features"
    names, st = decode_features((data / "features-format1-grid.npz").read_bytes(), where="g")
    assert names == tuple(f"lc[{i},{j}]" for i in range(3) for j in (10, 20, 30, 40))
    want = FeatureStats(
        5,
        np.linspace(0, 1, 12),
        np.linspace(1, 2, 12),
        np.arange(12) - 3.5,
        np.arange(12) + 0.25,
        [0] * 11 + [2],
    )
    assert st == want and st.nan_count.dtype == np.int64 and st.min.dtype == np.float64
    names, st = decode_features((data / "features-format1-plain.npz").read_bytes(), where="p")
    assert names == ("a", "bü")
    assert st == FeatureStats(3, [1.5, np.nan], [0.5, np.nan], [1.0, np.nan], [2.0, np.nan], [0, 3])


def test_flat_view_of_a_grid_keeps_names_lazy(tmp_path):
    v = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(3, 4, 2)
    ds = xr.Dataset({"g": (("y", "x", "t"), v)}, coords={"x": [10, 20, 30, 40]})
    assert isinstance(feature_name_seq(ds["g"], ("t",)), GridNames)
    assert feature_names(ds["g"], ("t",)) == tuple(feature_name_seq(ds["g"], ("t",)))
    ds.to_netcdf(tmp_path / "g.nc")
    s = shardload.prepare(
        {
            "source": {"paths": [str(tmp_path / "g.nc")]},
            "sample_dims": ["t"],
            "view": "flat",
            "arrays": {"x": ["g"]},
            "out": str(tmp_path / "s"),
            "splits": {},
        }
    )
    assert list(s.manifest.arrays["x"].features) == [
        f"g[{y},{x}]" for y in range(3) for x in (10, 20, 30, 40)
    ]
    np.testing.assert_array_equal(s.read("x"), v.reshape(12, 2).T)
    with np.load(tmp_path / "s" / "_features" / "x.npz") as z:  # the rule, not 12 strings
        assert "names_grid" in z and "names" not in z
    assert (
        shardload.open_store(tmp_path / "s").manifest.arrays["x"].features
        == s.manifest.arrays["x"].features
    )


@pytest.mark.parametrize(
    ("shape", "pieces"), [((2880, 4), 1), ((7, 3000, 4), 7), ((3, 5, 20000), 30), ((4,), 1)]
)
def test_grid_names_with_a_short_last_dim_come_in_few_pieces(shape, pieces):
    """A flat view of a time-major series names its features ``v[time,lev]``: 2,880 x 4
    names came in 2,880 pieces of 4 names (one numpy template fill each, 0.1 s of a prepare);
    trailing dims are taken together while their names fit one piece (same bytes)."""
    from shardload.manifest.names import PIECE_NAMES

    assert PIECE_NAMES == 1 << 14  # the piece counts below are for it
    g = GridNames("v", [[f"l{k}" for k in range(n)] for n in shape])
    chunks = list(g.utf8_chunks())
    assert b"".join(chunks) == "\0".join(g).encode()
    assert len(chunks) == pieces
