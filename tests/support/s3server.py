"""A real S3-protocol server for tests: moto in server mode, as a subprocess on loopback.

Why moto (issue 14): the S3 store must be tested against a server that speaks the protocol
(signing, XML errors, ranges, multipart uploads), not a stub; moto's server is on PyPI and
MinIO is not. It runs as a child process on 127.0.0.1 on a free port, so a test can kill it
mid-request and restart it.

What moto is and is not: it keeps every bucket and object in the server process's memory, so
a restart starts empty (buckets included); a test of a restart checks that the store works
again against the new server, not that objects survived. It does not check signatures, so any
credentials work.

Bounds: `start` waits at most `READY_TIMEOUT_S` for the server to answer; `stop` sends
SIGTERM and waits `STOP_TIMEOUT_S`, then SIGKILL, always by the child's own PID (never by
name: other engineers' processes share the machine). Talking to the server here (readiness,
bucket creation) uses plain HTTP from the standard library: pyarrow's S3 client is imported
by engine/objects/s3.py only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
POLL_INTERVAL_S = 0.05
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class MotoServer:
    """One moto server process. `start()` before use; `stop()` (or the context manager)
    after. `restart()` starts a fresh process on the same port."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port if port is not None else free_port()
        self._process: subprocess.Popen[bytes] | None = None
        # The server's output, for error messages; closed by `close` / the context manager.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    def start(self) -> None:
        assert self._process is None, "already started"
        self._process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C of the test run does not reach it twice
        )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"moto server exited at start: {self.log_tail()}")
            if self._answers():
                return
            time.sleep(POLL_INTERVAL_S)
        self.kill()
        raise RuntimeError(f"moto server not ready within {READY_TIMEOUT_S} s: {self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; by PID."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(STOP_TIMEOUT_S)

    def kill(self) -> None:
        """SIGKILL now (a crash mid-request), by PID, and reap it."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGKILL)
        process.wait(STOP_TIMEOUT_S)

    def restart(self) -> None:
        self.stop()
        self.start()

    def create_bucket(self, bucket: str) -> None:
        request = urllib.request.Request(f"http://{self.endpoint}/{bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.status == 200, answer.status

    def reset(self) -> None:
        """Drop every bucket and object (moto's own reset endpoint)."""
        request = urllib.request.Request(f"http://{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.status == 200, answer.status

    def log_tail(self, size_bytes: int = 2000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-size_bytes:]

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/moto-api/", timeout=1) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def __enter__(self) -> MotoServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()


@contextlib.contextmanager
def moto_server() -> Iterator[MotoServer]:
    """A started server, stopped (by PID) at the end whatever happens."""
    server = MotoServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()
        server._log.close()
