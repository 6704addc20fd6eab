"""The HTTP server: index, listings, ranges, caching headers, fsspec, security, CLI."""

from __future__ import annotations

import http.client
import logging
import os
import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

import fsspec
import pytest
import requests

from conftest import spawn
from shardload.move.serve import is_loopback, serving
from shardload.move.serve_app import PathRefused, resolve_request_path

T = 10  # seconds; every request is bounded


def raw_get(url: str, target: str, method: str = "GET") -> tuple[int, bytes]:
    """Send ``target`` byte for byte (requests and urllib normalise '..' away)."""
    netloc = urlparse(url).netloc
    conn = http.client.HTTPConnection(netloc, timeout=T)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_index_lists_stores_from_their_manifests(stores: Path) -> None:
    with serving(stores) as url:
        r = requests.get(url, timeout=T)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("application/json")
    by_name = {s["name"]: s for s in r.json()["stores"]}
    assert set(by_name) == {"alpha", "partial", "plainzarr", "zarr2"}
    assert by_name["alpha"] == {
        "name": "alpha",
        "url": "/alpha/",
        "format": "npy",
        "length": 30,
        "complete": True,
    }
    assert by_name["partial"]["complete"] is False
    assert by_name["plainzarr"]["format"] == by_name["zarr2"]["format"] == "zarr"


def test_index_as_html_for_browsers(stores: Path) -> None:
    with serving(stores) as url:
        r = requests.get(url, headers={"Accept": "text/html"}, timeout=T)
        r2 = requests.get(url + "?format=html", timeout=T)
    assert r.headers["Content-Type"].startswith("text/html")
    assert '<a href="/alpha/">' in r.text and r.text == r2.text


def test_broken_manifest_is_reported_not_fatal(stores: Path) -> None:
    (stores / "broken").mkdir()
    (stores / "broken" / "shardload.json").write_text("{not json")
    with serving(stores) as url:
        entry = [s for s in requests.get(url, timeout=T).json()["stores"] if s["name"] == "broken"]
    assert entry[0]["complete"] is False and "error" in entry[0]


def test_whole_file_with_length_etag_last_modified(stores: Path) -> None:
    data = (stores / "alpha" / "x" / "000001.npy").read_bytes()
    with serving(stores) as url:
        r = requests.get(url + "alpha/x/000001.npy", timeout=T)
        head = requests.head(url + "alpha/x/000001.npy", timeout=T)
    assert r.status_code == 200 and r.content == data
    assert int(r.headers["Content-Length"]) == len(data)
    assert r.headers["Accept-Ranges"] == "bytes"
    assert r.headers["ETag"] and r.headers["Last-Modified"]
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["Content-Length"]) == len(data)
    assert head.headers["ETag"] == r.headers["ETag"]


@pytest.mark.parametrize(
    ("spec", "start", "stop"),
    [("bytes=10-19", 10, 20), ("bytes=4000-", 4000, None), ("bytes=-7", -7, None)],
)
def test_byte_ranges(stores: Path, spec: str, start: int, stop: int | None) -> None:
    data = (stores / "alpha" / "x" / "000001.npy").read_bytes()
    want = data[start:stop]
    first = start % len(data)
    with serving(stores) as url:
        r = requests.get(url + "alpha/x/000001.npy", headers={"Range": spec}, timeout=T)
    assert r.status_code == 206
    assert r.content == want
    assert int(r.headers["Content-Length"]) == len(want)
    assert r.headers["Content-Range"] == f"bytes {first}-{first + len(want) - 1}/{len(data)}"


def test_unsatisfiable_range_is_416(stores: Path) -> None:
    size = (stores / "alpha" / "x" / "000000.npy").stat().st_size
    with serving(stores) as url:
        r = requests.get(url + "alpha/x/000000.npy", headers={"Range": "bytes=99999-"}, timeout=T)
        # aiohttp answers multi-range requests with 416 too (only single ranges are supported)
        multi = requests.get(
            url + "alpha/x/000000.npy", headers={"Range": "bytes=0-1,5-6"}, timeout=T
        )
    assert r.status_code == 416
    assert r.headers["Content-Range"] == f"bytes */{size}"
    assert multi.status_code == 416


def test_conditional_requests_give_304(stores: Path) -> None:
    with serving(stores) as url:
        first = requests.get(url + "alpha/shardload.json", timeout=T)
        etag, modified = first.headers["ETag"], first.headers["Last-Modified"]
        by_etag = requests.get(
            url + "alpha/shardload.json", headers={"If-None-Match": etag}, timeout=T
        )
        by_date = requests.get(
            url + "alpha/shardload.json", headers={"If-Modified-Since": modified}, timeout=T
        )
    assert by_etag.status_code == 304 and by_etag.content == b""
    assert by_date.status_code == 304


