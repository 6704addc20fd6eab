"""Rows that several write tasks of a process share: a source read once for a run of blocks.

Where one decode of the source yields the rows of several write blocks (a GRIB message holds
every grid point), the first task of such a *read group* reads the rows of all its blocks and
the other tasks of the group, in any thread of the process, wait for it and take their slice.
A group is dropped once each of its blocks has taken its rows, or (resumed runs, tasks spread
over processes) when more than two groups or more than a byte budget are held, least recently
used first (a block whose group was dropped reads it again: more decodes, never other rows).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np


class SharedReads:
    """Read groups by key, shared by the threads of a process."""

    def __init__(self, max_bytes: int, max_groups: int = 2) -> None:
        self.max_bytes = max_bytes
        self.max_groups = max_groups
        self._lock = threading.Lock()
        self._items: OrderedDict[Hashable, _Group] = OrderedDict()

    def take(
        self, key: Hashable, load: Callable[[], dict[str, Any]], *, uses: int
    ) -> dict[str, Any]:
        """The group ``key``'s rows, read with ``load`` by the first caller; the group is
        dropped after as many takes as the largest ``uses`` any caller gave (a caller that
        reads a group early for another purpose takes it once more than its blocks)."""
        with self._lock:
            group = self._items.get(key)
            mine = group is None
            if group is None:
                group = self._items[key] = _Group()
            group.uses = max(group.uses, uses)
            self._items.move_to_end(key)
        if mine:
            try:
                group.value = load()
            except BaseException as exc:
                group.error = exc
                with self._lock:
                    self._items.pop(key, None)
                raise
            finally:
                group.done.set()
        else:
            group.done.wait()
            if group.value is None:
                raise group.error or RuntimeError(f"reading rows {key} failed in another thread")
        with self._lock:
            group.taken += 1
            if group.taken >= group.uses:
                self._items.pop(key, None)
            self._evict()
        return group.value

    def _evict(self) -> None:
        total = sum(g.nbytes for g in self._items.values())
        while (total > self.max_bytes or len(self._items) > self.max_groups) and len(
            self._items
        ) > 1:
            _, old = self._items.popitem(last=False)
            total -= old.nbytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


class _Group:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.taken = 0
        self.uses = 1

    @property
    def nbytes(self) -> int:
        if self.value is None:
            return 0
        return int(sum(_nbytes(v) for v in self.value.values()))


def _nbytes(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return value.nbytes
    return int(sum(np.asarray(v).nbytes for v in value)) if isinstance(value, tuple) else 0


def slice_rows(value: Any, a: int, b: int) -> Any:
    """Rows ``[a, b)`` of what a view returned for one array (numpy rows or ragged rows)."""
    from shardload.manifest.ragged import RaggedRows

    if isinstance(value, RaggedRows):
        lengths = np.asarray(value.lengths, np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return RaggedRows(value.values[offsets[a] : offsets[b]], lengths[a:b])
    return value[a:b]
