"""Plain Zarr data (v2 or v3, e.g. written by xarray) described as a store: which arrays lie
along the samples, chunked along axis 0 only, and how CF decoding serves them (:mod:`.cf`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardload.errors import StoreError
from shardload.formats.base import is_local
from shardload.formats.zarr.anemoi import looks_like_anemoi, manifest_from_anemoi
from shardload.formats.zarr.cf import CFDecoding, plan_cf_decoding
from shardload.formats.zarr.read import _url, open_group_readonly
from shardload.manifest.core import ArrayInfo, Manifest

log = logging.getLogger(__name__)


def manifest_from_zarr(fs: Any, root: str, *, arrays: Sequence[str] | None = None) -> Manifest:
    """Describe plain Zarr data chunked along axis 0 as a (complete, stat-less) manifest.

    With ``arrays``, exactly those (each decodable, chunked along axis 0 only, all alike: else
    a :class:`StoreError` naming the array). Without, the sample-aligned arrays: those along
    the sample dimension (the leading dimension of most data variables, by Zarr dimension
    names; without names, the longest leading length shared by the most arrays) that share the
    data variables' row chunking and that CF decoding can serve (:mod:`.cf`). Every other
    array (coordinates of other dimensions, a ``time`` coordinate stored in one chunk, CF
    times, ...) is left out with a logged note, and listed with the reason in the manifest's
    ``provenance["skipped"]``: it never blocks reading the others.
    """
    members, attrs = _open_members(fs, root)
    if looks_like_anemoi(attrs, members):  # read as anemoi-datasets reads it
        if arrays is not None and list(arrays) != ["data"]:
            raise StoreError(
                f"{root} is an anemoi-datasets store: its one array along the dates is 'data' "
                f"(arrays={list(arrays)!r} asked for others; see anemoi_metadata for the rest)"
            )
        return manifest_from_anemoi(attrs, members, root)
    described = {k: _describe(k, m) for k, m in members.items()}
    if arrays is not None:
        picked, skipped = _pick_named(described, arrays, root), dict[str, str]()
    else:
        picked, skipped = _pick_auto(described, root)
    lengths = {a: described[a].shape[0] for a in picked}
    if len(set(lengths.values())) > 1:
        raise StoreError(f"arrays of {root} have unequal lengths: {lengths}")
    rows = {a: described[a].chunks[0] for a in picked}
    if len(set(rows.values())) > 1:
        raise StoreError(
            f"arrays of {root} have different row chunkings {rows}; pass arrays=[...] that are "
            "chunked alike"
        )
    length = next(iter(lengths.values()))
    from shardload.plan.chunks import plan_chunk_bounds

    bounds = plan_chunk_bounds(length, next(iter(rows.values())))
    provenance: dict[str, Any] = {"source": "plain zarr", "root": root}
    if skipped:
        provenance["skipped"] = skipped
    return Manifest(
        format="zarr",
        length=length,
        chunk_bounds=bounds,
        arrays={a: _array_info(described[a]) for a in picked},
        splits={"all": tuple(range(len(bounds) - 1))},
        complete=True,
        provenance=provenance,
    )


def _open_members(fs: Any, root: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The arrays of the Zarr group (or the one Zarr array, as ``data``) at ``root``, and the
    group's attributes."""
    import zarr

    attrs: dict[str, Any] = {}
    try:
        node = open_group_readonly(fs, root)
        members = dict(node.arrays())
        attrs = dict(node.attrs.asdict())
    except Exception:
        try:
            arr = zarr.open_array(store=root if is_local(fs) else _url(fs, root), mode="r")
            members = {"data": arr}
        except Exception as exc:
            raise StoreError(
                f"{root} is neither a shardload store nor a Zarr array/group: {exc}"
            ) from exc
    if not members:
        raise StoreError(f"Zarr store {root} has no arrays")
    return members, attrs


def _pick_named(described: Mapping[str, _Member], arrays: Sequence[str], root: str) -> list[str]:
    """Exactly ``arrays``, each of which must be servable."""
    missing = [a for a in arrays if a not in described]
    if missing:
        raise StoreError(f"array(s) {missing} not in Zarr store {root}; it has {sorted(described)}")
    for a in arrays:
        d = described[a]
        if d.problem is not None:
            raise d.problem
        if not d.rows_only:
            raise StoreError(
                f"array {a!r} in {root} is chunked {d.chunks} for shape {d.shape}: "
                "shardload reads stores chunked along axis 0 only (rechunk it with "
                "'shardload prepare')"
            )
    return list(arrays)


def _pick_auto(described: Mapping[str, _Member], root: str) -> tuple[list[str], dict[str, str]]:
    """The sample-aligned arrays, and why each other one was left out (logged)."""
    picked, skipped = _pick_sample_arrays(described)
    if not picked:
        reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items())
        raise StoreError(f"Zarr store {root} has no array shardload can read ({reasons})")
    if skipped:
        # a data variable along the samples left out is a surprise (a warning, short, once per
        # store and process: a DataLoader opens it in every worker); coordinates, their
        # bounds and the rest are not (every reason at INFO)
        data_vars = [k for k in skipped if described[k].data_var and described[k].aligned]
        log.info(
            "%s: reading %s; left out %s",
            root,
            picked,
            "; ".join(f"{k!r} ({v})" for k, v in skipped.items()),
        )
        if data_vars and root not in _WARNED:
            _WARNED.add(root)
            others = len(skipped) - len(data_vars)
            log.warning(
                "%s: left out data variable(s) %s%s; why: store.manifest.provenance['skipped'] "
                "(or this logger at INFO)",
                root,
                data_vars,
                f" and {others} other array(s)" if others else "",
            )
    return picked, skipped


