"""SEG-Y input through segyio (extra ``segy``): a post-stack 3-D volume read window by window.

A SEG-Y file is a sequence of traces (one per inline/crossline pair, each ``samples`` long).
segyio infers the geometry from the trace headers (inline and crossline numbers at bytes 189
and 193 unless ``source.open_kwargs`` says ``iline:``/``xline:``); the volume is then the array
``(inline, crossline, sample)``, variable ``data``, with the header numbers (``inline``,
``crossline``) and the sample times/depths (``sample``) as coordinates.

Nothing is loaded when the file is opened: :meth:`SegyVolume.read` reads one window as a few
ranges of consecutive traces (``f.trace.raw[a:b]``: one range per inline of the window in an
inline-sorted file, one per crossline in a crossline-sorted one). ``compute`` reads its windows
this way directly; ``prepare`` gets the same reads through a lazy xarray Dataset (one dask
chunk per block of inlines).

Refused, with a SourceError naming the file: files whose geometry segyio cannot infer
(unsorted, missing traces), pre-stack files (several offsets), several SEG-Y files at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardload.errors import SourceError, require

SEGY_SUFFIXES = (".sgy", ".segy")
#: The name of the volume's variable.
VARIABLE = "data"
DIMS = ("inline", "crossline", "sample")
#: Options of ``segyio.open`` a config may pass through ``source.open_kwargs``.
OPEN_OPTIONS = ("iline", "xline", "endian", "strict")
#: A block of the volume's "own" chunking holds about this many bytes (whole inlines).
BLOCK_BYTES = 32 * 2**20


def is_segy(path: str) -> bool:
    """By name (``.sgy``/``.segy``)."""
    return str(path).lower().rstrip("/").endswith(SEGY_SUFFIXES)


class SegyVolume:
    """A post-stack SEG-Y file as a read-only 3-D array; picklable (path and options only),
    one segyio handle per thread opened on first use."""

    def __init__(self, path: str, options: dict[str, Any] | None = None) -> None:
        segyio = require("segyio", "segy")
        self.path = os.fspath(path)
        opts = dict(options or {})
        bad = sorted(set(opts) - set(OPEN_OPTIONS))
        if bad:
            raise SourceError(
                f"source.open_kwargs {bad} are not options of a SEG-Y source {self.path}; "
                f"known: {list(OPEN_OPTIONS)}"
            )
        self.options = opts
        if not os.path.isfile(self.path):
            raise SourceError(f"input file not found: {self.path}")
        try:
            f = segyio.open(self.path, "r", **opts)
        except Exception as exc:  # segyio raises RuntimeError/ValueError/OSError
            raise SourceError(
                f"cannot open SEG-Y file {self.path} as a 3-D post-stack volume: {exc}. "
                "If its inline/crossline numbers are not at trace header bytes 189/193, give "
                "them as source.open_kwargs: {iline: BYTE, xline: BYTE}"
            ) from exc
        with f:
            if f.unstructured:
                raise SourceError(
                    f"SEG-Y file {self.path}: segyio cannot infer an inline/crossline geometry "
                    "(traces unsorted or missing); only regular post-stack volumes are read"
                )
            if len(f.offsets) != 1:
                raise SourceError(
                    f"SEG-Y file {self.path} is pre-stack ({len(f.offsets)} offsets); only "
                    "post-stack volumes (one offset) are read"
                )
            self.inline_sorted = f.sorting == segyio.TraceSortingFormat.INLINE_SORTING
            self.ilines = np.asarray(f.ilines).copy()
            self.xlines = np.asarray(f.xlines).copy()
            self.samples = np.asarray(f.samples, dtype=np.float64).copy()
            self.dtype = np.dtype(f.dtype)
            self.format = str(f.format)
        self.shape = (len(self.ilines), len(self.xlines), len(self.samples))
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_local"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    @property
    def ndim(self) -> int:
        return 3

    def block_inlines(self) -> int:
        """Inlines per block of the volume's own chunking (about :data:`BLOCK_BYTES`)."""
        inline_bytes = self.shape[1] * self.shape[2] * self.dtype.itemsize
        return max(1, min(self.shape[0], BLOCK_BYTES // max(inline_bytes, 1)))

    def _handle(self) -> Any:
        f = getattr(self._local, "f", None)
        if f is None:
            segyio = require("segyio", "segy")
            f = self._local.f = segyio.open(self.path, "r", **self.options)
        return f

    def read(self, box: Sequence[tuple[int, int]]) -> np.ndarray:
        """The window ``box`` (``(start, stop)`` per axis, array indices) as a new array."""
        (i0, i1), (x0, x1), (s0, s1) = box
        ni, nx, _ = self.shape
        out = np.empty((i1 - i0, x1 - x0, s1 - s0), dtype=self.dtype)
        raw = self._handle().trace.raw
        try:
            if self.inline_sorted:  # trace = i * nx + x
                for i in range(i0, i1):
                    out[i - i0] = raw[i * nx + x0 : i * nx + x1][:, s0:s1]
            else:  # crossline sorted: trace = x * ni + i
                for x in range(x0, x1):
                    out[:, x - x0] = raw[x * ni + i0 : x * ni + i1][:, s0:s1]
        except (OSError, RuntimeError) as exc:
            raise SourceError(
                f"reading inlines {i0}:{i1}, crosslines {x0}:{x1} of SEG-Y file {self.path} "
                f"failed: {exc}"
            ) from exc
        return out

    def __getitem__(self, key: Any) -> np.ndarray:
        """Basic slicing (what dask's ``from_array`` asks for)."""
        if not isinstance(key, tuple):
            key = (key,)
        key = key + (slice(None),) * (3 - len(key))
        box, squeeze = [], []
        for k, n in zip(key, self.shape, strict=True):
            if isinstance(k, slice):
                a, b, step = k.indices(n)
                if step != 1:
                    return self.read([(0, s) for s in self.shape])[key]
                box.append((a, max(a, b)))
                squeeze.append(False)
            else:
                i = int(k) % n
                box.append((i, i + 1))
                squeeze.append(True)
        out = self.read(box)
        return out[tuple(0 if s else slice(None) for s in squeeze)]


def open_segy_volume(paths: Sequence[str], options: dict[str, Any]) -> SegyVolume:
    if len(paths) != 1:
        raise SourceError(
            f"a SEG-Y source is one file; got {len(paths)} ({paths[0]} ...): compute or "
            "prepare them one at a time"
        )
    return SegyVolume(paths[0], options)


def open_segy_dataset(
    paths: Sequence[str], options: dict[str, Any], *, inline_chunks: int | None = None
) -> Any:
    """The volume as a lazy ``xarray.Dataset`` (variable ``data``; one dask chunk per block of
    ``inline_chunks`` inlines, whole crosslines and samples)."""
    import dask.array as da
    import xarray as xr

    vol = open_segy_volume(paths, options)
    ci = int(inline_chunks or vol.block_inlines())
    data = da.from_array(
        vol,
        chunks=(ci, -1, -1),
        lock=False,
        asarray=False,
        name=f"segy-{_token(vol)}",
        meta=np.empty((0, 0, 0), dtype=vol.dtype),
    )
    return xr.Dataset(
        {VARIABLE: (DIMS, data, {"segy_format": vol.format})},
        coords={"inline": vol.ilines, "crossline": vol.xlines, "sample": vol.samples},
        attrs={"source": vol.path},
    )


def _token(vol: SegyVolume) -> str:
    import hashlib

    st = os.stat(vol.path)
    key = f"{os.path.abspath(vol.path)}:{st.st_size}:{st.st_mtime_ns}:{sorted(vol.options.items())}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]
