"""By URL, the inner chunks one call needs from a sharded array, in few large range requests
kept in flight together (issues 25 and 28).

The default load reads a shuffle group (about 64 MiB decoded) as over a thousand inner chunks of
a few rows, drawn from every shard of the store. Asked for one at a time, an epoch of the
default store (65,536 rows, 7 shards) made about 6,000 range requests, and a request through
``shardload serve`` on loopback costs about as much as 1 MB more of its answer (1.5-2 ms, 50 KB
or 500 KB alike; docs/benchmarks.md). So a call (the loader gives one per array and group) plans
its requests per shard: the inner chunks it needs sorted by offset, and neighbours whose gap is
at most ``URL_GAP_BYTES`` merged into one request of at most ``URL_RUN_BYTES`` (a group that
needs a dense share of a shard fetches it in a few big spans), as many requests in flight for
the call as :func:`plan_in_flight` sizes from its runs (their bytes within ``URL_THREADS`` spans of
``URL_RUN_BYTES``, up to ``URL_IN_FLIGHT``: small spans are many round trips' worth otherwise),
each decoded by the thread that fetched it as soon as it arrives.

A shard whose checksum must still be checked is fetched whole, once per reader, and checked
(:func:`_checked_whole`); the call then decodes its chunks from those bytes and makes
no range request for that shard. At most ``CHECK_THREADS`` shards are held whole at once.
A shard already checked whose planned requests would cover at least ``URL_WHOLE_SHARE`` of it
(a later epoch: a group needs a dense share of every shard) is fetched whole again the same
way and checked again: one request instead of several, and the next group's call, planned
meanwhile, waits for those bytes instead of fetching the same spans for itself (a later epoch
of the default store by URL fetched it twice over in 26 range requests; now as a first epoch).

Every check of the one-shard path holds here: a shard index's crc32c and bounds
(:func:`.shards.shard_index`), each inner chunk's Blosc header against the index, a short answer
(a truncated file) named by its chunk, a missing shard named (never the fill value in a
shardload store). The bytes decoded are those the server sent for those offsets, whatever the
coalescing: the same rows locally and by URL.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from threading import BoundedSemaphore
from typing import TYPE_CHECKING, Any

import numpy as np

from shardload.errors import ChunkReadError
from shardload.formats.checksums import CheckedUnit, Verifier
from shardload.formats.zarr.ahead import Ahead, ahead_for
from shardload.formats.zarr.chunks import ChunkLayout
from shardload.formats.zarr.kept import KeptChunks, keep_inside, kept_for, later_chunks
from shardload.formats.zarr.shard_spans import (
    RUN_BYTES,
    BufferFile,
    Piece,
    _bytes_fetch,
    _checked_bytes,
    _from_kept,
    _no_fetch,
    _read_runs,
    _slices,
    pieces_by_shard,
    read_spans_into,
)
from shardload.formats.zarr.shards import (
    EMPTY,
    RangeFile,
    ShardIndexCache,
    shard_errors,
    shard_index,
)
from shardload.formats.zarr.streamed import decode_arriving, decoded_from
from shardload.move.retries import current_stop, stop_on

if TYPE_CHECKING:
    from shardload.formats.zarr.url_rows import RowSink

#: Inner chunks with at most this many bytes between them share one request: a request costs
#: about as much as this many more bytes of its answer on loopback (docs/benchmarks.md).
URL_GAP_BYTES = 1 << 20
#: One request asks for at most this many bytes (and the memory a fetching thread holds).
URL_RUN_BYTES = 8 << 20
#: Requests in flight at once for one call: as many as its runs' bytes allow (at most
#: URL_THREADS of the largest, URL_RUN_BYTES), up to the reader's URL_IN_FLIGHT
URL_THREADS = 8
#: Shards fetched whole for their checksum at once by one call (each held whole meanwhile).
CHECK_THREADS = 2
#: A checked shard whose planned requests cover at least this share of its chunk bytes is
#: fetched whole again in one request (and checked again), its bytes shared by the calls that
#: wait for it meanwhile (the next group's, read ahead), instead of each call's range requests.
URL_WHOLE_SHARE = 0.5

#: one request: shard k's pieces ``pieces`` (sorted by offset), bytes [start, end) of ``path``
Run = tuple[int, str, np.ndarray, list[Piece], int, int]


def plan_runs(
    offsets: Sequence[int] | np.ndarray,
    sizes: Sequence[int] | np.ndarray,
    *,
    gap_bytes: int,
    run_bytes: int,
) -> list[tuple[list[int], int, int]]:
    """The requests for inner chunks at ``offsets`` of ``sizes`` bytes (never-written ones,
    offset ``EMPTY``, left out): ``(positions, start, end)``, positions in offset order, chunks
    at most ``gap_bytes`` apart in one request of at most ``run_bytes`` (one chunk at least).

    >>> plan_runs([0, 100, 5000, EMPTY], [100, 20, 10, EMPTY], gap_bytes=0, run_bytes=10**6)
    [([0, 1], 0, 120), ([2], 5000, 5010)]
    >>> plan_runs([0, 100, 5000], [100, 20, 10], gap_bytes=4880, run_bytes=10**6)
    [([0, 1, 2], 0, 5010)]
    >>> plan_runs([0, 100, 5000], [100, 20, 10], gap_bytes=10**6, run_bytes=4000)
    [([0, 1], 0, 120), ([2], 5000, 5010)]
    """
    offs = np.asarray(offsets, np.uint64)
    order = np.argsort(offs, kind="stable").tolist()
    offs_l = [int(x) for x in offsets]
    sizes_l = [int(x) for x in sizes]
    runs: list[tuple[list[int], int, int]] = []
    for q in order:
        o = offs_l[q]
        if o == EMPTY:
            continue
        end = o + sizes_l[q]
        if runs:
            pos, start, last = runs[-1]
            if o <= last + gap_bytes and max(last, end) - start <= run_bytes:
                pos.append(q)
                runs[-1] = (pos, start, max(last, end))
                continue
        runs.append(([q], o, end))
    return runs


def plan_in_flight(run_bytes: Sequence[int]) -> int:
    """Requests one call keeps in flight for runs of ``run_bytes``: enough to cover the link's
    rate times its round trip when they are small, the memory of URL_THREADS runs of
    URL_RUN_BYTES at most (as many as that holds of the largest), URL_IN_FLIGHT at most.

    >>> plan_in_flight([8 << 20] * 20), plan_in_flight([50_000] * 20), plan_in_flight([50_000] * 99)
    (8, 20, 32)
    """
    from shardload.move.remote import URL_IN_FLIGHT

    if not run_bytes:
        return 1
    fit = URL_THREADS * URL_RUN_BYTES // max(1, max(run_bytes))
    return max(1, min(len(run_bytes), URL_IN_FLIGHT, max(URL_THREADS, fit)))


def read_url_spans_into(
    layout: ChunkLayout,
    name: str,
    spans: Sequence[tuple[int, int]],
    outs: Sequence[np.ndarray],
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
) -> None:
    """Several spans of an array by URL (``.shard_spans.read_spans_into`` for other layouts):
    a sharded array's inner chunks (Blosc or raw) as :func:`read_url_shards` reads them."""
    if layout.shard is None:
        read_spans_into(layout, name, spans, outs, verifier, indexes)
        return
    read_url_shards(layout, name, pieces_by_shard(layout, spans, outs), verifier, indexes)


