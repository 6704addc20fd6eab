"""Parquet: one Parquet file per chunk, ``NAME/000000.parquet``; readable by pyarrow alone."""
