"""SEG-Y sources (segyio, extra ``segy``): compute and prepare read them window by window."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.errors import MissingDependencyError, SourceError

segyio = pytest.importorskip("segyio")
da = pytest.importorskip("dask.array")

F3 = Path(__file__).parent / "data" / "segy" / "f3.sgy"  # real data (tests/data/segy/README.md)


def dask_overlap(x: np.ndarray, chunks: Any, func: Any, depth: Any, boundary: Any) -> np.ndarray:
    from shardload.blockwise.plan import normalize_chunks

    d = da.from_array(x, chunks=normalize_chunks(chunks, x.shape))
    return da.map_overlap(
        func, d, depth=depth, boundary=boundary, trim=True, dtype=x.dtype
    ).compute(scheduler="sync")


def write_segy(path: Path, cube: np.ndarray, *, sorting: str = "inline") -> Path:
    """The cube as an IEEE-float SEG-Y file written by segyio (inline numbers from 100,
    crossline numbers from 20, 4 ms); crossline-sorted: traces ordered crossline-major."""
    ni, nx, ns = cube.shape
    spec = segyio.spec()
    spec.format = 5  # 4-byte IEEE float: bit-exact float32
    spec.samples = list(range(ns))
    spec.ilines = list(range(100, 100 + ni))
    spec.xlines = list(range(20, 20 + nx))
    spec.sorting = 2 if sorting == "inline" else 1
    with segyio.create(str(path), spec) as f:
        order = [(i, x) for i in range(ni) for x in range(nx)]
        if sorting != "inline":
            order = [(i, x) for x in range(nx) for i in range(ni)]
        for t, (i, x) in enumerate(order):
            f.header[t] = {
                segyio.TraceField.INLINE_3D: 100 + i,
                segyio.TraceField.CROSSLINE_3D: 20 + x,
                segyio.TraceField.TRACE_SAMPLE_INTERVAL: 4000,
                segyio.TraceField.TRACE_SAMPLE_COUNT: ns,
            }
            f.trace[t] = np.ascontiguousarray(cube[i, x])
        f.bin.update(hdt=4000, hns=ns, tsort=spec.sorting)
    return path


@pytest.fixture(scope="module")
def seismic() -> np.ndarray:
    from shardload.samples.seismic import draw_model, seismic_inlines

    model = draw_model((10, 7, 40), seed=2, faults=2)
    return seismic_inlines(model, 0, 10, seed=2, noise=0.05).astype(np.float32)


@pytest.mark.parametrize("sorting", ["inline", "crossline"])
def test_compute_on_segy_from_the_generator_is_bit_identical_to_dask(
    tmp_path: Path, seismic: np.ndarray, sorting: str
) -> None:
    path = write_segy(tmp_path / "cube.sgy", seismic, sorting=sorting)
    with segyio.open(str(path)) as f:  # segyio's cube is (slowest, fastest, sample) lines
        on_disk = segyio.tools.cube(f)
        assert np.array_equal(on_disk if sorting == "inline" else on_disk.swapaxes(0, 1), seismic)
    from compute_funcs import block_position

    depth = {0: 2, 1: 1, 2: 3}
    m = shardload.compute(
        {
            "source": {"paths": [str(path)]},  # variable: the volume, 'data'
            "attributes": {
                "a": {
                    "function": "compute_funcs:block_position",
                    "depth": depth,
                    "boundary": "periodic",
                },
            },
            "chunks": {0: 4, 1: 3},  # divides neither axis
            "out": str(tmp_path / "attrs"),
            "execution": {"scheduler": "threads", "num_workers": 2},
        }
    )
    assert m.arrays["a"].attrs["dims"] == ["inline", "crossline", "sample"]
    got = shardload.open_store(str(tmp_path / "attrs")).read("a", 0, 10)
    ref = dask_overlap(seismic, {0: 4, 1: 3}, block_position, depth, "periodic")
    assert got.tobytes() == ref.tobytes()


def test_compute_on_a_real_segy_file(tmp_path: Path) -> None:
    """f3.sgy: a crop of the F3 survey, 2-byte integers (format 3), read lazily per window."""
    with segyio.open(str(F3)) as f:
        cube = segyio.tools.cube(f)
    assert cube.shape == (23, 18, 75) and cube.dtype == np.int16
    from compute_funcs import box

    m = shardload.compute(
        {
            "source": {"paths": [str(F3)], "variable": "data"},
            "attributes": {
                "b": {"function": "compute_funcs:box", "depth": 1, "boundary": "reflect"},
                "env": {"function": "shardload.attributes:envelope", "dtype": "float64"},
            },
            "chunks": {0: 5},
            "out": str(tmp_path / "attrs"),
            "execution": {"scheduler": "sync"},
        }
    )
    store = shardload.open_store(str(tmp_path / "attrs"))
    ref = dask_overlap(cube, {0: 5}, box, 1, "reflect")
    assert store.read("b", 0, 23).tobytes() == ref.tobytes()
    env = store.read("env", 0, 23)
    assert env.dtype == np.float64 and env.shape == cube.shape and (env >= 0).all()
    assert m.stats["b"].count == cube.size


def test_source_chunks_of_a_segy_file_are_blocks_of_whole_inlines(tmp_path: Path) -> None:
    from shardload.blockwise.source import SourceArray
    from shardload.prep.config import SourceConfig

    src = SourceArray(SourceConfig(paths=(str(F3),)), "data")
    assert src.info.dims == ("inline", "crossline", "sample")
    assert src.info.chunks == ((23,), (18,), (75,))  # 23 inlines fit in one 32 MiB block
    with segyio.open(str(F3)) as f:
        cube = segyio.tools.cube(f)
    assert np.array_equal(src.read([(3, 9), (2, 17), (10, 70)]), cube[3:9, 2:17, 10:70])


@pytest.mark.filterwarnings("ignore:Object at:UserWarning")
def test_prepare_takes_a_segy_file(tmp_path: Path, seismic: np.ndarray) -> None:
    path = write_segy(tmp_path / "cube.sgy", seismic)
    st = shardload.prepare(
        {
            "source": {"paths": [str(path)], "variables": ["data"]},
            "sample_dims": ["inline"],
            "arrays": {"x": ["data"]},
            "target_chunk_bytes": 4 * 7 * 40 * 4,  # 4 inlines a chunk
            "out": str(tmp_path / "prepared"),
            "splits": None,
            "execution": {"scheduler": "threads", "num_workers": 2},
        }
    )
    x = st.read("x", 0, 10)
    assert x.shape == (10, 7 * 40)
    np.testing.assert_array_equal(x, seismic.reshape(10, -1))


def test_segy_refusals(tmp_path: Path, seismic: np.ndarray, monkeypatch: Any) -> None:
    path = write_segy(tmp_path / "cube.sgy", seismic)
    cfg = {
        "source": {"paths": [str(path)], "variable": "amp"},
        "attributes": {"a": "compute_funcs:box"},
        "out": str(tmp_path / "attrs"),
        "execution": {"scheduler": "sync"},
    }
    with pytest.raises(SourceError, match=r"source\.variable.*'amp'.*SEG-Y.*'data'"):
        shardload.compute(cfg)
    cfg["source"] = {"paths": [str(path), str(F3)]}
    with pytest.raises(SourceError, match=r"a SEG-Y source is one file; got 2"):
        shardload.compute(cfg)
    cfg["source"] = {"paths": [str(path)], "open_kwargs": {"consolidated": False}}
    with pytest.raises(SourceError, match=r"open_kwargs \['consolidated'\].*SEG-Y"):
        shardload.compute(cfg)
    # headers with no inline/crossline numbers: no geometry
    with segyio.open(str(path), "r+") as f:
        for t in range(f.tracecount):
            f.header[t] = {segyio.TraceField.INLINE_3D: 0, segyio.TraceField.CROSSLINE_3D: 0}
    cfg["source"] = {"paths": [str(path)]}
    with pytest.raises(SourceError, match=r"cannot open SEG-Y file .*cube\.sgy.*iline"):
        shardload.compute(cfg)
    # without segyio: the extra is named
    monkeypatch.setitem(sys.modules, "segyio", None)
    with pytest.raises(MissingDependencyError, match=r"shardload\[segy\]"):
        shardload.compute(cfg)
    assert not (tmp_path / "attrs").exists()


def test_cli_sample_seismic_writes_segy(tmp_path: Path) -> None:
    """`shardload sample seismic --out cube.sgy`: the generator's cube through segyio."""
    from shardload.cli.app import main
    from shardload.samples.seismic import write_seismic_sample

    out = tmp_path / "cube.sgy"
    assert (
        main(
            [
                "sample",
                "seismic",
                "--out",
                str(out),
                "--shape",
                "6",
                "4",
                "30",
                "--chunk-inlines",
                "4",
                "--seed",
                "5",
            ]
        )
        == 0
    )
    z = write_seismic_sample(tmp_path / "cube.zarr", (6, 4, 30), seed=5)
    ref = zarr_open(z)
    with segyio.open(str(out)) as f:
        assert np.array_equal(segyio.tools.cube(f), ref)
        assert list(f.samples[:2]) == [0.0, 4.0]
    m = shardload.compute(
        {
            "source": {"paths": [str(out)]},
            "attributes": {"e": "shardload.attributes:envelope"},
            "out": str(tmp_path / "attrs"),
            "execution": {"scheduler": "sync"},
        }
    )
    assert m.length == 6


def zarr_open(path: Path) -> np.ndarray:
    import zarr

    return np.asarray(zarr.open_group(str(path), mode="r")["amp"][...])
