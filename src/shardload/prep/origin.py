"""Rows that come from somewhere other than a config's ``source``: what ``prepare``'s run needs
to know about them (``shardload copy`` passes an opened store as one, see
:mod:`shardload.prep.copy`).

A prepare run plans chunks, splits and its fingerprint from the config and the files it reads,
and publishes the view's arrays, statistics and sample coordinates. An origin replaces the
steps that depend on the config's source, and leaves everything about the layout (format,
compression, chunks, shards) to the same code as ``prepare``'s.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from shardload.manifest.core import Manifest
from shardload.plan.rechunk import plan_kept_shard_chunks
from shardload.prep.views.base import View

if TYPE_CHECKING:
    pass

log = logging.getLogger("shardload.prep.driver")


@runtime_checkable
class RowOrigin(Protocol):
    """Where a run's rows come from; picklable (write tasks in other processes get it)."""

    def open_view(self) -> View:
        """The view a write task reads its rows from (in any process)."""
        ...

    def identity(self) -> list[Any]:
        """JSON-able values that change when the rows may have changed (the write fingerprint
        holds them in place of the source files' sizes and times)."""
        ...

    def files(self) -> list[str]:
        """What the rows were read from, for the manifest's provenance."""
        ...

    def plan_chunk_rows(self, chunk_rows: int) -> int:
        """The rows per chunk to write, from those prepare's layout gives (planned by default,
        or the user's: the origin knows which)."""
        ...

    def plan_splits(
        self, bounds: Sequence[int]
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, int]]]:
        """``(splits, split_rows)`` over the chunks ``bounds``, as prepare's own planner returns."""
        ...

    def sample_coords(self) -> dict[str, np.ndarray]:
        """The sample coordinates to publish (``{}``: none)."""
        ...

    def amend(self, manifest: Manifest) -> Manifest:
        """The manifest to publish, from the one prepare built (before its files are written)."""
        ...


def kept_rows(cfg: Any, planned: int, kept: int, length: int) -> tuple[Any, int]:
    """``(cfg, chunk rows)`` once an origin shrank the planned chunk rows to ``kept`` (a copy
    keeping its splits): the default layout's shards keep their planned bytes."""
    if kept == planned or not cfg.default_layout or not cfg.shard_chunks:
        return cfg, kept
    shard = plan_kept_shard_chunks(planned, cfg.shard_chunks, kept, length)
    log.info("%d chunk(s) per shard (planned: %d of %d rows)", shard, cfg.shard_chunks, planned)
    return dataclasses.replace(cfg, chunk_rows=kept, shard_chunks=shard), kept
