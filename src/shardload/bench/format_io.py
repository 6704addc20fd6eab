"""Writers and per-sample readers of the array formats ``shardload bench formats`` compares.

Each format is written with its own library the way its documentation shows, in its natural
ragged form for variable-length samples: values + offsets for the npy stack, HDF5 and Zarr,
one file per sample for the npy directory. A reader answers ``read(i) -> 1-D float32 array``
and opens its files lazily in each process (so a DataLoader worker forked from the parent opens
its own handles). Arrow, Parquet and WebDataset live in ``format_columnar``.

Every reader is a plain object holding paths only, so it pickles for any multiprocessing start
method.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from shardload.bench.format_data import DTYPE, BenchData


class LazyReader:
    """Base of the per-sample readers: ``_open()`` runs once per process, on first ``read``."""

    def __init__(self, path: Path, *, mmap: bool | None) -> None:
        self.path = Path(path)
        self.mmap = mmap
        self._pid: int | None = None
        self._handle: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": None, "_handle": None}

    def handle(self) -> Any:
        if self._pid != os.getpid():
            self._handle = self._open()
            self._pid = os.getpid()
        return self._handle

    def _open(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def read(self, i: int) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        """Drop this process's handles (files close with them)."""
        self._handle = None
        self._pid = None


# -- npy directory: one .npy file per sample --------------------------------------------------


def sample_file(folder: Path, i: int) -> Path:
    return folder / f"{i:08d}.npy"


def write_npy_dir(data: BenchData, folder: Path, *, group_rows: int) -> None:
    folder.mkdir(parents=True)
    for i in range(data.num_samples):
        np.save(sample_file(folder, i), data.sample(i))


class NpyDirReader(LazyReader):
    def _open(self) -> None:
        return None

    def read(self, i: int) -> np.ndarray:
        return np.load(sample_file(self.path, i), mmap_mode="r" if self.mmap else None)


# -- npy stack: one (N, L) .npy, or values.npy + offsets.npy ----------------------------------


def write_npy_stack(data: BenchData, folder: Path, *, group_rows: int) -> None:
    folder.mkdir(parents=True)
    if data.fixed_length:
        np.save(folder / "stack.npy", data.stacked())
    else:
        np.save(folder / "values.npy", data.values)
        np.save(folder / "offsets.npy", data.offsets)


