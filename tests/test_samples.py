"""The MAELSTROM radiation sample generator: schema, plausibility, reproducibility, streaming."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from shardload.cli.app import main
from shardload.errors import ConfigError
from shardload.samples import radiation as rad
from shardload.samples.radiation import radiation_file_names, write_radiation_sample
from shardload.samples.radiation_fields import generate_inputs, generate_outputs

SCA_MAXIMA = {
    "skin_temperature": 344.121,
    "cos_solar_zenith_angle": 0.99760,
    "solar_irradiance": 1407.193,
}
ALBEDO_MAX = [1, 1, 1, 0.90557, 0.85934, 0.86475]
ALBEDO_DIRECT_MAX = [1, 1, 1, 0.90622, 0.90156, 0.90156]


def _inputs(files):
    return [f for f in files if f.name.startswith("rad4NN_inputs_")]


def _outputs(files):
    return [f for f in files if f.name.startswith("3dcorrection_outputs_")]


def test_file_names_and_order(radiation_sample):
    names = [f.name for f in radiation_sample]
    assert names[:2] == list(radiation_file_names("20200101", 0, 0))
    assert names[-1] == "3dcorrection_outputs_2020010100_125c7.nc"
    assert len(names) == 8 and all(f.exists() for f in radiation_sample)
    folder = radiation_sample[0].parent
    assert not [p for p in folder.iterdir() if p.name.endswith(".partial")]


def test_input_schema_matches_real_file(radiation_sample, ecrad_inputs):
    real = xr.open_dataset(ecrad_inputs, decode_cf=False)
    with xr.open_dataset(_inputs(radiation_sample)[0], decode_cf=False) as ours:
        assert list(ours.data_vars) == list(real.data_vars)
        for name, var in real.variables.items():
            mine = ours[name]
            assert mine.dims == var.dims, name
            assert mine.dtype == var.dtype, name
            assert mine.attrs == var.attrs, name
        assert {k: v for k, v in ours.sizes.items() if k != "column"} == {
            k: v for k, v in real.sizes.items() if k != "column"
        }
        assert ours.sizes["column"] == 300
        assert {"title", "history", "comment"} <= set(ours.attrs)
        assert ours.attrs["title"] == real.attrs["title"]


def test_output_schema_matches_real_fluxes(radiation_sample, ecrad_outputs):
    real = xr.open_dataset(ecrad_outputs, decode_cf=False)
    with xr.open_dataset(_outputs(radiation_sample)[0], decode_cf=False) as ours:
        assert set(ours.data_vars) == {
            "pressure_hl",
            "flux_dn_sw",
            "flux_up_sw",
            "flux_dn_lw",
            "flux_up_lw",
        }
        for name, var in ours.variables.items():
            assert var.dims == real[name].dims and var.dtype == np.float32, name
            for key in ("long_name", "units"):
                assert var.attrs[key] == real[name].attrs[key], (name, key)
        assert ours.pressure_hl.attrs == real.pressure_hl.attrs
        assert "SPARTACUS minus Tripleclouds" in ours.attrs["comment"]


@pytest.fixture(scope="module")
def fields():
    """Inputs and outputs of every patch, generated in memory."""
    parts = []
    for patch in range(16):
        rng = np.random.default_rng(patch)
        inputs = generate_inputs(rng, 500, date="20200101", timestep=250, patch=patch)
        parts.append((inputs, generate_outputs(rng, inputs)))
    cat = {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0] if parts[0][0][k].ndim}
    cat["solar_irradiance"] = parts[0][0]["solar_irradiance"]
    out = {k: np.concatenate([p[1][k] for p in parts]) for k in parts[0][1]}
    return cat, out


def test_values_are_plausible(fields):
    f, _ = fields
    p = f["pressure_hl"]
    assert np.all(p[:, 0] == 0) and np.all(np.diff(p, axis=1) > 0)
    assert 80_000 < np.median(p[:, -1]) < 105_000 and p.max() <= 107193.5
    t = f["temperature_hl"]
    assert t.min() >= 180 and t.max() <= 330.898
    night = f["cos_solar_zenith_angle"] == 0
    assert 0.35 < night.mean() < 0.65
    assert (f["cloud_fraction"] == 0).mean() > 0.8 and f["cloud_fraction"].max() <= 1
    for name, top in SCA_MAXIMA.items():
        assert f[name].max() <= top, name
    assert np.all(f["sw_albedo"] <= np.float32(ALBEDO_MAX)) and f["sw_albedo"].min() > 0
    assert np.all(f["sw_albedo_direct"] <= np.float32(ALBEDO_DIRECT_MAX))
    assert f["lw_emissivity"].max() <= 0.99 and f["lw_emissivity"].min() >= 0.9
    assert f["overlap_param"].min() >= 0 and f["overlap_param"].max() <= 0.993204
    assert 1e-5 < f["q"].max() < 0.03 and f["q"].min() > 0
    assert f["aerosol_mmr"].min() >= 0 and f["aerosol_mmr"].max() < 1e-6
    for name, value in f.items():
        assert np.all(np.isfinite(value)), name


def test_outputs_are_small_differences(fields):
    f, out = fields
    for name in ("flux_dn_sw", "flux_up_sw", "flux_dn_lw", "flux_up_lw"):
        v = out[name]
        assert v.dtype == np.float32 and v.shape == f["pressure_hl"].shape
        assert np.abs(v).max() > 0.1 and np.abs(v).max() < 100, name
    night = f["cos_solar_zenith_angle"] == 0
    assert np.all(out["flux_dn_sw"][night] == 0) and np.all(out["flux_up_sw"][night] == 0)
    clear = f["cloud_fraction"].max(axis=1) == 0
    assert np.all(out["flux_dn_lw"][clear] == 0)
    np.testing.assert_array_equal(out["pressure_hl"], f["pressure_hl"])


def test_same_seed_same_bytes_whatever_the_block(tmp_path):
    a = write_radiation_sample(tmp_path / "a", columns=700, timesteps=(125,), patches=(3,))
    b = write_radiation_sample(
        tmp_path / "b", columns=700, timesteps=(125,), patches=(3,), block_columns=256
    )
    for x, y in zip(a, b, strict=True):
        assert x.read_bytes() == y.read_bytes()


def test_seed_timestep_and_patch_change_the_data(tmp_path):
    def q(**kw):
        files = write_radiation_sample(
            tmp_path / str(len(list(tmp_path.iterdir()))), columns=64, **kw
        )
        with xr.open_dataset(files[0]) as ds:
            return ds.q.values

    base = q(seed=1)
    assert not np.array_equal(base, q(seed=2))
    assert not np.array_equal(base, q(seed=1, timesteps=(125,)))
    assert not np.array_equal(base, q(seed=1, patches=(1,)))
    np.testing.assert_array_equal(base, q(seed=1))


def test_writes_block_by_block(tmp_path, monkeypatch):
    sizes = []
    original = rad._write_block

    def spy(ds, values, start):
        sizes.append(values["pressure_hl"].shape[0])
        original(ds, values, start)

    monkeypatch.setattr(rad, "_write_block", spy)
    write_radiation_sample(tmp_path, columns=1100, block_columns=512)
    assert sizes == [512, 512, 512, 512, 76, 76]  # inputs and outputs per block


def test_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    calls = []

    def broken(rng, inputs):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return generate_outputs(rng, inputs)

    monkeypatch.setattr(rad, "generate_outputs", broken)
    with pytest.raises(KeyboardInterrupt):
        write_radiation_sample(tmp_path, columns=600, block_columns=256)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timesteps": (100,)}, "timesteps"),
        ({"patches": (16,)}, "patches"),
        ({"date": "2020-01-01"}, "date"),
        ({"columns": 0}, "columns"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        write_radiation_sample(tmp_path, **kwargs)


def test_cli(tmp_path, capsys):
    out = tmp_path / "raw"
    argv = ["sample", "radiation", "--out", str(out), "--columns", "50", "--patches", "1", "2"]
    assert main([*argv, "--timesteps", "0", "3500", "--seed", "4", "--date", "20210615"]) == 0
    assert len(list(out.glob("rad4NN_inputs_2021061500_*c*.nc"))) == 4
    assert (out / "3dcorrection_outputs_2021061500_3500c2.nc").exists()
    with pytest.raises(SystemExit):
        main(["sample", "radiation", "--help"])
    assert "3dcorrection_outputs" in capsys.readouterr().out
    assert main(["sample", "radiation", "--out", str(out), "--timesteps", "7"]) == 2


def test_outputs_are_a_function_of_the_inputs():
    """The targets are learnable: the same input columns give the same fluxes, whatever the
    random stream (they once carried a random per-column sign and size)."""
    inputs = generate_inputs(np.random.default_rng(1), 300, date="20200101", timestep=0, patch=5)
    a = generate_outputs(np.random.default_rng(2), inputs)
    b = generate_outputs(np.random.default_rng(3), inputs)
    for name in ("flux_dn_sw", "flux_up_sw", "flux_dn_lw", "flux_up_lw"):
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        assert np.abs(a[name]).max() > 0, name
