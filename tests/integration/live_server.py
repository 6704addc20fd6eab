"""A ``shardload serve`` subprocess for integration tests: free port, ready line, request log."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import python_env

READY = re.compile(r"serving (.+) at (http://127\.0\.0\.1:\d+/) \((\d+) stores\)")
LOG_LINE = re.compile(r"(GET|HEAD) (\S+) (\d{3}) ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """``python -m shardload serve DIR --host 127.0.0.1 --port P`` in a subprocess.

    ``url`` is the base URL (with a trailing slash); ``requests()`` lists ``(method, path,
    status)`` of every request logged so far (stderr is drained by a thread).
    """

    def __init__(self, root: Path, *, start_timeout_s: float = 30) -> None:
        self.root = root
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "shardload",
                "serve",
                str(root),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=python_env(),
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._lock = threading.Lock()
        ready = threading.Event()

        def drain(stream, sink: list[str], watch: bool) -> None:
            for line in stream:
                with self._lock:
                    sink.append(line)
                if watch and READY.search(line):
                    ready.set()
            ready.set()  # the process ended

        self._threads = [
            threading.Thread(target=drain, args=(self.proc.stdout, self.stdout, True), daemon=True),
            threading.Thread(
                target=drain, args=(self.proc.stderr, self.stderr, False), daemon=True
            ),
        ]
        for t in self._threads:
            t.start()
        if not ready.wait(start_timeout_s) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"the server did not start: {self.stdout} {self.stderr[-20:]}")
        m = READY.search("".join(self.stdout))
        assert m is not None
        self.ready_line = m.group(0)
        self.url = m.group(2)

    def requests(self, prefix: str = "") -> list[tuple[str, str, int]]:
        """Logged requests whose path starts with ``prefix``."""
        time.sleep(0.2)  # the access log line follows the response
        with self._lock:
            lines = list(self.stderr)
        out = []
        for line in lines:
            m = LOG_LINE.search(line)
            if m and m.group(2).startswith(prefix):
                out.append((m.group(1), m.group(2), int(m.group(3))))
        return out

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for t in self._threads:
            t.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
