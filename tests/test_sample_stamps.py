"""Sample files record the generator that wrote them, and are reused only while it would write
them the same (issue #25: a workspace kept from an older radiation generator, whose targets
were not a function of the inputs, made `make demo` end at the mean predictor's loss)."""

from __future__ import annotations

import logging

import netCDF4
import numpy as np
import pytest

from shardload.cli.app import main
from shardload.samples.stamp import (
    OPTIONS_ATTR,
    SAMPLE_VERSIONS,
    VERSION_ATTR,
    read_stamp,
    why_outdated,
)

RAD_IN, RAD_OUT = "rad4NN_inputs_2020010100_0c0.nc", "3dcorrection_outputs_2020010100_0c0.nc"
# kind -> (small options, the file it writes under --out)
KINDS = {
    "radiation": (["--columns", "32"], RAD_OUT),
    "era5": (["--times", "3", "--grid-deg", "30"], "era5-levels-members.nc"),
    "states": (["--dates", "6", "--lat", "4", "--lon", "8"], "states-6h.nc"),
}


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLOAD_HOME", str(tmp_path / "home"))


def _sample(kind: str, out, *extra: str) -> None:
    assert main(["sample", kind, "--out", str(out), *KINDS[kind][0], *extra]) == 0


def _older(path, how: str) -> None:
    """Make ``path`` look written by an older generator (other values, an old stamp)."""
    with netCDF4.Dataset(path, "a") as ds:
        name = next(n for n, v in ds.variables.items() if v.ndim >= 2)
        ds[name][:] = 0  # the older generator's values
        if how == "absent":
            ds.delncattr(VERSION_ATTR)
        else:
            ds.setncattr(VERSION_ATTR, 0)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_an_up_to_date_sample_is_reused_untouched(kind, tmp_path, caplog, capsys):
    path = tmp_path / KINDS[kind][1]
    _sample(kind, tmp_path)
    stamp = read_stamp(path)
    assert stamp[VERSION_ATTR] == SAMPLE_VERSIONS[kind] and why_outdated(path, kind) is None
    mtime, data = path.stat().st_mtime_ns, path.read_bytes()
    caplog.set_level(logging.INFO)
    _sample(kind, tmp_path)
    assert path.stat().st_mtime_ns == mtime and path.read_bytes() == data
    assert "up to date" in caplog.text
    if kind != "radiation":
        assert "kept (up to date)" in capsys.readouterr().out


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("how", ["absent", "older"])
def test_a_sample_from_an_older_generator_is_regenerated_saying_why(kind, how, tmp_path, caplog):
    path = tmp_path / KINDS[kind][1]
    _sample(kind, tmp_path / "fresh")
    _sample(kind, tmp_path)
    _older(path, how)
    assert why_outdated(path, kind) is not None
    caplog.set_level(logging.INFO)
    _sample(kind, tmp_path)
    why = "records no sample version" if how == "absent" else "generator version 0"
    assert f"regenerating {path.name if kind == 'radiation' else path}: it " in caplog.text
    assert why in caplog.text, caplog.text
    assert why_outdated(path, kind) is None
    # the values are the current generator's again, as in a fresh folder
    with netCDF4.Dataset(path) as got, netCDF4.Dataset(tmp_path / "fresh" / path.name) as want:
        for name, v in want.variables.items():
            np.testing.assert_array_equal(got[name][:], v[:], err_msg=name)


def test_other_options_regenerate_and_the_reason_names_them(tmp_path, caplog):
    _sample("states", tmp_path)
    caplog.set_level(logging.INFO)
    _sample("states", tmp_path, "--seed", "3")
    assert '"seed": 0' in caplog.text and '"seed": 3' in caplog.text
    assert '"seed": 3' in read_stamp(tmp_path / "states-6h.nc")[OPTIONS_ATTR]