def test_folder_listing_html_by_default_json_on_request(stores: Path) -> None:
    with serving(stores) as url:
        page = requests.get(url + "alpha/", timeout=T)
        no_slash = requests.get(url + "alpha", timeout=T)
        as_json = requests.get(url + "alpha/?format=json", timeout=T).json()
        by_accept = requests.get(
            url + "alpha/x", headers={"Accept": "application/json"}, timeout=T
        ).json()
    assert page.headers["Content-Type"].startswith("text/html")
    assert re.findall(r'href="([^"]+)"', page.text) == ["/alpha/shardload.json", "/alpha/x/"]
    assert no_slash.text == page.text
    assert as_json["path"] == "alpha/"
    assert [(e["name"], e["type"]) for e in as_json["entries"]] == [
        ("shardload.json", "file"),
        ("x", "directory"),
    ]
    assert [e["size"] for e in by_accept["entries"]] == [4096, 4097, 4098]


def test_fsspec_http_ls_find_cat_info(stores: Path) -> None:
    fs = fsspec.filesystem("http", skip_instance_cache=True)
    with serving(stores) as url:
        listing = fs.ls(url + "alpha/", detail=False)
        found = fs.find(url + "alpha")
        chunk = fs.cat_file(url + "alpha/x/000002.npy", start=100, end=200)
        info = fs.info(url + "alpha/x/000002.npy")
    assert listing == [url + "alpha/shardload.json", url + "alpha/x/"]
    assert found == [url + "alpha/shardload.json"] + [
        url + f"alpha/x/00000{i}.npy" for i in range(3)
    ]
    assert chunk == (stores / "alpha" / "x" / "000002.npy").read_bytes()[100:200]
    assert info["size"] == 4098


@pytest.mark.parametrize(
    "target",
    [
        "/alpha/../../etc/passwd",
        "/alpha/%2e%2e/%2e%2e/etc/passwd",
        "/alpha/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "/..%2f..%2fetc%2fpasswd",
        "/alpha/x/%00",
        "/alpha/..%5c..%5cetc",
        "/alpha/%ff%fe",
    ],
)
def test_traversal_is_refused(stores: Path, target: str) -> None:
    with serving(stores) as url:
        status, body = raw_get(url, target)
    assert status in (403, 404)
    assert b"root:" not in body


def test_absolute_and_odd_targets_stay_inside(stores: Path) -> None:
    with serving(stores) as url:
        assert raw_get(url, "//etc/passwd")[0] == 404
        assert raw_get(url, "/etc/passwd")[0] == 404
        assert raw_get(url, "//alpha//shardload.json")[0] == 200  # empty segments are skipped


def test_symlinks_out_are_refused_and_hidden_inside_are_served(stores: Path, tmp_path) -> None:
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "key").write_text("secret")
    os.symlink(outside, stores / "alpha" / "escape")
    os.symlink(outside / "key", stores / "alpha" / "escape_file")
    os.symlink(stores / "alpha" / "x", stores / "alpha" / "inner")
    with serving(stores) as url:
        assert raw_get(url, "/alpha/escape/key")[0] == 403
        assert raw_get(url, "/alpha/escape_file")[0] == 403
        status, body = raw_get(url, "/alpha/inner/000000.npy")
        listing = requests.get(url + "alpha/?format=json", timeout=T).json()["entries"]
    assert status == 200 and body == (stores / "alpha" / "x" / "000000.npy").read_bytes()
    assert {e["name"] for e in listing} == {"shardload.json", "x", "inner"}


def test_resolve_request_path_unit(stores: Path) -> None:
    root = stores.resolve()
    assert resolve_request_path(root, "/alpha/x/000000.npy?v=1") == root / "alpha/x/000000.npy"
    assert resolve_request_path(root, "/missing") is None
    for bad in ("alpha", "/a/../b", "/%2e", "/a%2fb", "/a%00"):
        with pytest.raises(PathRefused):
            resolve_request_path(root, bad)


def test_read_only(stores: Path) -> None:
    with serving(stores) as url:
        for method in (requests.put, requests.post, requests.delete):
            assert method(url + "alpha/new", data=b"x", timeout=T).status_code == 405
    assert not (stores / "alpha" / "new").exists()


def test_concurrent_range_reads(stores: Path) -> None:
    data = {i: (stores / "alpha" / "x" / f"{i:06d}.npy").read_bytes() for i in range(3)}

    def fetch(k: int) -> bool:
        i, start = k % 3, (k * 37) % 4000
        r = requests.get(
            url + f"alpha/x/{i:06d}.npy",
            headers={"Range": f"bytes={start}-{start + 63}"},
            timeout=T,
        )
        return r.status_code == 206 and r.content == data[i][start : start + 64]

    with serving(stores) as url, ThreadPoolExecutor(16) as pool:
        assert all(pool.map(fetch, range(200)))


