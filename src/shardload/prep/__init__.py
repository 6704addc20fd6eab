"""``prepare``: raw files -> a complete store (sources, views, config, the run, the commit).

The package is not named ``prepare``: that name is the function ``shardload.prepare``."""
