"""Built-in attributes, by the public name configs use: ``function: "shardload.attributes:NAME"``.

They live in :mod:`shardload.blockwise.attributes`; this module only gives them their short name.
"""

from shardload.blockwise.attributes import *  # noqa: F403
from shardload.blockwise.attributes import __all__ as __all__