def test_requests_are_logged(stores: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="shardload.serve")
    with serving(stores) as url:
        requests.get(url + "alpha/x/000000.npy", headers={"Range": "bytes=0-9"}, timeout=T)
    lines = [r.getMessage() for r in caplog.records if r.name == "shardload.serve"]
    assert any(re.fullmatch(r"GET /alpha/x/000000\.npy 206 10 [\d.]+ms", m) for m in lines)


def test_stops_at_the_end_of_the_block(stores: Path) -> None:
    with serving(stores) as url:
        pass
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=T)


def test_loopback_detection() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("")


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_cli_serve_prints_url_and_stops_cleanly(stores: Path, sig: int) -> None:
    proc = spawn("serve", str(stores), "--port", "0")
    try:
        line = proc.stdout.readline()  # the first line is printed once the port is bound
        m = re.fullmatch(
            r"serving (.+) at (http://127\.0\.0\.1:\d+/) \((\d+) stores\) — .*\n", line
        )
        assert m, line
        assert m.group(1) == str(stores.resolve()) and m.group(3) == "4"
        assert requests.get(m.group(2) + "alpha/shardload.json", timeout=T).status_code == 200
        proc.send_signal(sig)
        assert proc.wait(timeout=T) == 0
        assert "GET /alpha/shardload.json 200" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=T)


def test_cli_help_mentions_everything(capsys) -> None:
    from shardload.cli.app import main

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    for word in (
        "--host",
        "--port",
        "ranges",
        "format=json",
        "SIGTERM",
        "--max-connections",
        "--idle-timeout",
        "--header-timeout",
    ):
        assert word in text


def test_serving_reports_a_port_in_use(stores: Path) -> None:
    with serving(stores) as url:
        port = urlparse(url).port
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="did not start"), serving(stores, port=port):
            pass
        assert time.monotonic() - t0 < T


# -- limits: idle, slow and too many clients; empty suffix ranges --------------------------------
def _closed_within(sock, seconds: float, *, trickle: bool = False) -> float:
    """Seconds until the server closes ``sock`` (fails after ``seconds``). With ``trickle``,
    send one header byte every 0.1 s meanwhile (a slow-loris client)."""

    t0 = time.monotonic()
    sock.settimeout(0.1)
    while time.monotonic() - t0 < seconds:
        if trickle:
            try:
                sock.sendall(b"X")
            except OSError:
                return time.monotonic() - t0
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - t0
        except TimeoutError:
            continue
        except OSError:  # reset by the server
            return time.monotonic() - t0
    pytest.fail(f"the server kept the connection open for {seconds} s")


def _connect(url: str):
    import socket as socketlib

    u = urlparse(url)
    return socketlib.create_connection((u.hostname, u.port), timeout=T)


def test_idle_half_sent_and_slow_connections_are_closed(stores: Path) -> None:
    with serving(stores, header_timeout_s=0.5, idle_timeout_s=1.0) as url:
        idle, half, slow = _connect(url), _connect(url), _connect(url)
        half.sendall(b"GET /alpha/shardload.json HTTP/1.1\r\nHost: x\r\n")  # never ends
        slow.sendall(b"GET /alpha/shardload.json HTTP/1.1\r\nX-Slow: ")
        try:
            assert _closed_within(idle, 5) >= 0.8
            assert _closed_within(half, 5) < 3
            assert _closed_within(slow, 5, trickle=True) < 3
            # a keep-alive connection that finished a request is closed once idle, too
            conn = http.client.HTTPConnection(urlparse(url).netloc, timeout=T)
            conn.request("GET", "/alpha/shardload.json")
            assert conn.getresponse().read()
            assert _closed_within(conn.sock, 5) < 3
            conn.close()
            assert requests.get(url + "alpha/shardload.json", timeout=T).status_code == 200
        finally:
            for s in (idle, half, slow):
                s.close()


def test_too_many_connections_get_503_and_never_block_others(stores: Path) -> None:
    with serving(stores, max_connections=20, idle_timeout_s=1.0) as url:
        held = [_connect(url) for _ in range(60)]  # more idle clients than the limit
        try:
            t0 = time.monotonic()
            r = requests.get(url + "alpha/shardload.json", timeout=T)
            assert r.status_code in (200, 503) and time.monotonic() - t0 < 3
            extra = _connect(url)
            extra.settimeout(T)
            assert extra.recv(100).startswith(b"HTTP/1.1 503")  # at once, not after a timeout
            extra.close()
            time.sleep(1.5)  # the idle ones are closed by now
            assert requests.get(url + "alpha/shardload.json", timeout=T).status_code == 200
        finally:
            for s in held:
                s.close()


