"""``shardload sample seismic``: streamed block by block, independent of the block size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.samples.seismic import draw_model, ricker, seismic_inlines, write_seismic_sample

zarr = pytest.importorskip("zarr")


def test_cube_does_not_depend_on_block_size(tmp_path: Path) -> None:
    a = write_seismic_sample(tmp_path / "a.zarr", (10, 6, 50), seed=3, chunk_inlines=4)
    b = write_seismic_sample(tmp_path / "b.zarr", (10, 6, 50), seed=3, chunk_inlines=10)
    xa = zarr.open_group(str(a), mode="r")["amp"][...]
    xb = zarr.open_group(str(b), mode="r")["amp"][...]
    assert xa.dtype == np.float32 and xa.shape == (10, 6, 50)
    np.testing.assert_allclose(xa, xb, rtol=0, atol=1e-6)
    assert np.abs(xa).max() > 0.1  # reflections, not only noise
    assert not (tmp_path / "a.zarr.partial").exists()


def test_traces_are_reflectivity_convolved_with_ricker() -> None:
    model = draw_model((3, 4, 80), seed=1, faults=2)
    got = seismic_inlines(model, 0, 3, seed=1, noise=0.0)
    w = ricker(25.0, 0.004)
    assert w[len(w) // 2] == 1.0 and np.isclose(w.sum(), 0, atol=0.05)
    # recompute one trace by direct convolution of its spikes
    spikes = np.zeros(80)
    i, j = 1, 2
    for d, c, (di, dj), (amp, li, lj) in zip(
        model.depths, model.coefs, model.dips, model.folds, strict=True
    ):
        shift = sum(t for cos, sin, off, t in model.faults if i * cos + j * sin > off)
        z = int(
            np.rint(
                d
                + di * i
                + dj * j
                + amp * np.sin(2 * np.pi * i / li) * np.cos(2 * np.pi * j / lj)
                + shift
            )
        )
        if 0 <= z < 80:
            spikes[z] += c
    ref = np.convolve(spikes, w, mode="same")
    np.testing.assert_allclose(got[i, j], ref, atol=1e-5)


def test_cli_sample_seismic_then_compute(tmp_path: Path) -> None:
    from shardload.cli.app import main

    cube = tmp_path / "cube.zarr"
    assert (
        main(
            [
                "sample",
                "seismic",
                "--out",
                str(cube),
                "--shape",
                "8",
                "5",
                "40",
                "--chunk-inlines",
                "4",
            ]
        )
        == 0
    )
    m = shardload.compute(
        {
            "source": {"paths": [str(cube)], "variable": "amp"},
            "attributes": {"env": {"function": "shardload.attributes:envelope", "axis": -1}},
            "out": str(tmp_path / "attrs"),
            "execution": {"scheduler": "sync"},
        }
    )
    assert m.length == 8 and m.chunk_bounds == (0, 4, 8)
    env = shardload.open_store(str(tmp_path / "attrs")).read("env", 0, 8)
    assert (env >= 0).all() and env.shape == (8, 5, 40)


@pytest.mark.filterwarnings("ignore:Object at:UserWarning")  # zarr: the manifest files
def test_prepare_takes_the_attributes_store_as_source(tmp_path: Path) -> None:
    cube = write_seismic_sample(tmp_path / "cube.zarr", (8, 3, 20), chunk_inlines=4)
    shardload.compute(
        {
            "source": {"paths": [str(cube)], "variable": "amp"},
            "attributes": {
                "env": "shardload.attributes:envelope",
                "rms": {
                    "function": "shardload.attributes:rms_amplitude",
                    "window": 3,
                    "depth": {2: 1},
                },
            },
            "out": str(tmp_path / "attrs"),
            "execution": {"scheduler": "sync"},
        }
    )
    attrs = shardload.open_store(str(tmp_path / "attrs"))
    st = shardload.prepare(
        {
            "source": {"paths": [str(tmp_path / "attrs")], "open_kwargs": {"consolidated": False}},
            "sample_dims": ["inline"],  # the source's dims, kept by the compute store
            "arrays": {"x": ["env", "rms"]},
            "out": str(tmp_path / "prepared"),
            "splits": None,
            "execution": {"scheduler": "sync"},
        }
    )
    x = st.read("x", 0, 8)
    assert x.shape == (8, 2 * 3 * 20)
    np.testing.assert_array_equal(x[:, : 3 * 20], attrs.read("env", 0, 8).reshape(8, -1))
    # traces as samples: (inline, crossline) stacked into the sample axis
    st = shardload.prepare(
        {
            "source": {"paths": [str(tmp_path / "attrs")], "open_kwargs": {"consolidated": False}},
            "sample_dims": ["inline", "crossline"],
            "arrays": {"trace": ["env"]},
            "out": str(tmp_path / "traces"),
            "splits": None,
            "execution": {"scheduler": "sync"},
        }
    )
    t = st.read("trace", 0, 8 * 3)
    np.testing.assert_array_equal(t, attrs.read("env", 0, 8).reshape(8 * 3, 20))


def _attrs_store(tmp_path: Path) -> Path:
    cube = write_seismic_sample(tmp_path / "cube.zarr", (8, 3, 20), chunk_inlines=3)
    shardload.compute(
        {
            "source": {"paths": [str(cube)], "variable": "amp"},
            "attributes": {
                "env": "shardload.attributes:envelope",
                "grad": {"function": "shardload.attributes:gradient_magnitude", "depth": 1},
            },
            "out": str(tmp_path / "attrs"),
            "execution": {"scheduler": "threads", "num_workers": 2},
        }
    )
    return tmp_path / "attrs"


def test_compute_store_carries_checksums_and_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checksums per chunk, as prepared stores: `shardload verify` and verify='always' catch a
    flipped bit in a chunk file."""
    from shardload.cli.app import main
    from shardload.errors import ShardloadError

    root = _attrs_store(tmp_path)
    store = shardload.open_store(str(root))
    assert store.manifest.checksums == "xxh3_64" and (root / "checksums.npz").exists()
    assert main(["verify", str(root)]) == 0
    assert "all good" in capsys.readouterr().out
    chunk = sorted(p for p in (root / "grad").rglob("*") if p.is_file() and "zarr" not in p.name)[1]
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    chunk.write_bytes(bytes(raw))
    assert main(["verify", str(root)]) == 1
    out = capsys.readouterr().out
    bad = [ln for ln in out.splitlines() if ln.startswith("BAD")]
    assert len(bad) == 1 and str(chunk) in bad[0], out
    with pytest.raises(ShardloadError, match=r"corrupt|checksum"):
        shardload.open_store(str(root), verify="always").read("grad", 0, 8)


@pytest.mark.filterwarnings("ignore:Object at:UserWarning")  # zarr: the manifest files
def test_compute_store_keeps_the_source_dims(tmp_path: Path) -> None:
    root = _attrs_store(tmp_path)
    store = shardload.open_store(str(root))
    ds = store.to_xarray()
    assert ds["env"].dims == ("inline", "crossline", "time")
    assert ds["grad"].dims == ("inline", "crossline", "time")
    np.testing.assert_array_equal(ds["env"].values, store.read("env", 0, 8))
    xr = pytest.importorskip("xarray")
    with xr.open_zarr(str(root), consolidated=False) as z:  # the Zarr dimension_names too
        assert z["grad"].dims == ("inline", "crossline", "time")
    st = store.manifest.stats["env"]
    assert st.count == 8 * 3 * 20 and np.min(st.min) >= 0 and np.isfinite(st.std).all()
