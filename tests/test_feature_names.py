"""Lazy feature names of wide grids (views/names.py): the same names as strings would give,
and the same feature file."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.manifest import decode_features, encode_features
from shardload.views.flat import feature_name_seq, feature_names
from shardload.views.names import ChainedNames, GridNames

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


def test_feature_file_of_lazy_names_equals_the_strings():
    g = GridNames("lc", [[str(i) for i in range(30)], [str(i) for i in range(70)]])
    assert encode_features("x", g, None) == encode_features("x", list(g), None)
    names, _ = decode_features(encode_features("x", g, None), where="x")
    assert list(names) == list(g)


def test_flat_view_of_a_grid_keeps_names_lazy(tmp_path):
    v = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(3, 4, 2)
    ds = xr.Dataset({"g": (("y", "x", "t"), v)}, coords={"x": [10, 20, 30, 40]})
    assert isinstance(feature_name_seq(ds["g"], ("t",)), GridNames)
    assert feature_names(ds["g"], ("t",)) == tuple(feature_name_seq(ds["g"], ("t",)))
    ds.to_netcdf(tmp_path / "g.nc")
    s = shardload.prepare({
        "source": {"paths": [str(tmp_path / "g.nc")]}, "sample_dims": ["t"], "view": "flat",
        "arrays": {"x": ["g"]}, "out": str(tmp_path / "s"), "splits": {},
    })  # fmt: skip
    assert list(s.manifest.arrays["x"].features) == [
        f"g[{y},{x}]" for y in range(3) for x in (10, 20, 30, 40)
    ]
    np.testing.assert_array_equal(s.read("x"), v.reshape(12, 2).T)
