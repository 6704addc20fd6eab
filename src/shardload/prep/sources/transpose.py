"""Rows of a transposed (strided) view copied into place in cache-sized blocks.

A window series is written space-major (a space point's steps are one run of rows) while a
netCDF file holds it time-major, ``(time, lat, lon, lev)``: each block's slab, read in storage
order, is transposed on its way into the block. numpy's copy of such a view walks one of the
two arrays against its strides, a few bytes at a time (4 float32 levels: 16-byte runs, 10x a
plain copy of the same bytes). :func:`copy_transposed` copies the trailing axes contiguous in
both arrays as one item (a void of their bytes) and walks the source's slowest axis a few items
at a time, so that both arrays are read and written in runs that stay in cache. Copies of
bytes: no value is converted, the result is the same bits as ``dst[...] = src``.
"""

from __future__ import annotations

import numpy as np

#: items of the source's slowest axis copied at a time (16-32 were fastest here, for 4- to
#: 16-byte items; larger items are long runs in any order)
BLOCK = 16


def copy_transposed(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` (same shape and dtype), blocked along ``src``'s slowest axis."""
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise ValueError(f"cannot copy {src.shape} {src.dtype} into {dst.shape} {dst.dtype}")
    if src.size == 0:
        return
    d, s = _merged(dst, src)
    if s.ndim < 2:
        np.copyto(d, s)
        return
    ax = max(range(s.ndim), key=lambda i: abs(s.strides[i]) if s.shape[i] > 1 else -1)
    if ax == 0 or s.shape[ax] <= BLOCK:
        np.copyto(d, s)
        return
    for i in range(0, s.shape[ax], BLOCK):
        cut = (slice(None),) * ax + (slice(i, i + BLOCK),)
        np.copyto(d[cut], s[cut])


def copy_rows(dst: np.ndarray, src: np.ndarray, lo: int, hi: int, lead: int) -> None:
    """``dst[...] = src.reshape(-1, *src.shape[lead:])[lo:hi]`` without that reshape's copy:
    rows ``[lo, hi)`` of ``src``'s first ``lead`` axes flattened in C order, each whole
    sub-block copied by :func:`copy_transposed` straight into ``dst`` (``(hi - lo, *rest)``)."""
    if hi <= lo:
        return
    if lead <= 1:
        copy_transposed(dst, src[lo:hi])
        return
    inner = int(np.prod(src.shape[1:lead], dtype=np.int64))
    i0, i1 = lo // inner, (hi - 1) // inner + 1  # src[i0:i1] holds the rows
    w0 = i0 + (lo > i0 * inner)  # src[w0:w1] are whole
    w1 = max(w0, i1 - (hi < i1 * inner))
    at = 0
    if w0 > i0:  # the head, part of src[i0]
        n = min(hi, w0 * inner) - lo
        copy_rows(dst[:n], src[i0], lo - i0 * inner, lo - i0 * inner + n, lead - 1)
        at = n
    if w1 > w0:
        n = (w1 - w0) * inner
        whole = src[w0:w1]
        try:
            part = dst[at : at + n].view()
            part.shape = whole.shape  # raises rather than copying
        except (AttributeError, ValueError):
            for i in range(w0, w1):
                copy_rows(dst[at + (i - w0) * inner :], src[i], 0, inner, lead - 1)
        else:
            copy_transposed(part, whole)
        at += n
    if i1 > w1:  # the tail, part of src[i1 - 1]
        copy_rows(dst[at:], src[i1 - 1], 0, hi - (i1 - 1) * inner, lead - 1)


def _merged(dst: np.ndarray, src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``dst`` and ``src`` with their trailing axes contiguous in both merged into one item (a
    void of those bytes); as they are where none is."""
    n, size, m = src.ndim, src.itemsize, 0
    while m < n:
        i = n - 1 - m
        if src.shape[i] != 1 and (src.strides[i] != size or dst.strides[i] != size):
            break
        size *= src.shape[i]
        m += 1
    if m == 0 or size == src.itemsize:
        return dst, src
    shape = src.shape[: n - m]

    def unit(a: np.ndarray) -> np.ndarray:
        v = a.view()
        v.shape = (*shape, size // a.itemsize)  # a view: those axes are contiguous
        return v.view(np.dtype((np.void, size)))[..., 0]

    return unit(dst), unit(src)
