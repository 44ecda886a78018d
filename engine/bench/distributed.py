"""`python -m engine.bench distributed`: the engine as a distributed system (issue 15
"Benchmarks"): two compute nodes (this process and a child process) over a TN process whose
WAL is a shard of a 3-node logsvc cluster, all real processes on loopback.

    python -m engine.bench distributed --writers 16 --seconds 10 --rows 10000000

Phases, in this order, one JSON line each (then a summary line with the targets):

1. "sqlite": SQLite in WAL mode, `synchronous=FULL` (engine/bench/commit.py `measure_sqlite`), with
   as many writer threads as the two compute nodes have writers together, before anything
   else starts: the durable single-machine baseline.
2. "commits": a local dev-cluster (engine/bench/commit.py `local_cluster`), an active TN and a
   standby TN (`python -m engine serve [--standby]`, engine/tn/local.py) on shard 1; two
   `ComputeNode`s, each over its own `NetworkTN` in its own process (the second one is
   `python -m engine.bench.distributed`, spoken to in lines of JSON), each following the
   TN's pushes (`ComputeNode.follow`) and running `--writers` writer coroutines (closed
   loop: insert one ~100 B row, commit, again) for `--seconds` after `--warmup`. Commits/s
   over both, commit latency, and the logtail freshness under that load: for each commit
   acknowledged at one node, the time until the other node applied it (from its
   subscription, or from the pull its own next transaction makes, whichever came first;
   by CLOCK_MONOTONIC, which both processes read). One the other node applied before the
   writer saw its acknowledgement counts as 0 ms (and is counted as `before_ack`).
3. "freshness": the same, idle: `--probes` single commits one after another at the first
   node, PROBE_GAP_S apart.
4. "failover": the first node's writers commit again; the active TN is SIGKILLed; the time
   from the kill to the first commit acknowledged by the promoted standby (default
   election settings: the standby's watch, the client's back-off). Then a compute node that
   starts empty reads the table back: every key acknowledged in phases 2-4 must be there
   exactly once (`lost`, `duplicates`; keys whose commit failed with an open outcome may be
   there or not).
5. "load", "cold_start": the pair is stopped; one TN on shard 2, told by its tn.toml
   `[maintenance]` to checkpoint every second. `--rows` rows (engine/bench/scan.py's
   `orders`) are loaded through it in transactions of `--load-batch-rows` rows sent as write
   sets (the TN spills each one's rows to objects), then the benchmark waits until a
   checkpoint covers the load. Then a fresh `ComputeNode` (its own `NetworkTN`, an empty
   cache) is created and answers a first point lookup: the cold start; then a range scan.
   Twice: once as the TN answers its first pull (a TN this fresh still holds every entry
   in memory and sends those: metadata naming the spilled objects), once through a port
   that answers it with the newest checkpoint and the entries after it, as a TN whose
   logtail has moved on does (`checkpoints_loaded` says which happened). The summary's
   `cold_start_s` is the slower of the two.

Every process is stopped by PID in `finally` blocks (`stop_all`, `devcluster.down`, the
child's stdin closed then SIGKILL), every wait is bounded; timings are reported, never
asserted. On a machine with few cores the compute nodes compete for CPU with the TN and the
three logsvc nodes: each one's CPU over the commit phase is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine.bench import cold_start
from engine.bench.cold_start import DB_NAME
from engine.bench.commit import Case, local_cluster, measure_sqlite
from engine.cn.client import NetworkTN
from engine.cn.node import ComputeNode
from engine.compaction import Policy
from engine.errors import EngineError, OutcomeUnknown, WriteConflict
from engine.logtail import TailEntry
from engine.objects.store import LocalDirStore
from engine.schema import Column, Schema
from engine.tn.local import LocalPair, TNProcess, stop_all, wait_role, write_pair
from logsvc.bench import measure

SMALL_TABLE = "t"
SMALL_SCHEMA = Schema([Column("id", "int64"), Column("payload", "string")], primary_key=["id"])
PAYLOAD = "x" * 92
"""With the 8-byte key, ~100 B of row data, as `engine.bench commit`."""
KEY_STRIDE = 10**9
"""Writer i of node n owns keys from (n * WRITERS_MAX + i) * KEY_STRIDE: unique everywhere."""
WRITERS_MAX = 256
ROWS_MAX = 100_000_000
LOAD_BATCH_ROWS_MAX = 250_000
"""Rows of one load transaction: its Arrow stream stays below the TN protocol's 8 MiB per
insert operation (engine/tn/limits.py OP_ROWS_BYTES_MAX; ~30 B a row of `orders`)."""
PROBES_MAX = 100_000
SHARDS = 2
"""Shard 1: the TN pair of phases 2-4; shard 2: the cold start's TN (an empty log)."""
APPLY_WAIT_S_MAX = 30.0
"""How long a node may take to apply what the other acknowledged (else a sample is
missing, reported as such)."""
FAILOVER_WAIT_S_MAX = 60.0
"""How long the failover phase waits for the first commit on the promoted TN."""
FAILOVER_BEFORE_S = 1.0
"""Commits before the kill, and after the first commit on the promoted TN."""
SNAPSHOT_RETRIES_MAX = 5
"""A transaction begun before the failover may get the retryable "snapshot too old"
conflict on the new TN (decision 0007): tried again this many times."""
PROBE_GAP_S = 0.02
"""Between idle freshness probes: the previous probe reached the other node by then."""
CHILD_WAIT_S_MAX = 60.0
"""The second compute node's process answers each step within this (plus its writers'
seconds): it starts, connects and subscribes, or reports."""
CHILD_LINE_BYTES_MAX = 256 * 2**20
"""Its longest line: every commit's (commit_ts, time) of a run, as JSON."""
STOP_WAIT_S = 10.0

