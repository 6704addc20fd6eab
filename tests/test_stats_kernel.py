"""The float32 statistics of a block computed by the compiled kernel (prep/stats/kernel.py,
formats/zarr/_stats_f32.c): one call per block, and the same bits as numpy's reductions, which
compute them where the kernel is not built."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from shardload.prep.stats import STAT_FIELDS, partial

FIELDS = STAT_FIELDS


def _kernel() -> Any:
    """The module calling the kernel, or a skip where it is not built."""
    mod = importlib.import_module("shardload.prep.stats.kernel")
    if mod.KERNEL is None:
        pytest.skip("shardload's compiled kernel is not built (setup.py build_ext)")
    return mod


def _bits(p: Any) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    return {
        f: (
            str(np.asarray(getattr(p, f)).dtype),
            np.shape(getattr(p, f)),
            np.ascontiguousarray(getattr(p, f)).tobytes(),
        )
        for f in FIELDS
    }


def _both(monkeypatch: pytest.MonkeyPatch, block: np.ndarray) -> tuple[Any, Any]:
    mod = _kernel()
    compiled = partial(block)
    with monkeypatch.context() as m:
        m.setattr(mod, "KERNEL", None)
        numpy_only = partial(block)
    return compiled, numpy_only


class _Counting:
    def __init__(self, kernel: Any) -> None:
        self.kernel, self.calls, self.returned = kernel, 0, []

    def stats_f32(self, *args: Any) -> Any:
        self.calls += 1
        self.returned.append(self.kernel.stats_f32(*args))
        return self.returned[-1]


@pytest.mark.parametrize(
    ("shape", "calls"),
    [
        ((348480, 4), 1),  # a window series' block: reduced as rows of 256 values
        ((1000, 7), 2),  # the same, 972 rows as rows of 252 values, then the 28 left
        ((485, 34560), 1),  # a flat view's block of 485 grid points
        ((3, 5000), 1),
        ((17, 300), 1),
        ((40, 256), 1),
        ((2, 3, 4, 5), 1),
    ],
)
def test_a_float32_block_is_reduced_by_one_kernel_call(monkeypatch, shape, calls):
    mod = _kernel()
    counting = _Counting(mod.KERNEL)
    monkeypatch.setattr(mod, "KERNEL", counting)
    block = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    p = partial(block)
    assert counting.calls == calls
    x = block.reshape(-1, shape[-1]).astype(np.float64)
    np.testing.assert_allclose(p.mean, x.mean(axis=0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(p.m2, ((x - x.mean(axis=0)) ** 2).sum(axis=0), rtol=1e-5)
    np.testing.assert_array_equal(p.min, x.min(axis=0))
    np.testing.assert_array_equal(p.max, x.max(axis=0))


def test_the_kernel_gives_numpys_bits(monkeypatch):
    """Random blocks of every slab shape (rows added one by one, or a slab's sum added; slabs
    of 16 rows or more; a short last slab), values of many magnitudes and offsets, where the
    order of the additions shows in the last bits."""
    rng = np.random.default_rng(0)
    for trial in range(120):
        nf = int(rng.choice([1, 2, 3, 5, 16, 64, 100, 256, 300, 1000, 5000, 40000]))
        n = int(min(rng.integers(1, 3000), max(1, 2_000_000 // nf)))
        scale = 10.0 ** rng.integers(-8, 8, (1, nf))
        v = rng.standard_normal((n, nf)) * scale + rng.standard_normal(nf) * scale * 30
        block = (np.abs(v) if trial % 5 == 0 else v).astype(np.float32)
        compiled, numpy_only = _both(monkeypatch, block)
        assert _bits(compiled) == _bits(numpy_only), (trial, n, nf)


@pytest.mark.parametrize(
    "block",
    [
        np.array([[1, np.nan], [2, 3]], np.float32),
        np.array([[1, np.inf]] * 40, np.float32),
        np.full((100, 300), np.nan, np.float32),
        np.array([[3e38, -3e38]] * 300, np.float32),  # finite values, sums past float32
    ],
)
def test_nan_and_infinite_blocks_as_numpy_gives_them(monkeypatch, block):
    compiled, numpy_only = _both(monkeypatch, block)
    assert _bits(compiled) == _bits(numpy_only)


def test_a_nan_in_the_first_slab_stops_the_kernels_pass_at_that_slab(monkeypatch):
    """As numpy's path (tests/test_stats.py): a block of few features with NaN (a packed
    field's ``_FillValue`` over land) leaves the kernel's first pass at the first slab whose
    sum is NaN; its figures are the NaN path's."""
    import shardload.prep.stats.block as stats

    mod = _kernel()
    counting = _Counting(mod.KERNEL)
    monkeypatch.setattr(mod, "KERNEL", counting)
    rng = np.random.default_rng(11)
    x = (rng.normal(size=(400_000, 1)) * 10 + 3).astype("float32")
    x[rng.random(x.shape) < 0.2] = np.nan
    assert np.isnan(x[:100]).any()
    v = stats.as_features(x)
    assert stats._partial_slabs(v) is None
    step = stats._CACHE_BYTES // 4
    assert counting.returned == [-step]  # one slab summed, then the NaN path
    assert _bits(partial(x)) == _bits(stats._partial_slabs_nan(v))
