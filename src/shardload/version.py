"""The package version (one place: ``shardload.__version__`` and every writer's manifest read it)."""

__version__ = "0.1.0"
