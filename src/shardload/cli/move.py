"""``shardload serve`` and ``shardload stage``: move stores between machines and onto fast disks."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path

from shardload.move.serve import HEADER_TIMEOUT_S, IDLE_TIMEOUT_S, MAX_CONNECTIONS
from shardload.move.serve_auth import MAX_CLIENT_CONNECTIONS, TOKEN_ENV

SERVE_HELP = """\
Serve every store under DIR read-only over HTTP: the store at DIR/NAME is
http://HOST:PORT/NAME/ and its files are http://HOST:PORT/NAME/path/inside.

  GET /               JSON index of the stores (name, format, length, complete);
                      HTML for browsers (Accept: text/html) or with ?format=html
  GET /NAME/          listing of a folder: HTML links by default (what fsspec's
                      HTTPFileSystem.ls/find read), JSON with ?format=json or
                      Accept: application/json
  GET/HEAD files      byte ranges (206/416), ETag, Last-Modified, conditional
                      requests

Paths leaving DIR ('..', encoded slashes, NUL, symlinks pointing outside) are
refused; only GET and HEAD are answered (405 otherwise). Each request is logged
(logger 'shardload.move.serve'; -q hides them). Binds to 127.0.0.1 unless --host
says otherwise. Runs in the foreground; Ctrl-C or SIGTERM stops it (exit 0).

Beyond loopback: with a token (--token-file, $SHARDLOAD_SERVE_TOKEN or --token)
every request must carry 'Authorization: Bearer TOKEN' (401 otherwise); clients
set SHARDLOAD_TOKEN. --tls-cert/--tls-key serve HTTPS. A --host other than
loopback without a token is refused unless --insecure. At most
--max-client-connections requests are answered at once per client address (429
beyond; shardload's client retries them).

examples:
  shardload serve ~/.shardload/data/processed --port 8000
  python -c "import shardload; print(len(shardload.open_store('http://127.0.0.1:8000/era5')))"
  SHARDLOAD_SERVE_TOKEN=$(cat ~/.serve-token) shardload serve /data/stores \
      --host 0.0.0.0 --port 8443 --tls-cert cert.pem --tls-key key.pem
"""

STAGE_HELP = """\
Copy a store onto node-local fast storage (e.g. /dev/shm or $TMPDIR) before
training. SRC is a store folder, a URL (http://..., s3://..., anything fsspec
opens) or a .tar/.tar.gz/.tgz archive of a store. The copy is made once per
node even when every rank asks at once (the others wait and reuse it), is
written under a temporary name and renamed when complete, and is checked
(shardload.json present with complete: true when the store has one). Free space
is checked first.

Without --keep and without --run, the copy is held until Ctrl-C/SIGTERM and
then removed. With --run COMMAND, COMMAND runs with the staged path in
$SHARDLOAD_STAGED (a '{}' word in COMMAND is replaced by it), the copy is removed
after it unless --keep, and COMMAND's exit status is returned. With --keep and
no --run, the copy stays and the command returns at once.

examples:
  shardload stage http://host:8000/era5 --to /dev/shm --keep
  shardload stage era5.tar.gz --to /dev/shm --run "python train.py --data {}"
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``serve`` and ``stage`` subcommands."""
    p = subparsers.add_parser(
        "serve",
        help="serve a folder of stores over HTTP (read-only)",
        description=SERVE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("dir", metavar="DIR", type=Path, help="folder holding one store per sub-folder")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; anything else is reachable by other machines)",
    )
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free)")
    p.add_argument(
        "--max-connections",
        type=int,
        default=MAX_CONNECTIONS,
        metavar="N",
        help=f"open connections at most; more get 503 (default {MAX_CONNECTIONS})",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=IDLE_TIMEOUT_S,
        metavar="S",
        help=f"close a connection with no request for S seconds (default {IDLE_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=HEADER_TIMEOUT_S,
        metavar="S",
        help=f"close a connection whose request header takes longer (default {HEADER_TIMEOUT_S:g})",
    )
    _add_access_arguments(p)
    p.set_defaults(func=run_serve)

    p = subparsers.add_parser(
        "stage",
        help="copy a store (folder, URL or .tar[.gz]) to node-local storage such as /dev/shm",
        description=STAGE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC", help="store folder, URL, or .tar/.tar.gz/.tgz archive")
    p.add_argument(
        "--to", required=True, type=Path, metavar="DIR", help="target folder, e.g. /dev/shm"
    )
    p.add_argument("--keep", action="store_true", help="leave the copy in place afterwards")
    p.add_argument(
        "--run",
        metavar="COMMAND",
        help="run COMMAND (one quoted string) with the staged copy, then remove the copy",
    )
    p.set_defaults(func=run_stage)


def _add_access_arguments(p: argparse.ArgumentParser) -> None:
    """``serve``'s options beyond loopback: tokens, TLS, --insecure, the per-client limit."""
    p.add_argument(
        "--token",
        action="append",
        default=[],
        metavar="TOKEN",
        help=f"accept 'Authorization: Bearer TOKEN' (repeatable; shows in ps: prefer "
        f"--token-file or ${TOKEN_ENV}, which are read too)",
    )
    p.add_argument(
        "--token-file",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="accept each token in FILE (one a line, '#' comments; repeatable)",
    )
    p.add_argument("--tls-cert", type=Path, metavar="PEM", help="serve HTTPS with this certificate")
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="the certificate's private key")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow a --host other than loopback without a token (anyone reaching it reads all)",
    )
    p.add_argument(
        "--max-client-connections",
        type=int,
        default=None,
        metavar="N",
        help=f"connections open at once per client address; more get 429 (default "
        f"{MAX_CLIENT_CONNECTIONS} beyond loopback, none on loopback)",
    )


def run_serve(args: argparse.Namespace) -> int:
    from shardload.move.serve import serve
    from shardload.move.serve_auth import read_tokens
    from shardload.move.serve_index import list_stores

    root = args.dir.expanduser().resolve()
    if not root.is_dir():
        print(f"shardload serve: error: {args.dir} is not a folder", file=sys.stderr)
        return 2
    tokens = read_tokens(args.token, args.token_file)
    num_stores = len(list_stores(root))

    def ready(url: str) -> None:
        auth = f", {len(tokens)} token(s)" if tokens else ""
        print(f"serving {root} at {url} ({num_stores} stores{auth}) — Ctrl-C to stop", flush=True)

    serve(
        root,
        host=args.host,
        port=args.port,
        ready=ready,
        max_connections=args.max_connections,
        idle_timeout_s=args.idle_timeout,
        header_timeout_s=args.header_timeout,
        tokens=tokens,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        insecure=args.insecure,
        max_client_connections=args.max_client_connections,
    )
    print("stopped", flush=True)
    return 0


def run_stage(args: argparse.Namespace) -> int:
    from shardload.move.staging import exit_on_sigterm, staged

    exit_on_sigterm()  # SIGTERM while copying or running: unwind, so the copy is removed
    command = shlex.split(args.run) if args.run else []
    with staged(args.src, args.to, keep=args.keep) as path:
        print(f"staged {args.src} at {path}", flush=True)
        if command:
            env = {**os.environ, "SHARDLOAD_STAGED": str(path)}
            return subprocess.call([str(path) if c == "{}" else c for c in command], env=env)
        if args.keep:
            return 0
        print("holding the copy — Ctrl-C or SIGTERM to remove it", flush=True)
        _wait_for_signal()
    return 0


def _wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM (both end the wait normally, so the copy is removed)."""
    done = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda *_: done.set())
    try:
        while not done.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