def read_url_shards(
    layout: ChunkLayout,
    name: str,
    by_shard: dict[int, list[Piece]],
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
    sink: RowSink | None = None,
) -> None:
    """The pieces of each shard of ``by_shard`` (``.shard_spans``' grouping of one call's spans)
    by URL: chunks kept from earlier requests (:mod:`.kept`) decoded from those bytes, shards
    to check fetched whole, the others by the planned range requests. ``sink``: pieces of a
    shard's checked whole bytes decoded by it into their rows first (:mod:`.url_rows`)."""
    if not by_shard:
        return
    # ``verify="always"`` checks a shard each time it is read: no bytes kept across calls
    always = verifier is not None and verifier.enabled and verifier.mode == "always"
    kept = kept_for(indexes) if indexes is not None and not always else None
    ahead = ahead_for(indexes) if indexes is not None and not always else None
    checks = BoundedSemaphore(CHECK_THREADS)
    stop = current_stop()  # the loader's close ends these threads' retries too
    with ThreadPoolExecutor(URL_THREADS) as pool:

        def plan(k: int) -> list[Run]:
            with stop_on(stop):
                return _plan_shard(
                    layout, name, k, by_shard[k], verifier, indexes, checks, kept, ahead, sink
                )

        def fetch(r: Run) -> None:
            with stop_on(stop):
                _fetch_run(layout, name, r, kept)

        runs = [r for rs in pool.map(plan, list(by_shard)) for r in rs]
    with ThreadPoolExecutor(plan_in_flight([r[5] - r[4] for r in runs])) as pool:
        for _ in pool.map(fetch, runs):
            pass


