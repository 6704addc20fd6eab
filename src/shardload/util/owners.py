"""One object per owner, made on first ask, weakly keyed, fresh in a forked child.

The by-URL reader keeps per-reader state beside its shard index cache (the chunks it keeps for
later groups, :mod:`shardload.formats.zarr.kept`; the shards it asks for ahead,
:mod:`shardload.formats.zarr.ahead`): each lives as long as its owner, and a forked child (a
DataLoader worker) plans and fetches its own, never holding a parent's bytes, futures or locks.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["PerOwner"]

T = TypeVar("T")


class PerOwner(Generic[T]):
    """``get(owner)``: the ``make()`` of ``owner``, made once; after a fork every owner's is
    made anew (and the lock too: a parent's thread may have held it at the fork)."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._by: weakref.WeakKeyDictionary[Any, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._after_fork)

    def get(self, owner: Any) -> T:
        with self._lock:
            got = self._by.get(owner)
            if got is None:
                got = self._by[owner] = self._make()
            return got

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        for owner in list(self._by.keys()):
            self._by[owner] = self._make()
