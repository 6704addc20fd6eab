"""Writing npy stacks: one ``.npy`` file per chunk, ``NAME/000000.npy``.

Chunk files are uncompressed (the format's point is zero-decode, mmap-able reads); a chunk's
checksum is over its whole file, header included. Ragged arrays: ``NAME/values/CCCCCC.npy``
per sample chunk, written by the tasks in place, and ``NAME/offsets.npy``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import ConfigError
from shardload.formats.base import FormatOptions
from shardload.formats.checksums import digest
from shardload.formats.npy.read import chunk_path
from shardload.formats.ragged.write import npy_writer
from shardload.util import durable
from shardload.util.durable import file_written


class NpyWriter:
    """Writes one ``.npy`` file per chunk (``WRITER``)."""

    name = "npy"
    parallel_write = True
    ragged_staged = False  # a task's chunk value files are the final layout

    def create(
        self, root: Path, specs: Mapping[str, Any], bounds: Sequence[int], options: FormatOptions
    ) -> dict[str, str]:
        if options.compression != "none":
            raise ConfigError(
                f"compression: the npy format stores raw arrays; got {options.compression!r}, use 'none' "
                "(or format: zarr / hdf5 for compressed stores)"
            )
        for name in specs:
            (Path(root) / name).mkdir(parents=True, exist_ok=True)
        return {name: name for name in specs}

    def write_block(
        self,
        root: Path,
        name: str,
        chunk_index: int,
        start: int,
        data: np.ndarray,
        *,
        bounds: Sequence[int],
    ) -> dict[int, int]:
        i, offset = chunk_index, 0
        sums: dict[int, int] = {}
        while offset < len(data):
            rows = bounds[i + 1] - bounds[i]
            part = np.ascontiguousarray(data[offset : offset + rows])
            path = Path(root) / chunk_path(name, i)
            with open(path, "w+b") as f:
                np.lib.format.write_array(f, part, allow_pickle=False)
                f.flush()
                file_written(f.fileno(), path)  # durable before the block's record says done
                f.seek(0)
                header = f.read(_file_size(f) - part.nbytes)
            sums[i] = digest(header, part)  # the whole file's bytes, without reading them back
            offset += rows
            i += 1
        return sums

    def finish(self, root: Path) -> None:
        pass

    def array_path(self, name: str, *, ragged: bool = False) -> str:
        return name

    def finish_ragged(
        self,
        root: Path,
        infos: Mapping[str, tuple[np.dtype, np.ndarray]],
        offsets: Mapping[str, np.ndarray],
        bounds: Sequence[int],
        options: FormatOptions,
        staged: Callable[[str], Iterator[np.ndarray]],
    ) -> None:
        """``NAME/offsets.npy`` (``N + 1`` int64, global: row ``i`` is
        ``values[offsets[i]:offsets[i+1]]`` of the chunk files' concatenation)."""
        for name, off in offsets.items():
            durable.write_atomic(Path(root) / name / "offsets.npy", npy_writer(off))


def _file_size(f: Any) -> int:
    return os.fstat(f.fileno()).st_size


WRITER = NpyWriter()
