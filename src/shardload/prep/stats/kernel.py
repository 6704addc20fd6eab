"""The float32 sums of a block's statistics in shardload's optional compiled kernel.

``stats_f32`` (``formats/zarr/_stats_f32.c``, built into the ``_decode_rows`` extension by
setup.py) makes :func:`~shardload.prep.stats.block._partial_slabs`' two passes over a float32
block in one call without the GIL, adding in numpy's order: the same bits as numpy's
reductions, which compute them where the kernel is not built (``KERNEL`` is None).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardload.util import extension

_compiled: Any = extension.compiled()  # the optional compiled part (setup.py), or None

#: The arguments ``stats_f32`` takes (the extension's ``STATS_ABI``): an older build beside
#: newer sources is never called.
STATS_ABI = extension.STATS_ABI
#: The compiled kernel, or None (then numpy computes the statistics).
KERNEL: Any = _compiled if getattr(_compiled, "STATS_ABI", 0) == STATS_ABI else None


def sums_f32(
    v: np.ndarray, step: int, *, check: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """``(s1, sd, sq, min, max)`` of a C-contiguous float32 block ``v`` of shape ``(n, nf)``
    (``n >= 1``), rows taken ``step`` at a time: the sums of the values, of their deviations
    from the mean rounded to float32, and of those deviations' squares (float64), the minimum
    and maximum (float32). None where a feature's sum is not finite (a NaN or an infinity);
    ``check``: then the first pass stops at the first slab whose sums are not all finite."""
    n, nf = v.shape
    s1, sd, sq = np.zeros(nf), np.zeros(nf), np.zeros(nf)
    mn, mx = np.empty(nf, np.float32), np.empty(nf, np.float32)
    scratch = np.empty(3 * nf)  # two slab sums (float64) and the float32 center
    got = KERNEL.stats_f32(
        v.ctypes.data,
        n,
        nf,
        step,
        check,
        s1.ctypes.data,
        sd.ctypes.data,
        sq.ctypes.data,
        mn.ctypes.data,
        mx.ctypes.data,
        scratch.ctypes.data,
    )
    return (s1, sd, sq, mn, mx) if got > 0 else None  # got < 0: minus the rows summed
