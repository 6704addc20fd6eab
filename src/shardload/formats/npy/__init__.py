"""npy stack: one ``.npy`` file per chunk."""
