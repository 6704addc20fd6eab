"""Pure planning for the block-wise compute engine: windows, halos, padding and memory.

Everything here is arithmetic on shapes (no I/O), so that it can be tested exhaustively.

A *block* is one chunk of the source grid (``chunks`` per axis, as in dask). For an attribute with
``depth`` and ``boundary`` per axis, the block's *padded window* is the block grown by ``depth`` on
each side in the coordinates of the array padded as :func:`dask.array.overlap.boundaries` pads it
(axis by axis: ``reflect`` = numpy ``symmetric``, ``periodic`` = ``wrap``, ``nearest`` = ``edge``,
a number = constant; ``none`` = no padding, the halo is absent at the array edge). Padding axis by
axis with these modes is separable: element ``(i, j, ...)`` of the padded array is
``x[m0(i), m1(j), ...]`` (or the constant where any axis is outside), which is what
:func:`plan_axis` computes as an index map per axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np

from shardload.errors import ConfigError

BOUNDARY_MODES = ("reflect", "periodic", "nearest", "none")
#: Index-map value of an element that takes the constant boundary value.
CONSTANT = -1
#: Bytes the estimate adds for the interpreter, libraries and codec state.
BASE_BYTES = 256 * 2**20

Boundary = str | float


def check_boundary(value: object, where: str) -> Boundary:
    """A boundary mode (one of :data:`BOUNDARY_MODES`) or a constant number."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {value!r} is not a boundary; use one of {BOUNDARY_MODES}")
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in BOUNDARY_MODES:
        return value
    raise ConfigError(
        f"{where}: unknown boundary {value!r}; use one of {list(BOUNDARY_MODES)} or a number"
    )


def normalize_chunks(
    chunks: Mapping[int, int] | Sequence[Sequence[int]],
    shape: Sequence[int],
    *,
    where: str = "chunks",
) -> tuple[tuple[int, ...], ...]:
    """Block sizes per axis (dask's ``chunks`` tuple) from ``{axis: size}`` (``-1``: whole axis;
    axes not named: whole axis) or from explicit block sizes per axis."""
    ndim = len(shape)
    if isinstance(chunks, Mapping):
        sizes: dict[int, int] = {}
        for k, v in chunks.items():
            axis = int(k)
            if not -ndim <= axis < ndim:
                raise ConfigError(f"{where}: axis {k} does not exist (the source has {ndim} axes)")
            if isinstance(v, bool) or not isinstance(v, int) or (v < 1 and v != -1):
                raise ConfigError(f"{where}.{k}: {v!r}; give a positive block size or -1 (whole)")
            sizes[axis % ndim] = v
        out = []
        for a, n in enumerate(shape):
            c = sizes.get(a, -1)
            c = n if c == -1 else min(c, n)
            out.append(tuple(min(c, n - s) for s in range(0, n, c)) if n else (0,))
        return tuple(out)
    result = tuple(tuple(int(c) for c in ax) for ax in chunks)
    if len(result) != ndim or any(sum(c) != n for c, n in zip(result, shape, strict=True)):
        raise ConfigError(
            f"{where}: block sizes {result} do not add up to the shape {tuple(shape)}"
        )
    return result


def normalize_depth(
    depth: Mapping[int, int] | int | None, ndim: int, where: str
) -> tuple[int, ...]:
    if depth is None:
        return (0,) * ndim
    if isinstance(depth, int) and not isinstance(depth, bool):
        items: Mapping[int, int] = dict.fromkeys(range(ndim), depth)
    elif isinstance(depth, Mapping):
        items = depth
    else:
        raise ConfigError(f"{where}: {depth!r}; give {{axis: halo size}} or one number")
    out = [0] * ndim
    for k, v in items.items():
        axis = int(k)
        if not -ndim <= axis < ndim:
            raise ConfigError(f"{where}: axis {k} does not exist (the source has {ndim} axes)")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"{where}.{k}: {v!r}; give a halo size >= 0")
        out[axis % ndim] = v
    return tuple(out)