def test_empty_suffix_range_is_416(stores: Path) -> None:
    size = (stores / "alpha" / "x" / "000000.npy").stat().st_size
    with serving(stores) as url:
        r = requests.get(url + "alpha/x/000000.npy", headers={"Range": "bytes=-0"}, timeout=T)
        ok = requests.get(url + "alpha/x/000000.npy", headers={"Range": "bytes=-3"}, timeout=T)
    assert r.status_code == 416 and r.headers["Content-Range"] == f"bytes */{size}"
    assert ok.status_code == 206 and len(ok.content) == 3


def test_serve_gives_the_callers_signal_handlers_back(stores: Path) -> None:
    import threading

    from shardload.move.serve import serve

    def mine(signum, frame):  # pragma: no cover - never called
        pass

    before = signal.signal(signal.SIGTERM, mine)
    try:

        def stop_soon(url: str) -> None:
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()

        serve(stores, port=0, ready=stop_soon)  # returns on SIGTERM
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


@pytest.mark.integration
def test_hundreds_of_idle_clients_never_block_a_server_with_few_descriptors(stores: Path) -> None:
    """300 idle connections to a server allowed 256 open files: a new client gets an answer
    at once (503 while they hold their slots), never a hang (the old server made it wait)."""
    import subprocess
    import sys

    from conftest import python_env

    proc = subprocess.Popen(
        [
            "bash",
            "-c",
            f"ulimit -n 256 && exec {sys.executable} -m shardload -q serve {stores} --port 0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(),
    )
    held = []
    try:
        line = proc.stdout.readline()
        url = re.search(r"(http://\S+/)", line).group(1)
        held = [_connect(url) for _ in range(300)]
        t0 = time.monotonic()
        r = requests.get(url + "alpha/shardload.json", timeout=T)
        assert r.status_code in (200, 503) and time.monotonic() - t0 < 3
    finally:
        for s in held:
            s.close()
        proc.terminate()
        _, err = proc.communicate(timeout=T)
    assert "out of system resource" not in err and err.count("refused") <= 2


def _killed_prepare(root: Path) -> Path:
    """What a prepare killed just before its last rename leaves: ``beta.partial`` (whose
    manifest already says complete) with its progress records, and ``beta.partial.lock``."""
    import shutil

    partial = root / "beta.partial"
    shutil.copytree(root / "alpha", partial)
    (partial / "_progress").mkdir()
    (partial / "_progress" / "job.json").write_text('{"fingerprint": "f"}')
    (root / "beta.partial.lock").write_text("pid 123 host h start 0")
    (root / "alpha" / "link.partial").symlink_to(partial, target_is_directory=True)
    return partial


def test_stores_being_written_are_neither_served_nor_listed(stores: Path) -> None:
    import shardload
    from shardload.errors import IncompleteStoreError

    _killed_prepare(stores)
    with serving(stores) as url:
        names = {s["name"] for s in requests.get(url, timeout=T).json()["stores"]}
        assert "beta.partial" not in names and "alpha" in names
        for target in (
            "beta.partial/",
            "beta.partial/shardload.json",
            "beta.partial/_progress/job.json",
            "beta.partial/x/000000.npy",
            "beta.partial.lock",
            "alpha/link.partial/shardload.json",
        ):
            assert requests.get(url + target, timeout=T).status_code == 404, target
        listing = requests.get(url + "alpha/?format=json", timeout=T).json()["entries"]
        assert "link.partial" not in {e["name"] for e in listing}
        assert requests.get(url + "alpha/shardload.json", timeout=T).status_code == 200
        with pytest.raises(IncompleteStoreError, match="incomplete") as err:
            shardload.open_store(url + "beta.partial")
        assert "partial.partial" not in str(err.value)
    with pytest.raises(IncompleteStoreError, match="incomplete") as err:
        shardload.open_store(stores / "beta.partial")
    assert "partial.partial" not in str(err.value) and "beta.partial" in str(err.value)


def test_a_malformed_request_is_one_log_line_not_a_traceback(stores: Path, caplog) -> None:
    import socket

    bad = [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET /\x00 HTTP/1.1\r\n\r\n",
    ]
    caplog.set_level(logging.INFO)
    with serving(stores) as url:
        port = urlparse(url).port
        for payload in bad:
            with socket.create_connection(("127.0.0.1", port), timeout=T) as s:
                s.sendall(payload)
                s.recv(1000)  # the 400 answer
        time.sleep(0.3)
    records = [r for r in caplog.records if "serving" not in r.getMessage()]
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records]
    assert len(records) == len(bad), [r.getMessage() for r in records]
    assert all(" 400 " in r.getMessage() for r in records)
