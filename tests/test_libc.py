"""The C library is found without starting a process (issue 25): ``ctypes.util.find_library``
forks the caller to run ``ldconfig``, once in every DataLoader worker, and a peak-RSS sum over
the loader's processes then counted that fork's copy of the worker as memory."""

from __future__ import annotations

import contextlib
import importlib
import subprocess
import sys

import pytest

from shardload.load import runs, uring
from shardload.util import durable

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux libc")


@pytest.fixture
def popens(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Processes started (``subprocess.Popen`` calls), with every libc lookup cache emptied."""
    started: list[object] = []
    real = subprocess.Popen

    def counting(*args: object, **kwargs: object) -> object:
        started.append(args[0] if args else kwargs.get("args"))
        return real(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "Popen", counting)
    monkeypatch.setattr(runs, "_PREADV", {})
    monkeypatch.setattr(uring, "_SYSCALL", [])
    with contextlib.suppress(ImportError):  # the lookup's own cache
        monkeypatch.setattr(importlib.import_module("shardload.util.libc"), "_LIBC", {})
    return started


def test_preadv_found_without_a_process(popens: list[object]) -> None:
    assert runs._preadv() is not None and runs._preadv(errno=True) is not None
    assert popens == []


def test_uring_and_sync_file_range_found_without_a_process(popens: list[object]) -> None:
    assert uring._syscall() is not None
    assert durable._load_sync_file_range() is not None
    assert popens == []
