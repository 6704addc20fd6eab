"""open_radiation: the packed ML view of raw MAELSTROM files, lazily, on real and sample data."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
from dask.callbacks import Callback

from shardload.errors import SourceError
from shardload.prep.sources.radiation import FLUX_VARIABLES, open_radiation

ARRAYS = ("sca_inputs", "col_inputs", "hl_inputs", "inter_inputs", "pressure_hl")


class _CountTasks(Callback):
    def __init__(self):
        super().__init__()
        self.tasks = 0

    def _pretask(self, key, dsk, state):
        self.tasks += 1


def _reference_hr(dn, up, p):
    return -(9.80665 / 1004) * 86400 * np.diff(dn - up, axis=1) / np.diff(p, axis=1)


@pytest.fixture(scope="module")
def real(ecrad_inputs, ecrad_outputs):
    with _CountTasks() as counter:
        ds = open_radiation([ecrad_inputs], [ecrad_outputs], chunks=10)
    assert counter.tasks == 0, "open_radiation computed something eagerly"
    return ds, xr.load_dataset(ecrad_inputs), xr.load_dataset(ecrad_outputs)


def test_real_pair_shapes_dtypes_and_laziness(real):
    ds, _, _ = real
    shapes = {name: ds[name].shape for name in ds.data_vars}
    assert shapes == {
        "sca_inputs": (32, 17),
        "col_inputs": (32, 137, 27),
        "hl_inputs": (32, 138, 2),
        "inter_inputs": (32, 136, 1),
        "pressure_hl": (32, 138, 1),
        **{name: (32, 138) for name in FLUX_VARIABLES},
        "hr_sw": (32, 137),
        "hr_lw": (32, 137),
    }
    for name, var in ds.data_vars.items():
        assert isinstance(var.data, da.Array), name
        assert var.dtype == np.float32, name
    for dropped in ("iseed", "fractional_std", "inv_cloud_effective_size", "lat", "lon"):
        assert dropped not in ds.variables
    assert ds.hr_sw.attrs["units"] == "K d-1"


def test_feature_names_in_packing_order(real):
    ds, _, _ = real
    sca = list(ds.sca_feature.values)
    assert sca[:3] == ["skin_temperature", "cos_solar_zenith_angle", "sw_albedo_0"]
    assert sca[8] == "sw_albedo_direct_0" and sca[14:] == [
        "lw_emissivity_0",
        "lw_emissivity_1",
        "solar_irradiance",
    ]
    col = list(ds.col_feature.values)
    assert col[:11] == [
        "q",
        "o3_mmr",
        "co2_vmr",
        "n2o_vmr",
        "ch4_vmr",
        "o2_vmr",
        "cfc11_vmr",
        "cfc12_vmr",
        "hcfc22_vmr",
        "ccl4_vmr",
        "cloud_fraction",
    ]
    assert col[11:23] == [f"aerosol_mmr_{i}" for i in range(12)]
    assert col[23:] == ["q_liquid", "q_ice", "re_liquid", "re_ice"]
    assert list(ds.hl_feature.values) == ["temperature_hl", "pressure_hl"]
    assert list(ds.inter_feature.values) == ["overlap_param"]


def test_packed_values_equal_raw(real):
    ds, raw, out = real
    with dask.config.set(scheduler="synchronous"):
        v = {name: ds[name].values for name in ds.data_vars}
    np.testing.assert_array_equal(v["sca_inputs"][:, 0], raw.skin_temperature.values)
    np.testing.assert_array_equal(v["sca_inputs"][:, 1], raw.cos_solar_zenith_angle.values)
    np.testing.assert_array_equal(v["sca_inputs"][:, 2:8], raw.sw_albedo.values)
    np.testing.assert_array_equal(v["sca_inputs"][:, 8:14], raw.sw_albedo_direct.values)
    np.testing.assert_array_equal(v["sca_inputs"][:, 14:16], raw.lw_emissivity.values)
    assert np.all(v["sca_inputs"][:, 16] == raw.solar_irradiance.values)
    np.testing.assert_array_equal(v["col_inputs"][:, :, 0], raw.q.values)
    np.testing.assert_array_equal(v["col_inputs"][:, :, 10], raw.cloud_fraction.values)
    np.testing.assert_array_equal(
        v["col_inputs"][:, :, 11:23], raw.aerosol_mmr.values.transpose(0, 2, 1)
    )
    np.testing.assert_array_equal(v["col_inputs"][3, 70, 16], raw.aerosol_mmr.values[3, 5, 70])
    np.testing.assert_array_equal(v["col_inputs"][:, :, 26], raw.re_ice.values)
    np.testing.assert_array_equal(v["hl_inputs"][:, :, 0], raw.temperature_hl.values)
    np.testing.assert_array_equal(v["hl_inputs"][:, :, 1], raw.pressure_hl.values)
    np.testing.assert_array_equal(v["pressure_hl"][:, :, 0], raw.pressure_hl.values)
    np.testing.assert_array_equal(v["inter_inputs"][:, :, 0], raw.overlap_param.values)
    for name in FLUX_VARIABLES:
        np.testing.assert_array_equal(v[name], out[name].values)
    p = raw.pressure_hl.values
    for band in ("sw", "lw"):
        ref = _reference_hr(out[f"flux_dn_{band}"].values, out[f"flux_up_{band}"].values, p)
        np.testing.assert_allclose(v[f"hr_{band}"], ref, rtol=1e-5, atol=1e-5)
    # physics sanity: the shortwave heats a sunlit column's upper atmosphere
    day = raw.cos_solar_zenith_angle.values > 0.3
    assert np.median(v["hr_sw"][day, 20:]) > 0


def test_inputs_only(ecrad_inputs):
    ds = open_radiation([ecrad_inputs])
    assert set(ds.data_vars) == set(ARRAYS)


def test_generated_files_concatenate_along_column(radiation_sample):
    inputs = [f for f in radiation_sample if f.name.startswith("rad4NN")]
    outputs = [f for f in radiation_sample if f.name.startswith("3dcorrection")]
    ds = open_radiation(inputs, outputs, chunks=128)
    assert ds.sizes["column"] == 300 * len(inputs)
    assert isinstance(ds.col_inputs.data, da.Array)
    raws = [xr.load_dataset(f) for f in inputs]
    outs = [xr.load_dataset(f) for f in outputs]
    q = np.concatenate([r.q.values for r in raws])
    np.testing.assert_array_equal(ds.col_inputs[:, :, 0].values, q)
    irradiance = np.concatenate([np.full(300, r.solar_irradiance.values) for r in raws])
    np.testing.assert_array_equal(ds.sca_inputs[:, -1].values, irradiance)
    dn = np.concatenate([o.flux_dn_lw.values for o in outs])
    np.testing.assert_array_equal(ds.flux_dn_lw.values, dn)
    p = np.concatenate([r.pressure_hl.values for r in raws])
    up = np.concatenate([o.flux_up_lw.values for o in outs])
    np.testing.assert_allclose(ds.hr_lw.values, _reference_hr(dn, up, p), rtol=1e-4, atol=1e-6)
    assert np.all(np.isfinite(ds.hr_sw.values))


def test_missing_variable_names_file_and_variable(tmp_path, ecrad_inputs, ecrad_outputs):
    broken = tmp_path / "no_q.nc"
    xr.load_dataset(ecrad_inputs).drop_vars("q").to_netcdf(broken)
    with pytest.raises(SourceError, match=r"no_q\.nc.*'q'"):
        open_radiation([broken], [ecrad_outputs])
    no_flux = tmp_path / "no_flux.nc"
    xr.load_dataset(ecrad_outputs).drop_vars("flux_up_sw").to_netcdf(no_flux)
    with pytest.raises(SourceError, match=r"no_flux\.nc.*flux_up_sw"):
        open_radiation([ecrad_inputs], [no_flux])


def test_column_count_mismatch(radiation_sample, ecrad_inputs):
    outputs = [f for f in radiation_sample if f.name.startswith("3dcorrection")]
    with pytest.raises(SourceError, match="columns"):
        open_radiation([ecrad_inputs], outputs[:1])


def test_pairing_errors(radiation_sample, tmp_path):
    inputs = [f for f in radiation_sample if f.name.startswith("rad4NN")]
    outputs = [f for f in radiation_sample if f.name.startswith("3dcorrection")]
    with pytest.raises(SourceError, match="pair"):
        open_radiation(inputs, outputs[:2])
    with pytest.raises(SourceError, match="another date/step/patch"):
        open_radiation(inputs[:2], outputs[1:3])
    with pytest.raises(SourceError, match="cannot open"):
        open_radiation([tmp_path / "absent.nc"])
    with pytest.raises(SourceError, match="at least one"):
        open_radiation([])
