"""GraphView: path graphs over radiation columns, checked against numpy built from raw files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xarray as xr

from shardload.errors import ViewError
from shardload.prep.sources.radiation import open_radiation
from shardload.prep.views.base import View
from shardload.prep.views.graph import GraphView


def _split(files):
    inputs = [f for f in files if f.name.startswith("rad4NN")]
    return inputs, [f for f in files if f.name.startswith("3dcorrection")]


@pytest.fixture(scope="module")
def sample(radiation_sample):
    inputs, outputs = _split(radiation_sample)
    ds = open_radiation(inputs, outputs, chunks=100)
    raws = [xr.load_dataset(f) for f in inputs]
    outs = [xr.load_dataset(f) for f in outputs]
    return ds, raws, outs


def _reference(raws, outs):
    """x, edge_attr, y of every column, built by hand from the raw variables."""
    xs, edges, ys = [], [], []
    for raw, out in zip(raws, outs, strict=True):
        n = raw.sizes["column"]
        x = np.zeros((n, 138, 20), np.float32)
        x[:, :, 0] = raw.temperature_hl.values
        x[:, :, 1] = raw.pressure_hl.values
        for i in range(136):
            x[:, i + 1, 2] = raw.overlap_param.values[:, i]
        sca = np.concatenate(
            [
                raw.skin_temperature.values[:, None],
                raw.cos_solar_zenith_angle.values[:, None],
                raw.sw_albedo.values,
                raw.sw_albedo_direct.values,
                raw.lw_emissivity.values,
                np.full((n, 1), raw.solar_irradiance.values),
            ],
            axis=1,
        )
        x[:, :, 3:] = sca[:, None, :]
        gases = ["q", "o3_mmr", "co2_vmr", "n2o_vmr", "ch4_vmr", "o2_vmr", "cfc11_vmr"]
        gases += ["cfc12_vmr", "hcfc22_vmr", "ccl4_vmr", "cloud_fraction"]
        edge = [raw[g].values[:, :, None] for g in gases]
        edge.append(np.moveaxis(raw.aerosol_mmr.values, 1, 2))
        edge += [raw[g].values[:, :, None] for g in ("q_liquid", "q_ice", "re_liquid", "re_ice")]
        edges.append(np.concatenate(edge, axis=2))
        ys.append(
            np.stack(
                [out[f].values for f in ("flux_dn_sw", "flux_up_sw", "flux_dn_lw", "flux_up_lw")],
                axis=-1,
            )
        )
        xs.append(x)
    return np.concatenate(xs), np.concatenate(edges), np.concatenate(ys)


def test_specs_and_static(sample):
    ds, _, _ = sample
    view = GraphView(ds)
    assert isinstance(view, View)
    assert view.length == 1200
    specs = view.specs
    assert specs["x"].shape == (1200, 138, 20) and specs["x"].dtype == np.float32
    assert specs["x"].features[:4] == (
        "temperature_hl",
        "pressure_hl",
        "overlap_param",
        "skin_temperature",
    )
    assert specs["x"].features[-1] == "solar_irradiance"
    assert specs["edge_attr"].shape == (1200, 137, 27)
    assert specs["edge_attr"].features[11] == "aerosol_mmr_0"
    assert specs["y"].features == ("flux_dn_sw", "flux_up_sw", "flux_dn_lw", "flux_up_lw")
    static = json.loads(json.dumps(view.static))
    edge_index = np.array(static["edge_index"])
    assert edge_index.shape == (2, 274)
    assert static["num_nodes"] == 138 and static["num_undirected_edges"] == 137
    np.testing.assert_array_equal(edge_index[:, 0], [0, 1])
    np.testing.assert_array_equal(edge_index[:, 137], [1, 0])
    np.testing.assert_array_equal(edge_index[:, :137], edge_index[::-1, 137:])
    assert np.all(np.abs(edge_index[0] - edge_index[1]) == 1)


def test_read_matches_numpy_reference(sample):
    ds, raws, outs = sample
    view = GraphView(ds)
    x_ref, e_ref, y_ref = _reference(raws, outs)
    rng = np.random.default_rng(0)
    ranges = [(0, 1), (299, 301), (1199, 1200), (0, 1200), (5, 5)]
    ranges += [tuple(sorted(rng.integers(0, 1201, 2))) for _ in range(6)]
    for start, stop in ranges:
        got = view.read(int(start), int(stop))
        for name, ref in (("x", x_ref), ("edge_attr", e_ref), ("y", y_ref)):
            assert got[name].dtype == np.float32
            assert got[name].shape == (stop - start, *view.specs[name].shape[1:])
            np.testing.assert_array_equal(
                got[name], ref[start:stop], err_msg=f"{name} {start}:{stop}"
            )
    x = view.read(0, 10)["x"]
    assert np.all(x[:, [0, 137], 2] == 0)


def test_real_file_and_stacked_sample_dims(ecrad_inputs, ecrad_outputs):
    ds = open_radiation([ecrad_inputs], [ecrad_outputs], chunks=8)
    flat = GraphView(ds, dtype="float64")
    ref = flat.read(0, 32)
    assert ref["x"].dtype == np.float64
    x_ref, e_ref, y_ref = _reference(
        [xr.load_dataset(ecrad_inputs)], [xr.load_dataset(ecrad_outputs)]
    )
    np.testing.assert_array_equal(ref["x"], x_ref)
    np.testing.assert_array_equal(ref["edge_attr"], e_ref)
    np.testing.assert_array_equal(ref["y"], y_ref)
    # the same 32 columns as (time=4, column=8), with a feature dim stored first
    stacked = ds.assign_coords(
        time=("column", np.repeat(np.arange(4), 8)), col=("column", np.tile(np.arange(8), 4))
    )
    stacked = stacked.set_index(column=["time", "col"]).unstack("column").rename(col="column")
    stacked["col_inputs"] = stacked.col_inputs.transpose("col_feature", ...)
    view = GraphView(stacked, sample_dims=("time", "column"), dtype="float64")
    assert view.length == 32
    for start, stop in [(0, 32), (3, 5), (7, 9), (6, 27), (31, 32)]:
        got = view.read(start, stop)
        for name in ("x", "edge_attr", "y"):
            np.testing.assert_array_equal(got[name], ref[name][start:stop])


def test_inputs_only_has_no_y(ecrad_inputs):
    view = GraphView(open_radiation([ecrad_inputs]))
    assert set(view.specs) == {"x", "edge_attr"} and set(view.read(0, 2)) == {"x", "edge_attr"}


def test_errors(sample):
    ds, _, _ = sample
    with pytest.raises(ViewError, match="col_inputs"):
        GraphView(ds.drop_vars("col_inputs"))
    with pytest.raises(ViewError, match="inter_inputs"):
        GraphView(ds.isel(level_interface=slice(0, 100)))
    with pytest.raises(ViewError, match="sample dim"):
        GraphView(ds, sample_dims=("time",))
    with pytest.raises(ViewError, match="out of range"):
        GraphView(ds).read(0, 5000)
