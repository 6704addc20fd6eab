"""Sample data generators: synthetic raw files in the schemas of real data sets."""

from __future__ import annotations

from shardload.samples.radiation import radiation_file_names, write_radiation_sample

__all__ = ["radiation_file_names", "write_radiation_sample"]
