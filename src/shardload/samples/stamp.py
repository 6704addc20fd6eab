"""Which generator wrote a sample file, and whether it may be reused (issue #25).

Every file that ``shardload sample KIND`` (and ``shardload demo``) writes carries a stamp in
its global attributes (netCDF) or group attributes (Zarr)::

    shardload_sample_kind      "radiation", "era5", "states" or "seismic"
    shardload_sample_version   SAMPLE_VERSIONS[kind] when it was written
    shardload_sample_options   the options its values follow from, as sorted JSON

A file is reused only when all three match what the generator would write now
(:func:`why_outdated` returns None); otherwise it is written again, and the caller logs why.
Without this a workspace kept from an older generator (whose radiation targets were not yet a
function of the inputs) made ``make demo`` end at the mean predictor's loss.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

log = logging.getLogger(__name__)

#: The version of each generator's output. RULE: bump a kind's number in the same commit that
#: changes what its generator writes for the same options (values, variables, dims, or
#: attributes a prepare reads); files stamped with another number (or none: written before
#: 2026-11-28) are then regenerated instead of reused. radiation 2: the fluxes are a function
#: of the input profiles (b44c506; 1 was independent noise, which no model can learn).
SAMPLE_VERSIONS: Final[Mapping[str, int]] = {"radiation": 2, "era5": 1, "states": 1, "seismic": 1}

KIND_ATTR: Final = "shardload_sample_kind"
VERSION_ATTR: Final = "shardload_sample_version"
OPTIONS_ATTR: Final = "shardload_sample_options"


def sample_stamp(kind: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The stamp attributes of a ``kind`` sample written now with ``options``.

    >>> sample_stamp("states", {"seed": 0, "dates": 8})["shardload_sample_options"]
    '{"dates": 8, "seed": 0}'
    """
    return {
        KIND_ATTR: kind,
        VERSION_ATTR: SAMPLE_VERSIONS[kind],
        OPTIONS_ATTR: _options_json(options),
    }


def _options_json(options: Mapping[str, Any]) -> str:
    return json.dumps(dict(options), sort_keys=True)


def read_stamp(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The stamp attributes of the sample at ``path`` (a netCDF file or a Zarr folder), those it
    has: ``{}`` for a file written before stamps (or by something else)."""
    p = Path(path)
    if p.is_dir():
        import zarr

        attrs: Mapping[str, Any] = zarr.open_group(str(p), mode="r").attrs.asdict()
    else:
        import netCDF4

        with netCDF4.Dataset(p, "r") as ds:
            attrs = {k: ds.getncattr(k) for k in ds.ncattrs()}
    return {k: attrs[k] for k in (KIND_ATTR, VERSION_ATTR, OPTIONS_ATTR) if k in attrs}


def why_outdated(
    path: str | os.PathLike[str], kind: str, options: Mapping[str, Any] | None = None
) -> str | None:
    """Why the file at ``path`` is not what the ``kind`` generator writes now with ``options``
    (``None``: any options), or None when it is (and may be reused)."""
    p = Path(path)
    if not p.exists():
        return "it does not exist"
    try:
        stamp = read_stamp(p)
    except Exception as exc:  # any unreadable file is rewritten, never reused
        return f"it cannot be read ({type(exc).__name__}: {exc})"
    now = SAMPLE_VERSIONS[kind]
    if VERSION_ATTR not in stamp:
        return (
            f"it records no sample version (written before shardload recorded one, by an older "
            f"generator); the {kind} generator is now version {now}"
        )
    if stamp.get(KIND_ATTR) != kind:
        return f"it is a {stamp.get(KIND_ATTR)!r} sample, not {kind!r}"
    if int(stamp[VERSION_ATTR]) != now:
        return f"it was written by {kind} generator version {int(stamp[VERSION_ATTR])}; it is now {now}"
    if options is not None and stamp.get(OPTIONS_ATTR) != _options_json(options):
        return (
            f"it was written with options {stamp.get(OPTIONS_ATTR)}, not {_options_json(options)}"
        )
    return None


def reusable(path: str | os.PathLike[str], kind: str, options: Mapping[str, Any]) -> bool:
    """Whether the sample at ``path`` is what the ``kind`` generator writes now with
    ``options``; logs that it is reused, or why it is regenerated when it is there."""
    why = why_outdated(path, kind, options)
    if why is None:
        log.info("reusing %s: up to date", path)
    elif Path(path).exists():
        log.info("regenerating %s: %s", path, why)
    return why is None
