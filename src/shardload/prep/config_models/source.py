"""``source:``: the raw files to read."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
)

from shardload.prep.config_models.fields import (
    StrictModel,
    StrList,
)


class SourceModel(StrictModel):
    """Raw files to read (``source:``; a string or a list is shorthand for ``paths``)."""

    paths: StrList = Field(min_length=1, description="files, globs, Zarr folders or URLs")
    kind: Literal["xarray", "radiation"] = "xarray"
    outputs: StrList = Field(default_factory=list, description="radiation: output files")
    engine: str | None = None
    combine: Literal["by_coords", "nested"] = "by_coords"
    concat_dim: str | None = None
    decode_times: bool | None = None
    group: str | None = None
    variables: StrList | None = None
    open_kwargs: dict[str, Any] = Field(default_factory=dict)
    storage_options: dict[str, Any] = Field(default_factory=dict)
    filter: dict[str, Any] = Field(
        default_factory=dict,
        description="GRIB: keep messages with these key values, e.g. {typeOfLevel: isobaricInhPa} "
        "(cfgrib's filter_by_keys)",
    )


def source_shorthand(v: Any) -> Any:
    return {"paths": v} if isinstance(v, (str, list)) else v
