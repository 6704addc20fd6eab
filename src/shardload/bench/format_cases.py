"""The formats ``shardload bench formats`` compares: each as a :class:`FormatCase` (how to write
it, how to read it), and the size of their groups (batches, row groups, shards)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardload.bench import format_columnar as col
from shardload.bench import format_io as fio
from shardload.bench import format_squashfs as sqfs
from shardload.bench.format_squashfs import squashfs_unavailable
from shardload.errors import ConfigError

GROUP_BYTES = 4 << 20  # rows per Arrow batch / Parquet row group / Zarr shard / tar shard
READ_LIMIT_BLOCK = 16 << 20
SHUFFLE_BUFFER = 1000  # WebDataset's default sample buffer


@dataclass(frozen=True)
class FormatCase:
    """One format (and variant) of the benchmark: how to write it and how to read it.

    ``mmap_modes``: the settings timed (``(None,)`` when the format has no mmap mode).
    ``reader(path, mmap, group_rows)`` gives a per-sample reader (map-style); ``None`` means the
    format is read with its own iterator (WebDataset). ``prepare_read(path)`` runs in the main
    process before reading (e.g. mounts an image) and returns the path the reader opens;
    ``release(path)`` undoes it. ``unavailable()`` says why the format cannot run here.
    """

    format: str
    variant: str
    suffix: str
    mmap_modes: tuple[bool | None, ...]
    write: Callable[..., None]
    reader: Callable[..., Any] | None
    prepare_read: Callable[[Path], Path] | None = None
    release: Callable[[Path], None] | None = None
    unavailable: Callable[[], str | None] | None = None

    @property
    def name(self) -> str:
        return f"{self.format}-{self.variant}" if self.variant else self.format


def _group_reader(cls: type) -> Callable[..., Any]:
    return lambda path, mmap, group_rows: cls(path, mmap=mmap, group_rows=group_rows)


def _plain_reader(cls: type) -> Callable[..., Any]:
    return lambda path, mmap, group_rows: cls(path, mmap=mmap)


ON_OFF = (False, True)
CASES: tuple[FormatCase, ...] = (
    FormatCase("npy-dir", "", "", ON_OFF, fio.write_npy_dir, _plain_reader(fio.NpyDirReader)),
    FormatCase("npy-stack", "", "", ON_OFF, fio.write_npy_stack, _plain_reader(fio.NpyStackReader)),
    *(
        FormatCase(
            "zarr",
            f"{'sharded' if sharded else 'unsharded'}-{'zstd' if zstd else 'none'}",
            ".zarr",
            (None,),
            fio.zarr_writer(sharded=sharded, zstd=zstd),
            _plain_reader(fio.ZarrReader),
        )
        for sharded in (False, True)
        for zstd in (False, True)
    ),
    FormatCase("hdf5", "contiguous", ".h5", ON_OFF, fio.write_hdf5, _plain_reader(fio.Hdf5Reader)),
    FormatCase(
        "arrow", "ipc-file", ".arrow", ON_OFF, col.write_arrow, _group_reader(col.ArrowReader)
    ),
    FormatCase(
        "parquet", "snappy", ".parquet", ON_OFF, col.write_parquet, _group_reader(col.ParquetReader)
    ),
    FormatCase("webdataset", "tar", "", (None,), col.write_webdataset, None),
    FormatCase(
        "squashfs",
        f"npy-stack-{sqfs.COMPRESSION}",
        ".sqfs",
        ON_OFF,
        sqfs.write_squashfs,
        _plain_reader(fio.NpyStackReader),
        prepare_read=sqfs.mount_image,
        release=sqfs.unmount_image,
        unavailable=squashfs_unavailable,
    ),
)
FORMAT_NAMES: tuple[str, ...] = tuple(dict.fromkeys(c.format for c in CASES))


def plan_group_rows(num_samples: int, sample_bytes: int, *, min_groups: int = 4) -> int:
    """Samples per batch / row group / shard: about ``GROUP_BYTES``, at least ``min_groups``
    groups (so every DataLoader worker gets shards).

    >>> plan_group_rows(1024, 65536)
    64
    >>> plan_group_rows(10, 65536)
    3
    """
    rows = max(1, GROUP_BYTES // max(1, sample_bytes))
    return max(1, min(rows, -(-num_samples // min_groups)))


def select_cases(names: Sequence[str] | None) -> list[FormatCase]:
    if not names:
        return list(CASES)
    unknown = sorted(set(names) - set(FORMAT_NAMES))
    if unknown:
        raise ConfigError(f"--formats: unknown {unknown}; choose from {list(FORMAT_NAMES)}")
    return [c for c in CASES if c.format in names]


def case_path(root: Path, case: FormatCase) -> Path:
    return root / f"{case.name}{case.suffix}"
