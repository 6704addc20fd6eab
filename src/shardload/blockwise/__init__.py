"""Block-wise attribute computation (the package is not named ``compute``: that name is the function ``shardload.compute``) in bounded memory (``shardload compute``; docs/compute.md).

``plan`` is pure arithmetic (windows, halos, padding, memory bound); ``job`` plans a run (no
data read); ``source`` reads windows and ``window`` pads them; ``tasks`` computes and writes one
slab; ``engine`` (``compute``) runs the tasks through the commit protocol and ``publish`` builds
the manifest; ``cli`` registers the command.
"""

from __future__ import annotations

from shardload.blockwise.config import AttributeConfig, ComputeConfig, load_compute_config
from shardload.blockwise.engine import compute

__all__ = ["AttributeConfig", "ComputeConfig", "compute", "load_compute_config"]
