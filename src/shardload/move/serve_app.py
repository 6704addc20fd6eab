"""The web application of ``shardload serve``: request paths mapped into the served folder
(refusing every way out), files with byte ranges, folder listings, one access-log line per
request."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import unquote

from shardload.errors import require
from shardload.move.serve_auth import Access
from shardload.move.serve_index import is_hidden


class PathRefused(Exception):
    """The request target tries to leave the served folder (answered with 403)."""


def resolve_request_path(root: Path, raw_path: str) -> Path | None:
    """Map a raw request path to a file or folder inside ``root``.

    Parameters
    ----------
    root : Path
        The served folder, already resolved (absolute, no symlinks).
    raw_path : str
        The request target as received (percent-encoded, query string allowed).

    Returns
    -------
    Path or None
        The resolved path inside ``root``, or None when nothing exists there or the path is
        in a store being written (``OUT.partial/``, ``OUT.partial.lock``).

    Raises
    ------
    PathRefused
        For ``.``/``..`` segments, encoded ``/`` or ``\\``, NUL bytes, bad encodings, or a
        symlink whose target resolves outside ``root``.
    """
    path = raw_path.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/"):
        raise PathRefused(raw_path)
    parts = []
    for segment in path.split("/"):
        if not segment:
            continue  # "//" and the trailing "/" of folders
        try:
            name = unquote(segment, errors="strict")
        except UnicodeDecodeError as exc:
            raise PathRefused(raw_path) from exc
        if name in (".", "..") or any(c in name for c in ("/", "\\", "\0")):
            raise PathRefused(raw_path)
        parts.append(name)
    try:
        real = root.joinpath(*parts).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, symlink loop, name too long
        return None
    if real != root and root not in real.parents:
        raise PathRefused(raw_path)  # a symlink pointing out of the served folder
    if any(is_hidden(p) for p in (*parts, *real.relative_to(root).parts)):
        return None  # a store being written, or its lock: not found, as if absent
    return real


def make_app(root: Path, access: Access | None = None):
    """The application serving ``root``; ``access`` adds its tokens and per-client limit."""
    web = require("aiohttp.web", "serve")
    from shardload.move import serve_index
    from shardload.move.serve_auth import make_middleware

    async def handle(request):
        try:
            path = await asyncio.to_thread(resolve_request_path, root, request.raw_path)
        except PathRefused:
            raise web.HTTPForbidden(text="path outside the served folder\n") from None
        if path is None:
            raise web.HTTPNotFound(text="not found\n")
        if path.is_file():
            if _empty_suffix_range(request.headers.get("Range", "")):
                size = (await asyncio.to_thread(path.stat)).st_size
                raise web.HTTPRequestRangeNotSatisfiable(
                    headers={"Content-Range": f"bytes */{size}"}
                )
            return web.FileResponse(path)
        if not path.is_dir():
            raise web.HTTPNotFound(text="not a file\n")
        query_format = request.query.get("format", "")
        accept = request.headers.get("Accept", "")
        if path == root:
            as_html = query_format == "html" or (query_format != "json" and "text/html" in accept)
            stores = await asyncio.to_thread(serve_index.list_stores, root)
            if as_html:
                return web.Response(text=serve_index.stores_html(stores), content_type="text/html")
            return web.json_response({"stores": stores})
        as_json = query_format == "json" or (
            query_format != "html" and "application/json" in accept and "text/html" not in accept
        )
        rel = path.relative_to(root).as_posix()
        entries = await asyncio.to_thread(serve_index.list_folder, root, path)
        if as_json:
            return web.json_response({"path": rel + "/", "entries": entries})
        return web.Response(text=serve_index.folder_html(rel, entries), content_type="text/html")

    app = web.Application(middlewares=[make_middleware(access or Access())])
    app.router.add_get("/{tail:.*}", handle)  # HEAD is allowed too; other methods get 405
    return app


def _empty_suffix_range(header: str) -> bool:
    """``bytes=-0``: the last zero bytes, which RFC 9110 calls unsatisfiable (416)."""
    unit, _, spec = header.partition("=")
    spec = spec.strip()
    return (
        unit.strip().lower() == "bytes"
        and spec.startswith("-")
        and spec[1:].isdigit()
        and int(spec[1:]) == 0
    )


def access_logger_class():
    from aiohttp.abc import AbstractAccessLogger

    class AccessLogger(AbstractAccessLogger):
        """One line per request: method path status bytes time."""

        def log(self, request, response, time):
            sent = 0 if request.method == "HEAD" or response.status == 304 else None
            self.logger.info(
                "%s %s %d %d %.1fms",
                request.method,
                request.raw_path,
                response.status,
                sent if sent is not None else (response.content_length or 0),
                time * 1000,
            )

    return AccessLogger
