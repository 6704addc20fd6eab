"""RadiationRows (rows read straight from raw files) equals the xarray/dask packing exactly."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from shardload.errors import SourceError
from shardload.prep.sources.radiation import open_radiation
from shardload.prep.sources.radiation_rows import NAMES, radiation_rows


def _pairs(files):
    inputs = sorted(p for p in files if p.name.startswith("rad4NN_inputs"))
    outputs = sorted(p for p in files if p.name.startswith("3dcorrection_outputs"))
    return inputs, outputs


def _check_equal(rows, lazy, start, stop, names=NAMES):
    got = rows.read_rows(list(names), start, stop)
    for name in names:
        want = lazy[name].isel(column=slice(start, stop)).values
        assert got[name].dtype == np.float32
        np.testing.assert_array_equal(got[name], want, err_msg=f"{name} rows {start}:{stop}")


def test_generated_files_equal_lazy_packing_across_file_boundaries(radiation_sample):
    inputs, outputs = _pairs(radiation_sample)
    lazy = open_radiation(inputs, outputs)
    rows = radiation_rows(inputs, outputs, lazy)
    assert rows is not None and rows.length == lazy.sizes["column"]
    per_file = rows.offsets[1] - rows.offsets[0]
    _check_equal(rows, lazy, 0, 7)
    _check_equal(rows, lazy, int(per_file) - 5, int(per_file) + 9)  # straddles two files
    _check_equal(rows, lazy, rows.length - 3, rows.length)
    _check_equal(rows, lazy, 3, 3)  # empty


def test_real_netcdf3_file_goes_through_xarray_decoding(ecrad_inputs, ecrad_outputs):
    lazy = open_radiation([ecrad_inputs], [ecrad_outputs])
    rows = radiation_rows([ecrad_inputs], [ecrad_outputs], lazy)
    assert rows is not None
    _check_equal(rows, lazy, 0, 32)
    _check_equal(rows, lazy, 5, 6, names=("hr_sw", "sca_inputs"))


def test_cf_encoded_variable_is_decoded_like_xarray(tmp_path, radiation_sample):
    inputs, outputs = _pairs(radiation_sample)
    raw = xr.load_dataset(inputs[0])
    packed = tmp_path / "rad4NN_inputs_2020010100_0c0.nc"
    enc = {"q": {"dtype": "int16", "scale_factor": 1e-6, "add_offset": 0.01, "_FillValue": -32768}}
    raw.to_netcdf(packed, engine="h5netcdf", encoding=enc)
    lazy = open_radiation([packed], outputs[:1])
    rows = radiation_rows([packed], outputs[:1], lazy)
    _check_equal(rows, lazy, 2, 40, names=("col_inputs", "hr_lw"))


def test_bad_requests_name_the_problem(radiation_sample):
    inputs, outputs = _pairs(radiation_sample)
    lazy = open_radiation(inputs, outputs)
    rows = radiation_rows(inputs, outputs, lazy)
    with pytest.raises(SourceError, match="out of range"):
        rows.read_rows(["sca_inputs"], 0, rows.length + 1)
    with pytest.raises(SourceError, match="cannot read"):
        rows.read_rows(["t2m"], 0, 1)
    only_inputs = radiation_rows(inputs, None, open_radiation(inputs))
    with pytest.raises(SourceError, match="need output files"):
        only_inputs.read_rows(["hr_sw"], 0, 2)


def test_urls_and_other_shapes_fall_back_to_dask(radiation_sample):
    inputs, outputs = _pairs(radiation_sample)
    lazy = open_radiation(inputs, outputs)
    assert radiation_rows(["http://127.0.0.1:1/a.nc"], None, lazy) is None
    assert radiation_rows(inputs, outputs, lazy.isel(level=slice(0, 10))) is None


@pytest.mark.parametrize("view", ["flat", "graph"])
def test_views_read_the_same_with_and_without_the_row_reader(radiation_sample, view):
    from shardload.prep.config import load_config
    from shardload.prep.tasks import build
    from shardload.prep.views import build_view

    inputs, outputs = _pairs(radiation_sample)
    conf = {
        "source": {
            "kind": "radiation",
            "paths": [str(p) for p in inputs],
            "outputs": [str(p) for p in outputs],
        },
        "sample_dims": ["column"],
        "view": view,
        "out": "unused",
        **(
            {
                "arrays": {
                    "x": ["sca_inputs", "col_inputs", "hl_inputs", "inter_inputs"],
                    "y": ["flux_up_sw", "hr_sw", "hr_lw"],
                }
            }
            if view == "flat"
            else {}
        ),
    }
    cfg = load_config(conf)
    fast = build(cfg)
    assert fast.rows is not None
    slow = build_view(open_radiation(inputs, outputs), cfg)
    assert slow.rows is None
    for a, b in [(0, 17), (290, 610), (1190, 1200)]:
        got, want = fast.read(a, b), slow.read(a, b)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{view} {k} {a}:{b}")
