"""The format-free description of a store: manifest, arrays, feature statistics and names, ragged rows."""
