"""Closing a torch dataset's store: ``close()`` and ``with`` for :class:`StreamingDataset` and
:class:`MapDataset`, and a DataLoader worker's copy of the store closed as the worker exits.

A dataset given a path or URL opens its store itself, so it closes it (by URL: the client
session and its pooled connections; with a ``cache_dir``, the node cache's held copies); a
Store passed in is the caller's and stays open. A DataLoader worker holds a copy of the
dataset (forked, or unpickled) whose store opened its own reader and connections in that
process: the worker closes that copy when it exits (multiprocessing runs a worker's
finalizers as it leaves), never the main process's store, another object in another process.
"""

from __future__ import annotations

import os
from multiprocessing import util
from typing import Any, TypeVar

from torch.utils.data import get_worker_info

from shardload.store.core import Store

__all__ = ["ClosingDataset"]

D = TypeVar("D", bound="ClosingDataset")

#: before queues' finalizers (``multiprocessing.Queue`` closes at 10): reads end first
EXIT_PRIORITY = 20


class ClosingDataset:
    """Mixed into the torch datasets: ``close()``, ``with``, and the close at a worker's exit.

    The dataset's ``__init__`` calls :meth:`_own_store` with the ``store`` argument it was given.
    """

    store: Store
    _owns_store: bool
    _closes_at_exit: int | None  # the worker process whose exit closes its copy of the store

    def _own_store(self, given: Any) -> None:
        self._owns_store = not isinstance(given, Store)  # a path or URL: opened here
        self._closes_at_exit = None

    def close(self) -> None:
        """Close the store this dataset opened from a path or URL (its files and, by URL, its
        connections); a Store passed in stays open. Closing again does nothing more, and the
        dataset stays usable: a later pass opens what it reads anew (as after
        ``Store.close``). In a DataLoader worker it closes that worker's own copy of the store.
        """
        if self._owns_store or get_worker_info() is not None:
            self.store.close()

    def __enter__(self: D) -> D:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _close_at_worker_exit(self) -> None:
        """In a DataLoader worker, once per process: close this worker's copy of the store as
        the worker exits (a no-op in the main process, whose store is the caller's to close)."""
        pid = os.getpid()
        if self._closes_at_exit == pid or get_worker_info() is None:
            return
        self._closes_at_exit = pid
        util.Finalize(None, self.store.close, exitpriority=EXIT_PRIORITY)
