"""Zarr v3's mark of an inner chunk never written, in a shard's index (its offset and size both
``2**64 - 1``): in a module of its own, so that a reader slicing byte ranges only (an npy stack by
URL, through ``ranges`` and ``kept``) imports no codec library (numcodecs)."""

EMPTY = 2**64 - 1
