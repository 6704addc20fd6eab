"""``shardload bench ...``: benchmarks users run on their own machine (formats, loaders).

Each subcommand lives in its own module of this package exposing ``register(kinds)``."""
