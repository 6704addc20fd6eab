"""Variable-length (ragged) arrays in every format: values + offsets."""
