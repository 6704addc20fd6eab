"""shardload's optional compiled extension (``setup.py``: ``formats/zarr/_decode_rows.c`` and
``_stats_f32.c``), loaded in one place for its three callers (the decode kernels in
``formats/zarr/shard_rows.py``, staged raw reads in ``load/runs.py``, prepare's statistics in
``prep/stats/kernel.py``), with the argument versions this source tree passes: a build from
other sources (an old ``.so`` beside newer code, before ``setup.py build_ext`` runs again) is
never called. Imports nothing else (an npy read must not pull in numcodecs)."""

from __future__ import annotations

import importlib
from typing import Any

#: The arguments of ``decode_rows``, ``decode_rows_buf``, ``copy_rows_buf`` and ``read_rows``
#: (the extension's ``ABI``).
ABI = 5
#: The arguments of ``stats_f32`` (the extension's ``STATS_ABI``).
STATS_ABI = 1


def compiled() -> Any:
    """The extension module, or None where it is not built (no C compiler at install)."""
    try:
        return importlib.import_module("shardload.formats.zarr._decode_rows")
    except ImportError:  # pragma: no cover - an install without a C compiler
        return None
