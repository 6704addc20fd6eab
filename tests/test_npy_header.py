"""npy headers and npz files read without ``ast`` (util/npy_header.py): the same arrays as
numpy's own reader, and clear errors for what is not one."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from shardload.util.npy_header import load_npz, parse_npy

ARRAYS = {
    "f4": np.arange(12, dtype="<f4").reshape(3, 4),
    "u8": np.array([1, 2**63], dtype="<u8"),
    "scalar": np.array(7, dtype="<i8"),
    "empty": np.zeros((0, 5), dtype=">f8"),
    "fortran": np.asfortranarray(np.arange(6, dtype="<i2").reshape(2, 3)),
    "text": np.array(["a", "bcd"]),
    "bytes": np.frombuffer(b"abc\0de", dtype=np.uint8),
    "one": np.zeros((1,), dtype="bool"),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_parse_npy_equals_numpy(name):
    a = ARRAYS[name]
    buf = io.BytesIO()
    np.save(buf, a)
    shape, fortran, dtype, offset = parse_npy(buf.getvalue())
    assert (shape, dtype) == (a.shape, a.dtype) and fortran == (
        a.flags.f_contiguous and not a.flags.c_contiguous
    )
    assert offset % 64 == 0


def test_version_2_header_and_a_long_header():
    a = np.zeros(3, dtype=[(f"f{i}", "<f4") for i in range(2)])  # structured: numpy's parse
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a, version=(2, 0))
    shape, _, dtype, _ = parse_npy(buf.getvalue())
    assert shape == (3,) and dtype == a.dtype


def test_load_npz_equals_np_load():
    for save in (np.savez, np.savez_compressed):
        buf = io.BytesIO()
        save(buf, **ARRAYS)
        got = load_npz(buf.getvalue())
        with np.load(io.BytesIO(buf.getvalue())) as want:
            assert sorted(got) == sorted(want.files)
            for k in want.files:
                assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
                np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize(
    "data", [b"not a zip", b"\x93NUMPY\x01\x00\xff\xff{", b"PK\x03\x04garbage"]
)
def test_not_npy_or_npz_is_a_value_error(data):
    with pytest.raises(ValueError):
        parse_npy(data) if data.startswith(b"\x93") else load_npz(data)


def test_objects_are_refused():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        inner = io.BytesIO()
        np.save(inner, np.array([{}], dtype=object), allow_pickle=True)
        z.writestr("o.npy", inner.getvalue())
    with pytest.raises(ValueError, match="objects"):
        load_npz(buf.getvalue())
