"""Steps on whole attributes, after the block-wise pass: standardisation and k-means facies.

Both need statistics of a whole attribute (its mean and standard deviation; the cluster
centres), so they cannot run block by block in the first pass. A compute with steps runs in
two passes through one commit (docs/compute.md, "Steps"):

1. the attributes, block by block (records ``0 .. S-1``);
2. the statistics come from the first pass's records (the manifest's ``stats``); k-means is
   fitted by dask-ml's ``KMeans`` (extra ``ml``) on the attribute vectors read back from the
   written chunks, chunk by chunk (a dask array over the store, :data:`FIT_ROWS` vectors a
   chunk: no copy of the data in memory), and its centres saved in the progress folder (a
   resumed run reuses them);
3. each step's output, slab by slab (records ``S .. 2S-1``), through the same commit.

Config (an entry of ``attributes`` without ``function``)::

    env_z:  {standardize: env}                   # (env - mean) / std, float32
    facies: {kmeans: {inputs: [env, rms], n_clusters: 6, standardize: true,
                      random_state: 0, max_iter: 100, tol: 1e-4}}   # labels, int32
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import ConfigError, require

STEP_KINDS = ("standardize", "kmeans")
KMEANS_OPTIONS = ("inputs", "n_clusters", "standardize", "random_state", "max_iter", "tol")
#: Attribute vectors per dask chunk of the k-means fit, and per batch of the prediction: the
#: fit's and the labelling's working memory (x n_clusters x 8 bytes for the distances).
FIT_ROWS = 2**18


@dataclass(frozen=True)
class StepConfig:
    name: str
    kind: str  # "standardize" | "kmeans"
    inputs: tuple[str, ...]
    n_clusters: int = 8
    standardize: bool = True
    random_state: int = 0
    max_iter: int = 100
    tol: float = 1e-4

    @property
    def dtype(self) -> str:
        return "int32" if self.kind == "kmeans" else "float32"


@dataclass(frozen=True)
class StepModel:
    """What a step needs for pass 2: per input ``(mean, std)`` and, for k-means, the centres."""

    means: tuple[float, ...]
    stds: tuple[float, ...]
    centers: np.ndarray | None = None
    describe: Mapping[str, Any] = field(default_factory=dict)


def parse_step(name: str, raw: Mapping[str, Any]) -> StepConfig:
    where = f"attributes.{name}"
    kinds = [k for k in STEP_KINDS if k in raw]
    if len(kinds) != 1 or len(raw) != 1:
        raise ConfigError(
            f"{where}: give 'function: module:name', or exactly one step: "
            f"{{standardize: ATTRIBUTE}} or {{kmeans: {{inputs: [...], n_clusters: K}}}}; "
            f"got keys {sorted(raw)}"
        )
    kind = kinds[0]
    if kind == "standardize":
        src = raw[kind]
        if not isinstance(src, str):
            raise ConfigError(f"{where}.standardize: {src!r}; give the name of one attribute")
        return StepConfig(str(name), kind, (src,))
    opts = raw[kind]
    if not isinstance(opts, Mapping):
        raise ConfigError(f"{where}.kmeans: give {{inputs: [ATTRIBUTE, ...], n_clusters: K}}")
    bad = sorted(set(opts) - set(KMEANS_OPTIONS))
    if bad:
        raise ConfigError(f"{where}.kmeans: unknown option(s) {bad}; known: {list(KMEANS_OPTIONS)}")
    inputs = opts.get("inputs")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not inputs or not all(isinstance(i, str) for i in inputs):
        raise ConfigError(f"{where}.kmeans.inputs: {inputs!r}; give a list of attribute names")
    k = opts.get("n_clusters", 8)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"{where}.kmeans.n_clusters: {k!r}; give a positive integer")
    it = opts.get("max_iter", 100)
    if isinstance(it, bool) or not isinstance(it, int) or it < 1:
        raise ConfigError(f"{where}.kmeans.max_iter: {it!r}; give a positive integer")
    return StepConfig(
        str(name),
        kind,
        tuple(inputs),
        n_clusters=k,
        standardize=bool(opts.get("standardize", True)),
        random_state=int(opts.get("random_state", 0)),
        max_iter=it,
        tol=float(opts.get("tol", 1e-4)),
    )


def check_steps(steps: Mapping[str, StepConfig], attributes: Sequence[str]) -> None:
    """Inputs are attributes of the first pass (not steps), named once."""
    for s in steps.values():
        where = f"attributes.{s.name}.{s.kind}" + (".inputs" if s.kind == "kmeans" else "")
        for i in s.inputs:
            if i not in attributes:
                raise ConfigError(
                    f"{where}: {i!r} is not an attribute computed by a function "
                    f"(those are {list(attributes)})"
                )
        if len(set(s.inputs)) != len(s.inputs):
            raise ConfigError(f"{where}: {list(s.inputs)} names an attribute twice")
    if any(s.kind == "kmeans" for s in steps.values()):
        require("dask_ml", "ml")


class _Vectors:
    """The attribute vectors ``(voxel, input)`` of the written arrays, standardised or not, as
    an array-like dask reads chunk by chunk (rows ``a:b`` of the voxels in C order)."""

    def __init__(self, root: str, step: StepConfig, model: StepModel, shape: Sequence[int]) -> None:
        self.root, self.step, self.model = root, step, model
        self.row_elems = int(np.prod(shape[1:], dtype=np.int64))
        self.shape = (int(np.prod(shape, dtype=np.int64)), len(step.inputs))
        self.dtype = np.dtype(np.float64)
        self.ndim = 2
        self._arrays: list[Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": None}

    def __getitem__(self, key: Any) -> np.ndarray:
        rows = key[0] if isinstance(key, tuple) else key
        a, b, _ = rows.indices(self.shape[0])
        out = self.read(a, b)
        return out[(slice(None), *key[1:])] if isinstance(key, tuple) else out

    def read(self, a: int, b: int) -> np.ndarray:
        import zarr

        if self._arrays is None:
            self._arrays = [
                zarr.open_array(store=self.root, path=n, mode="r") for n in self.step.inputs
            ]
        r0, r1 = a // self.row_elems, -(-b // self.row_elems)
        off = r0 * self.row_elems
        cols = [np.asarray(arr[r0:r1]).reshape(-1)[a - off : b - off] for arr in self._arrays]
        return vectors(cols, self.model, self.step.standardize)


def vectors(cols: Sequence[np.ndarray], model: StepModel, standardize: bool) -> np.ndarray:
    """``(n, inputs)`` float64: each input column, standardised with ``model`` or not."""
    out = np.empty((len(cols[0]), len(cols)), dtype=np.float64)
    for j, c in enumerate(cols):
        out[:, j] = c
        if standardize:
            out[:, j] -= model.means[j]
            out[:, j] /= model.stds[j]
    return out


def fit_kmeans(
    root: str, step: StepConfig, model: StepModel, shape: Sequence[int], workers: int
) -> np.ndarray:
    """dask-ml ``KMeans`` (k-means|| init, Lloyd iterations) on the attribute vectors read
    from the written chunks; the centres ``(n_clusters, inputs)``."""
    import dask
    import dask.array as da

    cluster = require("dask_ml.cluster", "ml")
    vec = _Vectors(root, step, model, shape)
    x = da.from_array(
        vec,
        chunks=(FIT_ROWS, -1),
        asarray=False,
        lock=False,
        meta=np.empty((0, 0), dtype=np.float64),
        name=f"vectors-{step.name}",
    )
    if x.shape[0] < step.n_clusters:
        raise ConfigError(
            f"attributes.{step.name}.kmeans.n_clusters: {step.n_clusters} clusters for "
            f"{x.shape[0]} vectors"
        )
    km = cluster.KMeans(
        n_clusters=step.n_clusters,
        random_state=step.random_state,
        max_iter=step.max_iter,
        tol=step.tol,
        init="k-means||",
    )
    with dask.config.set(scheduler="threads", num_workers=workers):
        km.fit(x)
    return np.asarray(km.cluster_centers_, dtype=np.float64)


def apply_step(step: StepConfig, model: StepModel, cols: Sequence[np.ndarray]) -> np.ndarray:
    """The step's output for one slab (``cols``: each input's values, same shape)."""
    shape = cols[0].shape
    flat = [c.reshape(-1) for c in cols]
    if step.kind == "standardize":
        z = vectors(flat, model, True)[:, 0]
        return z.astype(np.float32).reshape(shape)
    from sklearn.metrics import pairwise_distances_argmin_min

    assert model.centers is not None
    labels = np.empty(len(flat[0]), dtype=np.int32)
    for a in range(0, len(labels), FIT_ROWS):  # bounded working memory
        x = vectors([c[a : a + FIT_ROWS] for c in flat], model, step.standardize)
        lab, _ = pairwise_distances_argmin_min(x, model.centers)  # as dask-ml's predict
        labels[a : a + FIT_ROWS] = lab
    return labels.reshape(shape)


def save_centers(path: Path, centers: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, centers, allow_pickle=False)
    return buf.getvalue()