def test_both_files_of_a_radiation_pair_are_checked(tmp_path, caplog):
    _sample("radiation", tmp_path)
    _older(tmp_path / RAD_IN, "absent")  # the inputs only: the pair is written again
    caplog.set_level(logging.INFO)
    _sample("radiation", tmp_path)
    assert f"regenerating {RAD_IN}" in caplog.text
    assert why_outdated(tmp_path / RAD_IN, "radiation") is None


def test_a_seismic_cube_is_reused_when_current_and_refused_when_not(tmp_path, caplog):
    import zarr

    cube = tmp_path / "cube.zarr"
    argv = ["sample", "seismic", "--out", str(cube), "--shape", "4", "3", "8"]
    assert main(argv) == 0
    assert why_outdated(cube, "seismic") is None
    assert main(argv) == 0  # up to date: kept (it was refused before stamps)
    assert main([*argv, "--seed", "1"]) == 2  # another cube there: not replaced silently
    assert "--overwrite" in caplog.text and '"seed": 0' in caplog.text
    zarr.open_group(str(cube), mode="r+").attrs.put({})  # a cube from before stamps
    assert main(argv) == 2 and "records no sample version" in caplog.text
    assert main([*argv, "--overwrite"]) == 0 and why_outdated(cube, "seismic") is None


#: Each generator's output at a tiny size, summarised (mean, std of a few variables), with the
#: version it is stamped with. Figures from running the generators on 2026-11-28. If they no
#: longer match, the generator's output changed: bump SAMPLE_VERSIONS[kind] (samples/stamp.py)
#: so that files written before are regenerated, then record the new figures and version here.
FINGERPRINTS = {
    "radiation": (
        2,
        {
            "q": (0.000187101519244429, 0.0003327399290325968),
            "temperature_hl": (231.3034551454627, 18.347445263876743),
            "flux_dn_sw": (1.255549879304928, 2.8227762337801217),
            "flux_up_lw": (-0.69126884192319, 0.7486731737102167),
        },
    ),
    "era5": (
        1,
        {
            "t": (252.14597597576324, 19.865497971251934),
            "z": (31414.379323323566, 19754.297085734033),
        },
    ),
    "states": (
        1,
        {
            "q": (7.872895943621795, 2.8814311960642973),
            "t": (288.08419450124103, 16.268790869590863),
            "z": (5627.010335286458, 38.73434500083789),
        },
    ),
    "seismic": (1, {"amp": (-0.24375168926781043, 0.4973071873941469)}),
}


def _summary(kind: str, tmp_path) -> dict[str, tuple[float, float]]:
    import xarray as xr
    import zarr

    if kind == "seismic":
        from shardload.samples.seismic import write_seismic_sample

        cube = write_seismic_sample(tmp_path / "c.zarr", (4, 3, 8))
        arrays = {"amp": zarr.open_group(str(cube), mode="r")["amp"][:]}
    else:
        _sample(kind, tmp_path)
        arrays = {}
        for f in sorted(tmp_path.glob("*.nc")):
            with xr.open_dataset(f) as ds:
                arrays.update({k: v.values for k, v in ds.data_vars.items()})
    names = FINGERPRINTS[kind][1]
    return {
        k: (float(np.mean(arrays[k], dtype=np.float64)), float(np.std(arrays[k], dtype=np.float64)))
        for k in names
    }


@pytest.mark.parametrize("kind", sorted(FINGERPRINTS))
def test_a_generator_whose_output_changed_has_a_new_version(kind, tmp_path):
    version, want = FINGERPRINTS[kind]
    got = _summary(kind, tmp_path)
    changed = [k for k in want if not np.allclose(got[k], want[k], rtol=1e-5, atol=0)]
    assert not changed, (
        f"the {kind} generator writes other values for {changed} ({got}): bump "
        f"SAMPLE_VERSIONS[{kind!r}] in samples/stamp.py and record the new figures here"
    )
    assert SAMPLE_VERSIONS[kind] == version, (
        f"SAMPLE_VERSIONS[{kind!r}] is {SAMPLE_VERSIONS[kind]}: record its figures here"
    )
