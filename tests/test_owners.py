"""``util.owners.PerOwner``: the by-URL reader's per-reader state (kept chunks, shards asked
for ahead): one per owner, gone with it, and a forked child's its own."""

from __future__ import annotations

import gc
import os

import pytest

from shardload.formats.zarr.ahead import ahead_for
from shardload.formats.zarr.kept import kept_for
from shardload.util.owners import PerOwner


class Owner:
    pass


def test_one_object_per_owner_made_once() -> None:
    made: list[object] = []
    reg = PerOwner(lambda: made.append(object()) or made[-1])
    a, b = Owner(), Owner()
    assert reg.get(a) is reg.get(a) and reg.get(b) is not reg.get(a)
    assert len(made) == 2


def test_an_owners_object_goes_with_it() -> None:
    reg: PerOwner[list[int]] = PerOwner(list)
    owner = Owner()
    reg.get(owner)
    del owner
    gc.collect()
    assert len(reg._by) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("lookup", [kept_for, ahead_for], ids=["kept", "ahead"])
def test_a_forked_child_has_its_own(lookup) -> None:  # type: ignore[no-untyped-def]
    """A DataLoader worker forked from a process that read by URL never holds its parent's
    kept bytes or futures: the same owner gives the child a new object."""
    owner = Owner()
    parent = lookup(owner)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: 0 if it got a fresh one, made once
        try:
            fresh = lookup(owner)
            ok = fresh is not parent and lookup(owner) is fresh
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    assert got == b"1"
    assert lookup(owner) is parent
