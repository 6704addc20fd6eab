"""Writing Parquet stores: one Parquet file per chunk and array, ``NAME/CCCCCC.parquet``.

Mapping (what ``pyarrow.parquet.read_table`` shows):

- each file holds one column named like the array and one row group (the chunk's rows);
- an array of shape ``(N,)`` is a plain column of its dtype; an array of shape
  ``(N, *row_shape)`` is a ``FixedSizeList<dtype>[prod(row_shape)]`` column of each row
  flattened in C order (the row shape is in the field's metadata, ``shardload.row_shape``):
  a Parquet row is a sample, as any Parquet reader shows it; columns and values are not
  nullable (no definition levels). The list's repetition levels make decoding about 7x
  slower than one flat column of the values would be (5.9 against 0.85 ms per MB chunk of
  float32 rows, 32 features); a row per sample is what other readers expect;
- the folder ``NAME/`` is a Parquet dataset: ``pq.read_table("STORE/NAME")`` reads the whole
  array, its files in chunk order.

Why a file per chunk rather than one file with a row group per chunk: tasks in any process
write their blocks concurrently and each file is durable on its own (as npy and Zarr chunks:
``parallel_write``), a chunk's checksum is its file's bytes, and a row range opens only the
files of its chunks, whose footer is one small read each. Compression ``none`` / ``zstd`` /
``lz4`` maps onto Parquet's ``NONE`` / ``ZSTD`` / ``LZ4`` (LZ4_RAW) codecs; no dictionary
encoding and no statistics (numeric samples gain nothing from them and writes cost more).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import StoreError
from shardload.formats.base import FormatOptions
from shardload.formats.checksums import digest
from shardload.formats.parquet.read import chunk_path
from shardload.manifest.core import NUMERIC_DTYPES
from shardload.util.durable import file_written, write_atomic

#: the numpy dtypes Parquet stores as themselves: every dtype a store may have
DTYPES = frozenset(NUMERIC_DTYPES)
_CODECS = {"none": "NONE", "zstd": "ZSTD", "lz4": "LZ4"}
OPTIONS_FILE = "_parquet.json"


def to_table(name: str, rows: np.ndarray) -> Any:
    """Rows of an array as a one-column Arrow table (see the module's mapping)."""
    import pyarrow as pa

    rows = np.ascontiguousarray(rows)
    flat = pa.array(rows.reshape(-1))  # zero-copy for numeric dtypes (bool packs bits)
    if rows.ndim == 1:
        field = pa.field(name, flat.type, nullable=False)
        return pa.Table.from_arrays([flat], schema=pa.schema([field]))
    size = int(np.prod(rows.shape[1:], dtype=np.int64))
    # not nullable, values nor rows: no definition levels to write or decode (1.5x faster)
    kind = pa.list_(pa.field("element", flat.type, nullable=False), size)
    column = pa.FixedSizeListArray.from_arrays(flat, type=kind)
    meta = {b"shardload.row_shape": ",".join(map(str, rows.shape[1:])).encode()}
    field = pa.field(name, kind, nullable=False, metadata=meta)
    return pa.Table.from_arrays([column], schema=pa.schema([field]))


def encode_chunk(name: str, rows: np.ndarray, options: FormatOptions) -> bytes:
    """One chunk's Parquet file, in memory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    level = options.level if options.compression == "zstd" else None
    pq.write_table(
        to_table(name, rows),
        sink,
        row_group_size=max(1, len(rows)),
        compression=_CODECS[options.compression],
        compression_level=level,
        use_dictionary=False,
        write_statistics=False,
    )
    return bytes(sink.getvalue().to_pybytes())


class ParquetWriter:
    """Writes one Parquet file per chunk (``WRITER``)."""

    name = "parquet"
    parallel_write = True

    def __init__(self) -> None:
        self._options: dict[str, FormatOptions] = {}

    def create(
        self, root: Path, specs: Mapping[str, Any], bounds: Sequence[int], options: FormatOptions
    ) -> dict[str, str]:
        for name, spec in specs.items():
            dtype = np.dtype(spec.dtype)
            if dtype.name not in DTYPES:
                raise StoreError(
                    f"array {name!r} has dtype {dtype}, which Parquet cannot store; "
                    f"choose one of {sorted(DTYPES)} (dtype: ...) or another format"
                )
            (Path(root) / name).mkdir(parents=True, exist_ok=True)
        # write tasks in other processes (and a resumed run) read the options from the store
        doc = {
            "compression": options.compression,
            "level": options.level,
            "codecs": dict(options.codecs),
        }
        write_atomic(Path(root) / OPTIONS_FILE, json.dumps(doc).encode())
        return {name: name for name in specs}

    def _options_of(self, root: Path) -> FormatOptions:
        key = str(root)
        if key not in self._options:
            d = json.loads((Path(root) / OPTIONS_FILE).read_text())
            self._options[key] = FormatOptions(
                d["compression"], d["level"], codecs=d.get("codecs") or {}
            )
        return self._options[key]

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
        options = self._options_of(root).for_array(name)
        i, offset = chunk_index, 0
        sums: dict[int, int] = {}
        while offset < len(data):
            rows = int(bounds[i + 1] - bounds[i])
            blob = encode_chunk(name, data[offset : offset + rows], options)
            path = Path(root) / chunk_path(name, i)
            with open(path, "wb") as f:
                f.write(blob)
                f.flush()
                file_written(f.fileno(), path)  # durable before the block's record says done
            sums[i] = digest(blob)  # the whole file's bytes
            offset += rows
            i += 1
        return sums

    def finish(self, root: Path) -> None:
        self._options.pop(str(root), None)
        with contextlib.suppress(FileNotFoundError):
            os.remove(Path(root) / OPTIONS_FILE)

    def array_path(self, name: str, *, ragged: bool = False) -> str:
        return name


WRITER = ParquetWriter()
