"""The kind of read a store's selected arrays need: decided here, once, for every loader.

- ``"ragged"``: variable-length arrays (:mod:`.ragged`): whole segments read, batches padded.
- ``"window"``: windows cut at load time (:mod:`.windows`): each sample's run read where it lies.
- ``"scatter"``: raw rows in local files on a platform with ``preadv`` (:mod:`.scatter`): rows
  go from the page cache straight to their batch rows.
- ``"gather"``: everything else (compressed chunks, HDF5, URLs, :mod:`.gather`): segments read
  into group buffers, batches gathered out of them.

:func:`reads_rows_in_place` is the *layout* fact the planner's defaults depend on (small
pieces are cheap to read); it depends on the store only, never on the platform, so every rank
plans the same pieces. :func:`read_kind` adds the platform (``preadv``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from shardload.load.ragged import ragged_names
from shardload.load.scatter import raw_rows, raw_sources
from shardload.load.windows import WindowReader
from shardload.store.core import Store

ReadKind = Literal["gather", "scatter", "ragged", "window"]
READ_KINDS: tuple[ReadKind, ...] = ("gather", "scatter", "ragged", "window")


def reads_rows_in_place(store: Store, names: Sequence[str]) -> bool:
    """Whether a piece of a chunk costs no more per row than the whole chunk: raw rows in local
    files (never variable-length arrays, read by whole chunks), or windows cut at load time."""
    if isinstance(store.reader, WindowReader):
        return True
    return not ragged_names(store, names) and raw_rows(store, names)


def read_kind(store: Store, names: Sequence[str]) -> ReadKind:
    """Which group reader reads ``names`` of ``store`` on this platform."""
    if ragged_names(store, names):
        return "ragged"
    if isinstance(store.reader, WindowReader):
        return "window"
    if raw_sources(store, names) is not None:
        return "scatter"
    return "gather"
