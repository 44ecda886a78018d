"""A test run stopped with SIGTERM still ends the processes its tests started (the root
conftest.py turns SIGTERM into an interruption, so its end-of-session sweep runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support import descendants

ROOT = Path(__file__).resolve().parents[2]
# Bounds of the inner run: its start (collection, one import of the conftest) and its end
# after the signal (the sweep, which waits for what it kills).
START_WAIT_S_MAX = 60.0
END_WAIT_S_MAX = 60.0

_INNER_TEST = """
import os, subprocess, sys, time

def test_starts_a_detached_process_and_waits() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    with open(os.environ["PID_FILE"] + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.replace(os.environ["PID_FILE"] + ".tmp", os.environ["PID_FILE"])
    time.sleep(600)
"""


def test_a_run_stopped_by_sigterm_ends_what_its_tests_started(tmp_path: Path) -> None:
    """As a node of a dev cluster runs in a session of its own, the inner test's child
    outlives a pytest that SIGTERM killed outright; it must be gone once pytest exits."""
    (tmp_path / "test_inner.py").write_text(_INNER_TEST)
    pid_file = tmp_path / "child.pid"
    env = dict(os.environ, PID_FILE=str(pid_file))
    inner = [str(tmp_path / "test_inner.py"), "--rootdir", str(tmp_path)]
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.conftest",
            *inner,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    child = 0
    try:
        deadline = time.monotonic() + START_WAIT_S_MAX
        while not pid_file.exists():
            assert run.poll() is None, run.communicate()[0]
            assert time.monotonic() < deadline, "the inner test never started its child"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert descendants.command_line(child), "the child is running"
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=END_WAIT_S_MAX)
        assert descendants.command_line(child) == "", f"left running; pytest said:\n{output}"
        assert "processes left running by tests, ended: 1" in output
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if child and descendants.command_line(child):
            os.kill(child, signal.SIGKILL)
