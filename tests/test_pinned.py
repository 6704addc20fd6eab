"""``move/pinned.py``'s versions, without a server: what pins a file and what is a change."""

from __future__ import annotations

import pickle

import pytest

from shardload.errors import ChunkReadError, RemoteChangedError
from shardload.move.pinned import Pins, Version


def test_an_answer_naming_no_version_pins_nothing() -> None:
    """An empty read (no request made) or a server without validators: the file stays
    unpinned, so its checks hold for one read (before: an empty version was pinned for good,
    and a later answer's ETag never was)."""
    pins = Pins()
    pins.settle("f", Version(), "u")
    assert not pins.pinned("f")
    pins.settle("f", Version('"a"', None), "u")
    assert pins.pinned("f") and pins.get("f") == Version('"a"', None)


def test_another_version_is_a_change_naming_the_url() -> None:
    pins = Pins()
    pins.settle("f", Version('"a"', "Sat, 28 Nov 2026 15:00:00 GMT"), "http://h/s/f")
    pins.settle("f", Version('"a"', None), "http://h/s/f")  # a date left out: same ETag
    with pytest.raises(RemoteChangedError, match=r"http://h/s/f changed on the server") as e:
        pins.settle("f", Version('"b"', None), "http://h/s/f")
    assert isinstance(e.value, ChunkReadError)
    dated = Pins()
    dated.settle("g", Version(None, "Sat, 28 Nov 2026 15:00:00 GMT"), "u")
    with pytest.raises(RemoteChangedError):
        dated.settle("g", Version(None, "Sat, 28 Nov 2026 15:00:01 GMT"), "u")


def test_pins_travel_with_a_pickle() -> None:
    pins = Pins()
    pins.settle("f", Version('"a"', None), "u")
    again = pickle.loads(pickle.dumps(pins))
    assert again.get("f") == Version('"a"', None)
    with pytest.raises(RemoteChangedError):
        again.settle("f", Version('"b"', None), "u")


def test_a_pickled_filesystem_keeps_its_pins() -> None:
    """A DataLoader worker started with spawn gets the store's filesystem by pickle: its reads
    stay tied to the versions the main process read (and checked)."""
    from shardload.move.remote import open_fs

    fs, _ = open_fs("http://127.0.0.1:9/store")
    fs.pins.settle("http://127.0.0.1:9/store/x/c/0/0", Version('"a"', None), "u")
    worker = pickle.loads(pickle.dumps(fs))
    assert worker.pinned("http://127.0.0.1:9/store/x/c/0/0")
    assert not worker.pinned("http://127.0.0.1:9/store/x/c/1/0")
