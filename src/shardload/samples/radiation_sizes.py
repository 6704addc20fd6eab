"""The sizes of the radiation sample's files, what ``shardload sample radiation``'s options
default to: importable without the generator (its fields, its writer), which every other
command's parser would import with them."""

from __future__ import annotations

#: Columns per file by default: a demo-sized pair (~40 MB) written in well under a second.
#: The real dataset has 16,960 columns per patch file.
DEFAULT_COLUMNS = 2048
#: Columns generated and written at a time (~90 MB of float64 temporaries).
DEFAULT_BLOCK_COLUMNS = 4096
#: Columns of one random stream; blocks are whole multiples of it.
UNIT_COLUMNS = 256
#: Columns per patch file in the real MAELSTROM dataset.
REAL_COLUMNS_PER_PATCH = 16_960
