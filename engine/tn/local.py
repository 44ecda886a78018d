"""A local TN pair as real processes (`python -m engine serve`), for the demo, the
distributed benchmark and the end-to-end tests: two TN configs on one logsvc shard (each
the other's peer, one object directory shared), a compute node config naming both, and a
handle per process that stops it by PID.

Nothing here decides anything about the TN; it only writes configs, starts processes and
waits, every wait bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from engine.compaction import Policy
from engine.tn.channel import probe
from engine.tn.limits import ClientOptions
from logsvc import stop_signal

START_WAIT_S_MAX = 30.0
"""A TN answers its port within this after start (opening replays the WAL tail)."""
STOP_WAIT_S = 10.0
"""After SIGTERM or SIGKILL, a TN process is reaped within this, or SIGKILLed again."""
TOKEN_FILE_MODE = 0o600
_PROBE = ClientOptions(connect_timeout_s=0.5)


class LocalTNError(RuntimeError):
    """A local TN process exited, or did not reach a state, when it should have; the
    message carries its output."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class LocalPair:
    """Where a pair's files are (`base`) and the addresses its TNs listen on."""

    base: Path
    token: str
    a: str
    b: str

    @property
    def config_a(self) -> Path:
        return self.base / "tn-a.toml"

    @property
    def config_b(self) -> Path:
        return self.base / "tn-b.toml"

    @property
    def cn_config(self) -> Path:
        return self.base / "cn.toml"

    @property
    def objects(self) -> Path:
        return self.base / "objects"


def write_pair(
    base: Path,
    cluster_dir: str,
    shard: int,
    token: str,
    maintenance: Policy | None = None,
) -> LocalPair:
    """Two TN configs on `shard` of the dev-cluster in `cluster_dir` (client.toml there),
    each the other's peer, sharing one object directory under `base`; and cn.toml.
    `maintenance` (the TNs' `[maintenance]`): the engine's defaults when None."""
    base.mkdir(parents=True, exist_ok=True)
    link = base / "cluster"
    if not link.exists():
        link.symlink_to(Path(cluster_dir).resolve())
    token_path = base / "tn.token"
    token_path.write_text(token + "\n")
    os.chmod(token_path, TOKEN_FILE_MODE)
    pair = LocalPair(base, token, f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}")
    _write_tn_config(pair.config_a, "tn-a", pair.a, pair.b, shard, maintenance)
    _write_tn_config(pair.config_b, "tn-b", pair.b, pair.a, shard, maintenance)
    pair.cn_config.write_text(
        f'tns = ["{pair.a}", "{pair.b}"]\ntoken_file = "tn.token"\n\n[objects]\ndir = "objects"\n'
    )
    return pair


def _write_tn_config(
    path: Path, name: str, listen: str, peer: str, shard: int, maintenance: Policy | None
) -> None:
    more = ""
    if maintenance is not None:
        more = (
            f"\n[maintenance]\nflush_age_ms = {maintenance.flush_age_ms}\n"
            f"checkpoint_interval_ms = {maintenance.checkpoint_interval_ms}\n"
            f"checkpoint_wal_reserve_entries = {maintenance.checkpoint_wal_reserve_entries}\n"
            f"history_retention_ms = {maintenance.history_retention_ms}\n"
        )
        if maintenance.snapshot_grace_ms:  # else the TN's own default (config.TN_POLICY)
            more += f"snapshot_grace_ms = {maintenance.snapshot_grace_ms}\n"
    path.write_text(
        f"""\
[tn]
data_dir = "{name}"
listen = "{listen}"
token_file = "tn.token"
peers = ["{peer}"]
log_level = "info"

[wal]
client_config = "cluster/client.toml"
shard = {shard}

[objects]
dir = "objects"
"""
        + more
    )


class TNProcess:
    """One `python -m engine serve` process in its own session (so a signal reaches it and
    nothing else), its output in a log file beside its config."""

    def __init__(self, config: Path, *, standby: bool = False) -> None:
        self.config = config
        self.log = config.with_suffix(f".{int(time.monotonic() * 1000)}.log")
        args = [sys.executable, "-m", "engine", "serve", "--config", str(config)]
        # Deferred: a SIGTERM inside Popen, after the fork, would lose the PID of a process
        # that its caller must stop.
        with open(self.log, "wb") as out, stop_signal.deferred():
            self.process = subprocess.Popen(
                [*args, *(["--standby"] if standby else [])],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout_s: float) -> int:
        """The exit status; a process still running after `timeout_s` is killed and
        LocalTNError raised with its output."""
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise LocalTNError(f"no exit within {timeout_s} s:\n{self.output}") from None

    def send(self, signum: int) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signum)

    def kill(self, signum: int = signal.SIGKILL) -> None:
        """Send `signum` (SIGKILL, or SIGTERM for a clean stop) and wait for the exit; a
        process that does not exit then is SIGKILLed (continued first, if it was stopped)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signum)
            try:
                self.process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGCONT)
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_WAIT_S)
                raise


def stop_all(*processes: TNProcess | None) -> None:
    """SIGKILL every process started (a stopped one is continued first), each whatever
    happened to the others."""
    for process in processes:
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.send(signal.SIGCONT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.kill()


async def role_of(address: str, token: str) -> str | None:
    """What the TN at `address` says it is (active, standby, ...), None if it answers
    nothing."""
    try:
        channel, reply = await probe(address, token, _PROBE)
    except (OSError, TimeoutError, ConnectionError):
        return None
    channel.abort()
    return reply.status.role


async def wait_role(
    address: str, token: str, role: str, process: TNProcess, wait_s: float = START_WAIT_S_MAX
) -> None:
    """Until the TN at `address` says it is `role`; LocalTNError with its output if the
    process exits or `wait_s` passes first."""
    deadline = time.monotonic() + wait_s
    while await role_of(address, token) != role:
        if process.process.poll() is not None:
            raise LocalTNError(f"the TN exited:\n{process.output}")
        if time.monotonic() >= deadline:
            raise LocalTNError(f"{address} never {role} within {wait_s} s:\n{process.output}")
        await asyncio.sleep(0.1)
