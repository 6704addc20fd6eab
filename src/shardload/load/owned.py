"""The iterator :func:`~shardload.load.batches.iter_batches` returns: its batches, and the
store it opened from a path or URL closed once they end, fail, or are closed or dropped.

A generator cannot do this alone: one never started (made and dropped before its first batch,
as a loop that breaks at once, or torchdata loading a finished state) runs no ``finally``,
so its store (by URL: a client session and its pooled connections) stayed open until a
garbage collection found it. This object's ``__del__`` runs as its last reference goes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from shardload.load.recycle import hand_on_kept
from shardload.store.core import Store

__all__ = ["Batches"]


class Batches(Iterator[dict[str, np.ndarray]]):
    """Batches of one worker of one rank (an iterator), closing the store it owns.

    ``close()`` (or leaving a ``with`` block, or dropping the last reference) stops the reads
    in flight and closes the store ``iter_batches`` opened itself; a store the caller passed
    stays open. Closing again does nothing; a closed iterator yields no more batches.
    """

    def __init__(self, batches: Iterator[dict[str, np.ndarray]], owned: Store | None) -> None:
        self._batches: Iterator[dict[str, np.ndarray]] | None = batches
        self._owned = owned

    def __next__(self) -> dict[str, np.ndarray]:
        if self._batches is None:
            raise StopIteration
        try:
            return next(self._batches)
        except BaseException:  # the epoch read, or failed: nothing more will be asked of it
            self.close()
            raise

    def close(self) -> None:
        """Stop reading (threads joined, slots freed) and close the store opened here."""
        batches, self._batches = self._batches, None
        owned, self._owned = self._owned, None
        try:
            if batches is not None and hasattr(batches, "close"):
                batches.close()
        finally:
            if owned is not None:
                hand_on_kept(owned)  # its buffers, for the next epoch's store of this path
                owned.close()

    def __enter__(self) -> Batches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
