"""Every file name of a store, in one place: what a folder holds, and what a writer leaves beside it.

A complete store ``OUT/``::

    OUT/shardload.json          the manifest (MANIFEST_NAME): written last, atomically
    OUT/checksums.npz           per-chunk checksums (CHECKSUMS_NAME)
    OUT/metadata.json           the splits, for tools that do not read the manifest (METADATA_NAME)
    OUT/_features/              feature names of wide arrays (FEATURES_DIR)
    OUT/NAME/...                the arrays, laid out by their format

While a writer runs (docs/design.md, "Writing a store")::

    OUT.partial/                the store being written (PARTIAL_SUFFIX); never opened as a store
    OUT.partial.lock            who holds the write (LOCK_SUFFIX): pid, host, start time
    OUT.partial/_progress/      one record per finished block (PROGRESS_DIR, RECORD_NAME), the
                                job's description (JOB_FILE) and the merge's (MERGED_FILE)
    OUT.partial/_staged/        blocks staged before their merge (STAGED_DIR)
"""

from __future__ import annotations

MANIFEST_NAME = "shardload.json"
CHECKSUMS_NAME = "checksums.npz"
METADATA_NAME = "metadata.json"
FEATURES_DIR = "_features"
COORDS_NAME = "_coords.npz"  # the sample coordinates (number, time, ...), prep/coords.py

PARTIAL_SUFFIX = ".partial"
LOCK_SUFFIX = ".partial.lock"
PROGRESS_DIR = "_progress"
STAGED_DIR = "_staged"
JOB_FILE = "job.json"
MERGED_FILE = "merged.json"
RECORD_NAME = "block-{:06d}.npz"

__all__ = [
    "CHECKSUMS_NAME",
    "COORDS_NAME",
    "FEATURES_DIR",
    "JOB_FILE",
    "LOCK_SUFFIX",
    "MANIFEST_NAME",
    "MERGED_FILE",
    "METADATA_NAME",
    "PARTIAL_SUFFIX",
    "PROGRESS_DIR",
    "RECORD_NAME",
    "STAGED_DIR",
]
