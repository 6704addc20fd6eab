"""Writing variable-length (ragged) arrays: the steps every format shares (chunk value files,
the offsets from the records, the marker), around the format writer's own hooks.

A format that stores ragged arrays (``ragged=True`` in :mod:`shardload.formats.registry`) has
on its writer:

- ``ragged_staged``: False when a task's chunk value files are the final layout (npy), True
  when they are staged in ``_ragged/NAME/`` and the driver builds the layout at the end;
- ``array_path(name, ragged=True)``: the manifest's path of the array;
- ``finish_ragged(root, infos, offsets, bounds, options, staged)``: write the offsets (and,
  staged, the values from ``staged(name)``, an iterator over the chunks' values).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from shardload.errors import StoreError
from shardload.formats.base import FormatOptions
from shardload.formats.checksums import digest
from shardload.formats.ragged.read import CHUNK_NAME
from shardload.formats.registry import format_entry, get_writer
from shardload.manifest.ragged import RaggedRows, offsets_of

STAGING_DIR = "_ragged"
MARKER = "ragged.json"


def ragged_writer(fmt: str) -> Any:
    """The writer of format ``fmt``, which must store variable-length arrays."""
    if not format_entry(fmt).ragged:
        raise StoreError(f"format {fmt!r} cannot store variable-length arrays")
    return get_writer(fmt)


def array_path(fmt: str, name: str) -> str:
    """The manifest's ``path`` of ragged array ``name``."""
    return str(ragged_writer(fmt).array_path(name, ragged=True))


def chunk_dir(fmt: str, root: Path, name: str) -> Path:
    """Where a task writes the values of its sample chunks (final for npy, staged otherwise)."""
    staged = ragged_writer(fmt).ragged_staged
    return Path(root) / (f"{STAGING_DIR}/{name}" if staged else f"{name}/values")


def create_ragged(fmt: str, root: Path, names: Sequence[str]) -> None:
    for name in names:
        chunk_dir(fmt, root, name).mkdir(parents=True, exist_ok=True)


def write_ragged_block(
    fmt: str, root: Path, name: str, chunk: int, data: RaggedRows, *, bounds: Sequence[int]
) -> dict[int, int]:
    """Write the values of the sample chunks ``data`` covers (whole chunks from ``chunk``),
    each durably; their checksums by chunk."""
    from shardload.util.durable import write_atomic

    off = offsets_of(data.lengths)
    sums: dict[int, int] = {}
    i, r = chunk, 0
    folder = chunk_dir(fmt, root, name)
    folder.mkdir(parents=True, exist_ok=True)
    while r < len(data.lengths):
        rows = int(bounds[i + 1] - bounds[i])
        part = np.ascontiguousarray(data.values[off[r] : off[r + rows]])
        write_atomic(folder / CHUNK_NAME.format(i), npy_writer(part))
        sums[i] = digest(part)
        r += rows
        i += 1
    return sums


def npy_writer(arr: np.ndarray) -> Callable[[BinaryIO], None]:
    """What :func:`~shardload.util.durable.write_atomic` calls to write ``arr`` as ``.npy``."""

    def write(f: BinaryIO) -> None:
        np.lib.format.write_array(f, arr, allow_pickle=False)

    return write


def length_stats(lengths: np.ndarray) -> dict[str, Any]:
    """What the manifest records about a ragged array's row lengths."""
    n = len(lengths)
    return {
        "max_length": int(lengths.max()) if n else 0,
        "min_length": int(lengths.min()) if n else 0,
        "mean_length": float(lengths.mean()) if n else 0.0,
        "num_values": int(lengths.sum()),
    }


def finish_ragged(
    fmt: str,
    root: Path,
    infos: Mapping[str, tuple[np.dtype, np.ndarray]],
    *,
    bounds: Sequence[int],
    options: FormatOptions,
    progress: Path,
) -> dict[str, int]:
    """Build the final layout of every ragged array (``name -> (dtype, lengths)``) once all
    blocks are recorded; the offsets' checksum per array. Idempotent: a marker in ``progress``
    says it is done; without it, it is redone from the staged chunks."""
    from shardload.util.durable import fsync_tree, write_atomic

    offsets = {n: offsets_of(lengths) for n, (_, lengths) in infos.items()}
    sums = {n: digest(o) for n, o in offsets.items()}
    marker = Path(progress) / MARKER
    if not infos or marker.exists():
        return sums
    bounds = [int(b) for b in bounds]

    def staged(name: str) -> Iterator[np.ndarray]:
        for c in range(len(bounds) - 1):
            yield np.load(Path(root) / STAGING_DIR / name / CHUNK_NAME.format(c), mmap_mode="r")

    ragged_writer(fmt).finish_ragged(root, infos, offsets, bounds, options, staged)
    fsync_tree(Path(root))
    write_atomic(marker, json.dumps(sorted(infos)).encode())
    shutil.rmtree(Path(root) / STAGING_DIR, ignore_errors=True)
    return sums


def value_chunk(lengths: np.ndarray, bounds: Sequence[int]) -> int:
    """Values per storage chunk: about one sample chunk's values."""
    chunks = max(1, len(bounds) - 1)
    return max(1024, int(np.ceil(int(lengths.sum()) / chunks)))
