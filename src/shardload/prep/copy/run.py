"""``shardload copy SRC DST``: any store (any format, older layouts, other chunking, by URL)
rewritten as the store ``prepare`` writes, values equal.

The copy is a prepare run (:func:`~shardload.prep.driver.write_store`) whose rows come from the
opened source store (:class:`~.origin.StoreOrigin`) instead of raw files: the same layout
defaults and options, the same ``DST.partial`` + lock + ``_progress/`` records (an interrupted
copy resumes when run again; a second copy into the same DST is refused), checksums,
statistics and publish. What the source store knows and a config cannot say (splits, feature
names, attrs, static data, sample coordinates, statistics) is carried over.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardload.errors import ConfigError, ShardloadError, StoreError
from shardload.layout import PARTIAL_SUFFIX
from shardload.prep.config import validate
from shardload.prep.copy.origin import StoreOrigin
from shardload.store.core import Store, open_store

#: the layout options of ``copy``: prepare's config keys of the same names, checked as they are
LAYOUT_KEYS = (
    "format",
    "compression",
    "compression_level",
    "chunk_rows",
    "target_chunk_bytes",
    "shard_chunks",
)


def copy_store(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool | None = None,
    execution: Mapping[str, Any] | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    dst_storage_options: Mapping[str, Any] | None = None,
    **layout: Any,
) -> Store:
    """Copy the store ``src`` (a folder or URL; any format; plain Zarr data too) into ``dst``
    in the layout prepare writes by default, or the one ``layout`` gives: ``format``,
    ``compression``, ``compression_level``, ``chunk_rows``, ``target_chunk_bytes``,
    ``shard_chunks`` (prepare's config keys, same values and checks). ``dst`` may be an
    ``s3://`` URL (written as prepare writes one; ``dst_storage_options`` for s3fs, else the
    AWS environment variables); ``storage_options`` are the source's.

    Every array, row, dtype, attr and feature name is copied; the splits keep their rows (new
    chunk bounds keep every split boundary: planned chunk rows shrink to fit, a given
    ``chunk_rows`` that would cut one is refused); statistics, static data and sample
    coordinates are carried. Returns the opened copy. Raises as :func:`shardload.prepare`
    does (``StoreExistsError`` without ``overwrite``, ``StoreLockedError`` while another
    run writes ``dst``); an interrupted copy resumes when run again with the same options.
    """
    unknown = sorted(set(layout) - set(LAYOUT_KEYS))
    if unknown:
        raise ConfigError(
            f"copy: unknown option(s) {unknown}; the layout options are {list(LAYOUT_KEYS)}"
        )
    src_s, dst_s = os.fspath(src), os.fspath(dst)
    if dst_s.startswith("file://"):
        dst_s = dst_s[len("file://") :]
    if "://" in dst_s:  # an object store (s3://): checked as prepare checks out
        from shardload.prep.remote_commit import check_out_url

        try:
            check_out_url(dst_s)
        except ConfigError as exc:
            raise ConfigError(f"copy: DST {exc}") from None
        if dst_s.rstrip("/") == src_s.rstrip("/"):
            raise ConfigError(f"copy: DST {dst_s} is the source store: copy into another prefix")
        out = dst_s
    else:
        out = str(Path(dst_s).expanduser().absolute())
    store = _open_source(src_s, storage_options)
    if "://" not in out:
        _check_paths(store, src_s, Path(out))
    raw: dict[str, Any] = {  # what prepare's config says of a copy: its arrays, each as it is
        "source": {"paths": [src_s]},
        "sample_dims": ["sample"],
        "arrays": {name: [name] for name in store.arrays},
        "out": out,
        "out_storage_options": dict(dst_storage_options or {}),
        "overwrite": bool(overwrite),
        **{k: v for k, v in layout.items() if v is not None},
    }
    if execution is not None:
        raw["execution"] = execution
    cfg = validate(raw, Path.cwd(), where="copy options")  # prepare's keys, checks, defaults
    cfg = dataclasses.replace(cfg, **_split_labels(store))
    origin = StoreOrigin(
        store,
        src_s,
        chunk_rows_given=layout.get("chunk_rows") is not None,
        storage_options=storage_options,
    )
    from shardload.prep.driver import write_store

    return write_store(cfg, origin.open_view(), progress=progress, origin=origin)


def _open_source(src: str, storage_options: Mapping[str, Any] | None) -> Store:
    """The source store, opened; an error naming it when it is not one."""
    if "://" not in src and not os.path.exists(os.path.expanduser(src)):
        raise StoreError(f"copy: source store {src} does not exist")
    try:
        return open_store(src, storage_options=dict(storage_options or {}) or None)
    except ShardloadError as exc:
        text = str(exc)
        where = "" if src in text else f"source store {src}: "
        raise type(exc)(f"copy: {where}{text}") from exc
    except (OSError, ValueError) as exc:
        raise StoreError(f"copy: cannot open source store {src}: {exc}") from exc


def _check_paths(store: Store, src: str, dst: Path) -> None:
    """A copy never writes into, over or around its own source."""
    if not store.is_local:
        return
    a = Path(store.root).resolve()
    b = dst.resolve()
    partial = b.with_name(b.name + PARTIAL_SUFFIX)
    for p in (b, partial):
        if p == a or a in p.parents or p in a.parents:
            raise ConfigError(
                f"copy: DST {dst} overlaps the source store {src}: copy into another folder"
            )


def _split_labels(store: Store) -> dict[str, Any]:
    """The fractions, seed and shuffle that made the source's splits (for the copy's
    ``metadata.json``), where its provenance says them."""
    conf = store.manifest.provenance.get("config")
    if not isinstance(conf, Mapping):
        return {"splits": {}}
    fractions = conf.get("splits")
    out: dict[str, Any] = {"splits": {}}
    if isinstance(fractions, Mapping) and all(
        isinstance(v, (int, float)) for v in fractions.values()
    ):
        out["splits"] = {str(k): float(v) for k, v in fractions.items()}
    if isinstance(conf.get("split_seed"), int):
        out["split_seed"] = conf["split_seed"]
    if isinstance(conf.get("split_shuffle"), bool):
        out["split_shuffle"] = conf["split_shuffle"]
    return out
