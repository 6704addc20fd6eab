"""The HTTP(S) client options of a store read by ``http://`` or ``https://`` URL.

Built in every process that opens the URL (so DataLoader workers read the same environment):

- the connect and read-stall timeouts (``timeout_s``) unless ``client_kwargs`` has its own;
- a bearer token for ``shardload serve --token``: ``storage_options={"headers":
  {"Authorization": "Bearer TOKEN"}}`` as fsspec takes it, or the environment variable
  ``SHARDLOAD_TOKEN`` (used when the options carry no ``Authorization`` header);
- a certificate authority to trust for HTTPS (a self-signed server certificate):
  ``storage_options={"ca_file": "cert.pem"}`` or ``SHARDLOAD_CA_FILE`` (trusted beside the
  system's authorities). A file name rather than an ``ssl.SSLContext`` keeps the options
  picklable for DataLoader workers started with spawn; an ``ssl`` option given directly (a
  context, as aiohttp takes it) is passed on untouched;
- a bounded pool of connections: each opened store has its own client session (a private
  filesystem), which keeps at most :data:`CONNECTIONS_PER_STORE` connections to the server and
  closes one left idle for :data:`IDLE_KEEPALIVE_S` (aiohttp's defaults: 100 and 15 s). Many
  stores opened by one process (every rank's, every epoch's) would otherwise hold hundreds of
  idle keep-alive connections and meet the server's connection limit (``shardload serve``:
  503 beyond 512 open).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from shardload.errors import ConfigError

if TYPE_CHECKING:
    import ssl

#: the bearer token sent to http(s) URLs when the options carry no Authorization header
TOKEN_ENV = "SHARDLOAD_TOKEN"
#: a PEM file of certificate authorities to trust for https URLs
CA_FILE_ENV = "SHARDLOAD_CA_FILE"
#: shardload's own storage option (not fsspec's): the PEM file of ``CA_FILE_ENV``
CA_FILE_OPTION = "ca_file"
#: connections to the server at most per opened store: the reader's requests in flight
#: (``move.remote.URL_IN_FLIGHT``) and the files' size queries of a staging copy
CONNECTIONS_PER_STORE = 32
#: a pooled connection idle this long closes (the server's own idle timeout is 30 s)
IDLE_KEEPALIVE_S = 5.0


def is_http(url: str) -> bool:
    return url.split("://", 1)[0].lower() in ("http", "https")


def http_options(options: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """fsspec's HTTP filesystem options from ``options`` (see the module docstring)."""
    import aiohttp

    opts = dict(options)
    client = dict(opts.pop("client_kwargs", {}) or {})
    client.setdefault("timeout", aiohttp.ClientTimeout(sock_connect=timeout_s, sock_read=timeout_s))
    opts["client_kwargs"] = client
    headers = dict(opts.get("headers") or {})
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token and not any(k.lower() == "authorization" for k in headers):
        headers["Authorization"] = f"Bearer {token}"
        opts["headers"] = headers
    opts.setdefault("get_client", bounded_client)
    ca_file = opts.pop(CA_FILE_OPTION, None) or os.environ.get(CA_FILE_ENV, "").strip() or None
    if ca_file is not None and "ssl" not in opts:
        opts["ssl"] = _trusting(os.fspath(ca_file))
    return opts


async def bounded_client(**kwargs: Any) -> Any:
    """fsspec's HTTP client session (its ``get_client`` option) on a bounded connection pool
    (see the module docstring); a module function, so the options still pickle."""
    import aiohttp

    if "connector" not in kwargs:
        kwargs["connector"] = aiohttp.TCPConnector(
            limit=CONNECTIONS_PER_STORE, keepalive_timeout=IDLE_KEEPALIVE_S
        )
    return aiohttp.ClientSession(**kwargs)


def _trusting(ca_file: str) -> ssl.SSLContext:
    """A verifying client context trusting the system's authorities and ``ca_file``."""
    import ssl  # only here: a process reading a warm node cache makes no connection

    ctx = ssl.create_default_context()
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{CA_FILE_OPTION} / {CA_FILE_ENV} {ca_file}: cannot load certificates from it: {exc}"
        ) from exc
    return ctx


def close_client(fs: Any) -> None:
    """Close the client session of fsspec's HTTP filesystem ``fs`` (its pooled connections)
    now rather than when ``fs`` is garbage-collected, which for an object in a reference cycle
    waits for a full collection: a process opening stores by URL again and again (a notebook,
    every epoch's ``iter_batches(url)``) held a dozen sockets per closed store until then."""
    reader = getattr(fs, "_shardload_reader", None)  # move/http_get.py's connections
    if reader:
        reader.close()
    session = getattr(fs, "_session", None)
    if session is not None and callable(getattr(fs, "close_session", None)):
        fs._session = None
        fs.close_session(fs.loop, session)
