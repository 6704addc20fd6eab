"""A dated view: a flat view's rows placed on the rows of a regular time axis, a row for each
date the source lacks, filled with NaN (:mod:`shardload.prep.dated`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from shardload.errors import ViewError
from shardload.manifest.core import ArraySpec
from shardload.prep.dated import DatedRows, show_dates
from shardload.prep.views.base import View


class DatedView:
    """``inner`` (one row per source date) seen as one row per date of ``dated.axis``."""

    def __init__(self, inner: View, dated: DatedRows) -> None:
        if int(inner.length) != len(dated.source_rows):
            raise ViewError(
                f"the view has {inner.length} rows but the time coordinate {dated.coord!r} "
                f"has {len(dated.source_rows)} dates"
            )
        self.inner, self.dated = inner, dated
        length = dated.axis.length
        if dated.gaps:
            for name, spec in inner.specs.items():
                if np.dtype(spec.dtype).kind != "f":
                    raise ViewError(
                        f"array {name!r} is {np.dtype(spec.dtype).name}, which has no NaN for "
                        f"the {len(dated.gaps)} date(s) the time coordinate {dated.coord!r} "
                        f"lacks ({show_dates(dated.axis, dated.gaps)}): give dtype: float32 "
                        "(or float64), or dates: false for a store without those rows"
                    )
        self._specs = {
            k: replace(s, shape=(length, *tuple(s.shape)[1:])) for k, s in inner.specs.items()
        }

    @property
    def length(self) -> int:
        return self.dated.axis.length

    @property
    def specs(self) -> Mapping[str, ArraySpec]:
        return self._specs

    @property
    def static(self) -> Mapping[str, Any]:
        return self.inner.static

    @property
    def rows(self) -> Any:
        """The inner view's row reader (the driver asks whether the view reads rows itself)."""
        return getattr(self.inner, "rows", None)

    @property
    def read_by_rows(self) -> bool:
        """Whether the inner view's row reader serves every read."""
        return bool(getattr(self.inner, "read_by_rows", False))

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        src = self.dated.source_rows
        i0, i1 = (int(i) for i in np.searchsorted(src, [start, stop]))
        got = self.inner.read(i0, i1) if i1 > i0 else {}
        if i1 - i0 == stop - start:  # no gap in these rows
            return got
        at = src[i0:i1] - start
        out = {}
        for name, spec in self._specs.items():
            buf = np.full((stop - start, *tuple(spec.shape)[1:]), np.nan, dtype=spec.dtype)
            if got:
                buf[at] = got[name]
            out[name] = buf
        return out
