"""Every process a command started, found by a tag in its environment, and ended whole.

`logsvc demo` (and the dev cluster, the TN pair) start each node and TN in a session of its
own, so that a signal reaches that process alone. Killing the command, or its process group,
therefore leaves them running: `subprocess.run(..., timeout=...)` kills only its child, and
a timed-out demo test left three nodes and a standby TN running for an hour (session 5).
Every one of them inherits the environment, so a test gives the command a unique
`LOGSVC_TEST_TAG` and, whatever happened (timeout, failure, success), ends every process
whose environment carries that tag, read from /proc/PID/environ (Linux). A process that
replaced its environment wholesale (`env={...}` without the tag) is not found: none of the
product's spawns do that.

`TaggedProcess` is a `subprocess.Popen` with the tag that ends its tree on `end()` or when
its `with` block is left; `run` is `subprocess.run` over it. `tagged_pids` / `end_tagged` are
the sweep itself (the root conftest.py sweeps the session's tag once at the end).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

TAG_VAR = "LOGSVC_TEST_TAG"
# How long the processes of a tag get to disappear after SIGKILL (a loaded box needs a
# moment to tear down a process with many threads); past it `end_tagged` raises.
GONE_WAIT_S_MAX = 30.0


def new_tag() -> str:
    return secrets.token_hex(8)


def tagged_env(tag: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with the tag set."""
    env = dict(os.environ if base is None else base)
    env[TAG_VAR] = tag
    return env


def tagged_pids(tag: str) -> list[int]:
    """Live processes (zombies have an empty environ) whose environment holds the tag,
    this one excepted."""
    needle = f"{TAG_VAR}={tag}".encode()
    own = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == own:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(name))
    return sorted(found)


def command_line(pid: int) -> str:
    """The process's command line ("" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def end_tagged(tag: str, wait_s: float = GONE_WAIT_S_MAX) -> list[int]:
    """SIGKILL every process of the tag (continued first, in case it was stopped) until
    none is left; return the PIDs ended. Raises TimeoutError if some outlive `wait_s`."""
    ended: set[int] = set()
    deadline = time.monotonic() + wait_s
    while pids := tagged_pids(tag):
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes tagged {tag} still running after {wait_s} s: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            ended.add(pid)
        time.sleep(0.05)
    return sorted(ended)


class TaggedProcess:
    """`subprocess.Popen(args, **kwargs)` with a fresh tag in its environment; `end()` (or
    leaving the `with` block) kills it and every process it started, however detached."""

    def __init__(self, args: Sequence[str], **kwargs: Any) -> None:
        self.tag = new_tag()
        kwargs["env"] = tagged_env(self.tag, kwargs.get("env"))
        self.popen: subprocess.Popen[str] = subprocess.Popen(args, **kwargs)

    def end(self) -> list[int]:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        return end_tagged(self.tag)

    def __enter__(self) -> TaggedProcess:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.end()


def run(args: Sequence[str], timeout_s: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, **kwargs)`,
    except that on the way out (the command's end, TimeoutExpired, an interrupt) every
    process the command started is ended too."""
    with TaggedProcess(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    ) as process:
        stdout, stderr = process.popen.communicate(timeout=timeout_s)
        return subprocess.CompletedProcess(args, process.popen.returncode, stdout, stderr)