def normalize_boundary(
    boundary: Boundary | Mapping[int, Boundary] | None, ndim: int, where: str
) -> tuple[Boundary, ...]:
    """One boundary per axis (dask's default is ``reflect``)."""
    if boundary is None:
        return ("reflect",) * ndim
    if isinstance(boundary, Mapping):
        out: list[Boundary] = ["reflect"] * ndim
        for k, v in boundary.items():
            axis = int(k)
            if not -ndim <= axis < ndim:
                raise ConfigError(f"{where}: axis {k} does not exist (the source has {ndim} axes)")
            out[axis % ndim] = check_boundary(v, f"{where}.{k}")
        return tuple(out)
    b = check_boundary(boundary, where)
    return (b,) * ndim


def ensure_minimum_chunksize(size: int, chunks: Sequence[int]) -> tuple[int, ...]:
    """Blocks along one axis so that every block holds at least ``size`` elements, merged
    exactly as dask's ``map_overlap`` merges them (``dask.array.overlap.ensure_minimum_chunksize``,
    reproduced so that planning needs no dask; a test compares the two).

    >>> ensure_minimum_chunksize(10, (20, 20, 1))
    (20, 11, 10)
    """
    if size <= min(chunks):
        return tuple(chunks)
    output: list[int] = []
    new = 0
    for c in chunks:
        if c < size:
            if new > size + (size - c):
                output.append(new - (size - c))
                new = size
            else:
                new += c
        if new >= size:
            output.append(new)
            new = 0
        if c >= size:
            new += c
    if new >= size:
        output.append(new)
    elif output:
        output[-1] += new
    else:
        raise ValueError(f"the depth {size} is larger than the axis ({sum(chunks)})")
    return tuple(output)


def plan_overlap_chunks(
    chunks: Sequence[Sequence[int]], depths: Mapping[str, Sequence[int]]
) -> tuple[tuple[int, ...], ...]:
    """The blocks every attribute runs on, as dask's ``map_overlap`` would rechunk them.

    Where a depth exceeds the smallest block along an axis, dask merges small blocks into their
    neighbours; this does the same. Refused (clear error naming the attribute and option) where
    the rechunked blocks would differ between attributes, or along axis 0 (whose blocks are the
    output store's equal chunks).
    """
    out = []
    for axis, sizes in enumerate(chunks):
        widest = max((d[axis] for d in depths.values()), default=0)
        try:
            shared = ensure_minimum_chunksize(widest, sizes)
        except ValueError:
            name = next(n for n, d in depths.items() if d[axis] == widest)
            raise ConfigError(
                f"attributes.{name}.depth: depth {widest} along axis {axis} is larger than the "
                f"axis ({sum(sizes)} elements)"
            ) from None
        if shared != tuple(sizes):
            for name, d in depths.items():
                if axis == 0 or ensure_minimum_chunksize(d[axis], sizes) != shared:
                    raise ConfigError(
                        f"attributes.{name}.depth: depth {widest} along axis {axis} is larger than "
                        f"the smallest block along that axis ({min(sizes)} of blocks "
                        f"{tuple(sizes)}); dask would rechunk to {shared}"
                        + (
                            ", which the output store's equal chunks along axis 0 cannot hold"
                            if axis == 0
                            else " for some attributes only"
                        )
                        + "; use other chunks (option 'chunks') or a smaller depth"
                    )
        out.append(shared)
    return tuple(out)


@dataclass(frozen=True)
class AxisWindow:
    """One axis of one block for one attribute."""

    start: int  # the block, in source coordinates
    stop: int
    index: tuple[int, ...]  # source index of each element of the padded window (CONSTANT: value)
    trim_left: int  # elements to drop from the function's output before the block

    @property
    def size(self) -> int:
        return len(self.index)


def plan_axis(start: int, stop: int, n: int, depth: int, boundary: Boundary) -> AxisWindow:
    """The padded window of block ``[start, stop)`` of an axis of length ``n``.

    >>> plan_axis(0, 4, 10, 2, "reflect").index
    (1, 0, 0, 1, 2, 3, 4, 5)
    >>> plan_axis(8, 10, 10, 2, "periodic").index
    (6, 7, 8, 9, 0, 1)
    >>> plan_axis(0, 4, 10, 2, "none").index, plan_axis(0, 4, 10, 2, "none").trim_left
    ((0, 1, 2, 3, 4, 5), 0)
    """
    if boundary == "none":
        lo, hi = max(start - depth, 0), min(stop + depth, n)
    else:
        lo, hi = start - depth, stop + depth
    idx = []
    for i in range(lo, hi):
        if 0 <= i < n:
            idx.append(i)
        elif boundary == "reflect":
            idx.append(-i - 1 if i < 0 else 2 * n - 1 - i)
        elif boundary == "nearest":
            idx.append(0 if i < 0 else n - 1)
        elif boundary == "periodic":
            idx.append(i % n)
        else:  # a constant
            idx.append(CONSTANT)
    return AxisWindow(start, stop, tuple(idx), start - lo)


