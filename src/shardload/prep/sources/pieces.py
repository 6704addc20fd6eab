"""Decoded pieces of a source kept for the threads of one process (:class:`PieceCache`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from shardload.errors import SourceError

CACHE_BYTES = 256 << 20  # decoded pieces kept per process


class PieceCache:
    """Decoded pieces by key, shared by threads: the first asker reads, the others wait for it.
    Least recently used pieces go once the cache holds more than ``max_bytes``."""

    def __init__(self, max_bytes: int = CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[Any, _Entry] = OrderedDict()

    def get(self, key: Any, load: Any) -> np.ndarray:
        with self._lock:
            entry = self._items.get(key)
            mine = entry is None
            if entry is None:
                entry = self._items[key] = _Entry()
            self._items.move_to_end(key)
        if not mine:
            entry.done.wait()
            if entry.value is None:
                raise SourceError(f"reading piece {key} failed in another thread: {entry.error}")
            return entry.value
        try:
            entry.value = load()
        except BaseException as exc:
            entry.error = exc
            with self._lock:
                self._items.pop(key, None)
            raise
        finally:
            entry.done.set()
        self._evict()
        return entry.value

    def _evict(self) -> None:
        with self._lock:
            total = sum(e.value.nbytes for e in self._items.values() if e.value is not None)
            while total > self.max_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                total -= old.value.nbytes if old.value is not None else 0


class _Entry:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: np.ndarray | None = None
        self.error: BaseException | None = None
