"""The C library through ctypes, found without starting a process.

``ctypes.util.find_library("c")`` runs ``/sbin/ldconfig -p`` on Linux: a fork of the calling
process, whose copy holds the caller's whole resident memory until it execs. Every DataLoader
worker looked ``preadv`` up that way once, so a peak-RSS sum over a loader's processes caught,
now and then, a third copy of a worker (docs/benchmarks.md, "Memory: ... issue 25"); it also
cost each worker a fork of a few hundred MiB process. glibc's ``libc.so.6`` is already loaded
in any Python process that has one; elsewhere ``CDLL(None)`` reaches the symbols of the libc
the interpreter was linked against (musl), and non-Linux systems keep ``find_library`` (no
subprocess on macOS).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_LIBC: dict[bool, ctypes.CDLL] = {}


def libc(*, use_errno: bool = False) -> ctypes.CDLL:
    """The C library (cached per ``use_errno``); raises OSError where there is none."""
    got = _LIBC.get(use_errno)
    if got is None:
        if sys.platform.startswith("linux"):
            try:
                got = ctypes.CDLL("libc.so.6", use_errno=use_errno)
            except OSError:  # musl: the interpreter's own symbols hold its libc
                got = ctypes.CDLL(None, use_errno=use_errno)
        else:
            got = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=use_errno)
        _LIBC[use_errno] = got
    return got