def _plan_shard(
    layout: ChunkLayout,
    name: str,
    k: int,
    pieces: list[Piece],
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
    checks: BoundedSemaphore,
    kept: KeptChunks | None,
    ahead: Ahead | None = None,
    sink: RowSink | None = None,
) -> list[Run]:
    """Shard ``k``: its kept chunks decoded, the rest checked and decoded from the shard's
    whole bytes (no run left), or its runs."""
    assert layout.shard is not None
    path = layout.chunk_path(k)
    first = k * layout.shard.chunks
    runs: list[Run] = []
    reads = [first + p[0] for p in pieces]
    with shard_errors(layout, name, k, path, (part for *_, part in pieces)):
        if verifier is not None and verifier.needed(name, k):
            # every call wanting a shard fetched ahead decodes its pieces while the GET brings
            # them, counted among the shard's users (its checked bytes stay for it), then
            # waits for the check; not only the call that checks it (the others decoded from
            # the checked bytes after it, the epoch's tail)
            with verifier.unit_use(name, k) as unit:
                early = decode_arriving(layout, name, k, path, pieces, ahead, sink)
                data = _checked_whole(
                    layout, verifier, name, k, path, checks, indexes, kept, reads, ahead=ahead,
                    used=unit,
                )  # fmt: skip
            if data is not None:  # decoded here (unless that stands), while the bytes are held
                index = _index(layout, name, k, path, data, indexes)
                if not decoded_from(early, data, index):
                    _from_whole(layout, name, k, path, pieces, data, indexes, sink)
                return []
        # taken after the check: a call that checked the shard meanwhile kept these chunks
        held = kept.take(name, reads) if kept is not None else {}
        if held:  # from earlier requests (a chunk each: gap -1 runs none together)
            mine = [p for p in pieces if first + p[0] in held]
            mine = sink.decode_kept(k, mine, held) if sink is not None else mine
            if mine:  # (the sink's leftovers: decoded, or named, by the path of any chunk)
                index = _index(layout, name, k, path, None, indexes)
                at = {int(index[j, 0]): held[first + j] for j, *_ in mine}
                _read_runs(layout, name, k, mine, index, path, _from_kept(at), -1)
            pieces = [p for p in pieces if first + p[0] not in held]
            if not pieces:
                return []
        index = _index(layout, name, k, path, None, indexes)
        js = [p[0] for p in pieces]
        offs, sizes = index[js, 0], index[js, 1]
        empty = [pieces[q] for q in np.flatnonzero(offs == np.uint64(EMPTY)).tolist()]
        if empty:  # never written: the fill value (``_read_runs`` fetches nothing for them)
            _read_runs(layout, name, k, empty, index, path, _no_fetch)
        later = later_chunks(kept, name, first, index)
        if len(later):  # runs stretched over chunks to keep: a later group's request saved
            offs = np.concatenate([offs, index[later, 0]])
            sizes = np.concatenate([sizes, index[later, 1]])
        n = len(pieces)
        for pos, start, end in plan_runs(
            offs, sizes, gap_bytes=URL_GAP_BYTES, run_bytes=URL_RUN_BYTES
        ):
            mine = [pieces[q] for q in pos if q < n]
            if mine:  # a run of chunks to keep only is left for the group that reads them
                runs.append((k, path, index, mine, start, end))
        if verifier is not None and _dense(runs, index):
            data = _checked_whole(layout, verifier, name, k, path, checks, indexes, kept, [], True)
            assert data is not None
            _from_whole(layout, name, k, path, pieces, data, indexes, sink)
            return []
    return runs


def _dense(runs: list[Run], index: np.ndarray) -> bool:
    """Whether ``runs`` cover at least ``URL_WHOLE_SHARE`` of the shard's chunk bytes: then
    the shard is fetched whole instead (:func:`_checked_whole` with ``again``)."""
    if not runs:
        return False
    sizes = index[:, 1][index[:, 0] != np.uint64(EMPTY)]
    covered = sum(end - start for *_, start, end in runs)
    return covered >= URL_WHOLE_SHARE * int(sizes.sum())


def _from_whole(
    layout: ChunkLayout,
    name: str,
    k: int,
    path: str,
    pieces: list[Piece],
    data: memoryview,
    indexes: ShardIndexCache | None,
    sink: RowSink | None = None,
) -> None:
    """Shard ``k``'s pieces decoded from its whole, checked bytes (by ``sink`` first)."""
    index = _index(layout, name, k, path, data, indexes)
    pieces = sink.decode(k, pieces, data, index) if sink is not None else pieces
    _read_runs(layout, name, k, pieces, index, path, _bytes_fetch(data), RUN_BYTES)