TARGETS = {
    "vs_sqlite_full_min": 1.0,
    "freshness_p99_ms_max": 20.0,
    "cold_start_s_max": 5.0,
    "failover_s_max": 3.0,
}


@dataclass(frozen=True, slots=True)
class Options:
    writers: int = 16
    seconds: float = 10.0
    warmup: float = 1.0
    rows: int = 10_000_000
    load_batch_rows: int = 200_000
    probes: int = 200
    dir_path: str | None = None


def percentile(samples: Sequence[float], fraction: float) -> float | None:
    """logsvc/bench/measure.py's rule (linear interpolation) over unsorted `samples`."""
    return measure.percentile(sorted(samples), fraction)


def _row(key: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([key], pa.int64()), pa.array([PAYLOAD], pa.string())], names=["id", "payload"]
    )


class _TimedNode(ComputeNode):
    """A compute node that notes when it applied each commit: the moment the change became
    visible to its readers. By `time.monotonic` (CLOCK_MONOTONIC on Linux), which the
    processes of one machine share: the second node's times compare with the first's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.applied_at: dict[int, float] = {}
        self.progress = asyncio.Event()

    def _apply_entry(self, got: TailEntry) -> None:
        super()._apply_entry(got)
        self.applied_at.setdefault(got.commit_ts, time.monotonic())
        self.progress.set()

    async def wait_applied(self, ts: int, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while self.applied_ts < ts:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.progress.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(remaining, 0.5)):
                    await self.progress.wait()
        return True


@dataclass(slots=True)
class _Ledger:
    """Keys whose commit was acknowledged, and keys whose commit failed with an open
    outcome (they may have landed)."""

    acked: array[int] = field(default_factory=lambda: array("q"))
    in_doubt: set[int] = field(default_factory=set)
    errors: int = 0
    first_error: str | None = None

    def error(self, key: int, exc: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, OutcomeUnknown):
            self.in_doubt.add(key)


@dataclass(slots=True)
class _Acks:
    """One node's acknowledged commits: (commit_ts, when) and latencies."""

    commit_ts: array[int] = field(default_factory=lambda: array("q"))
    at: array[float] = field(default_factory=lambda: array("d"))
    latencies_ms: array[float] = field(default_factory=lambda: array("d"))
    in_window: int = 0


async def _commit(cn: ComputeNode, key: int) -> int:
    """One single-row insert committed; its commit_ts. A "snapshot too old" conflict (a
    transaction that straddled a failover) is tried again."""
    for _ in range(SNAPSHOT_RETRIES_MAX):
        try:
            async with cn.transaction() as txn:
                await txn.table(DB_NAME, SMALL_TABLE).insert(_row(key))
        except WriteConflict as exc:
            if "snapshot too old" not in str(exc):
                raise
            continue
        assert txn.commit_ts is not None
        return int(txn.commit_ts)
    raise WriteConflict(f"key {key}: snapshot too old {SNAPSHOT_RETRIES_MAX} times")


class _Keys:
    def __init__(self, node: int) -> None:
        self._next = [(node * WRITERS_MAX + i) * KEY_STRIDE for i in range(WRITERS_MAX)]

    def take(self, writer: int) -> int:
        key = self._next[writer]
        self._next[writer] += 1
        return key


