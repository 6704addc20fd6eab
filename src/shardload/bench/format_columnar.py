"""Arrow IPC, Parquet and WebDataset for ``shardload bench formats``.

Arrow and Parquet store one column ``x``: a fixed-size list (fixed length) or a list array
(variable length, Arrow's values + offsets), in record batches / row groups of ``group_rows``
samples. Their unit of reading is the batch / row group, so the per-sample reader keeps the
last one it decoded: sequential reads decode each group once, shuffled reads up to once per
sample, which is what a map-style dataset over these formats costs.

WebDataset shards are tar files of ``KEY.npy`` members written by ``webdataset.ShardWriter``
and read with its own pipeline (the format's natural iterator: shards split over DataLoader
workers, shuffle = shard order + a sample buffer, not a full permutation).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from shardload.bench.format_data import BenchData
from shardload.bench.format_io import LazyReader
from shardload.errors import require

COLUMN = "x"


def _list_array(data: BenchData) -> Any:
    pa = require("pyarrow", "bench")
    values = pa.array(data.values)
    if data.fixed_length:
        return pa.FixedSizeListArray.from_arrays(values, data.sample_len)
    if data.offsets[-1] < np.iinfo(np.int32).max:
        return pa.ListArray.from_arrays(pa.array(data.offsets.astype(np.int32)), values)
    return pa.LargeListArray.from_arrays(pa.array(data.offsets), values)


def _table(data: BenchData) -> Any:
    pa = require("pyarrow", "bench")
    return pa.table({COLUMN: _list_array(data)})


def list_rows(arr: Any) -> Callable[[int], np.ndarray]:
    """Row ``r`` of an Arrow (fixed-size / large) list array as a zero-copy numpy view."""
    import pyarrow as pa

    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    if pa.types.is_fixed_size_list(arr.type):
        size = arr.type.list_size
        flat = arr.flatten().to_numpy(zero_copy_only=True)
        return lambda r: flat[r * size : (r + 1) * size]
    # offsets index ``values`` (the unsliced child) also for a sliced array
    offsets = arr.offsets.to_numpy(zero_copy_only=True)
    values = arr.values.to_numpy(zero_copy_only=True)
    return lambda r: values[offsets[r] : offsets[r + 1]]


class _GroupCache(LazyReader):
    """A reader of batch-organised files: sample ``i`` is row ``i % rows`` of group
    ``i // rows``; the last group read is kept."""

    def __init__(self, path: Path, *, mmap: bool | None, group_rows: int) -> None:
        super().__init__(path, mmap=mmap)
        self.group_rows = group_rows
        self._group: tuple[int, Callable[[int], np.ndarray]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_group": None}

    def _read_group(self, g: int) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def read(self, i: int) -> np.ndarray:
        g, r = divmod(i, self.group_rows)
        if self._group is None or self._group[0] != g or self._pid != os.getpid():
            self._group = (g, list_rows(self._read_group(g)))
        return self._group[1](r)

    def close(self) -> None:
        self._group = None
        super().close()


# -- Arrow IPC file ---------------------------------------------------------------------------


def write_arrow(data: BenchData, path: Path, *, group_rows: int) -> None:
    pa = require("pyarrow", "bench")
    table = _table(data)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=group_rows)


class ArrowReader(_GroupCache):
    """mmap on: ``pa.memory_map`` (record batches are zero-copy views of the map);
    off: ``pa.OSFile`` (each record batch read into memory)."""

    def _open(self) -> Any:
        import pyarrow as pa

        source = pa.memory_map(str(self.path)) if self.mmap else pa.OSFile(str(self.path))
        return pa.ipc.open_file(source)

    def _read_group(self, g: int) -> Any:
        return self.handle().get_batch(g).column(COLUMN)


# -- Parquet ----------------------------------------------------------------------------------


def write_parquet(data: BenchData, path: Path, *, group_rows: int) -> None:
    require("pyarrow", "bench")
    import pyarrow.parquet as pq

    # pyarrow's defaults otherwise (snappy, dictionary encoding where it pays)
    pq.write_table(_table(data), path, row_group_size=group_rows)


class ParquetReader(_GroupCache):
    """``pq.ParquetFile(memory_map=...)``: one row group decoded per group change."""

    def _open(self) -> Any:
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.path, memory_map=bool(self.mmap))

    def _read_group(self, g: int) -> Any:
        return self.handle().read_row_group(g, columns=[COLUMN]).column(COLUMN)


# -- WebDataset tar shards --------------------------------------------------------------------


def write_webdataset(data: BenchData, folder: Path, *, group_rows: int) -> None:
    wds = require("webdataset", "bench")
    folder.mkdir(parents=True)
    pattern = str(folder / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=group_rows, verbose=0) as sink:
        for i in range(data.num_samples):
            sink.write({"__key__": f"{i:08d}", "npy": data.sample(i)})


def webdataset_shards(folder: Path) -> list[str]:
    return sorted(str(p) for p in Path(folder).glob("shard-*.tar"))


def open_webdataset(
    folder: Path,
    *,
    shuffle: bool,
    seed: int,
    batch_size: int,
    shuffle_buffer: int,
    collate: Callable[[list[tuple[int, np.ndarray]]], Any],
) -> Any:
    """WebDataset's pipeline over the shards, yielding collated batches of ``(index, sample)``."""
    wds = require("webdataset", "bench")
    urls = webdataset_shards(folder)
    ds = wds.WebDataset(
        urls,
        shardshuffle=len(urls) if shuffle else False,
        seed=seed,
        empty_check=False,
        detshuffle=shuffle,
    ).decode()
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed)
    return ds.map(lambda s: (int(s["__key__"]), s["npy"])).batched(
        batch_size, collation_fn=collate, partial=True
    )
