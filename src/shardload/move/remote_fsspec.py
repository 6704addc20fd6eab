"""fsspec's face of a :class:`~shardload.move.remote.RemoteFileSystem`, made when asked for.

shardload's readers call a handful of methods of a store's filesystem (``cat_file``, ``open``,
``info``...), which :class:`RemoteFileSystem` has itself. What needs a real fsspec filesystem
(zarr-python's ``FsspecStore`` through ``AsyncFileSystemWrapper``, fsspec's buffered file of a
file read by ranges, any other method of fsspec's API a user calls on ``store.fs``) gets this
adapter, whose reads are the ``RemoteFileSystem``'s own (retries, node cache, pins). So a
process reading a warm node cache never imports fsspec (27 ms of a new process, issue 28).
"""

from __future__ import annotations

from typing import Any

from fsspec import AbstractFileSystem
from fsspec.spec import AbstractBufferedFile

#: Smallest block of a file object's ranged reads (an npy header in one request, not three).
MIN_BLOCK_BYTES = 64 * 1024


class FsspecView(AbstractFileSystem):
    """An fsspec filesystem reading through ``remote`` (a ``RemoteFileSystem``): every read
    and query is the remote's method, called at call time (a spy on the class sees them)."""

    protocol = ("shardload-remote",)
    cachable = False
    async_impl = False

    def __init__(self, remote: Any) -> None:
        super().__init__()
        self.remote = remote

    def __repr__(self) -> str:
        return f"<FsspecView of {self.remote!r}>"

    def unstrip_protocol(self, name: str) -> str:
        return str(self.remote.unstrip_protocol(name))

    def cat_file(  # type: ignore[override]
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> Any:
        return self.remote.cat_file(path, start, end, **kw)

    def _open(self, path: str, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        if mode != "rb":
            raise PermissionError(f"{self.unstrip_protocol(path)}: remote stores are read-only")
        if self.remote.spec.cache_dir is not None:
            return self.remote.open_cached(path)
        if not isinstance(block_size, int) or block_size < MIN_BLOCK_BYTES:
            block_size = "default" if block_size in (None, "default") else MIN_BLOCK_BYTES
        return RemoteFile(self, path, mode="rb", block_size=block_size, **kwargs)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        return dict(self.remote.info(path, **kwargs))

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        return self.remote.ls(path, detail=detail, **kwargs)

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        return self.remote.find(path, *args, **kwargs)

    def sizes(self, paths: list[str]) -> list[int]:
        return list(self.remote.sizes(paths))

    def exists(self, path: str, **kwargs: Any) -> bool:
        return bool(self.remote.exists(path))


class RemoteFile(AbstractBufferedFile):
    """A read-only file on a :class:`FsspecView`: ranged reads, each retried."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        return bytes(self.fs.remote.cat_file(self.path, start, end))
