"""``compression: auto`` (the default): which arrays a store keeps lz4-compressed.

Blosc-lz4 with byte shuffle costs the encode of every chunk at prepare and a decode of every
chunk read at load. On data it cannot shrink (float noise, packed integers, already-compressed
values) that buys a few percent of bytes: float32 white noise saves 6%, int16 noise nothing,
while real fields save 19-75% (docs/benchmarks.md, "Prepare: compression where it
compresses"). Under ``auto`` the driver encodes the start of each fixed-size array (about
:data:`SAMPLE_BYTES`: whole chunks where they are small, the start of the first one where they
are big), from the rows of the first write block (read as its task reads them, and kept for
that task: :func:`~shardload.prep.tasks.read_first_block`), and keeps lz4 for each array it
shrinks by at least :data:`MIN_SAVING`; the others are stored
without a compressor (Zarr: no ``blosc`` codec in the array's chain).

One decision per array, made once in the driver before the store is created: every write
task, in any thread, process or machine, writes what the array's metadata says. The same rows
give the same decision (lz4 is deterministic), so a resumed run decides as the first did.
Variable-length arrays keep lz4. Planning (:func:`plan_codecs`) is pure; the encode and the
read are at the edges (:func:`measure_lz4`, :func:`choose_codecs`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from shardload.formats.base import AUTO, DEFAULT_LEVELS, FormatOptions

log = logging.getLogger("shardload.prep.driver")  # the name users' logs have always shown

#: An array is compressed when lz4 shrinks its first chunks by at least this fraction. 10%:
#: above what lz4 + shuffle saves on noise (float32 normal 6.4%, float64 5.9%, int16 0%), below
#: what it saves on every real field measured (19% for ecRad's humidity and fluxes, 25-75% for
#: ERA5, SST and smooth fields; docs/benchmarks.md).
MIN_SAVING = 0.10
#: About this many decoded bytes of each array are encoded to decide (whole small chunks, or
#: the start of a big one; within the first write block): lz4's saving on smaller samples is
#: noisy (4 KiB of float32 noise: 0.4%, 128 KiB and more: 6.4%).
SAMPLE_BYTES = 1 << 20


class CodecChoice(NamedTuple):
    """What ``auto`` decided for one array, and on what: ``chunks`` pieces encoded apart
    (:func:`plan_sample`), ``raw_bytes`` decoded, ``lz4_bytes`` encoded."""

    codec: str
    chunks: int
    raw_bytes: int
    lz4_bytes: int

    @property
    def saving(self) -> float:
        """The fraction of bytes lz4 saved on the sample."""
        return 1.0 - self.lz4_bytes / self.raw_bytes if self.raw_bytes else 0.0

    def describe(self, name: str) -> str:
        kept = "stored lz4" if self.codec == "lz4" else "stored uncompressed"
        return (
            f"array {name!r}: lz4 saved {100 * self.saving:.1f}% on its first "
            f"{self.raw_bytes / 2**20:.2f} MiB ({self.chunks} piece(s)): {kept}"
        )


def plan_codecs(
    measured: Mapping[str, tuple[int, int, int]], *, min_saving: float = MIN_SAVING
) -> dict[str, CodecChoice]:
    """Each array's codec from ``{name: (chunks, raw_bytes, lz4_bytes)}`` (pure): ``lz4``
    where it saved at least ``min_saving`` of the bytes, else ``none``.

    >>> c = plan_codecs({"noise": (8, 1000, 936), "field": (8, 1000, 300)})
    >>> c["noise"].codec, c["field"].codec
    ('none', 'lz4')
    >>> plan_codecs({"empty": (0, 0, 0)})["empty"].codec  # nothing to measure: lz4
    'lz4'
    """
    out = {}
    for name, (chunks, raw, packed) in measured.items():
        saves = raw == 0 or (raw - packed) >= min_saving * raw
        out[name] = CodecChoice("lz4" if saves else "none", chunks, raw, packed)
    return out


def plan_sample(
    num_rows: int, row_bytes: int, chunk_rows: int, sample_bytes: int = SAMPLE_BYTES
) -> tuple[int, int]:
    """``(piece_rows, pieces)``: the first ``pieces`` runs of ``piece_rows`` rows of
    ``num_rows`` that are encoded to decide (pure). Chunks of at most ``sample_bytes``: whole
    chunks, as many as hold ``sample_bytes`` (or all there are); bigger chunks: the first
    ``sample_bytes`` of the first one (lz4 codes a chunk in blocks of at most 256 KiB, so
    the first MiB of a chunk says what the chunk saves, at a fraction of its encode).

    >>> plan_sample(100, 1024, 10, sample_bytes=20_000)   # 10 KiB chunks: 2 of them
    (10, 2)
    >>> plan_sample(15, 1024, 10, sample_bytes=10**9)     # fewer rows than asked: all
    (10, 2)
    >>> plan_sample(1000, 1024, 500, sample_bytes=65_536)  # 500 KiB chunks: 64 rows of one
    (64, 1)
    """
    row_bytes, chunk_rows = max(1, row_bytes), max(1, chunk_rows)
    want_rows = -(-sample_bytes // row_bytes)
    piece = max(1, min(chunk_rows, want_rows, num_rows))
    pieces = -(-min(want_rows, num_rows) // piece)
    return piece, int(max(1, min(pieces, -(-num_rows // piece))))


def measure_lz4(
    rows: np.ndarray, chunk_rows: int, *, level: int | None = None
) -> tuple[int, int, int]:
    """``(pieces, raw_bytes, lz4_bytes)``: the first rows of ``rows`` (:func:`plan_sample`)
    encoded one piece at a time as the writers encode a chunk (Blosc lz4, byte shuffle)."""
    from numcodecs import Blosc

    codec = Blosc(
        cname="lz4", clevel=DEFAULT_LEVELS["lz4"] if level is None else level, shuffle=Blosc.SHUFFLE
    )
    row_bytes = rows.nbytes // max(1, len(rows))
    piece, n = plan_sample(len(rows), row_bytes, chunk_rows)
    raw = packed = 0
    for i in range(n):
        chunk = np.ascontiguousarray(rows[i * piece : (i + 1) * piece])
        raw += chunk.nbytes
        packed += len(codec.encode(chunk))
    return n, raw, packed


def choose_codecs(job: Any, options: FormatOptions) -> FormatOptions:
    """``options`` with each fixed-size array's codec (``compression: auto``), from the first
    write block of ``job`` (a :class:`~shardload.prep.tasks.PrepareJob`); logged per array.
    Other compressions: ``options`` as they are."""
    from shardload.prep.executor import resolve_scheduler
    from shardload.prep.tasks import read_first_block

    fixed = [n for n, s in job.specs.items() if not s.ragged]
    if options.compression != AUTO or not fixed or job.length == 0:
        return options
    # kept for block 0's task where it runs in this process (threads)
    here = resolve_scheduler(job.config.execution) in ("threads", "sync")
    rows = read_first_block(job, keep=here)
    measured = {
        n: measure_lz4(
            np.asarray(rows[n], dtype=job.specs[n].dtype), job.chunk_rows, level=options.level
        )
        for n in fixed
    }
    choices = plan_codecs(measured)
    for name, choice in choices.items():
        log.info("%s", choice.describe(name))
    return dataclasses.replace(options, codecs={n: c.codec for n, c in choices.items()})