async def _writers(
    cn: ComputeNode,
    keys: _Keys,
    writers: int,
    seconds: float,
    ledger: _Ledger,
    acks: _Acks | None,
) -> None:
    clock = time.monotonic
    deadline = clock() + seconds

    async def writer(index: int) -> None:
        while clock() < deadline:
            key = keys.take(index)
            began = clock()
            try:
                commit_ts = await _commit(cn, key)
            except EngineError as exc:
                ledger.error(key, exc)
                continue
            ended = clock()
            ledger.acked.append(key)
            if acks is not None:
                acks.commit_ts.append(commit_ts)
                acks.at.append(ended)
                acks.latencies_ms.append((ended - began) * 1000)
                if ended <= deadline:
                    acks.in_window += 1

    await asyncio.gather(*(writer(i) for i in range(writers)))


def _freshness_ms(acks: _Acks, applied_at: dict[int, float]) -> tuple[list[float], int]:
    """For each commit in `acks`, how long after its acknowledgement the other node applied
    it (`applied_at`, the same clock), and how many it never applied."""
    samples: list[float] = []
    missing = 0
    for ts, at in zip(acks.commit_ts, acks.at, strict=True):
        seen = applied_at.get(ts)
        if seen is None:
            missing += 1
        else:
            samples.append((seen - at) * 1000)
    return samples, missing


def _freshness(samples: Sequence[float], prefix: str) -> dict[str, Any]:
    """Percentiles of how long after the acknowledgement the other node saw a commit; one
    seen first (its push handled before the writer's reply) counts as 0 ms, and how many
    were is reported."""
    return {
        **_latency([max(0.0, x) for x in samples], prefix),
        f"{prefix}before_ack": sum(1 for x in samples if x <= 0),
    }


def _latency(samples: Sequence[float], prefix: str) -> dict[str, Any]:
    return {
        f"{prefix}p50_ms": percentile(samples, 0.50),
        f"{prefix}p99_ms": percentile(samples, 0.99),
        f"{prefix}max_ms": round(max(samples), 3) if samples else None,
    }


# --- the second compute node, a process of its own ---------------------------------------------


class ChildFailed(RuntimeError):
    """The second compute node's process exited or did not answer in time; the message
    carries its output."""


class _Child:
    """The second compute node's process (`python -m engine.bench.distributed`), spoken to
    in lines of JSON on its stdin and stdout, stopped by PID."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    @classmethod
    async def start(cls, settings: dict[str, Any], log_path: Path) -> _Child:
        with open(log_path, "wb") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "engine.bench.distributed",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                limit=CHILD_LINE_BYTES_MAX,
            )
        child = cls(process, log_path)
        await child.send(settings)
        return child

    @property
    def pid(self) -> int:
        return self.process.pid

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        await self.process.stdin.drain()

    async def receive(self, wait_s: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        try:
            async with asyncio.timeout(wait_s):
                line = await self.process.stdout.readline()
        except TimeoutError:
            raise ChildFailed(f"no answer within {wait_s} s:\n{self._output()}") from None
        if not line:
            raise ChildFailed(f"it exited:\n{self._output()}")
        found = json.loads(line)
        assert isinstance(found, dict)
        return found

    def _output(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    async def stop(self) -> None:
        """Close its stdin (it exits), then SIGKILL it if it has not within STOP_WAIT_S."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            async with asyncio.timeout(STOP_WAIT_S):
                await self.process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            async with asyncio.timeout(STOP_WAIT_S):
                await self.process.wait()


