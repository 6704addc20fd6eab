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
    stats = _final_stats(merged, specs, cfg.nan == "warn", num_blocks, job.dated)
    time_entry = _time_entry(job, merged)
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
        time=time_entry,
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
        else _sample_coords(view, cfg.sample_dims, manifest.length, job.dated)
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


def _sample_coords(view: View, sample_dims: Any, length: int, dated: Any) -> SampleCoords:
    from shardload.prep.views.flat import FlatView

    if dated is not None:  # every date of the axis, those the source lacks included
        dates = dated.axis.dates.astype("datetime64[ns]")
        return SampleCoords({str(sample_dims[0]): dates}, (length,), {str(sample_dims[0]): 0})
    if not isinstance(view, FlatView):  # other views' samples are not the stacked dims
        return SampleCoords({})
    return plan_sample_axes(view.sample_source, sample_dims, length)


def _time_entry(job: PrepareJob, merged: OrderedMerge) -> dict[str, Any]:
    """A dated store's ``time`` entry (``{}`` for others), its missing dates logged once."""
    from shardload.prep.dated import show_dates
    from shardload.prep.stats.dated import MISSING_NOTE, time_entry

    if job.dated is None:
        return {}
    found = merged.notes().get(MISSING_NOTE, np.zeros(0, np.int64))
    entry = time_entry(job.dated, found)
    axis, gaps = job.dated.axis, set(job.dated.axis.missing)
    nan_states = sorted(set(entry["missing"]) - gaps)
    log.info(
        "dated store: %d dates from %s every %s; statistics over %s (%d dates)",
        axis.length,
        axis.start,
        axis.frequency_text,
        entry["statistics"]["period"],
        entry["statistics"]["num_dates"],
    )
    if entry["missing"]:
        log.info(
            "%d missing date(s)%s: %d gap(s) in the source's dates%s, %d all-NaN state(s)%s",
            len(entry["missing"]),
            " (as declared in dates.missing)" if job.dated.declared is not None else "",
            len(gaps),
            f" ({show_dates(axis, gaps)})" if gaps else "",
            len(nan_states),
            f" ({show_dates(axis, nan_states)})" if nan_states else "",
        )
    return entry


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
    merge: OrderedMerge,
    specs: Mapping[str, ArraySpec],
    warn_nan: bool,
    num_blocks: int,
    dated: Any = None,
) -> dict[str, Any]:
    """Each array's statistics (a dated store's: over its period, and its tendencies)."""
    from shardload.prep.stats.dated import NAN_NOTE, stat_names

    if not merge.started or merge.next != num_blocks:
        raise StoreError(
            f"the statistics cover blocks 0:{merge.next} of {num_blocks} (a block was not merged)"
        )
    notes = merge.notes()  # before finalize, which takes over the running arrays
    final = merge.finalize()
    stats = {name: final[name] for name in stat_names(specs, dated)}
    for name in specs:
        if dated is not None:  # NaN values in every row that is not missing
            nans = int(np.sum(notes.get(f"{NAN_NOTE}{name}", 0)))
        else:
            nans = int(np.sum(stats[name].nan_count))
        if nans and warn_nan:
            log.warning(
                "array %r has %d NaN value(s) %s",
                name,
                nans,
                "(counts per feature in the manifest stats)"
                if dated is None
                else "in dates that are not missing (counts per feature of the statistics "
                "period in the manifest stats)",
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
