"""A contiguous, unfiltered HDF5 variable as a read-only array over a map of its file bytes.

A block of space points of a time-major series, ``(time, lat, lon, lev)``, is a short run of
every time step. Read through HDF5, each block gathers those runs into a new array under h5py's
lock (one thread at a time, the GIL held), and is then transposed into the block: two passes
over its bytes, the first one slow (a 283 MB series read by 17 blocks: 0.76 s of CPU for the
gathers). Over a map of the file, the transpose reads the page cache in place: one pass, no
lock, no syscall per run, and numpy's copy leaves the GIL to the other threads.

A file truncated while mapped would stop the process with ``SIGBUS`` where a read would raise;
the file's size is checked when it is mapped (a file already short raises :class:`SourceError`,
as a short read does).
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from shardload.errors import SourceError


def map_contiguous(
    path: str, offset: int, shape: tuple[int, ...], dtype: np.dtype, *, name: str
) -> np.ndarray:
    """The ``shape`` values of ``dtype`` at byte ``offset`` of the file ``path``, read-only,
    without reading them (they are read, from the page cache, when the array is)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if offset + nbytes > size:
            raise SourceError(f"{path}: variable {name!r} is truncated (short read)")
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        mm = mmap.mmap(f.fileno(), offset + nbytes - start, access=mmap.ACCESS_READ, offset=start)
    arr = np.frombuffer(mm, dtype, count=nbytes // dtype.itemsize, offset=offset - start)
    return arr.reshape(shape)  # holds the map: it is closed with the last view of it