def _checked_whole(
    layout: ChunkLayout,
    verifier: Verifier,
    name: str,
    k: int,
    path: str,
    checks: BoundedSemaphore,
    indexes: ShardIndexCache | None,
    kept: KeptChunks | None,
    reads: list[int],
    again: bool = False,
    ahead: Ahead | None = None,
    used: CheckedUnit | None = None,
) -> memoryview | None:
    """Shard ``k`` fetched whole and checked (``.shard_spans._checked_once`` by URL), at most
    ``checks`` at once: the semaphore is taken inside the shard's unit lock, so a call that
    waits for a check another call makes gets its bytes (waiting for the semaphore first, it
    found the shard checked and its bytes gone: a range request more). ``again``: a shard
    already checked is fetched (and checked, when the store has checksums) once more, unless
    a call that this one waited for left its bytes.

    When bytes are returned, the call's ``reads`` (inner chunks) are counted as read
    (``KeptChunks.take``; else the caller takes them). The chunks this worker reads later are
    kept by the last call in the unit lock (:func:`_take_and_keep`): a call that saw the shard
    unchecked before this check ended but came to the lock after it (the bytes gone) takes them
    there. ``ahead``: a first check takes the bytes and digest fetched ahead (:mod:`.ahead`).
    ``used``: the shard's unit, this call already counted among its users
    (``Verifier.unit_use``), whose lock is taken here."""
    with _locked(used) if used is not None else verifier.unit_lock(name, k) as unit:
        needed = verifier.needed(name, k)
        if not needed and (unit.data is not None or not again):
            if unit.data is not None and kept is not None:
                _take_and_keep(layout, name, k, path, unit, kept, reads, indexes)
            return unit.data
        with checks:
            got = ahead.take(name, k) if ahead is not None and needed else None
            try:
                with layout.open(path) as f:
                    if got is not None:  # compared here, before any of its bytes is used
                        verifier.check(name, k, got[1], path=path, what=f"shard {k}")
                        unit.data = got[0]
                    elif verifier.enabled:
                        unit.data = _checked_bytes(verifier, name, k, path, f)
                    else:
                        unit.data = f.whole()
            except OSError as exc:  # as verify_file: missing or unreadable, strict or not
                raise ChunkReadError.from_os_error(exc, f"shard {k}", name, path) from exc
        if kept is not None:
            _take_and_keep(layout, name, k, path, unit, kept, reads, indexes)
        return unit.data


@contextmanager
def _locked(unit: CheckedUnit) -> Iterator[CheckedUnit]:
    with unit.lock:
        yield unit


def _take_and_keep(
    layout: ChunkLayout,
    name: str,
    k: int,
    path: str,
    unit: CheckedUnit,
    kept: KeptChunks,
    reads: list[int],
    indexes: ShardIndexCache | None,
) -> None:
    """This call's ``reads`` of shard ``k`` counted, then, unless another call waits for the
    unit's bytes (it gets them whole: none of its chunks copied for it), the chunks this
    worker reads later kept (docs/design.md, "Reading shards by URL")."""
    kept.take(name, reads)
    if unit.users > 1:  # (read without the table lock: one arriving now waits for the bytes)
        return
    data = unit.data
    index = _index(layout, name, k, path, data, indexes)
    keep_inside(kept, name, k, index, memoryview(data), 0, len(data))


def _index(
    layout: ChunkLayout,
    name: str,
    k: int,
    path: str,
    data: memoryview | None,
    indexes: ShardIndexCache | None,
) -> np.ndarray:
    f: Any = BufferFile(data) if data is not None else RangeFile(layout.opener.fs, path)
    return shard_index(layout, name, k, path, f, None, indexes)


def _fetch_run(layout: ChunkLayout, name: str, run: Run, kept: KeptChunks | None) -> None:
    """One request: bytes [start, end) of the shard, its pieces decoded from them, the chunks
    between them that this worker reads later kept."""
    k, path, index, pieces, start, end = run
    with shard_errors(layout, name, k, path, (part for *_, part in pieces)):
        buf, got = RangeFile(layout.opener.fs, path).fetch(start, end)
        _read_runs(layout, name, k, pieces, index, path, _slices(buf, got, start), end - start)
        if kept is not None and len(pieces) < len(index):
            keep_inside(kept, name, k, index, buf, start, got)
