"""Reading npy stacks: one ``.npy`` file per chunk, ``NAME/000000.npy``; memory-mappable, any numpy
reads it.

Chunk files are uncompressed (the format's point is zero-decode, mmap-able reads). A chunk's
header is checked against the manifest (dtype, shape, C order) before its bytes are trusted,
and its checksum (over the whole file, header included) as ``verify`` says.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError, StoreError
from shardload.formats.base import RawChunk, is_local, readinto_full
from shardload.formats.checksums import DEFAULT_VERIFY, Verifier, digest, file_digest
from shardload.formats.ragged.read import read_npy_file
from shardload.manifest.core import Manifest
from shardload.util.npy_header import parse_npy

CHUNK_NAME = "{:06d}.npy"


def chunk_path(array_path: str, i: int) -> str:
    return f"{array_path}/{CHUNK_NAME.format(i)}"


def open_reader(
    fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
) -> NpyReader:
    return NpyReader(fs, root, manifest, verify=verify)


class NpyReader:
    """Reads row ranges; local files with ``np.fromfile`` at the data offset, remote ones with
    one ranged request per touched chunk."""

    def __init__(
        self, fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
    ) -> None:
        self.fs, self.root, self.manifest = fs, root.rstrip("/"), manifest
        self.local = is_local(fs)
        self._offsets: dict[tuple[str, int], int] = {}
        self.bounds = np.asarray(manifest.chunk_bounds, dtype=np.int64)
        self.verifier = Verifier(fs, self.root, manifest, verify, files=True)

    def verify_chunk(self, name: str, i: int) -> bytes | None:
        """Check chunk ``i`` of ``name`` against its checksum when ``verify`` asks for it (the
        whole file: local files through mmap, from the page cache). By URL, returns the file's
        bytes it fetched and checked (the caller serves its rows from them: one transfer)."""
        path = self.path(name, i)
        if not self.verifier.needed(name, i, path if self.local else None):
            return None
        whole = None
        try:
            if self.local:
                got = file_digest(path)
            else:
                from shardload.move.remote import read_bytes

                whole = read_bytes(self.fs, path, what=f"chunk {i} of array {name!r}")
                got = digest(whole)
        except OSError as exc:
            raise ChunkReadError.from_os_error(exc, f"chunk {i}", name, path) from exc
        self.verifier.check(name, i, got, path=path, what=f"chunk {i}")
        return whole

    def check_metadata(self, where: str) -> None:
        """The header of each fixed array's last chunk file (dtype, row shape, its rows)
        against the manifest ``where``, when the store is opened (every other chunk's header
        is checked at its first read). A missing file is left to the read that needs it."""
        n = self.manifest.num_chunks
        for name, info in self.manifest.arrays.items():
            if info.is_ragged or n == 0:
                continue
            try:
                self._data_offset(name, n - 1)
            except ChunkReadError as exc:
                if isinstance(exc.__cause__, FileNotFoundError):
                    continue
                raise StoreError(
                    f"{where} and the files of array {name!r} disagree: {exc}"
                ) from exc

    def path(self, name: str, i: int) -> str:
        return f"{self.root}/{chunk_path(self.manifest.arrays[name].path, i)}"

    def _data_offset(self, name: str, i: int) -> int:
        """Where chunk ``i``'s rows start in its file, once its header was checked against
        the manifest (dtype, C order, shape): a valid header of another layout is an error."""
        key = (name, i)
        if key not in self._offsets:
            path = self.path(name, i)
            info = self.manifest.arrays[name]
            c0, c1 = self.manifest.chunk_range(i)
            want = (np.dtype(info.dtype), False, (c1 - c0, *info.row_shape))
            try:
                if self.local:
                    with open(path, "rb") as f:
                        self._offsets[key] = _header_len(f, path, want, f"chunk {i} of {name!r}")
                else:
                    with self.fs.open(path, "rb", block_size=0) as f:
                        self._offsets[key] = _header_len(f, path, want, f"chunk {i} of {name!r}")
            except FileNotFoundError as exc:
                raise ChunkReadError(f"chunk {i} of array {name!r} is missing: {path}") from exc
            except OSError as exc:  # EIO: a damaged disk or SquashFS image
                raise ChunkReadError(
                    f"chunk {i} of array {name!r} could not be read: {path}: {exc}"
                ) from exc
        return self._offsets[key]

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        info = self.manifest.arrays[name]
        out = np.empty((max(0, stop - start), *info.row_shape), dtype=np.dtype(info.dtype))
        self.read_into(name, start, stop, out)
        return out

    def read_into(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)`` straight into ``out`` (C-contiguous): one copy, from the file."""
        if stop <= start:
            return
        dtype = out.dtype
        row_bytes = int(np.prod(out.shape[1:], dtype=np.int64)) * dtype.itemsize
        dst_bytes = out.reshape(-1).view(np.uint8).data  # = memoryview(...), typed on 3.11
        first = int(np.searchsorted(self.bounds, start, side="right") - 1)
        pos, i = start, first
        while pos < stop:
            c0, c1 = int(self.bounds[i]), int(self.bounds[i + 1])
            a, b = pos - c0, min(stop, c1) - c0
            off = self._data_offset(name, i) + a * row_bytes
            whole = self.verify_chunk(name, i)
            nbytes = (b - a) * row_bytes
            path = self.path(name, i)
            dst = dst_bytes[(pos - start) * row_bytes : (pos - start) * row_bytes + nbytes]
            try:
                if self.local:
                    with open(path, "rb", buffering=0) as f:
                        f.seek(off)
                        got = readinto_full(f, dst)
                else:
                    from shardload.move.remote import read_bytes

                    raw = (
                        whole[off : off + nbytes]
                        if whole is not None
                        else read_bytes(
                            self.fs, path, off, off + nbytes, what=f"chunk {i} of array {name!r}"
                        )
                    )
                    got = len(raw)
                    dst[:got] = raw[:nbytes]
            except (OSError, ValueError) as exc:
                raise ChunkReadError(
                    f"chunk {i} of array {name!r} could not be read: {path}: {exc}"
                ) from exc
            if got != nbytes:
                raise ChunkReadError(
                    f"chunk {i} of array {name!r} is truncated or corrupt: {path} "
                    f"(expected {nbytes} bytes at offset {off}, got {got})"
                )
            pos += b - a
            i += 1

    def raw_chunk(self, name: str, i: int) -> RawChunk | None:
        """Chunk ``i`` of ``name`` as raw rows in a local file (local stores only)."""
        if not self.local:
            return None
        info = self.manifest.arrays[name]
        row_bytes = int(np.prod(info.row_shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize
        offset = self._data_offset(name, i)
        self.verify_chunk(name, i)  # before the caller's reads scatter its rows anywhere
        return RawChunk(self.path(name, i), offset, row_bytes)

    def mmap_chunk(self, name: str, i: int) -> np.ndarray:
        """A read-only memory map of one chunk (local stores only), header and checksum
        checked first."""
        offset = self._data_offset(name, i)
        self.verify_chunk(name, i)
        info = self.manifest.arrays[name]
        c0, c1 = self.manifest.chunk_range(i)
        path = self.path(name, i)
        try:
            return np.memmap(
                path,
                dtype=np.dtype(info.dtype),
                mode="r",
                offset=offset,
                shape=(c1 - c0, *info.row_shape),
            )
        except FileNotFoundError as exc:
            raise ChunkReadError(f"chunk {i} of array {name!r} is missing: {path}") from exc
        except (OSError, ValueError) as exc:  # e.g. shorter than its header says
            raise ChunkReadError(
                f"chunk {i} of array {name!r} is truncated or corrupt: {path}: {exc}"
            ) from exc

    def checksum_units(self, name: str) -> int:
        """Checksum units of array ``name``: its chunk files."""
        return self.manifest.num_chunks

    def check_unit(self, name: str, k: int) -> None:
        """Check chunk file ``k`` whole (header against the manifest, then the checksum, or,
        in a store without checksums, that all its rows read)."""
        self._data_offset(name, k)
        if self.verifier.enabled:
            self.verify_chunk(name, k)
        else:
            self.read(name, *self.manifest.chunk_range(k))

    def close(self) -> None:
        self._offsets.clear()


def _header_len(
    f: Any, path: str, want: tuple[np.dtype, bool, tuple[int, ...]] | None = None, what: str = ""
) -> int:
    """Bytes before the data of an npy file (magic, header length, header); parses the header
    (validating it) from memory, after all reads are done, and compares its ``(dtype,
    fortran_order, shape)`` with ``want``."""
    try:
        prefix = f.read(8)  # magic string + version
        version = np.lib.format.read_magic(io.BytesIO(prefix))
        size_field = f.read(2 if version == (1, 0) else 4)
        header = f.read(int.from_bytes(size_field, "little"))
        shape, fortran, dtype, _ = parse_npy(prefix + size_field + header)  # no ast: threads
    except ValueError as exc:
        raise ChunkReadError(f"not a valid .npy chunk file: {path}: {exc}") from exc
    if want is not None and (np.dtype(dtype), bool(fortran), tuple(shape)) != want:
        raise ChunkReadError(
            f"{what} does not match the manifest: {path} holds dtype {np.dtype(dtype)}, shape "
            f"{tuple(shape)}, {'Fortran' if fortran else 'C'} order; the store says "
            f"{want[0]}, {want[2]}, C order"
        )
    return len(prefix) + len(size_field) + len(header)


class NpyRagged:
    """The ragged arrays of an npy stack: ``NAME/values/CCCCCC.npy``, the values of sample
    chunk ``C``, and ``NAME/offsets.npy`` (:class:`shardload.formats.ragged.read.RaggedSource`)."""

    def __init__(self, fs: Any, root: str, manifest: Manifest) -> None:
        self.fs, self.root, self.manifest = fs, root.rstrip("/"), manifest

    def _where(self, name: str) -> str:
        return f"{self.root}/{self.manifest.arrays[name].path}"

    def offsets_path(self, name: str) -> str:
        return f"{self._where(name)}/offsets.npy"

    def values_path(self, name: str, c: int) -> str:
        return f"{self._where(name)}/values/{CHUNK_NAME.format(c)}"

    def read_offsets(self, name: str, n: int, *, what: str) -> np.ndarray:
        path = self.offsets_path(name)
        return read_npy_file(self.fs, path, what, shape=(n,), dtype=np.dtype(np.int64))

    def read_values(
        self, name: str, c: int, v0: int, v1: int, *, dtype: np.dtype, what: str
    ) -> np.ndarray:
        return read_npy_file(
            self.fs, self.values_path(name, c), what, shape=(v1 - v0,), dtype=dtype
        )

    def close(self) -> None:
        pass


def open_ragged(fs: Any, root: str, manifest: Manifest) -> NpyRagged:
    return NpyRagged(fs, root, manifest)
