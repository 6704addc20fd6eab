"""One exception hierarchy. Every message names the file, variable, chunk or option at fault."""

from __future__ import annotations


class ShardloadError(Exception):
    """Base class of every error shardload raises on purpose."""


class ConfigError(ShardloadError, ValueError):
    """A configuration key or option is missing, unknown or has a bad value."""


class SourceError(ShardloadError):
    """A raw input cannot be opened or lacks a file, variable or dimension."""


class ViewError(ShardloadError, ValueError):
    """The data cannot be turned into the requested view (shapes, dtypes, lengths)."""


class StoreError(ShardloadError):
    """A store cannot be read or written."""


class StoreExistsError(StoreError, FileExistsError):
    """The output exists and ``overwrite`` was not asked for."""


class StoreLockedError(StoreError):
    """Another run is writing the same output (the message names the holder)."""


class DiskFullError(StoreError):
    """The disk filled up while writing a store (the message names the output and the bytes)."""


class IncompleteStoreError(StoreError):
    """The store was not finished (a prepare crashed or is still running)."""


class ChunkReadError(StoreError):
    """One chunk of one array could not be read or decoded (missing or corrupt)."""

    @classmethod
    def from_os_error(cls, exc: OSError, what: str, name: str, path: object) -> ChunkReadError:
        """The error for ``exc`` raised opening or reading ``what`` (e.g. ``"chunk 3"``) of
        array ``name`` from ``path``: missing, or could not be read."""
        if isinstance(exc, FileNotFoundError):
            return cls(f"{what} of array {name!r} is missing: {path}")
        return cls(f"{what} of array {name!r} could not be read: {path}: {exc}")


class NaNError(ShardloadError, ValueError):
    """NaN values were found and the ``nan`` option is ``fail``."""


class PlanError(ShardloadError, ValueError):
    """An epoch cannot be planned with these settings (e.g. batch larger than a rank's share)."""


class StateError(ShardloadError, ValueError):
    """A resume state does not belong to this dataset, seed or plan."""


class RemoteError(ShardloadError):
    """A remote store could not be reached after retries."""


class RemoteNotFoundError(RemoteError, FileNotFoundError):
    """A remote file does not exist (HTTP 404 or the backend's FileNotFoundError); not retried."""


class RemoteChangedError(RemoteError, ChunkReadError):
    """A file read by URL changed on the server since the reader first read (and checked) it:
    a 412 to its precondition, or an answer naming another version (``move/pinned.py``)."""


class StagingError(ShardloadError):
    """A store cannot be staged (no space, incomplete copy, bad archive)."""


class ImageError(StoreError):
    """A SquashFS image cannot be packed or mounted (a tool or FUSE missing, a bad image)."""


class ClusterError(ShardloadError):
    """Batch-system workers could not be had: a submission failed (the message quotes the batch
    system), no worker arrived within ``execution.timeout_s``, or every worker was lost."""


class MissingDependencyError(ShardloadError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


def require(module: str, extra: str):
    """Import ``module`` or raise an error naming the ``shardload[extra]`` to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"{module!r} is needed for this feature: pip install 'shardload[{extra}]'"
        ) from exc


class ShuffleQualityWarning(UserWarning):
    """The default load of a store cannot mix its rows well (its chunks are too big for a
    shuffle group); the message names the store and the fix. Once per store and process."""
