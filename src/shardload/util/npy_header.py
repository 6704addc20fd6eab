"""The one lock around numpy's npy header parse on the read side.

numpy parses npy headers with ``ast.literal_eval``, which is not thread-safe in CPython < 3.11.8 /
3.12.1 ("SystemError: AST constructor recursion depth mismatch", gh-106905), and reader threads
parse npy chunk headers and the checksum file concurrently. The lock guards the parse only, never
I/O: a thread holding it across a (remote, retried) read while a DataLoader forks its workers
would leave the workers a lock that is never released; a forked child gets a new lock.
"""

from __future__ import annotations

import os
import threading

_LOCK = threading.Lock()


def npy_header_lock() -> threading.Lock:
    """This process's lock (call it each time: a forked child replaces it)."""
    return _LOCK


def _new_lock() -> None:
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)