async def _child_main() -> int:
    """The second compute node: its settings, {"go": true} (run the writers, answer with
    their acknowledgements), {"report_upto": ts} (answer with when it applied each commit,
    once it applied `ts`); exits at the end of its input."""

    async def line() -> dict[str, Any] | None:
        text = await asyncio.to_thread(sys.stdin.readline)
        return json.loads(text) if text else None

    def say(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    settings = await line()
    if settings is None:
        return 1
    tn = NetworkTN(settings["addresses"], settings["token"])
    store = LocalDirStore(settings["objects"], read_only=True)
    cn = _TimedNode(tn, store, client_id="bench-cn2")
    try:
        await cn.follow()
        say({"ready": True})
        if await line() is None:
            return 1
        ledger, keys, acks = _Ledger(), _Keys(1), _Acks()
        writers, warmup = settings["writers"], settings["warmup"]
        if warmup > 0:
            await _writers(cn, keys, writers, warmup, ledger, None)
        await _writers(cn, keys, writers, settings["seconds"], ledger, acks)
        say(
            {
                "commit_ts": list(acks.commit_ts),
                "at": list(acks.at),
                "latencies_ms": list(acks.latencies_ms),
                "in_window": acks.in_window,
                "acked": list(ledger.acked),
                "in_doubt": sorted(ledger.in_doubt),
                "errors": ledger.errors,
                "first_error": ledger.first_error,
            }
        )
        report = await line()
        if report is None:
            return 1
        await cn.wait_applied(report["report_upto"], APPLY_WAIT_S_MAX)
        say({"applied_at": list(cn.applied_at.items())})
    finally:
        await cn.close()
        await tn.close()
        store.close()
    return 0


# --- phases 2-4: two compute nodes over a TN pair ----------------------------------------------


async def _on_pair(
    pair: LocalPair,
    active: TNProcess,
    options: Options,
    pids: dict[str, int],
    emit: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    addresses = [pair.a, pair.b]
    tn = NetworkTN(addresses, pair.token)
    store = LocalDirStore(str(pair.objects), read_only=True)
    cn = _TimedNode(tn, store, client_id="bench-cn1")
    ledger = _Ledger()
    keys = _Keys(0)
    child: _Child | None = None
    out: dict[str, Any] = {}
    try:
        async with cn.transaction() as txn:
            await txn.create_database(DB_NAME)
            await txn.create_table(DB_NAME, SMALL_TABLE, SMALL_SCHEMA)
        await cn.follow()
        settings = {
            "addresses": addresses,
            "token": pair.token,
            "objects": str(pair.objects),
            "writers": options.writers,
            "seconds": options.seconds,
            "warmup": options.warmup,
        }
        child = await _Child.start(settings, pair.base / "cn2.log")
        await child.receive(CHILD_WAIT_S_MAX)  # ready: following
        out.update(await _commits(cn, keys, child, options, ledger, pids, emit))
        await child.stop()
        out.update(await _failover(cn, tn, pair.b, active, keys, options, ledger, emit))
        out.update(await _read_back(addresses, pair, ledger, emit))
    finally:
        if child is not None:
            await child.stop()
        await cn.close()
        await tn.close()
        store.close()
    return out


async def _commits(
    cn: _TimedNode,
    keys: _Keys,
    child: _Child,
    options: Options,
    ledger: _Ledger,
    pids: dict[str, int],
    emit: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Phases 2 and 3: both nodes' writers at once, then idle probes from this one."""
    pids = {"cn2": child.pid, **pids}
    await child.send({"go": True})
    if options.warmup > 0:
        await _writers(cn, keys, options.writers, options.warmup, ledger, None)
    mine = _Acks()
    cpu_before, others_before = measure.own_cpu_s(), measure.processes_cpu_s(pids)
    started = time.monotonic()
    await _writers(cn, keys, options.writers, options.seconds, ledger, mine)
    elapsed = time.monotonic() - started
    theirs_sent = await child.receive(options.seconds + CHILD_WAIT_S_MAX)
    cpu, others_after = measure.own_cpu_s() - cpu_before, measure.processes_cpu_s(pids)
    theirs = _Acks(
        array("q", theirs_sent["commit_ts"]),
        array("d", theirs_sent["at"]),
        array("d", theirs_sent["latencies_ms"]),
        theirs_sent["in_window"],
    )
    ledger.acked.extend(theirs_sent["acked"])
    ledger.in_doubt.update(theirs_sent["in_doubt"])
    errors = ledger.errors + theirs_sent["errors"]
    first_error = ledger.first_error or theirs_sent["first_error"]
    if theirs.commit_ts:
        await cn.wait_applied(max(theirs.commit_ts), APPLY_WAIT_S_MAX)
    probes = await _probes(cn, keys, options.probes, ledger)
    upto = max([*mine.commit_ts, *probes.commit_ts, 0])
    await child.send({"report_upto": upto})
    reported = await child.receive(APPLY_WAIT_S_MAX + CHILD_WAIT_S_MAX)
    applied_there = {int(ts): float(at) for ts, at in reported["applied_at"]}

    fresh_mine, missing_mine = _freshness_ms(mine, applied_there)
    fresh_theirs, missing_theirs = _freshness_ms(theirs, cn.applied_at)
    fresh = fresh_mine + fresh_theirs
    commits = mine.in_window + theirs.in_window
    line = {
        "bench": "distributed",
        "figure": "commits",
        "nodes": 2,
        "writers_per_node": options.writers,
        "seconds": options.seconds,
        "drain_s": round(max(0.0, elapsed - options.seconds), 3),
        "commits": commits,
        "commits_per_s": round(commits / options.seconds, 1),
        "commits_per_s_by_node": [round(a.in_window / options.seconds, 1) for a in (mine, theirs)],
        **_latency([*mine.latencies_ms, *theirs.latencies_ms], ""),
        "freshness_samples": len(fresh),
        **_freshness(fresh, "freshness_"),
        "freshness_missing": missing_mine + missing_theirs,
        "cpu_s": {
            "cn1": round(cpu, 2),
            **{
                name: round(others_after.get(name, 0.0) - before, 2)
                for name, before in others_before.items()
            },
        },
        "errors": errors,
        "first_error": first_error,
    }
    emit(line)
    idle, idle_missing = _freshness_ms(probes, applied_there)
    idle_line = {
        "bench": "distributed",
        "figure": "freshness",
        "load": "idle",
        "probes": options.probes,
        "samples": len(idle),
        **_freshness(idle, ""),
        "missing": idle_missing,
    }
    emit(idle_line)
    return {
        "commits_per_s": line["commits_per_s"],
        "commit_p99_ms": line["p99_ms"],
        "freshness_under_load_p50_ms": line["freshness_p50_ms"],
        "freshness_under_load_p99_ms": line["freshness_p99_ms"],
        "freshness_p50_ms": idle_line["p50_ms"],
        "freshness_p99_ms": idle_line["p99_ms"],
    }


async def _probes(cn: ComputeNode, keys: _Keys, probes: int, ledger: _Ledger) -> _Acks:
    """`probes` single commits one at a time, PROBE_GAP_S apart (the other node has
    applied the one before: nothing else is in flight)."""
    acks = _Acks()
    for _ in range(probes):
        key = keys.take(0)
        began = time.monotonic()
        try:
            commit_ts = await _commit(cn, key)
        except EngineError as exc:
            ledger.error(key, exc)
            continue
        acked_at = time.monotonic()
        ledger.acked.append(key)
        acks.commit_ts.append(commit_ts)
        acks.at.append(acked_at)
        acks.latencies_ms.append((acked_at - began) * 1000)
        await asyncio.sleep(PROBE_GAP_S)
    return acks


async def _failover(
    cn: ComputeNode,
    tn: NetworkTN,
    standby_address: str,
    active: TNProcess,
    keys: _Keys,
    options: Options,
    ledger: _Ledger,
    emit: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """`options.writers` writers on `cn`; SIGKILL of the active TN under them; the time to
    the first commit acknowledged while `tn` uses the standby's address."""
    clock = time.monotonic
    stop = asyncio.Event()
    acks: list[tuple[float, str | None]] = []
    errors_before = ledger.errors
    first_after: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    killed_at = [float("inf")]

    async def writer(index: int) -> None:
        while not stop.is_set():
            key = keys.take(index)
            try:
                await _commit(cn, key)
            except EngineError as exc:
                ledger.error(key, exc)
                await asyncio.sleep(0.01)  # not a hot loop while no TN answers
                continue
            now = clock()
            ledger.acked.append(key)
            acks.append((now, tn.address))
            if now > killed_at[0] and tn.address == standby_address and not first_after.done():
                first_after.set_result(now)

    tasks = [asyncio.ensure_future(writer(i)) for i in range(options.writers)]
    try:
        await asyncio.sleep(FAILOVER_BEFORE_S)
        before = len(acks)
        killed_at[0] = clock()
        active.kill(signal.SIGKILL)
        try:
            async with asyncio.timeout(FAILOVER_WAIT_S_MAX):
                first = await first_after
            failover_s: float | None = round(first - killed_at[0], 3)
        except TimeoutError:
            failover_s = None
        await asyncio.sleep(FAILOVER_BEFORE_S)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    line = {
        "bench": "distributed",
        "figure": "failover",
        "writers": options.writers,
        "failover_s": failover_s,
        "commits_before_kill": before,
        "commits_after_kill": len(acks) - before,
        "commits_resent": tn.commits_resent,
        "errors": ledger.errors - errors_before,
        "first_error": ledger.first_error,
    }
    emit(line)
    return {"failover_s": failover_s}


async def _read_back(
    addresses: list[str],
    pair: LocalPair,
    ledger: _Ledger,
    emit: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Every key acknowledged in the run, read back through a compute node that starts
    empty (on its own client)."""
    tn = NetworkTN(addresses, pair.token)
    store = LocalDirStore(str(pair.objects), read_only=True)
    cn = ComputeNode(tn, store)
    try:
        async with cn.snapshot() as view:
            got = (await view.table(DB_NAME, SMALL_TABLE).scan(columns=["id"])).column("id")
    finally:
        await cn.close()
        await tn.close()
        store.close()
    found = got.to_pylist()
    found_set = set(found)
    acked = set(ledger.acked)
    in_doubt = ledger.in_doubt
    line = {
        "bench": "distributed",
        "figure": "read_back",
        "acknowledged": len(acked),
        "found": len(found),
        "lost": len(acked - found_set),
        "duplicates": len(found) - len(found_set),
        "in_doubt": len(in_doubt),
        "unexplained": len(found_set - acked - in_doubt),
    }
    emit(line)
    return {"acknowledged": line["acknowledged"], "lost": line["lost"]}


# --- the command ------------------------------------------------------------------------------


def _start_pair(pair: LocalPair, stack: contextlib.ExitStack) -> TNProcess:
    """The active TN, then the standby; both stopped by PID when `stack` closes."""
    active = TNProcess(pair.config_a)
    stack.callback(stop_all, active)
    asyncio.run(wait_role(pair.a, pair.token, "active", active))
    standby = TNProcess(pair.config_b, standby=True)
    stack.callback(stop_all, standby)
    asyncio.run(wait_role(pair.b, pair.token, "standby", standby))
    return active


def run(options: Options, emit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every phase (the module docstring); returns the summary line."""
    started = time.monotonic()
    sqlite = measure_sqlite(
        "full",
        Case(2 * options.writers, 1, options.seconds, options.warmup),
        dir_path=options.dir_path,
    )
    emit({**sqlite, "bench": "distributed", "figure": "sqlite"})
    found: dict[str, Any] = {}
    token = secrets.token_hex(16)
    base = Path(tempfile.mkdtemp(prefix="engine-bench-distributed-", dir=options.dir_path))
    try:
        with local_cluster(SHARDS, options.dir_path) as (client_config, cluster_pids):
            cluster_dir = os.path.dirname(client_config)
            pair = write_pair(base / "pair", cluster_dir, 1, token)
            with contextlib.ExitStack() as stack:
                active = _start_pair(pair, stack)
                pids = {"tn": active.pid, **cluster_pids}
                found.update(asyncio.run(_on_pair(pair, active, options, pids, emit)))
            loading = write_pair(
                base / "load",
                cluster_dir,
                2,
                token,
                Policy(checkpoint_interval_ms=cold_start.CHECKPOINT_INTERVAL_MS),
            )
            tn = TNProcess(loading.config_a)
            try:
                asyncio.run(wait_role(loading.a, token, "active", tn))
                found.update(
                    asyncio.run(
                        cold_start.load_and_cold_start(
                            loading, options.rows, options.load_batch_rows, emit
                        )
                    )
                )
            finally:
                stop_all(tn)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    baseline = sqlite["commits_per_s"]
    measured = {
        "commits_per_s": found["commits_per_s"],
        "sqlite_full_commits_per_s": baseline,
        "vs_sqlite_full": round(found["commits_per_s"] / baseline, 2) if baseline else None,
        **found,
    }
    met = {
        "vs_sqlite_full": _at_least(measured["vs_sqlite_full"], TARGETS["vs_sqlite_full_min"]),
        "freshness_p99_ms": _at_most(found["freshness_p99_ms"], TARGETS["freshness_p99_ms_max"]),
        "freshness_under_load_p99_ms": _at_most(
            found["freshness_under_load_p99_ms"], TARGETS["freshness_p99_ms_max"]
        ),
        "cold_start_s": _at_most(found["cold_start_s"], TARGETS["cold_start_s_max"]),
        "failover_s": _at_most(found["failover_s"], TARGETS["failover_s_max"]),
    }
    return {
        "bench": "distributed",
        "summary": True,
        "writers_per_node": options.writers,
        "seconds": options.seconds,
        "rows": options.rows,
        "cpus": os.cpu_count(),
        **measured,
        "targets": TARGETS,
        "met": met,
        "total_s": round(time.monotonic() - started, 1),
    }


def _at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def _at_most(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


if __name__ == "__main__":
    if not __debug__:
        sys.exit("engine.bench.distributed refuses to run under python -O (asserts stay on)")
    sys.exit(asyncio.run(_child_main()))
