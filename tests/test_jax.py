"""Feeding JAX from ``iter_batches`` (docs/loading.md, "JAX"): one copy at most per batch.

The JAX part runs in a child interpreter: JAX starts threads when imported, and a pytest process
that imported it would then fork DataLoader workers in later tests (JAX warns that this may
deadlock, and the warning is an error under this suite's filters).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shardload

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None,
    reason="jax is not installed (pip install 'shardload[jax]', the CPU build from PyPI)",
)


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    import xarray as xr

    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {
            "t": (("time", "z"), rng.standard_normal((1000, 13)).astype("f4")),
            "y": (("time",), rng.standard_normal(1000).astype("f4")),
        }
    )
    out = tmp_path / "store"
    shardload.prepare(
        {
            "sample_dims": ["time"],
            "arrays": {"x": ["t"], "y": ["y"]},
            "chunk_rows": 100,
            "compression": "none",
            "out": str(out),
        },
        dataset=ds,
    )
    return str(out)


#: run by a child interpreter with the store's path as its argument
_CHECK = """
import sys
import jax
import jax.numpy as jnp
import numpy as np
import shardload

store_path = sys.argv[1]
store = shardload.open_store(store_path)
held = []
aligned = aliased = 0
for batch in shardload.iter_batches(store, batch_size=64, seed=0, epoch=0):
    x = batch["x"]
    xj = jax.device_put(x)  # the docs' example
    ptr = xj.unsafe_buffer_pointer()
    if x.ctypes.data % 64 == 0:
        # JAX on the CPU aliases a 64-byte aligned, C-contiguous numpy buffer: no copy
        aligned += 1
        aliased += ptr == x.ctypes.data
    held.append((batch["index"], xj, jnp.sum(xj, axis=1)))
assert aligned > 0, "no batch was 64-byte aligned: the zero-copy path went untested"
assert aliased == aligned, f"{aligned - aliased} of {aligned} aligned batches were copied"
# every JAX array still holds its rows after the loader moved on (an aliased buffer that
# the loader reused would show here as another batch's values)
for index, xj, sums in held:
    want = np.stack([store.read("x", int(i), int(i) + 1)[0] for i in index])
    np.testing.assert_array_equal(np.asarray(xj), want)
    np.testing.assert_allclose(np.asarray(sums), want.sum(axis=1), rtol=1e-5)
assert sorted(int(i) for index, _, _ in held for i in index) == list(range(len(store)))
print("checked", aligned, "aligned batches")
"""


def test_device_put_of_a_batch_is_its_only_copy_and_holds_its_values(store_path: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, store_path],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "checked" in done.stdout
