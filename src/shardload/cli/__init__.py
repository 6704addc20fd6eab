"""The ``shardload`` command line: :func:`shardload.cli.app.main` assembles the subcommands."""

from shardload.cli.app import main

__all__ = ["main"]
