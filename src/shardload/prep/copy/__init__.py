"""``shardload copy``: a store rewritten in prepare's layout (:func:`copy_store`)."""

from __future__ import annotations

from shardload.prep.copy.run import LAYOUT_KEYS, copy_store

__all__ = ["LAYOUT_KEYS", "copy_store"]
