"""Publishing a store ``prepare`` wrote: the format's files finished, the statistics and
checksums merged from every block, the manifest built and the store renamed into place
(``metadata.json`` and the checksums before the manifest, which makes it complete).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import StoreError
from shardload.formats.base import FormatOptions
from shardload.formats.checksums import ALGORITHM, encode_checksums
from shardload.formats.registry import get_writer
from shardload.layout import CHECKSUMS_NAME, COORDS_NAME, METADATA_NAME
from shardload.manifest.core import ArrayInfo, ArraySpec, Manifest
from shardload.plan.chunks import RegularBounds
from shardload.prep.commit import BlockCommit
from shardload.prep.config import PrepareConfig
from shardload.prep.coords import SampleCoords, plan_sample_axes, write_zarr_metadata
from shardload.prep.origin import RowOrigin
from shardload.prep.recorder import merge_checksums
from shardload.prep.stats import OrderedMerge
from shardload.prep.tasks import LENGTHS_KEY, PrepareJob
from shardload.prep.views.base import View
from shardload.prep.views.window_series import SeriesLayout, window_manifest
from shardload.version import __version__

log = logging.getLogger("shardload.prep.driver")  # the name users' logs have always shown


def publish_store(
    commit: BlockCommit,
    job: PrepareJob,
    merged: OrderedMerge,
    *,
    fmt: Any,
    create: Callable[[Path], None],
    view: View,
    specs: Mapping[str, ArraySpec],
    options: FormatOptions,
    splits: dict[str, tuple[int, ...]],
    split_rows: dict[str, tuple[int, int]],
    origin: RowOrigin | None = None,
) -> None:
    """Finish every recorded block into a complete store and publish it (``OUT.partial`` ->
    ``OUT``): the format's staged blocks merged, statistics, checksums, the variable-length
    arrays' offsets, ``metadata.json`` and the manifest, last. An ``origin`` gives the sample
    coordinates and amends the manifest (``shardload copy``)."""
    cfg, bounds, num_blocks = job.config, job.bounds, job.num_blocks
    fixed = [n for n, s in specs.items() if not s.ragged]
    ragged = [n for n, s in specs.items() if s.ragged]
    records = [commit.read_record(i) for i in range(num_blocks)]
    staged = ((i, *job.block(i)[:2]) for i in range(num_blocks))
    commit.finish_format(fmt, create, staged, fixed, bounds=bounds)
    stats = _final_stats(merged, specs, cfg.nan == "warn", num_blocks)
    sums = merge_checksums(records, list(specs))
    lengths = _finish_ragged(cfg, commit, records, specs, ragged, bounds, options, sums)
    manifest = Manifest(
        format=cfg.format,
        length=job.length,
        chunk_bounds=tuple(bounds),
        arrays={
            n: ArrayInfo(
                n,
                tuple(s.shape),
                np.dtype(s.dtype).name,
                job.chunk_rows,
                path=_array_path(cfg.format, n, s.ragged),
                features=s.features,
                attrs=dict(s.attrs),
                ragged=_length_stats(lengths[n]) if s.ragged else None,
            )
            for n, s in specs.items()
        },
        splits=splits,
        split_rows=split_rows,
        stats=stats,
        static=dict(view.static),
        options={
            **options.to_dict(),
            "view": cfg.view,
            "sample_dims": list(cfg.sample_dims),
            "blocks": [job.block(i)[1] for i in range(num_blocks)] + [job.length],
        },
        provenance=provenance(cfg, job.dataset),
        complete=True,
        shardload_version=__version__,
        checksums=ALGORITHM if sums else "",
    )
    if isinstance(view, SeriesLayout):  # the window arrays over the series
        manifest = window_manifest(
            manifest, view, view.sample_bounds(cfg.chunk_rows, cfg.target_chunk_bytes)
        )
    if origin is not None:
        manifest = origin.amend(manifest)
    coords = (
        SampleCoords(origin.sample_coords())
        if origin is not None
        else _sample_coords(view, cfg.sample_dims, manifest.length)
    ).without(specs)  # an array's name wins
    if coords.values:
        manifest = replace(manifest, options={**manifest.options, **coords.options()})
    if cfg.format == "zarr":  # before the manifest: xr.open_zarr finds named dims and coords
        write_zarr_metadata(commit.root, specs, coords, chunk_rows=job.chunk_rows)
    files = {METADATA_NAME: split_metadata(manifest, cfg), **manifest.file_writers()}
    if coords.values:
        files = {COORDS_NAME: coords.encode(), **files}
    if sums:  # before the manifest, which publish writes last
        files = {CHECKSUMS_NAME: encode_checksums(sums), **files}
    commit.publish(files)  # feature files first, the manifest last


def _sample_coords(view: View, sample_dims: Any, length: int) -> SampleCoords:
    from shardload.prep.views.flat import FlatView

    if not isinstance(view, FlatView):  # other views' samples are not the stacked dims
        return SampleCoords({})
    return plan_sample_axes(view.sample_source, sample_dims, length)


def split_metadata(manifest: Manifest, cfg: PrepareConfig) -> bytes:
    """``metadata.json``: each split's rows, chunks and (for row-range splits) its row range,
    with the fractions and seed that made them (the manifest holds the same; this file is
    for readers without shardload)."""
    splits = {
        name: {
            "rows": manifest.split_num_rows(name),
            "chunks": list(chunks),
            "row_range": list(manifest.split_rows[name]) if name in manifest.split_rows else None,
        }
        for name, chunks in manifest.splits.items()
    }
    doc = {
        "samples": manifest.length,
        "splits": splits,
        "fractions": dict(cfg.splits or {}),
        "split_seed": cfg.split_seed,
        "split_shuffle": cfg.split_shuffle,
        "shardload_version": __version__,
    }
    return json.dumps(doc, indent=1).encode()


def _array_path(fmt: str, name: str, ragged: bool) -> str:
    if ragged:
        from shardload.formats.ragged.write import array_path

        return array_path(fmt, name)
    return str(get_writer(fmt).array_path(name))


def _length_stats(lengths: np.ndarray) -> dict[str, Any]:
    from shardload.formats.ragged.write import length_stats

    return length_stats(lengths)


def _finish_ragged(
    cfg: PrepareConfig,
    commit: BlockCommit,
    records: list[dict[str, np.ndarray]],
    specs: Mapping[str, ArraySpec],
    ragged: list[str],
    bounds: RegularBounds,
    options: FormatOptions,
    sums: dict[str, Any],
) -> dict[str, np.ndarray]:
    """Offsets (and for zarr / hdf5 the values) of the variable-length arrays, from the
    blocks' records; the offsets' checksum appended to each one's chunk checksums."""
    if not ragged:
        return {}
    from shardload.formats.ragged.write import finish_ragged

    lengths = {}
    for n in ragged:
        try:
            lengths[n] = np.concatenate([r[f"{LENGTHS_KEY}{n}"] for r in records])
        except KeyError as exc:
            raise StoreError(f"a progress record lacks the row lengths of array {n!r}") from exc
    infos = {n: (np.dtype(specs[n].dtype), lengths[n]) for n in ragged}
    off_sums = finish_ragged(
        cfg.format,
        commit.root,
        infos,
        bounds=tuple(bounds),
        options=options,
        progress=commit.progress,
    )
    for n in ragged:
        if n in sums:
            sums[n] = np.append(sums[n], np.uint64(off_sums[n]))
    return lengths


def _final_stats(
    merge: OrderedMerge, specs: Mapping[str, ArraySpec], warn_nan: bool, num_blocks: int
) -> dict[str, Any]:
    if not merge.started or merge.next != num_blocks:
        raise StoreError(
            f"the statistics cover blocks 0:{merge.next} of {num_blocks} (a block was not merged)"
        )
    stats = {}
    final = merge.finalize()
    for name in specs:
        stats[name] = final[name]
        nans = int(np.sum(stats[name].nan_count))
        if nans and warn_nan:
            log.warning(
                "array %r has %d NaN value(s) (counts per feature in the manifest stats)",
                name,
                nans,
            )
    return stats


def provenance(cfg: PrepareConfig, dataset: Any = None) -> dict[str, Any]:
    from shardload.prep.sources.paths import expand_paths

    files = (
        ["xarray.Dataset passed to prepare(dataset=...)"]
        if dataset is not None
        else expand_paths(
            list(cfg.source.paths) + list(cfg.source.outputs), dict(cfg.source.storage_options)
        )
    )
    return {
        "files": files[:10000],
        "num_files": len(files),
        "config": cfg.to_dict(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "shardload_version": __version__,
    }
