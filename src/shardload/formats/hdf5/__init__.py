"""HDF5: one file, one dataset per array."""