#: stores whose left-out data variables were warned about in this process
_WARNED: set[str] = set()


def _array_info(d: _Member) -> ArrayInfo:
    attrs: dict[str, Any] = {}
    if d.dims is not None:
        attrs["dims"] = list(d.dims)
    if d.decoding is not None:
        attrs["cf"] = d.decoding.to_dict()
    dtype = d.decoding.dtype if d.decoding is not None else d.dtype.str
    return ArrayInfo(
        name=d.name,
        shape=d.shape,
        dtype=str(np.dtype(dtype)),
        chunk_rows=d.chunks[0],
        path=d.name,
        attrs=attrs,
    )


@dataclass
class _Member:
    """One array of a plain Zarr group, as the manifest sees it."""

    name: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype
    dims: tuple[str, ...] | None  # Zarr v3 dimension names / v2 _ARRAY_DIMENSIONS
    coordinates: tuple[str, ...]  # its CF "coordinates" attribute
    bounds: tuple[str, ...] = ()  # its CF "bounds" attribute (a coordinate's cell bounds)
    decoding: CFDecoding | None = None
    problem: StoreError | None = None  # why it cannot be served (CF decoding refused)
    data_var: bool = True
    aligned: bool = False  # along the sample dimension

    @property
    def rows_only(self) -> bool:
        return len(self.shape) >= 1 and self.chunks[1:] == self.shape[1:]


def _describe(name: str, m: Any) -> _Member:
    meta = m.metadata
    fmt = int(getattr(meta, "zarr_format", 3))
    attrs = dict(m.attrs.asdict()) if hasattr(m.attrs, "asdict") else dict(m.attrs)
    dims = getattr(meta, "dimension_names", None) if fmt == 3 else attrs.get("_ARRAY_DIMENSIONS")
    dims = tuple(str(d) for d in dims) if dims is not None and None not in dims else None
    coords = attrs.get("coordinates")
    d = _Member(
        name=name,
        shape=tuple(int(s) for s in m.shape),
        chunks=tuple(int(c) for c in m.chunks),
        dtype=np.dtype(m.dtype),
        dims=dims,
        coordinates=tuple(coords.split()) if isinstance(coords, str) else (),
        bounds=(attrs["bounds"],) if isinstance(attrs.get("bounds"), str) else (),
    )
    if dims is not None:  # named dimensions: written by xarray or a CF-aware tool
        try:
            d.decoding = plan_cf_decoding(
                name, dtype=d.dtype, attrs=attrs, fill_value=m.fill_value, zarr_format=fmt
            )
        except StoreError as exc:
            d.problem = exc
    elif d.dtype.kind not in "biufc":
        d.problem = StoreError(f"array {name!r} has dtype {d.dtype}, not numbers")
    return d


def _pick_sample_arrays(described: Mapping[str, _Member]) -> tuple[list[str], dict[str, str]]:
    """The sample-aligned arrays and, for every other array, why it was left out (pure)."""
    dim_names = {n for d in described.values() for n in (d.dims or ())}
    coord_names = {c for d in described.values() for c in (*d.coordinates, *d.bounds)}
    for d in described.values():
        d.data_var = d.name not in dim_names and d.name not in coord_names
    ranked = [d for d in described.values() if d.shape]
    skipped = {d.name: "a scalar" for d in described.values() if not d.shape}
    if not ranked:
        return [], skipped
    data = [d for d in ranked if d.data_var] or ranked

    def lead(d: _Member) -> tuple[str, Any]:  # the leading dimension: by name, else by length
        return ("name", d.dims[0]) if d.dims is not None else ("length", d.shape[0])

    counts = Counter(lead(d) for d in data)
    length_of = {lead(d): d.shape[0] for d in ranked}
    sample = max(counts, key=lambda k: (counts[k], length_of[k]))
    length = length_of[sample]
    where = f"dimension {sample[1]!r}" if sample[0] == "name" else f"length {length}"
    aligned = []
    for d in ranked:
        d.aligned = lead(d) == sample or (d.dims is None and d.shape[0] == length)
        if not d.aligned:
            skipped[d.name] = f"not along the sample {where} (dims {d.dims or d.shape})"
        elif d.problem is not None:
            skipped[d.name] = str(d.problem)
        elif not d.rows_only:
            skipped[d.name] = (
                f"chunked {d.chunks} for shape {d.shape}: shardload reads arrays chunked along "
                "axis 0 only"
            )
        else:
            aligned.append(d)
    votes = Counter(d.chunks[0] for d in aligned if d.data_var) or Counter(
        d.chunks[0] for d in aligned
    )
    if not votes:
        return [], skipped
    rows = max(votes, key=lambda r: (votes[r], r))
    for d in aligned:
        if d.chunks[0] != rows:
            skipped[d.name] = (
                f"chunked {d.chunks[0]} rows along the sample {where} where the other arrays "
                f"use {rows} (open it alone: arrays=[{d.name!r}])"
            )
    picked = [d.name for d in aligned if d.chunks[0] == rows]
    return picked, {k: skipped[k] for k in described if k in skipped}
