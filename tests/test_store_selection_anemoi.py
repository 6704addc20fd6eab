"""Variables of an anemoi-datasets store picked at open time (``shardload.select(store,
variables=..., drop_variables=...)``, issue #27), on a store anemoi-datasets builds: rows equal
anemoi's ``open_dataset(path)[i]`` at the picked variables, in the order asked, with the time
options too; ``anemoi_metadata`` follows (names, per-variable statistics)."""

from __future__ import annotations

import numpy as np
import pytest

import shardload
from anemoi_helpers import GriddedSpec, build_store, read_reference
from shardload.errors import PlanError
from shardload.formats.zarr.anemoi import anemoi_metadata

#: builds one store with anemoi-datasets (about 20 s)
pytestmark = pytest.mark.slow

SPEC = GriddedSpec(
    length=12, variables=("t2m", "msl", "z"), grid=(3, 4), missing=("2020-01-02T00:00:00",)
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = build_store(tmp_path_factory.mktemp("anemoi_sel"), SPEC)
    return shardload.open_store(path), read_reference(path)


def test_variables_picked_in_order_with_a_time_selection(built):
    store, ref = built
    s = shardload.select(store, variables=["z", "t2m"], start="2020-01-01T12", frequency="12h")
    assert s.manifest.arrays["data"].shape == (5, 2, 1, 12)
    assert s.time.missing == (1,)  # 2020-01-02T00, row 4 of the store
    pick = [ref.variables.index(v) for v in ("z", "t2m")]  # anemoi orders its variables
    want = ref.rows[2::2][:, pick]
    got = s.read("data")
    ok = [i for i in range(5) if i != 1]
    np.testing.assert_array_equal(got[ok], want[ok])
    meta = anemoi_metadata(s.manifest)
    assert meta is not None and meta.variables == ("z", "t2m")
    for k, v in ref.statistics.items():
        np.testing.assert_array_equal(meta.statistics[k], np.asarray(v)[pick])
    batch = next(shardload.iter_batches(s, batch_size=8, shuffle=False))
    np.testing.assert_array_equal(batch["index"], ok)
    np.testing.assert_array_equal(batch["data"], want[ok])
    win = next(shardload.iter_batches(s, batch_size=8, shuffle=False, window=2))
    for i, r in enumerate(win["index"].tolist()):
        np.testing.assert_array_equal(win["data"][i], want[r : r + 2])


def test_drop_variables_and_errors(built):
    store, ref = built
    s = shardload.select(store, drop_variables=["msl"])
    kept = [v for v in ref.variables if v != "msl"]
    assert anemoi_metadata(s.manifest).variables == tuple(kept)
    keep = [i for i in range(12) if i not in ref.missing]
    pick = [ref.variables.index(v) for v in kept]
    np.testing.assert_array_equal(s.read("data")[keep], ref.rows[keep][:, pick])
    with pytest.raises(PlanError, match=r"variables=: variable\(s\) \['q'\] not in"):
        shardload.select(store, variables=["q"])
    with pytest.raises(PlanError, match="leave no variable"):
        shardload.select(store, drop_variables=["t2m", "msl", "z"])


def test_concat_of_periods_drops_anemois_statistics(built):
    store, ref = built
    c = shardload.concat(
        shardload.select(store, end="2020-01-01T18"), shardload.select(store, start="2020-01-02T12")
    )
    assert c.time.missing == (4, 5)  # 2020-01-02T00 (missing in the store) and the gap's 06
    keep = [i for i in range(12) if i not in (4, 5)]
    np.testing.assert_array_equal(c.read("data")[keep], ref.rows[keep])
    meta = anemoi_metadata(c.manifest)
    assert meta is not None and meta.statistics == {} and dict(c.manifest.stats) == {}