def npy_data_offset(path: Path) -> tuple[int, tuple[int, ...], np.dtype]:
    """Byte offset of an ``.npy`` file's data, its shape and dtype (numpy's header reader)."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        if fortran:
            raise ValueError(f"{path}: Fortran-ordered .npy not supported")
        return f.tell(), shape, dtype


class NpyStackReader(LazyReader):
    """mmap on: ``np.load(mmap_mode="r")`` and a slice; off: one ``os.pread`` per sample."""

    def _open(self) -> dict[str, Any]:
        fixed = (self.path / "stack.npy").exists()
        data_path = self.path / ("stack.npy" if fixed else "values.npy")
        h: dict[str, Any] = {"fixed": fixed}
        if not fixed:
            h["offsets"] = np.load(self.path / "offsets.npy")
        if self.mmap:
            h["array"] = np.load(data_path, mmap_mode="r")
        else:
            start, shape, dtype = npy_data_offset(data_path)
            h["fd"] = _FileDescriptor(data_path)
            h["start"], h["dtype"] = start, dtype
            h["row_values"] = shape[1] if fixed else None
        return h

    def read(self, i: int) -> np.ndarray:
        h = self.handle()
        if self.mmap:
            if h["fixed"]:
                return h["array"][i]
            return h["array"][h["offsets"][i] : h["offsets"][i + 1]]
        if h["fixed"]:
            a, b = i * h["row_values"], (i + 1) * h["row_values"]
        else:
            a, b = int(h["offsets"][i]), int(h["offsets"][i + 1])
        item = h["dtype"].itemsize
        buf = os.pread(h["fd"].fd, (b - a) * item, h["start"] + a * item)
        if len(buf) != (b - a) * item:
            raise OSError(f"{self.path}: short read of sample {i}")
        return np.frombuffer(buf, dtype=h["dtype"])


class _FileDescriptor:
    """An ``os.open`` descriptor closed when the reader drops it."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDONLY)

    def __del__(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


# -- HDF5: contiguous (N, L) dataset, or values + offsets --------------------------------------


def write_hdf5(data: BenchData, path: Path, *, group_rows: int) -> None:
    import h5py

    # contiguous and uncompressed: the layout HDF5 can serve through a memory map
    with h5py.File(path, "w") as f:
        if data.fixed_length:
            f.create_dataset("x", data=data.stacked())
        else:
            f.create_dataset("values", data=data.values)
            f.create_dataset("offsets", data=data.offsets)


class Hdf5Reader(LazyReader):
    """mmap off: h5py slicing; on: ``np.memmap`` at the dataset's file offset (contiguous)."""

    def _open(self) -> dict[str, Any]:
        import h5py

        f = h5py.File(self.path, "r")
        fixed = "x" in f
        ds = f["x" if fixed else "values"]
        h: dict[str, Any] = {"file": f, "fixed": fixed, "ds": ds}
        if not fixed:
            h["offsets"] = f["offsets"][()]
        if self.mmap:
            offset = ds.id.get_offset()
            if offset is None:
                raise ValueError(f"{self.path}: dataset {ds.name} is not contiguous, no mmap")
            h["array"] = np.memmap(self.path, ds.dtype, "r", offset=offset, shape=ds.shape)
        return h

    def read(self, i: int) -> np.ndarray:
        h = self.handle()
        src = h["array"] if self.mmap else h["ds"]
        if h["fixed"]:
            return np.asarray(src[i])
        return np.asarray(src[h["offsets"][i] : h["offsets"][i + 1]])

    def close(self) -> None:
        if self._handle is not None and self._pid == os.getpid():
            self._handle["file"].close()
        super().close()


# -- Zarr v3: chunks of one sample, sharded or not, zstd or not --------------------------------


def zarr_writer(*, sharded: bool, zstd: bool):
    """A writer of Zarr v3 arrays with one sample per chunk (fixed) or ``L`` values per chunk
    (variable); sharded: ``group_rows`` samples per shard file."""

    def write(data: BenchData, folder: Path, *, group_rows: int) -> None:
        import zarr
        from zarr.codecs import ZstdCodec

        compressors = [ZstdCodec(level=3)] if zstd else None
        root = zarr.open_group(folder, mode="w", zarr_format=3)
        if data.fixed_length:
            L = data.sample_len
            arr = root.create_array(
                "x",
                shape=(data.num_samples, L),
                chunks=(1, L),
                shards=(group_rows, L) if sharded else None,
                dtype=DTYPE,
                compressors=compressors,
            )
            arr[...] = data.stacked()
        else:
            mean = max(1, round(len(data.values) / data.num_samples))
            values = root.create_array(
                "values",
                shape=data.values.shape,
                chunks=(mean,),
                shards=(mean * group_rows,) if sharded else None,
                dtype=DTYPE,
                compressors=compressors,
            )
            values[...] = data.values
            offsets = root.create_array(
                "offsets", shape=data.offsets.shape, dtype=data.offsets.dtype, compressors=None
            )
            offsets[...] = data.offsets

    return write


class ZarrReader(LazyReader):
    """zarr-python's own slicing (``arr[i]``, ``values[a:b]``); no mmap mode."""

    def _open(self) -> dict[str, Any]:
        import zarr

        root = zarr.open_group(self.path, mode="r")
        if "x" in root:
            return {"fixed": True, "x": root["x"]}
        offsets: Any = root["offsets"]
        return {"fixed": False, "values": root["values"], "offsets": np.asarray(offsets[...])}

    def read(self, i: int) -> np.ndarray:
        h = self.handle()
        if h["fixed"]:
            return h["x"][i]
        return h["values"][int(h["offsets"][i]) : int(h["offsets"][i + 1])]
