"""Why a folder is not a store yet: a write in progress or left by an interrupted run, named
with the command that resumes it (``shardload prepare`` or ``shardload compute``)."""

from __future__ import annotations

import json
from typing import Any

from shardload.errors import IncompleteStoreError
from shardload.layout import JOB_FILE, MANIFEST_NAME, PARTIAL_SUFFIX, PROGRESS_DIR


def writer_command(fs: Any, partial: str) -> str:
    """The command writing ``partial`` ('prepare' or 'compute'), from its job description
    (``_progress/job.json``, which ``compute`` marks ``"compute": true``; 'prepare' when it
    cannot be read)."""
    try:
        with fs.open(f"{partial}/{PROGRESS_DIR}/{JOB_FILE}", "rb") as f:
            job = json.loads(f.read())
    except (OSError, ValueError):
        return "prepare"
    return "compute" if isinstance(job, dict) and job.get("compute") else "prepare"


def partial_error(fs: Any, root: str, url: str) -> IncompleteStoreError:
    """``url`` is itself ``OUT.partial``: the folder being written."""
    done = url.rstrip("/")[: -len(PARTIAL_SUFFIX)]
    cmd = writer_command(fs, root)
    return IncompleteStoreError(
        f"{url} is not a store but one being written (or left by an interrupted {cmd}): "
        f"the store is incomplete; open {done} once 'shardload {cmd}' has finished, or "
        "re-run it to resume"
    )


def interrupted_error(fs: Any, root: str, url: str) -> IncompleteStoreError:
    """``url`` has no manifest but ``url.partial`` beside it, or progress records in it (an
    upload to an object store under way or interrupted)."""
    partial = f"{root}{PARTIAL_SUFFIX}"
    try:
        uploading = not fs.exists(partial)
    except OSError:
        uploading = False
    if uploading:
        return IncompleteStoreError(
            f"{url} is not complete: a prepare (or copy) writing it was interrupted or is still "
            f"uploading (found {url}/{PROGRESS_DIR} and no {MANIFEST_NAME}); re-run it with the "
            "same config to resume"
        )
    cmd = writer_command(fs, partial)
    return IncompleteStoreError(
        f"{url} is not complete: a {cmd} was interrupted or is still running (found "
        f"{partial}); re-run 'shardload {cmd}' with the same config to resume, or delete "
        f"{partial}"
    )
