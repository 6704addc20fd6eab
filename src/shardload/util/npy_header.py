"""npy headers parsed without ``ast``, and the lock around numpy's parse where one is still used.

numpy parses npy headers with ``ast.literal_eval``, which is not thread-safe in CPython < 3.11.8 /
3.12.1 ("SystemError: AST constructor recursion depth mismatch", gh-106905): it fails when
another thread builds an AST at the same moment, and that other thread need not parse a header
at all (``compile`` of a module imported for the first time, any ``literal_eval``), so a lock
around our own parses cannot exclude it. Reader threads parse npy chunk headers, the checksum
file and the feature files concurrently: :func:`parse_npy` reads the headers numpy itself writes
(``{'descr': ..., 'fortran_order': ..., 'shape': (...), }``) with a regular expression, and
:func:`load_npz` reads an ``.npz`` through it; anything else falls back to numpy's parse under
the lock. The lock guards the parse only, never I/O: a thread holding it across a (remote,
retried) read while a DataLoader forks its workers would leave the workers a lock that is never
released; a forked child gets a new lock.
"""

from __future__ import annotations

import io
import os
import re
import threading
import zipfile

import numpy as np

_LOCK = threading.Lock()

_MAGIC = b"\x93NUMPY"
_HEADER = re.compile(
    r"\{\s*'descr':\s*'([^']+)',\s*'fortran_order':\s*(True|False),\s*"
    r"'shape':\s*\(\s*((?:\d+\s*,\s*)*\d*)\s*\),?\s*\}\s*"
)


def npy_header_lock() -> threading.Lock:
    """This process's lock (call it each time: a forked child replaces it)."""
    return _LOCK


def _new_lock() -> None:
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_lock)


def parse_npy(raw: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """``(shape, fortran_order, dtype, data offset)`` of the npy file that ``raw`` starts with
    (at least its whole header). Raises ValueError for anything that is not an npy header or
    holds Python objects.

    >>> buf = io.BytesIO(); np.save(buf, np.zeros((2, 3), "<f4")); parse_npy(buf.getvalue())[:3]
    ((2, 3), False, dtype('float32'))
    """
    if raw[:6] != _MAGIC or len(raw) < 10:
        raise ValueError("not an npy file (no npy magic string)")
    major = raw[6]
    if major == 1:
        start, size = 10, int.from_bytes(raw[8:10], "little")
    elif major in (2, 3):
        start, size = 12, int.from_bytes(raw[8:12], "little")
    else:
        raise ValueError(f"npy format version {major}.{raw[7]} is not supported")
    if len(raw) < start + size:
        raise ValueError("npy header cut short")
    text = raw[start : start + size].decode("utf-8" if major == 3 else "latin1")
    m = _HEADER.fullmatch(text)
    if m is None:  # a header numpy did not write this way: numpy's own parse, under the lock
        buf = io.BytesIO(raw[: start + size])
        with _LOCK:
            version = np.lib.format.read_magic(buf)
            read = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read(buf)
        return tuple(shape), bool(fortran), np.dtype(dtype), start + size
    dtype = np.dtype(m.group(1))
    if dtype.hasobject:
        raise ValueError("npy data holds Python objects (not loaded)")
    shape = tuple(int(s) for s in m.group(3).replace(" ", "").split(",") if s)
    return shape, m.group(2) == "True", dtype, start + size


def load_npz(data: bytes) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file's bytes (read-only views where stored uncompressed), as
    ``np.load`` gives them, without ``ast``. Raises ValueError for a file that is not one."""
    out: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for name in z.namelist():
                raw = z.read(name)
                shape, fortran, dtype, offset = parse_npy(raw)
                count = int(np.prod(shape, dtype=np.int64))
                arr = np.frombuffer(raw, dtype=dtype, count=count, offset=offset)
                key = name[:-4] if name.endswith(".npy") else name
                out[key] = arr.reshape(shape, order="F" if fortran else "C")
    except (zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"not an npz file: {exc}") from exc
    return out
