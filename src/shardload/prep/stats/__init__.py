"""Per-feature statistics computed block by block and merged exactly: a block's partial
(:mod:`.block`), partials merged in block order (:mod:`.ordered`), the final statistics
(:mod:`.final`)."""

from shardload.prep.stats.block import (
    STAT_FIELDS,
    Partial,
    as_features,
    merge,
    merge_all,
    partial,
)
from shardload.prep.stats.final import finalize
from shardload.prep.stats.ordered import OrderedMerge

__all__ = [
    "STAT_FIELDS",
    "OrderedMerge",
    "Partial",
    "as_features",
    "finalize",
    "merge",
    "merge_all",
    "partial",
]
