"""Pure planning of source-chunk reuse: which decoded source chunks each block reads, how often
each chunk is read in a run, when it is next needed, and how many bytes of decoded chunks to keep.

A block's window (the block with its halo, :func:`shardload.blockwise.plan.plan_axis`) reads
the source chunks it overlaps. Blocks smaller than the source's chunks read the same chunk many
times (blocks 32^3 of a cube stored in chunks of 64 whole inlines: 256 blocks per chunk and
slab); a decoded chunk kept while those blocks run is decoded once. Windows are separable, so
everything is planned per axis: block ``j`` along axis ``k`` reads chunks ``reads[k][j]``, and
chunk ``(c0, c1, ...)`` is read by the blocks of the product of ``readers[k][ck]``. Slabs (the
blocks along axis 0, one task each) run in ``order``; blocks inside a slab in C order.

>>> p = plan_reuse(((64, 64), (512,)), ((32, 32, 32, 32), (512,)), [(8, 0)], [("reflect",) * 2])
>>> p.reads[0]
((0,), (0, 1), (0, 1), (1,))
>>> p.uses((0, 0)), p.uses((1, 0)), p.next_use((1, 0), finished=set())
(3, 3, (1, 0))
>>> p.cache_bytes(itemsize=4, tasks=2) // 2**10   # two chunks of 64 x 512 float32
256
>>> p.direct_read_bytes(itemsize=4)   # every window reads a chunk other blocks read too
0
>>> plan_reuse(((4, 4),), ((4, 4),), [(0,)], [("reflect",)]).direct_read_bytes(itemsize=4)
16
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import product

import numpy as np

from shardload.blockwise.plan import Boundary, plan_axis, runs

Chunk = tuple[int, ...]


def _edges(sizes: Sequence[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


@dataclass(frozen=True)
class ReusePlan:
    """Source chunks read per block, per axis (see the module docstring)."""

    source_chunks: tuple[tuple[int, ...], ...]  # the source's chunk sizes per axis
    blocks: tuple[tuple[int, ...], ...]  # the compute blocks per axis
    reads: tuple[tuple[tuple[int, ...], ...], ...]  # [axis][block] -> chunk indices read
    readers: tuple[tuple[tuple[int, ...], ...], ...]  # [axis][chunk] -> blocks reading it
    order: tuple[int, ...]  # the slabs of this run, in the order they start

    @cached_property
    def edges(self) -> tuple[np.ndarray, ...]:
        """The source chunks' edges per axis."""
        return tuple(_edges(s) for s in self.source_chunks)

    def chunk_box(self, chunk: Chunk) -> list[tuple[int, int]]:
        """The chunk's ``(start, stop)`` per axis, in source coordinates."""
        return [(int(e[c]), int(e[c + 1])) for e, c in zip(self.edges, chunk, strict=True)]

    def block_chunks(self, slab: int, inner: Sequence[int]) -> list[Chunk]:
        """Every source chunk the window of block ``(slab, *inner)`` reads."""
        per_axis = [self.reads[0][slab]] + [self.reads[k + 1][j] for k, j in enumerate(inner)]
        return [tuple(c) for c in product(*per_axis)]

    @cached_property
    def _positions(self) -> dict[int, int]:
        return {s: i for i, s in enumerate(self.order)}

    def slab_reads(self, c0: int) -> int:
        """How many slabs of this run read chunks of row ``c0`` (axis 0)."""
        return sum(1 for s in self.readers[0][c0] if s in self._positions)

    def uses(self, chunk: Chunk) -> int:
        """How many blocks of this run read ``chunk``."""
        n = self.slab_reads(chunk[0])
        for k in range(1, len(chunk)):
            n *= len(self.readers[k][chunk[k]])
        return n

    def next_use(self, chunk: Chunk, *, finished: Collection[int]) -> tuple[int, ...] | None:
        """Where ``chunk`` is next read: ``(position of the slab in order, first inner block)``,
        skipping finished slabs; None when no slab left reads it (the eviction key: farthest
        first)."""
        pos = self._positions
        slabs = [pos[s] for s in self.readers[0][chunk[0]] if s in pos and s not in finished]
        if not slabs:
            return None
        return (min(slabs), *(self.readers[k][chunk[k]][0] for k in range(1, len(chunk))))

    def cache_bytes(self, *, itemsize: int, tasks: int) -> int:
        """Bytes of the decoded chunks that any ``tasks`` slabs in flight read more than once:
        the ``tasks`` largest slabs' chunks, at most every such chunk of the run. Slabs start
        in order, but a slow one may lag any number of slabs behind the others, so the bound
        does not assume the slabs in flight are neighbours."""
        sizes = np.ones((), dtype=np.int64)  # elements of each inner chunk (c1, c2, ...)
        counts = np.ones((), dtype=np.int64)  # inner blocks reading it
        for s, rd in zip(self.source_chunks[1:], self.readers[1:], strict=True):
            sizes = np.multiply.outer(sizes, np.asarray(s, dtype=np.int64))
            counts = np.multiply.outer(counts, np.asarray([len(r) for r in rd], dtype=np.int64))
        every = int(sizes.sum())  # a row read by two slabs: each of its chunks read twice
        shared = int(sizes[counts > 1].sum())  # else: the chunks two inner blocks read

        def row_bytes(c0: int) -> int:
            return int(self.source_chunks[0][c0]) * (every if self.slab_reads(c0) > 1 else shared)

        per_slab = sorted(sum(row_bytes(c) for c in self.reads[0][s]) for s in self.order)
        rows = {c for s in self.order for c in self.reads[0][s]}
        largest = sum(per_slab[-max(1, tasks) :])
        return min(largest, sum(row_bytes(c) for c in rows)) * itemsize

    def direct_read_bytes(self, *, itemsize: int) -> int:
        """The most bytes of source chunks one window decodes in a single read: the windows all
        of whose chunks are read once (by that block alone) are read straight from the source,
        decoding every chunk they overlap at once; 0 when there are none."""
        if not self.order:
            return 0
        most = 1
        for k, (reads, readers) in enumerate(zip(self.reads, self.readers, strict=True)):
            run = self.order if k == 0 else range(len(reads))
            sizes = self.source_chunks[k]
            boxes = [
                sum(sizes[c] for c in reads[j])
                for j in run
                if all((self.slab_reads(c) if k == 0 else len(readers[c])) == 1 for c in reads[j])
            ]
            if not boxes:
                return 0
            most *= max(boxes)
        return most * itemsize


