"""``shardload serve`` beyond loopback: bearer tokens, TLS checked by the client, read-only,
per-client limits, refusal of a non-loopback bind without a token, and a bounded hammering."""

from __future__ import annotations

import http.client
import logging
import re
import socket
import ssl
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
import requests

from _stores import make_store, split_rows
from conftest import spawn
from shardload.errors import ConfigError, RemoteError
from shardload.move.serve import serving
from shardload.move.serve_auth import authorized, read_tokens

pytestmark = pytest.mark.timeout(180)
T = 10
TOKEN = "tok-" + "a1b2c3d4" * 4
OTHER = "tok-" + "ffffeeee" * 4


def make_cert(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost (the openssl CLI)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("served")
    make_store(root, fmt="zarr", compression="lz4", n=203, chunk_rows=7, name="era")
    (root / "era.nc").unlink()
    (root.parent / "secret.txt").write_text("TOP-SECRET-7f3a9c")
    return root


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("tls"))


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_request_without_or_with_a_wrong_token_gets_401_and_no_data(served, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    with serving(served, tokens=[TOKEN, OTHER]) as url:
        for headers in (
            {},
            bearer("tok-" + "a1b2c3d4" * 3 + "a1b2c3d5"),  # one character off
            {"Authorization": TOKEN},  # no scheme
            {"Authorization": f"Basic {TOKEN}"},
            bearer(TOKEN + "x"),
        ):
            r = requests.get(url + "era/shardload.json", headers=headers, timeout=T)
            assert r.status_code == 401 and r.content == b"", headers
            assert r.headers["WWW-Authenticate"].startswith("Bearer")
        listing = requests.get(url, timeout=T)
        assert listing.status_code == 401 and b"era" not in listing.content
        assert requests.get(url + "era/shardload.json", headers=bearer(), timeout=T).ok
        assert requests.get(url + "era/shardload.json", headers=bearer(OTHER), timeout=T).ok
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    served_log = [r.getMessage() for r in caplog.records if r.name == "shardload.serve"]
    refused = [m for m in served_log if " 401 " in m]
    assert len(refused) == 6  # one access-log line per refused request, nothing more


def test_token_comparison_unit() -> None:
    tokens = (TOKEN.encode(), OTHER.encode())
    assert authorized(f"Bearer {TOKEN}", tokens) and authorized(f"bearer {OTHER}", tokens)
    assert not authorized("", tokens) and not authorized("Bearer ", tokens)
    assert not authorized(f"Token {TOKEN}", tokens) and not authorized("Bearer ☃", tokens)


def test_tokens_from_options_files_and_the_environment(tmp_path, monkeypatch) -> None:
    f = tmp_path / "tokens"
    f.write_text(f"# the team's tokens\n{TOKEN}\n\n{OTHER}\n")
    monkeypatch.setenv("SHARDLOAD_SERVE_TOKEN", f"{TOKEN},{'e' * 20}")
    assert read_tokens([], [f]) == (TOKEN, OTHER, "e" * 20)
    with pytest.raises(ConfigError, match=r"tokens, line 2: a token of 5 characters"):
        f.write_text("# x\nshort\n")
        read_tokens([], [f])
    with pytest.raises(ConfigError, match=r"--token-file .*nope: cannot read"):
        read_tokens([], [tmp_path / "nope"])


def test_store_loader_and_workers_over_https_with_the_token(served, tls, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    import shardload
    from shardload.torch import StreamingDataset

    cert, key = tls
    local = shardload.open_store(served / "era")
    want = local.read("x", 0, len(local))
    with serving(served, tokens=[TOKEN], tls_cert=cert, tls_key=key) as url:
        assert url.startswith("https://")
        so = {"headers": bearer(), "ca_file": str(cert)}
        store = shardload.open_store(url + "era", storage_options=so)
        np.testing.assert_array_equal(store.read("x", 0, len(store)), want)
        rows = [b["index"] for b in shardload.iter_batches(store, batch_size=16, seed=3)]
        assert sorted(np.concatenate(rows).tolist()) == list(range(len(local)))
        # the environment instead of options: DataLoader workers (forked) read it too
        monkeypatch.setenv("SHARDLOAD_TOKEN", TOKEN)
        monkeypatch.setenv("SHARDLOAD_CA_FILE", str(cert))
        ds = StreamingDataset(url + "era", batch_size=16, split="train", seed=1)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        batches = list(loader)
        for b in batches:
            np.testing.assert_array_equal(b["x"].numpy(), want[b["index"].numpy()])
        got = np.sort(np.concatenate([b["index"].numpy() for b in batches]))
        np.testing.assert_array_equal(got, split_rows(local, "train"))


def test_a_client_that_does_not_trust_the_certificate_fails_clearly(served, tls) -> None:
    import shardload

    cert, key = tls
    with serving(served, tokens=[TOKEN], tls_cert=cert, tls_key=key) as url:
        t = time.monotonic()
        with pytest.raises(RemoteError, match=r"(?s)CERTIFICATE_VERIFY_FAILED.*SHARDLOAD_CA_FILE"):
            shardload.open_store(url + "era", storage_options={"headers": bearer()})
        assert time.monotonic() - t < 5  # not retried: a certificate does not become trusted
        # the same with the standard library, which checks the certificate the same way
        host, port = urlparse(url).hostname, urlparse(url).port
        with pytest.raises(ssl.SSLCertVerificationError):
            conn = http.client.HTTPSConnection(host, port, timeout=T)
            conn.request("GET", "/era/shardload.json", headers=bearer())
        trusting = ssl.create_default_context(cafile=str(cert))
        conn = http.client.HTTPSConnection(host, port, timeout=T, context=trusting)
        conn.request("GET", "/era/shardload.json", headers=bearer())
        assert conn.getresponse().status == 200


def test_a_missing_token_is_a_clear_error_not_a_missing_store(served) -> None:
    import shardload

    with (
        serving(served, tokens=[TOKEN]) as url,
        pytest.raises(RemoteError, match=r"401.*SHARDLOAD_TOKEN") as err,
    ):
        shardload.open_store(url + "era", retries=0)
    assert "not found" not in str(err.value)


def test_only_get_and_head(served) -> None:
    with serving(served, tokens=[TOKEN]) as url:
        for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
            r = requests.request(method, url + "era/shardload.json", headers=bearer(), timeout=T)
            assert r.status_code == 405, method
        assert requests.head(url + "era/shardload.json", headers=bearer(), timeout=T).ok


def test_per_client_connection_limit_gives_429(served) -> None:
    with serving(served, max_client_connections=3) as url:
        host, port = urlparse(url).hostname, urlparse(url).port
        held = [socket.create_connection((host, port), timeout=T) for _ in range(3)]
        try:
            time.sleep(0.2)
            r = requests.get(url + "era/shardload.json", timeout=T)
            assert r.status_code == 429 and r.headers["Retry-After"] == "1"
        finally:
            for s in held:
                s.close()
        time.sleep(0.2)
        assert requests.get(url + "era/shardload.json", timeout=T).ok


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_non_loopback_bind_without_a_token_is_refused(served, host) -> None:
    with (
        pytest.raises(ConfigError, match=r"without a token.*--token-file.*--insecure"),
        serving(served, host=host),
    ):
        pass


def test_cli_refuses_a_non_loopback_bind_without_a_token(served) -> None:
    p = spawn("serve", str(served), "--host", "0.0.0.0", "--port", "0")
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "--insecure" in err and "--token" in err
    assert "Traceback" not in err


def test_cli_serves_https_with_a_token_from_the_environment(served, tls, monkeypatch) -> None:
    cert, key = tls
    monkeypatch.setenv("SHARDLOAD_SERVE_TOKEN", TOKEN)  # not on the command line (ps)
    p = spawn(
        "serve", str(served), "--host", "0.0.0.0", "--port", "0",
        "--tls-cert", str(cert), "--tls-key", str(key),
    )  # fmt: skip
    try:
        line = p.stdout.readline()
        assert "https://" in line and "1 token(s)" in line, line
        port = int(line.split("https://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        url = f"https://127.0.0.1:{port}/era/shardload.json"
        assert requests.get(url, verify=str(cert), timeout=T).status_code == 401
        assert requests.get(url, headers=bearer(), verify=str(cert), timeout=T).ok
    finally:
        p.terminate()
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and TOKEN not in out + err


def send_raw(host: str, port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection, read what comes back until close or 3 s."""
    with socket.create_connection((host, port), timeout=3) as s:
        try:
            s.sendall(data)
        except OSError:
            return b""
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except OSError:
            pass
    return got


def test_hammering_with_bad_tokens_and_malformed_requests(served, caplog) -> None:
    """A few hundred hostile requests: the server stays up, answers 4xx (or closes), serves
    nothing outside its folder nor without the token, and logs no traceback."""
    caplog.set_level(logging.DEBUG)
    secret = b"TOP-SECRET-7f3a9c"
    meta = (served / "era" / "shardload.json").read_bytes()
    bad = [
        b"GARBAGE\r\n\r\n",
        b"\x00\x01\x02\xff\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"GET /era/shardload.json HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n",
        b"GET /era/shardload.json HTTP/1.1\r\nHost: x\r\n" + b"X-A: b\r\n" * 500 + b"\r\n",
        b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /../secret.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer " + TOKEN.encode()
        + b"\r\n\r\n",
        b"GET /era/%2e%2e/%2e%2e/secret.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer "
        + TOKEN.encode() + b"\r\n\r\n",
        b"GET /era/..%2f..%2fsecret.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer "
        + TOKEN.encode() + b"\r\n\r\n",
        b"GET /era/shardload.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer\r\n\r\n",
        b"GET /era/shardload.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + b"Authorization: Bearer " + b"\xff" * 40 + b"\r\n\r\n",
        b"POST /era/shardload.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
    ]  # fmt: skip
    ranges = ["bytes=5-1", "bytes=-0", "bytes=0-1,4-5", "bytes=x-y", "items=0-5", "bytes=99999-"]
    with serving(served, tokens=[TOKEN], max_client_connections=1000) as url:
        host, port = urlparse(url).hostname, urlparse(url).port
        statuses: list[int] = []
        for n in range(200):  # bad tokens
            r = requests.get(url + "era/shardload.json", headers=bearer(f"{n:032d}"), timeout=T)
            statuses.append(r.status_code)
            assert r.content == b""
        for data in bad * 6:
            got = send_raw(host, port, data)
            assert secret not in got and meta not in got
            assert re.match(rb"HTTP/1\.[01] 4\d\d ", got), (data[:60], got[:80])
            statuses.append(int(got.split(b" ", 2)[1]))
        for spec in ranges * 5:
            h = {**bearer(), "Range": spec}
            r = requests.get(url + "era/shardload.json", headers=h, timeout=T)
            statuses.append(r.status_code)
            if r.status_code == 200:  # a range header the server may ignore: the whole file
                assert r.content == meta
            elif r.status_code == 206:
                assert r.content in meta
        assert all(400 <= s < 500 or s in (200, 206) for s in statuses), sorted(set(statuses))
        assert statuses.count(401) >= 200
        # still up and serving the right bytes
        assert requests.get(url + "era/shardload.json", headers=bearer(), timeout=T).content == meta
    assert len(statuses) > 300
    leaked = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not leaked, [r.getMessage() for r in leaked[:3]]


def test_garbage_on_the_tls_port_logs_no_traceback(served, tls, caplog) -> None:
    """Plain HTTP, random bytes and a half handshake to the HTTPS port: refused, nothing
    served, no traceback logged, and the server still answers a proper client."""
    caplog.set_level(logging.DEBUG)
    cert, key = tls
    with serving(served, tokens=[TOKEN], tls_cert=cert, tls_key=key) as url:
        host, port = urlparse(url).hostname, urlparse(url).port
        meta = (served / "era" / "shardload.json").read_bytes()
        for data in (
            b"GET /era/shardload.json HTTP/1.1\r\nHost: x\r\n\r\n",
            bytes(range(256)) * 4,
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # a cut ClientHello
        ):
            got = send_raw(host, port, data)
            assert meta not in got
        r = requests.get(url + "era/shardload.json", headers=bearer(), verify=str(cert), timeout=T)
        assert r.content == meta
    leaked = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not leaked, [r.getMessage() for r in leaked[:3]]


def test_per_client_limit_by_default_only_beyond_loopback() -> None:
    """On loopback every client is 127.0.0.1: a per-address limit would refuse one process's
    idle keep-alive connections (a test suite opening many stores against one server got 429s
    for 30 s); beyond loopback it is on by default."""
    from shardload.move.serve import make_access
    from shardload.move.serve_auth import MAX_CLIENT_CONNECTIONS

    assert make_access("127.0.0.1").max_client_connections == 0  # none: max_connections only
    assert make_access("0.0.0.0", tokens=[TOKEN]).max_client_connections == MAX_CLIENT_CONNECTIONS
    assert make_access("127.0.0.1", max_client_connections=3).max_client_connections == 3
    with pytest.raises(ConfigError, match="--max-client-connections must be >= 1"):
        make_access("::", tokens=[TOKEN], max_client_connections=0)
