"""Listings for :mod:`shardload.move.serve`: the store index at ``/`` and folder listings.

Folder listings are HTML by default because fsspec's ``HTTPFileSystem.ls`` (and so ``find``,
``walk`` and zarr's ``FsspecStore`` listing) only reads ``<a href>`` links from ``text/html``
pages; a link ending in ``/`` is a folder to fsspec. Links are absolute paths on the server, so
they work from ``/a/b`` and ``/a/b/`` alike. The same data is available as JSON.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from shardload.layout import LOCK_SUFFIX, MANIFEST_NAME, PARTIAL_SUFFIX


def is_hidden(name: str) -> bool:
    """True for what a writer leaves beside a store while it runs (``OUT.partial/``,
    ``OUT.partial.lock``): never served nor listed, since it is not a store yet (a killed
    prepare's folder may even hold a manifest saying ``complete: true``, written just before
    the rename that never came)."""
    return name.endswith(PARTIAL_SUFFIX) or name.endswith(LOCK_SUFFIX)


def _inside(root: Path, entry: os.DirEntry) -> bool:
    """False for a symlink whose target is outside ``root`` (or dangling)."""
    if not entry.is_symlink():
        return True
    try:
        real = Path(entry.path).resolve(strict=True)
    except (OSError, RuntimeError):
        return False
    return real == root or root in real.parents


def describe_store(folder: Path) -> dict[str, Any] | None:
    """The index entry of one store folder, or None when the folder is not a store.

    A folder is a store when it holds ``shardload.json`` (its ``format``, ``length`` and
    ``complete`` are reported), or is a plain Zarr group (``zarr.json`` or ``.zgroup``; reported
    with ``length`` None and ``complete`` true, as ``open_store`` treats them).
    """
    entry: dict[str, Any] = {"name": folder.name, "url": f"/{quote(folder.name)}/"}
    manifest = folder / MANIFEST_NAME
    if manifest.is_file():
        try:
            meta = json.loads(manifest.read_text())
        except (OSError, ValueError) as exc:
            return {**entry, "format": None, "length": None, "complete": False, "error": str(exc)}
        if not isinstance(meta, dict):
            meta = {}
        return {
            **entry,
            "format": meta.get("format"),
            "length": meta.get("length"),
            "complete": bool(meta.get("complete", False)),
        }
    if (folder / "zarr.json").is_file() or (folder / ".zgroup").is_file():
        return {**entry, "format": "zarr", "length": None, "complete": True}
    return None


def list_stores(root: Path) -> list[dict[str, Any]]:
    """Every store directly under ``root``, sorted by name (see :func:`describe_store`);
    stores being written (``OUT.partial``, :func:`is_hidden`) are left out."""
    stores = []
    with os.scandir(root) as it:
        for entry in it:
            if is_hidden(entry.name):
                continue
            if entry.is_dir() and _inside(root, entry):
                desc = describe_store(Path(entry.path))
                if desc is not None:
                    stores.append(desc)
    return sorted(stores, key=lambda s: s["name"])


def list_folder(root: Path, folder: Path) -> list[dict[str, Any]]:
    """The files and sub-folders of ``folder`` (symlinks leading out of ``root`` and
    :func:`is_hidden` names left out)."""
    entries = []
    with os.scandir(folder) as it:
        for entry in it:
            if is_hidden(entry.name) or not _inside(root, entry):
                continue
            try:
                is_dir = entry.is_dir()
                size = None if is_dir else entry.stat().st_size
            except OSError:
                continue
            entries.append(
                {"name": entry.name, "type": "directory" if is_dir else "file", "size": size}
            )
    return sorted(entries, key=lambda e: e["name"])


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title></head>
<body><h1>{title}</h1>
<table>
{rows}
</table>
</body></html>
"""


def folder_html(rel: str, entries: list[dict[str, Any]]) -> str:
    """An HTML listing of one folder; ``rel`` is its path below the served root."""
    base = "/" + "/".join(quote(p) for p in rel.split("/") if p)
    rows = []
    for e in entries:
        slash = "/" if e["type"] == "directory" else ""
        href = f"{base}/{quote(e['name'])}{slash}"
        size = "" if e["size"] is None else str(e["size"])
        name = html.escape(e["name"] + slash)
        rows.append(f'<tr><td><a href="{html.escape(href)}">{name}</a></td><td>{size}</td></tr>')
    return _PAGE.format(title=html.escape(f"/{rel}/"), rows="\n".join(rows))


def stores_html(stores: list[dict[str, Any]]) -> str:
    """An HTML version of the store index (for browsers; the default answer is JSON)."""
    rows = [
        "<tr><th>store</th><th>format</th><th>length</th><th>complete</th></tr>",
        *(
            f'<tr><td><a href="{html.escape(s["url"])}">{html.escape(s["name"])}/</a></td>'
            f"<td>{html.escape(str(s['format']))}</td><td>{html.escape(str(s['length']))}</td>"
            f"<td>{s['complete']}</td></tr>"
            for s in stores
        ),
    ]
    return _PAGE.format(title="shardload stores", rows="\n".join(rows))
