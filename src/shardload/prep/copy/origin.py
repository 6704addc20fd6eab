"""An opened store as the origin of a prepare run's rows (``shardload copy``).

:class:`StoreView` reads rows of every array of a :class:`~shardload.store.core.Store`, block by
block, as a view does from a source; :class:`StoreOrigin` gives the run what the store already
knows: its splits (kept row for row, on the new chunks), statistics, sample coordinates,
static data and manifest options.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from shardload.errors import ShardloadError
from shardload.layout import COORDS_NAME, MANIFEST_NAME
from shardload.manifest.core import ArraySpec, Manifest
from shardload.manifest.features import FeatureStats
from shardload.plan.grids import expand_sample_coords
from shardload.plan.rechunk import plan_kept_chunk_rows, plan_kept_splits, split_boundaries
from shardload.prep.copy.series import StoreSeriesView
from shardload.store.core import Store

log = logging.getLogger("shardload.prep.copy")

#: manifest options that describe the source's own layout or view, never carried into the copy
#: when the copy's manifest has them too (the copy's own layout wins)
CARRIED_OPTIONS = ("view", "sample_dims")
#: the sample coordinates' options, which the copy writes itself
SAMPLE_COORD_OPTIONS = ("sample_coords", "sample_coords_grid")


class StoreView:
    """Every array of ``store`` as a view: same names, shapes, dtypes, feature names, attrs;
    variable-length arrays as :class:`~shardload.manifest.ragged.RaggedRows`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._specs = {
            name: ArraySpec(
                name,
                tuple(info.shape),
                np.dtype(info.dtype),
                features=info.features,
                attrs=dict(info.attrs),
                ragged=info.is_ragged,
                mean_length=float((info.ragged or {}).get("mean_length", 0.0)),
            )
            for name, info in store.manifest.arrays.items()
        }

    @property
    def length(self) -> int:
        return len(self.store)

    @property
    def specs(self) -> Mapping[str, ArraySpec]:
        return self._specs

    @property
    def static(self) -> Mapping[str, Any]:
        return dict(self.store.manifest.static)

    def read(self, start: int, stop: int) -> dict[str, Any]:
        return {name: self.store.read(name, start, stop) for name in self._specs}


class StoreOrigin:
    """The rows of an opened store, for :func:`~shardload.prep.driver.write_store`
    (a :class:`~shardload.prep.origin.RowOrigin`). Pickled (into a write task for another
    process) it keeps only where the store is, so a task's size does not grow with the
    source's chunks; the store reopens once per process, at its first read."""

    def __init__(
        self,
        store: Store,
        src: str,
        *,
        chunk_rows_given: bool = False,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._store: Store | None = store
        self.src = src
        #: the user gave the chunk rows: refuse to change them (planned ones shrink to fit)
        self.chunk_rows_given = chunk_rows_given
        self.storage_options = dict(storage_options or {})

    @property
    def store(self) -> Store:
        if self._store is None:
            from shardload.store.core import open_store

            self._store = open_store(self.src, storage_options=self.storage_options or None)
        return self._store

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_store": None}

    @property
    def manifest(self) -> Manifest:
        return self.store.manifest

    @property
    def at_load(self) -> bool:
        """The source cuts its windows at load time: the copy writes its series arrays."""
        w = self.manifest.static.get("window")
        return isinstance(w, Mapping) and bool(w.get("at_load")) and "series" in w

    def open_view(self) -> StoreView | StoreSeriesView:
        return StoreSeriesView(self.store) if self.at_load else StoreView(self.store)

    def files(self) -> list[str]:
        return [self.src]

    def identity(self) -> list[Any]:
        m = self.manifest
        bounds = np.asarray(m.chunk_bounds, dtype=np.int64).tobytes()
        return [
            self.src,
            m.length,
            hashlib.sha256(bounds).hexdigest()[:16],
            {k: [list(a.shape), a.dtype, a.is_ragged] for k, a in m.arrays.items()},
            str(m.provenance.get("created", "")),
            _manifest_digest(self.store),
        ]

    def plan_chunk_rows(self, chunk_rows: int) -> int:
        m = self.manifest
        if self.at_load:  # series chunks: the splits are kept on the samples' chunks
            return chunk_rows
        boundaries = split_boundaries(m.chunk_bounds, m.splits, m.split_rows)
        kept = plan_kept_chunk_rows(chunk_rows, boundaries, given=self.chunk_rows_given)
        if kept != chunk_rows:
            log.info(
                "chunks of %d rows (planned: %d) keep every split boundary of %s",
                kept,
                chunk_rows,
                self.src,
            )
        return kept

    def plan_splits(
        self, bounds: Sequence[int]
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, int]]]:
        m = self.manifest
        splits = plan_kept_splits(bounds, m.chunk_bounds, m.splits, m.split_rows)
        return splits, {k: (int(a), int(b)) for k, (a, b) in m.split_rows.items()}

    def sample_coords(self) -> dict[str, np.ndarray]:
        names = list(self.manifest.options.get("sample_coords") or [])
        if not names:
            return {}
        raw = _read_file(self.store, COORDS_NAME)
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            values = {str(n): np.asarray(npz[n]) for n in names}
        return expand_sample_coords(values, self.manifest.options, len(self.store))

    def amend(self, manifest: Manifest) -> Manifest:
        """The copy's manifest: its own layout, the source's statistics (the values are equal;
        re-merged in other blocks, float means would differ in their last bits), options and
        provenance."""
        src = self.manifest
        options = dict(manifest.options)
        for k, v in src.options.items():
            if k in CARRIED_OPTIONS or (k not in options and k not in SAMPLE_COORD_OPTIONS):
                options[k] = v
        # a dated store's statistics cover a period of its rows and include its tendencies:
        # the same rows in the copy (every row is copied, splits keep their rows), so they
        # and the time axis are carried as they are
        stats = dict(src.stats) if src.time else _carried_stats(manifest.stats, src.stats)
        return replace(
            manifest,
            stats=stats,
            time=dict(src.time),
            options=options,
            provenance={
                **manifest.provenance,
                "copied_from": {"store": self.src, "provenance": dict(src.provenance)},
            },
        )


def _carried_stats(
    new: Mapping[str, FeatureStats], old: Mapping[str, FeatureStats]
) -> dict[str, FeatureStats]:
    """The source's statistics where they describe the same values as the ones just merged
    (counts, NaN counts, minima and maxima equal); the merged ones elsewhere."""
    out = dict(new)
    for name, mine in new.items():
        if name not in old:
            continue
        theirs = old[name]
        same = all(
            np.array_equal(np.asarray(getattr(mine, f)), np.asarray(getattr(theirs, f)), True)
            for f in ("count", "nan_count", "min", "max")
        )
        if same:
            out[name] = theirs
        else:
            log.warning(
                "the statistics of array %r in the source store differ from its values "
                "(count, NaNs, min or max): the copy has the statistics of the values",
                name,
            )
    return out


def _read_file(store: Store, rel: str) -> bytes:
    path = f"{store.root}/{rel}"
    if store.is_local:
        with open(path, "rb") as f:
            return f.read()
    from shardload.move.remote import read_bytes

    return bytes(read_bytes(store.fs, path, what=f"{rel} of {store.url}"))


def _manifest_digest(store: Store) -> str:
    """The source manifest's bytes, hashed ("" for plain Zarr data, which has none)."""
    try:
        raw = _read_file(store, MANIFEST_NAME)
    except (OSError, ShardloadError):  # plain Zarr data: no manifest file
        return ""
    return hashlib.sha256(raw).hexdigest()[:24]