def plan_reuse(
    source_chunks: Sequence[Sequence[int]],
    blocks: Sequence[Sequence[int]],
    depths: Sequence[Sequence[int]],
    boundaries: Sequence[Sequence[Boundary]],
    order: Sequence[int] | None = None,
) -> ReusePlan:
    """The reuse plan of blocks ``blocks`` over a source chunked ``source_chunks``, for
    attributes with ``depths`` and ``boundaries`` (one sequence per attribute), running the
    slabs ``order`` (default: all, in order)."""
    reads, readers = [], []
    for k, (src, blk) in enumerate(zip(source_chunks, blocks, strict=True)):
        n = int(sum(src))
        src_edges, blk_edges = _edges(src), _edges(blk)
        axis_reads = []
        for j in range(len(blk)):
            a, b = int(blk_edges[j]), int(blk_edges[j + 1])
            idx = [
                i
                for d, bd in zip(depths, boundaries, strict=True)
                for i in plan_axis(a, b, n, d[k], bd[k]).index
            ]
            chunks: set[int] = set()
            for lo, hi in runs(idx):
                first = int(np.searchsorted(src_edges, lo, side="right")) - 1
                last = int(np.searchsorted(src_edges, hi - 1, side="right")) - 1
                chunks.update(range(first, last + 1))
            axis_reads.append(tuple(sorted(chunks)))
        users: list[list[int]] = [[] for _ in src]
        for j, cs in enumerate(axis_reads):
            for c in cs:
                users[c].append(j)
        reads.append(tuple(axis_reads))
        readers.append(tuple(tuple(u) for u in users))
    return ReusePlan(
        tuple(tuple(int(c) for c in s) for s in source_chunks),
        tuple(tuple(int(c) for c in b) for b in blocks),
        tuple(reads),
        tuple(readers),
        tuple(range(len(blocks[0]))) if order is None else tuple(order),
    )
