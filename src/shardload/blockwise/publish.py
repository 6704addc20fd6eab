"""What a compute run publishes: the statistics merged from the slabs' records, the steps'
fitted models, and the manifest of the output arrays."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardload.blockwise.job import ComputeJob
from shardload.blockwise.steps import (
    StepConfig,
    StepModel,
    fit_kmeans,
    save_centers,
)
from shardload.errors import ConfigError, NaNError
from shardload.formats.base import FormatOptions
from shardload.formats.checksums import ALGORITHM
from shardload.manifest.core import ArrayInfo, Manifest
from shardload.prep.commit import BlockCommit
from shardload.prep.stats import STAT_FIELDS, finalize, merge_all
from shardload.prep.stats import Partial as StatPartial
from shardload.version import __version__

log = logging.getLogger("shardload.blockwise.engine")  # the name users' logs have always shown


def array_info(job: ComputeJob, name: str, dtype: Any, **attrs: Any) -> ArrayInfo:
    """One output array on the source's grid and dims, with what made it (the source's
    dimension names become the arrays' Zarr dimension_names)."""
    return ArrayInfo(
        name,
        job.info.shape,
        dtype,
        job.bounds[1] - job.bounds[0],
        path=name,
        attrs={**attrs, "dims": list(job.info.dims)},
    )


def plan_arrays(job: ComputeJob) -> dict[str, ArrayInfo]:
    """Every output array: the attributes, then the steps."""
    specs = {a.name: array_info(job, a.name, a.dtype) for a in job.attributes}
    for st in job.steps:
        specs[st.name] = array_info(job, st.name, st.dtype)
    return specs


def compute_manifest(
    job: ComputeJob, stats: dict[str, Any], sums: Mapping[str, Any], options: FormatOptions
) -> Manifest:
    """The manifest of a finished run: every array with the function (or step) that made it."""
    cfg = job.config
    return Manifest(
        format="zarr",
        length=job.info.shape[0],
        chunk_bounds=job.bounds,
        arrays={
            a.name: array_info(
                job,
                a.name,
                a.dtype,
                function=a.function,
                kwargs=dict(a.kwargs),
                depth=list(a.depth),
                boundary=list(a.boundary),
            )
            for a in job.attributes
        }
        | {
            s.name: array_info(
                job, s.name, s.dtype, step=s.kind, **_step_attrs(s, job.models[s.name])
            )
            for s in job.steps
        },
        splits={"all": tuple(range(job.num_slabs))},
        stats=stats,
        options={
            **options.to_dict(),
            "compute": {"chunks": [list(c) for c in job.chunks], "variable": cfg.variable},
        },
        provenance={"source": list(cfg.source.paths), "variable": cfg.variable},
        complete=True,
        shardload_version=__version__,
        checksums=ALGORITHM if sums else "",
    )


def merge_stats(records: list[dict[str, np.ndarray]], names: Sequence[str]) -> dict[str, Any]:
    stats = {}
    for name in names:
        parts = [StatPartial.from_dict({k: r[f"{name}/{k}"] for k in STAT_FIELDS}) for r in records]
        merged = merge_all(parts)
        assert merged is not None
        stats[name] = finalize(merged)
    return stats


def fit_steps(
    job: ComputeJob, commit: BlockCommit, stats: Mapping[str, Any], tasks: int
) -> dict[str, StepModel]:
    """Each step's model: the inputs' mean and std (the first pass's statistics) and, for
    k-means, the centres fitted by dask-ml on the written attributes; centres are kept in the
    progress folder, so a resumed run labels with the same ones."""
    from shardload.util.durable import write_atomic

    models = {}
    for s in job.steps:
        means = tuple(float(np.asarray(stats[i].mean).reshape(-1)[0]) for i in s.inputs)
        stds = tuple(float(np.asarray(stats[i].std).reshape(-1)[0]) for i in s.inputs)
        if s.kind == "standardize" or s.standardize:
            for i, sd in zip(s.inputs, stds, strict=True):
                if not np.isfinite(sd) or sd == 0:
                    raise ConfigError(
                        f"attributes.{s.name}.{s.kind}: attribute {i!r} has standard deviation "
                        f"{sd} (constant or all NaN): it cannot be standardised"
                        + (" (set kmeans.standardize: false)" if s.kind == "kmeans" else "")
                    )
        model = StepModel(means, stds)
        if s.kind == "kmeans":
            for i in s.inputs:
                nans = int(np.sum(stats[i].nan_count))
                if nans:
                    raise NaNError(
                        f"attributes.{s.name}.kmeans.inputs: attribute {i!r} has {nans} NaN "
                        "value(s) (allow_nan: true let them through); k-means needs finite "
                        "vectors: drop it from the inputs or fill the NaNs in the source"
                    )
            saved = commit.progress / f"step-{s.name}.npy"
            if saved.exists():
                centers = np.load(saved, allow_pickle=False)
            else:
                log.info("fitting k-means %s on %s (dask-ml)", s.name, list(s.inputs))
                centers = fit_kmeans(job.root, s, model, job.info.shape, tasks)
                write_atomic(saved, save_centers(saved, centers))
            model = dataclasses.replace(model, centers=centers)
        models[s.name] = model
    return models


def _step_attrs(s: StepConfig, model: StepModel) -> dict[str, Any]:
    out: dict[str, Any] = {
        "inputs": list(s.inputs),
        "means": list(model.means),
        "stds": list(model.stds),
    }
    if s.kind == "kmeans":
        assert model.centers is not None
        out.update(
            n_clusters=s.n_clusters,
            standardize=s.standardize,
            random_state=s.random_state,
            max_iter=s.max_iter,
            tol=s.tol,
            centers=model.centers.tolist(),
        )
    return out
