"""Who may read from ``shardload serve``: bearer tokens, TLS, per-client request limits, and the
rule that a server reachable from other machines needs a token.

- Tokens come from ``--token``, ``--token-file`` (one a line; blank lines and ``#`` comments
  skipped) and the environment variable ``SHARDLOAD_SERVE_TOKEN`` (one token, or several
  separated by commas or white space), so a token need not appear in ``ps``. A request must
  carry ``Authorization: Bearer TOKEN`` for one of them; the comparison runs over every token
  with :func:`hmac.compare_digest`, so its time says nothing about how much of a token matched
  or which one did. Anything else gets ``401`` with ``WWW-Authenticate: Bearer``, an empty
  body and one access-log line.
- TLS: ``--tls-cert`` / ``--tls-key`` (PEM) turn the server into HTTPS (TLS 1.2 at least).
- Per client address, at most ``max_client_connections`` connections are open at once (HTTP/1.1
  answers one request at a time per connection, so this bounds its requests in flight); the
  next ones get ``429`` with ``Retry-After: 1`` and are closed (shardload's client retries 429
  with backoff). Enforced by :class:`shardload.move.serve_limits.GuardedProtocol`. By default
  only beyond loopback: on loopback every client has the same address.
- :func:`check_bind`: an address other than loopback without a token is refused unless
  ``insecure`` says the caller means it.
"""

from __future__ import annotations

import hmac
import os
import re
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardload.errors import ConfigError, require

#: the server's tokens from the environment (one, or several separated by commas / spaces)
TOKEN_ENV = "SHARDLOAD_SERVE_TOKEN"
#: connections open at once from one client address (half of the default max_connections:
#: an fsspec HTTP client alone opens up to 100); more get 429
MAX_CLIENT_CONNECTIONS = 256
#: a token must be at least this long (``python -c "import secrets; print(secrets.token_urlsafe(32))"``)
MIN_TOKEN_CHARS = 16
_TOKEN = re.compile(r"^[!-~]+$")  # visible ASCII: what an HTTP header carries unchanged


@dataclass(frozen=True)
class Access:
    """Who may read: the accepted tokens (none: anyone), the TLS context (None: plain HTTP)
    and the per-client limit of open connections."""

    tokens: tuple[bytes, ...] = ()
    ssl_context: ssl.SSLContext | None = None
    max_client_connections: int = MAX_CLIENT_CONNECTIONS  # 0: no per-client limit

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_context is not None else "http"


def read_tokens(
    tokens: Iterable[str] = (),
    token_files: Iterable[str | os.PathLike] = (),
    *,
    env: bool = True,
) -> tuple[str, ...]:
    """Every token given: ``tokens``, the lines of ``token_files`` and (``env``) the
    environment variable ``SHARDLOAD_SERVE_TOKEN``; each checked (visible ASCII, at least
    ``MIN_TOKEN_CHARS`` characters), duplicates dropped.

    Raises
    ------
    ConfigError
        Naming the file (and line) or option of a bad token, or a token file that cannot be read.
    """
    found: list[tuple[str, str]] = [(t, "--token") for t in tokens]
    for path in token_files:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"--token-file {path}: cannot read it: {exc}") from exc
        for n, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if line and not line.startswith("#"):
                found.append((line, f"--token-file {path}, line {n}"))
    raw = os.environ.get(TOKEN_ENV, "") if env else ""
    found += [(t, TOKEN_ENV) for t in re.split(r"[,\s]+", raw) if t]
    for token, where in found:
        if not _TOKEN.match(token):
            raise ConfigError(f"{where}: a token is visible ASCII without spaces")
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"{where}: a token of {len(token)} characters is too easy to guess (at least "
                f'{MIN_TOKEN_CHARS}; make one with python -c "import secrets; '
                'print(secrets.token_urlsafe(32))")'
            )
    return tuple(dict.fromkeys(t for t, _ in found))


def tls_context(
    cert: str | os.PathLike | None, key: str | os.PathLike | None
) -> ssl.SSLContext | None:
    """The server's TLS context from PEM files, or None when neither is given."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("--tls-cert and --tls-key go together: give both PEM files, or neither")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(os.fspath(cert), os.fspath(key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"--tls-cert {cert} / --tls-key {key}: cannot load the certificate and key: {exc}"
        ) from exc
    return ctx


def check_bind(host: str, tokens: Sequence[Any], *, insecure: bool, loopback: bool) -> None:
    """Refuse to serve a non-loopback ``host`` without a token, unless ``insecure``."""
    if loopback or tokens or insecure:
        return
    raise ConfigError(
        f"refusing to serve on {host!r} without a token: anyone reaching this address could "
        f"read every file. Give --token-file FILE (or {TOKEN_ENV}, or --token) and clients the "
        "same token (SHARDLOAD_TOKEN), add --tls-cert/--tls-key for HTTPS, or pass --insecure "
        "to serve without one (in Python: serve(..., tokens=[...]) or insecure=True)"
    )


def authorized(header: str, tokens: tuple[bytes, ...]) -> bool:
    """True when ``header`` (an ``Authorization`` value) is ``Bearer`` + one of ``tokens``;
    every token is compared, each in constant time."""
    scheme, _, given = header.partition(" ")
    candidate = given.strip().encode("utf-8", "replace")
    ok = False
    for token in tokens:
        ok |= hmac.compare_digest(candidate, token)
    return ok and scheme.lower() == "bearer"


def make_middleware(access: Access) -> Any:
    """The aiohttp middleware of ``access``: a request without one of its tokens gets 401."""
    web = require("aiohttp.web", "serve")

    @web.middleware
    async def guard(request: Any, handler: Any) -> Any:
        if access.tokens and not authorized(
            request.headers.get("Authorization", ""), access.tokens
        ):
            return web.Response(
                status=401, headers={"WWW-Authenticate": 'Bearer realm="shardload"'}
            )
        return await handler(request)

    return guard
