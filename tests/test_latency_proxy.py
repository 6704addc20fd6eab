"""The latency proxy (``shardload.testing.latency``) moves bytes in large pieces (issue 28): each
direction reads as much as the kernel holds, up to ``PIECE_BYTES`` at once, into pipes by
``os.splice`` (or buffers by ``recv_into``), so the proxy's own work per MiB is a few steps,
not the bound of what a test or benchmark measures through it. Counted, not timed: the
pieces read and the sends against the bytes moved. Before, an event loop read every 64 KiB
apart and copied each piece into a new ``bytes``."""

from __future__ import annotations

import os
import urllib.request
from urllib.parse import urlparse

import numpy as np
import pytest

from shardload.move.serve import serving
from shardload.testing.latency import latency_proxy

pytestmark = pytest.mark.timeout(120)

OLD_PIECE_BYTES = 1 << 16  # what the event loop read at once
BODY_BYTES = 32 << 20
MODES = [pytest.param(True, id="splice"), pytest.param(False, id="recv_into")]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
@pytest.mark.parametrize("splice", MODES)
def test_a_large_answer_moves_in_few_large_pieces(tmp_path, splice) -> None:
    if splice and not hasattr(os, "splice"):
        pytest.skip("no os.splice here")
    body = np.random.default_rng(0).integers(0, 256, BODY_BYTES, dtype=np.uint8).tobytes()
    (tmp_path / "body.bin").write_bytes(body)
    with serving(tmp_path) as base:
        target = urlparse(base)
        fds = open_fds()
        with latency_proxy(target.hostname, target.port, rtt_s=0.02) as (proxy, port):
            proxy.splice = splice
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/body.bin") as r:
                got = r.read()
            request = proxy.bytes_moved - len(got)
        assert open_fds() == fds  # every pipe, buffer and socket of the proxy closed
    assert got == body
    assert proxy.requests == 1 and len(proxy.turns) == 1
    assert 0 < request < 1024  # the request, then the answer: every byte sent once
    # the answer's bytes: fewer pieces than the event loop's 64 KiB reads could carry, a
    # send for every run of them that was due at once
    assert proxy.pieces * OLD_PIECE_BYTES < len(got) + request, proxy.pieces
    assert proxy.sends <= proxy.pieces, (proxy.sends, proxy.pieces)