def runs(indices: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted unique non-negative ``indices`` as contiguous ``[a, b)`` runs.

    >>> runs([6, 7, 8, 9, 0, 1, -1])
    [(0, 2), (6, 10)]
    """
    vals = sorted({i for i in indices if i >= 0})
    out: list[tuple[int, int]] = []
    for v in vals:
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0], v + 1)
        else:
            out.append((v, v + 1))
    return out


def block_grid(chunks: Sequence[Sequence[int]]) -> list[tuple[tuple[int, int], ...]]:
    """Every block as ``((start, stop) per axis)``, in C order (axis 0 slowest)."""
    edges = []
    for sizes in chunks:
        e = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        edges.append([(int(e[i]), int(e[i + 1])) for i in range(len(sizes))])
    return [tuple(b) for b in product(*edges)]


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes of a run, before it starts."""

    tasks: int
    window_bytes: int  # the largest block with its (widest) halo, source dtype
    per_task_bytes: int
    total_bytes: int
    cache_bytes: int = 0  # decoded source chunks kept for the blocks that read them again
    decode_bytes: int = 0  # per task: what decoding one source chunk holds besides the result

    def describe(self) -> str:
        chunks = ""
        if self.cache_bytes or self.decode_bytes:
            chunks = (
                f"decoded-chunk cache {self.cache_bytes / 2**20:.1f} MiB + {self.tasks} x "
                f"{self.decode_bytes / 2**20:.1f} MiB decoding + "
            )
        return (
            f"({self.tasks} concurrent task(s) + 1) x {self.per_task_bytes / 2**20:.1f} MiB "
            f"(block window {self.window_bytes / 2**20:.1f} MiB with halo) + {chunks}"
            f"{BASE_BYTES / 2**20:.0f} MiB = {self.total_bytes / 2**20:.1f} MiB"
        )


def plan_memory(
    chunks: Sequence[Sequence[int]],
    depths: Sequence[Sequence[int]],
    *,
    itemsize: int,
    out_itemsizes: Sequence[int],
    work_bytes_per_element: Sequence[float],
    tasks: int,
    cache_bytes: int = 0,
    decode_bytes: int = 0,
) -> MemoryEstimate:
    """Peak memory: ``(tasks + 1) x per_task + cache_bytes + tasks x decode_bytes + BASE_BYTES``.

    A task holds the window it read (block + widest halo), one padded copy of it (edge blocks),
    one attribute's function output and working memory at a time (``work_bytes_per_element`` per
    window element: what the function allocates), and the output of every attribute for the
    axis-0 slab of blocks it writes (one store chunk per attribute). The ``+ 1`` is the
    encoded/decoded copies held by the codecs on read and write. ``cache_bytes``: the decoded
    source chunks kept for blocks that read them again (:mod:`shardload.blockwise.cache`);
    ``decode_bytes``: what a task decoding one source chunk holds besides the decoded chunk.
    """
    ndim = len(chunks)
    widest = [max((d[a] for d in depths), default=0) for a in range(ndim)]
    win_elems = int(np.prod([max(c) + 2 * w for c, w in zip(chunks, widest, strict=True)]))
    window = win_elems * itemsize
    slab_elems = max(chunks[0]) * int(np.prod([sum(c) for c in chunks[1:]], dtype=np.int64))
    work = max(
        (
            int(win_elems * (o + w))
            for o, w in zip(out_itemsizes, work_bytes_per_element, strict=True)
        ),
        default=0,
    )
    per_task = 2 * window + work + slab_elems * int(sum(out_itemsizes))
    total = (tasks + 1) * per_task + cache_bytes + tasks * decode_bytes + BASE_BYTES
    return MemoryEstimate(tasks, window, per_task, total, cache_bytes, decode_bytes)
