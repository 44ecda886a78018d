"""The engine soak run (issue 20): an hour of the engine over logsvc with a process killed
with SIGKILL every couple of minutes, every acknowledged commit checked after each kill.

    PYTHONPATH=$PWD .venv/bin/python -m tests.soak.engine_soak --minutes 60 --kill-every-s 120

What runs (all on 127.0.0.1, every process stopped by PID at the end, on an error and on
Ctrl-C): a 3-node logsvc dev-cluster (`logsvc.devcluster`), an active and a standby TN
(`python -m engine serve`, WAL on shard 1, objects in OUT/tn/objects), two compute node
processes and one embedded engine process (file WAL, OUT/embedded) running the mixed
workload of tests/soak/worker.py: inserts, updates, deletes, large transactions (the
embedded engine's spill), scans at timestamps.

Every `--kill-every-s` (jittered by a quarter, seeded) one process chosen at random (each
kind of `--kinds` once per round, in a seeded random order) gets SIGKILL: a logsvc node
(restarted on its data dir, then every shard must have a leader), the active TN (the standby
must take over within TAKEOVER_WAIT_S_MAX; the killed one comes back with `--standby`:
restarted without it, it would be refused and exit 3), a compute node or the embedded
engine (restarted with new keys, adopting their live large ranges). Then, once
the workers commit again (bounded), the ledger (tests/soak/ledger.py) is checked: the
compute nodes' writes through a fresh compute node (when that read fails, a problem, and the
ledger is checked from the TNs' WAL reopened read-only instead), the embedded engine's from
its reopened state (when it was the one killed, and at the end). A process that dies without being
killed, a takeover that does not happen, or no progress after a kill is a problem, reported
with its log tail. A failed takeover ends the run (nothing could commit after it).

Every `--sample-every-s` (10 s): RSS and open fds of each process, logsvc's retained WAL
(the shard's [first, next) LSNs from its leader), the embedded WAL's bytes, and the objects
of each object store, into OUT/samples.csv; drawn into OUT/samples.png at the end
(matplotlib, pip-installed on demand into `--deps-dir`; without it the chart is skipped
and says why). A series grew without bound when the maximum of its last third exceeds the
maximum of its middle third by more than GROWTH_RATIO_MAX and its slack.

The report: one JSON line on stdout and OUT/report.json. Exit status 0 when nothing
acknowledged was lost or duplicated, no in-doubt transaction was torn, no row appeared that
nobody wrote, no series grew and no problem was seen; 1 otherwise; 2 on a harness error
(or when interrupted).

Not part of `pytest tests` (no test_ file here) nor of CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import importlib
import importlib.util
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow.feather as feather

from engine.cn.client import NetworkTN
from engine.cn.node import ComputeNode
from engine.compaction import Policy
from engine.objects.store import LocalDirStore
from engine.tn.limits import ClientOptions
from engine.tn.local import LocalPair, LocalTNError, TNProcess, stop_all, wait_role, write_pair
from logsvc import devcluster
from logsvc.client import ClientOptions as LogsvcOptions
from logsvc.client import connect
from logsvc.config import load_client_config
from tae_driver.limits import FILE_SEGMENT_BYTES_DEFAULT
from tests.soak import worker
from tests.soak.ledger import CheckResult, Chunk, Ledger

REPO = Path(__file__).resolve().parents[2]
SHARD = 1
NODES = 3
KINDS = ("logsvc", "tn", "cn", "embedded")
CN_SLOTS = ("cn-1", "cn-2")
EMBEDDED = "embedded"

START_WAIT_S_MAX = 60.0
TAKEOVER_WAIT_S_MAX = 45.0
"""The standby promotes itself about 1 s after the active TN dies; 45 s is a failure."""
LEADERS_WAIT_S_MAX = 60.0
PROGRESS_WAIT_S_MAX = 90.0
"""After a kill, every compute node must acknowledge a commit within this."""
CHECK_WAIT_S_MAX = 180.0
VERIFY_WAIT_S_MAX = 300.0
STOP_WAIT_S = 10.0
READER_JOIN_S_MAX = 10.0
LOG_TAIL_LINES = 40
TAKEOVER_TAIL_LINES = 15
PROBLEM_CHARS_MAX = 400
"""Of a problem's first line, in the report (the whole of it goes to OUT/problems.log)."""
RESTARTS_MAX = 3
"""A worker that exits by itself is restarted this many times, then left down (a crash loop
would only repeat its problem)."""
CHECK_CLIENT = ClientOptions(
    connect_timeout_s=1.0, request_timeout_s=30.0, failover_wait_s_max=30.0
)
STATUS_PROBE = LogsvcOptions(request_timeout_s=3.0, retry_s_max=3.0, connect_timeout_s=2.0)
STATUS_WAIT_S_MAX = 8.0

GROWTH_RATIO_MAX = 1.25
GROWTH_SLACK = {
    "rss_mib": 48.0,
    "fds": 24.0,
    "entries": 5000.0,
    "bytes": FILE_SEGMENT_BYTES_DEFAULT + 16 * 2**20,
    "files": 32.0,
}
"""What a series may rise (beyond GROWTH_RATIO_MAX) from its middle third's maximum to its
last third's before it counts as growing: noise of one busy moment, not a trend. The file
WAL deletes only whole segments (64 MiB), so its directory may grow by one segment before
a truncation shows: at the embedded workload's ~15 KB/s, for the whole of an hour."""
GROWTH_SAMPLES_MIN = 9
MATPLOTLIB_PIN = "matplotlib==3.10.7"
INSTALL_WAIT_S_MAX = 300.0
DEPS_DIR_DEFAULT = os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "logsvc-soak-deps",
    f"py{sys.version_info.major}.{sys.version_info.minor}",
)


class HarnessError(RuntimeError):
    """The soak itself could not go on (exit 2)."""


class RunEnded(RuntimeError):
    """The system failed so that the run cannot go on (a takeover did not happen): a
    problem (exit 1), already recorded."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# --- worker processes --------------------------------------------------------------------------


class WorkerProc:
    """One tests/soak/worker.py process; its announcements go into `ledger` (under `lock`)
    as a thread reads them. Stopped by PID (its own session)."""

    def __init__(
        self,
        slot: str,
        incarnation: int,
        args: list[str],
        log: Path,
        ledger: Ledger,
        lock: threading.Lock,
    ) -> None:
        self.slot = slot
        self.name = f"{slot}.{incarnation}"
        self.ledger = ledger
        self.lock = lock
        self.acks = 0
        self.scans = 0
        self.scans_skipped = 0
        self.scans_bad: list[str] = []
        self.fails: Counter[str] = Counter()
        self.unknown: Counter[str] = Counter()
        self.killing = False
        self.log = log
        with open(self.log, "ab") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.soak.worker", "--name", self.name, *args],
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True, name=self.name)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._take(line.rstrip("\n"))

    def _take(self, line: str) -> None:
        kind, _, rest = line.partition(" ")
        with self.lock:
            if kind == "begin":
                op, _, body = rest.partition(" ")
                announced = json.loads(body)
                writes = {int(k): v for k, v in announced["w"].items()}
                chunks = [Chunk(*c) for c in announced["c"]]
                self.ledger.begin(op, self.name, writes, chunks)
            elif kind == "ack":
                self.ledger.ack(rest.split(" ")[0])
                self.acks += 1
            elif kind == "fail":
                op, _, reason = rest.partition(" ")
                self.ledger.fail(op)
                self.fails[reason] += 1
            elif kind == "unknown":
                op, _, reason = rest.partition(" ")
                self.ledger.unknown(op)
                self.unknown[reason] += 1
            elif kind == "scan":
                self.scans += 1
            elif kind == "scanskip":
                self.scans_skipped += 1
            elif kind == "scanbad":
                self.scans_bad.append(rest)

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, reaped, every line it wrote read; its open transactions in doubt."""
        self.killing = True
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        try:
            self.process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            raise HarnessError(f"worker {self.name} (pid {self.pid}) survived SIGKILL") from None
        self._reader.join(READER_JOIN_S_MAX)
        with self.lock:
            self.ledger.orphan(self.name)

    def summary(self) -> dict[str, object]:
        return {
            "acks": self.acks,
            "fails": dict(self.fails),
            "unknown": dict(self.unknown),
            "scans": self.scans,
            "scans_skipped": self.scans_skipped,
            "scans_bad": len(self.scans_bad),
        }


# --- samples and growth (pure, apart from reading /proc) -----------------------------------------


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def files_under(path: Path) -> tuple[int, int]:
    """(files, bytes) under `path`, recursively; (0, 0) when it is not there."""
    count = size = 0
    for root, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                size += os.stat(os.path.join(root, name)).st_size
                count += 1
    return count, size


@dataclass(frozen=True, slots=True)
class Growth:
    unit: str
    samples: int
    middle_max: float | None
    last_max: float | None
    grew: bool | None
    """None: too few samples to say."""


def growth(times_s: list[float], values: list[float | None], unit: str) -> Growth:
    """Whether the series grew without bound: the maximum of its last third (by time) above
    the maximum of its middle third by more than GROWTH_RATIO_MAX and GROWTH_SLACK[unit]."""
    points = [(t, v) for t, v in zip(times_s, values, strict=True) if v is not None]
    if len(points) < GROWTH_SAMPLES_MIN:
        return Growth(unit, len(points), None, None, None)
    start, end = points[0][0], points[-1][0]
    third = (end - start) / 3
    middle = [v for t, v in points if start + third <= t < start + 2 * third]
    last = [v for t, v in points if t >= start + 2 * third]
    if not middle or not last:
        return Growth(unit, len(points), None, None, None)
    middle_max, last_max = max(middle), max(last)
    grew = last_max > middle_max * GROWTH_RATIO_MAX + GROWTH_SLACK[unit]
    return Growth(unit, len(points), round(middle_max, 2), round(last_max, 2), grew)


PROCESS_LABELS = ("n1", "n2", "n3", "tn-a", "tn-b", *CN_SLOTS, EMBEDDED, "soak")
"""`soak` is this harness: its series are drawn and reported (`harness_grew`), not judged."""
SERIES: tuple[tuple[str, str], ...] = (
    *((f"{label}_rss_mib", "rss_mib") for label in PROCESS_LABELS),
    *((f"{label}_fds", "fds") for label in PROCESS_LABELS),
    ("logsvc_retained_entries", "entries"),
    ("embedded_wal_bytes", "bytes"),
    ("tn_objects", "files"),
    ("embedded_objects", "files"),
)
CSV_COLUMNS = ("t_s", *(name for name, _ in SERIES), "logsvc_first_lsn", "logsvc_next_lsn")


# --- the run -------------------------------------------------------------------------------------


@dataclass
class Totals:
    """One ledger's results over the run's checks."""

    checks: int = 0
    lost: int = 0
    """The largest count of one check (each check covers every write acknowledged so far)."""
    duplicated: int = 0
    phantom: int = 0
    partial: int = 0
    resolved_applied: int = 0
    resolved_not_applied: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, result: CheckResult) -> None:
        self.checks += 1
        self.lost = max(self.lost, result.lost)
        self.duplicated = max(self.duplicated, result.duplicated)
        self.phantom = max(self.phantom, result.phantom)
        self.partial += result.partial
        self.resolved_applied += result.resolved_applied
        self.resolved_not_applied += result.resolved_not_applied
        for sample in result.samples:
            if len(self.samples) < 20:
                self.samples.append(sample)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out).resolve()
        self.rng = random.Random(args.seed)
        self.cluster_dir = str(self.out / "cluster")
        self.client_config = f"{self.cluster_dir}/client.toml"
        self.embedded_dir = self.out / "embedded"
        self.lock = threading.Lock()
        self.ledgers = {"cn": Ledger(), EMBEDDED: Ledger()}
        self.totals = {"cn": Totals(), EMBEDDED: Totals()}
        self.workers: dict[str, WorkerProc] = {}
        self.retired: list[WorkerProc] = []
        self.key_bases: dict[str, list[int]] = {slot: [] for slot in (*CN_SLOTS, EMBEDDED)}
        self.incarnations = 0
        self.pair: LocalPair | None = None
        self.tns: dict[str, TNProcess | None] = {"tn-a": None, "tn-b": None}
        self.active = "tn-a"
        self.kills: Counter[str] = Counter()
        self.kind_queue: list[str] = []
        self.survived: Counter[str] = Counter()
        self.kill_times: list[tuple[float, str]] = []
        self.problems: list[str] = []
        self.takeover_failure: dict[str, str] | None = None
        self.restarts: Counter[str] = Counter()
        self.started_s = time.monotonic()
        self.samples: list[dict[str, float | None]] = []
        self.cluster_up = False

    # --- names -------------------------------------------------------------------------------

    def tn_address(self, name: str) -> str:
        assert self.pair is not None
        return self.pair.a if name == "tn-a" else self.pair.b

    def tn_config(self, name: str) -> Path:
        assert self.pair is not None
        return self.pair.config_a if name == "tn-a" else self.pair.config_b

    @property
    def standby(self) -> str:
        return "tn-b" if self.active == "tn-a" else "tn-a"

    def problem(self, text: str) -> None:
        """Its first line goes into the report, all of it (log tails) into problems.log."""
        summary = text.splitlines()[0][:PROBLEM_CHARS_MAX]
        with open(self.out / "problems.log", "a") as f:
            f.write(f"[{time.strftime('%H:%M:%S')}] {text}\n\n")
        say(f"PROBLEM: {summary} (details: {self.out / 'problems.log'})")
        self.problems.append(summary)

    # --- starting ----------------------------------------------------------------------------

    async def start(self) -> None:
        say(
            f"starting: {NODES} logsvc nodes, 2 TNs, 2 compute nodes, 1 embedded engine "
            f"in {self.out}"
        )
        self.cluster_up = True
        await asyncio.to_thread(devcluster.up, self.cluster_dir, NODES, self.args.shards)
        policy = replace(Policy(), checkpoint_interval_ms=self.args.checkpoint_ms)
        self.pair = write_pair(
            self.out / "tn", self.cluster_dir, SHARD, secrets.token_hex(16), policy
        )
        self.tns["tn-a"] = TNProcess(self.pair.config_a)
        await self._wait_tn("tn-a", "active", START_WAIT_S_MAX)
        self.tns["tn-b"] = TNProcess(self.pair.config_b, standby=True)
        await self._wait_tn("tn-b", "standby", START_WAIT_S_MAX)
        for slot in (*CN_SLOTS, EMBEDDED):
            self._start_worker(slot)
        await self._progress(START_WAIT_S_MAX * 2, "at start", (*CN_SLOTS, EMBEDDED))

    async def _wait_tn(self, name: str, role: str, wait_s: float) -> None:
        process = self.tns[name]
        assert process is not None and self.pair is not None
        await wait_role(self.tn_address(name), self.pair.token, role, process, wait_s)

    def _start_worker(self, slot: str) -> None:
        assert self.pair is not None
        self.incarnations += 1
        key_base = self.incarnations * worker.KEY_SPACE
        ledger = self.ledgers[EMBEDDED if slot == EMBEDDED else "cn"]
        with self.lock:
            adopted = [
                chunk
                for base in self.key_bases[slot]
                for chunk in ledger.live_chunks(base, base + worker.KEY_SPACE)
            ]
        self.key_bases[slot].append(key_base)
        common = [
            "--key-base", str(key_base),
            "--seed", str(self.rng.randrange(2**31)),
            "--seconds", str(self.args.minutes * 60 + 3600),
            "--pace-s", str(self.args.pace_s),
            "--large-every-s", str(self.args.large_every_s),
            "--adopt", ",".join(f"{c.lo}:{c.hi}" for c in adopted),
        ]  # fmt: skip
        (self.out / "workers").mkdir(exist_ok=True)
        if slot == EMBEDDED:
            mode = [
                "--mode", "embedded", "--dir", str(self.embedded_dir),
                "--large-rows", str(self.args.embedded_large_rows),
            ]  # fmt: skip
        else:
            mode = [
                "--mode", "cn", "--tns", f"{self.pair.a},{self.pair.b}",
                "--token-file", str(self.pair.base / "tn.token"),
                "--objects", str(self.pair.objects),
                "--large-rows", str(self.args.cn_large_rows),
            ]  # fmt: skip
        log = self.out / "workers" / f"{slot}.log"
        self.workers[slot] = WorkerProc(
            slot, self.incarnations, [*mode, *common], log, ledger, self.lock
        )

    async def _progress(self, wait_s: float, when: str, slots: tuple[str, ...]) -> bool:
        """Until each worker of `slots` acknowledges a commit it had not before; a problem
        (with its log tail) if one does not within `wait_s`."""
        before = {slot: self.workers[slot].acks for slot in slots}
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if all(self.workers[s].acks > before[s] for s in slots):
                return True
            await asyncio.sleep(0.2)
        stuck = [s for s in slots if self.workers[s].acks <= before[s]]
        self.problem(
            f"no commit acknowledged by {stuck} within {wait_s:.0f} s {when}; worker log tail:\n"
            + log_tail(self.workers[stuck[0]].log, 10)
            + f"\nactive TN {self.active} log tail:\n"
            + self._tn_tail(self.active)
        )
        return False

    def tn_log(self, name: str) -> Path:
        process = self.tns[name]
        assert process is not None
        return process.log

    def _tn_tail(self, name: str) -> str:
        process = self.tns[name]
        return log_tail(process.log) if process is not None else "(not started)"

    # --- kills -------------------------------------------------------------------------------

    async def kill_one(self) -> None:
        """One kill, its restart, the wait for commits and the checks. Survived: no problem
        on the way (everything came back, commits went on, the fresh compute node could
        read) and the checks found nothing lost, duplicated or torn."""
        problems_before = len(self.problems)
        if not self.kind_queue:  # every kind once per round, in a random order
            self.kind_queue = list(self.args.kinds)
            self.rng.shuffle(self.kind_queue)
        kind = self.kind_queue.pop()
        self.kills[kind] += 1
        self.kill_times.append((time.monotonic() - self.started_s, kind))
        if kind == "logsvc":
            await self._kill_logsvc()
        elif kind == "tn":
            await self._kill_tn(self.active)
        elif kind == "cn":
            await self._kill_cn(self.rng.choice(CN_SLOTS))
        else:
            await self._kill_embedded()
        live = tuple(slot for slot in CN_SLOTS if self.workers[slot].alive())
        if await self._progress(PROGRESS_WAIT_S_MAX, f"after the {kind} kill", live):
            await self.check_cns()
        damage = sum(t.lost + t.duplicated + t.partial for t in self.totals.values())
        if len(self.problems) == problems_before and damage == 0:
            self.survived[kind] += 1

    async def _kill_logsvc(self) -> None:
        node = self.rng.choice([f"n{i}" for i in range(1, NODES + 1)])
        say(f"kill -9 logsvc node {node}")
        await asyncio.to_thread(devcluster.kill_node, self.cluster_dir, node)
        await self._restart_logsvc(node)

    async def _restart_logsvc(self, node: str) -> None:
        await asyncio.to_thread(devcluster.start_node, self.cluster_dir, node)
        try:
            await asyncio.to_thread(
                devcluster.wait_for_leaders, self.cluster_dir, self.args.shards, LEADERS_WAIT_S_MAX
            )
        except TimeoutError as exc:
            self.problem(
                f"after {node} restarted: {exc}\n{log_tail(Path(self.cluster_dir) / f'{node}.log')}"
            )

    async def _kill_tn(self, name: str) -> None:
        process = self.tns[name]
        assert process is not None
        say(f"kill -9 the active TN {name} (pid {process.pid})")
        await asyncio.to_thread(process.kill, signal.SIGKILL)
        await self._take_over(name)

    async def _take_over(self, dead: str) -> None:
        """The standby must become active; `dead` comes back as the standby."""
        standby = self.standby if dead == self.active else self.active
        try:
            await self._wait_tn(standby, "active", TAKEOVER_WAIT_S_MAX)
        except LocalTNError as exc:
            self.takeover_failure = {
                "dead": dead,
                "standby": standby,
                "error": str(exc).splitlines()[0],
                "standby_log_tail": log_tail(self.tn_log(standby), TAKEOVER_TAIL_LINES),
            }
            self.problem(
                f"takeover failed: the standby TN {standby} did not become active within "
                f"{TAKEOVER_WAIT_S_MAX:.0f} s after {dead} died ({str(exc).splitlines()[0]}); "
                f"its log tail:\n{self._tn_tail(standby)}"
            )
            raise RunEnded("takeover failed") from None
        say(f"{standby} took over")
        self.active = standby
        await self._restart_standby(dead)

    async def _restart_standby(self, name: str) -> None:
        self.tns[name] = TNProcess(self.tn_config(name), standby=True)
        try:
            await self._wait_tn(name, "standby", START_WAIT_S_MAX)
        except LocalTNError as exc:
            self.problem(f"{name} restarted with --standby is not a standby: {exc}")

    async def _kill_cn(self, slot: str) -> None:
        proc = self.workers[slot]
        say(f"kill -9 compute node {proc.name} (pid {proc.pid})")
        await asyncio.to_thread(proc.kill)
        self.retired.append(proc)
        await self.check_cns()  # its transactions in doubt resolved before it comes back
        self._start_worker(slot)

    async def _kill_embedded(self) -> None:
        proc = self.workers[EMBEDDED]
        say(f"kill -9 the embedded engine {proc.name} (pid {proc.pid})")
        await asyncio.to_thread(proc.kill)
        self.retired.append(proc)
        await self.check_embedded()
        self._start_worker(EMBEDDED)

    # --- processes that died by themselves ---------------------------------------------------

    async def watch(self) -> None:
        """A worker, TN or logsvc node that exited without being killed: a problem, and
        restarted."""
        for slot, proc in list(self.workers.items()):
            if not proc.alive() and not proc.killing:
                self.restarts[slot] += 1
                again = self.restarts[slot] <= RESTARTS_MAX
                self.problem(
                    f"worker {proc.name} exited by itself ({proc.process.returncode}); "
                    + ("restarted" if again else f"left down after {RESTARTS_MAX} restarts")
                    + ":\n"
                    + log_tail(proc.log, 10)
                )
                await asyncio.to_thread(proc.kill)
                if slot == EMBEDDED:
                    await self.check_embedded()
                if again:
                    self.retired.append(proc)
                    self._start_worker(slot)
        for name, process in self.tns.items():
            if process is not None and process.process.poll() is not None:
                role = "active" if name == self.active else "standby"
                self.problem(
                    f"the {role} TN {name} exited by itself ({process.process.returncode}); "
                    f"its log tail:\n{log_tail(process.log)}"
                )
                if role == "active":
                    await self._take_over(name)
                else:
                    await self._restart_standby(name)
        for node, pid in devcluster.read_pids(self.cluster_dir).items():
            if not devcluster.alive(pid):
                self.problem(
                    f"logsvc node {node} exited by itself:\n"
                    + log_tail(Path(self.cluster_dir) / f"{node}.log")
                )
                await self._restart_logsvc(node)

    # --- checks ------------------------------------------------------------------------------

    async def check_cns(self) -> bool:
        """The compute nodes' writes, read back through a fresh compute node; when that read
        fails (a problem), from the TNs' WAL reopened read-only instead, so that the ledger
        is still checked. False when the fresh compute node could not read."""
        with self.lock:
            mark = self.ledgers["cn"].mark()
        try:
            ids, values = await asyncio.wait_for(self._read_through_cn(), CHECK_WAIT_S_MAX)
        except Exception as exc:  # a read that fails is the system's problem, not ours
            self.problem(f"reading back through a fresh compute node failed: {exc!r}")
            assert self.pair is not None
            got = await self._reopened(
                "tn",
                ["--client-config", self.client_config, "--shard", str(SHARD)],
                ["--objects", str(self.pair.objects), "--dir", str(self.out / "reader")],
            )
            if got is None:
                with self.lock:
                    self.ledgers["cn"].unmark()
                return False
            ids, values = got
            say("checking the compute nodes' writes from the TNs' WAL reopened instead")
            with self.lock:
                result = self.ledgers["cn"].check(mark, ids, values)
            self._record("cn (TNs' WAL reopened)", result, "cn")
            return False
        with self.lock:
            result = self.ledgers["cn"].check(mark, ids, values)
        self._record("cn", result, "cn")
        return True

    async def _read_through_cn(self) -> tuple[np.ndarray, np.ndarray]:
        assert self.pair is not None
        tn = NetworkTN([self.pair.a, self.pair.b], self.pair.token, CHECK_CLIENT)
        store = LocalDirStore(str(self.pair.objects), read_only=True)
        node = ComputeNode(tn, store, client_id="soak-check")
        try:
            async with node.snapshot() as view:
                table = await view.table(worker.DB, worker.TABLE).scan(columns=["id", "v"])
        finally:
            await node.close()
            await tn.close()
            store.close()
        return _arrays(table)

    async def _reopened(self, mode: str, *more: list[str]) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows of an engine reopened read-only in a child process (worker.py
        --verify); None, and a problem, when that fails."""
        rows = self.out / f"{mode}-rows.arrow"
        command = [
            sys.executable, "-m", "tests.soak.worker", "--mode", mode, "--verify",
            "--out", str(rows), *(arg for args in more for arg in args),
        ]  # fmt: skip
        what = "the embedded engine" if mode == EMBEDDED else "the TNs' WAL"
        try:
            done = await asyncio.to_thread(
                subprocess.run, command, capture_output=True, text=True, timeout=VERIFY_WAIT_S_MAX
            )
        except subprocess.TimeoutExpired:
            self.problem(f"reopening {what} took over {VERIFY_WAIT_S_MAX:.0f} s")
            return None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
            self.problem(f"reopening {what} failed ({done.returncode}): {last}\n{done.stderr}")
            return None
        return _arrays(feather.read_table(str(rows)))

    async def check_embedded(self) -> None:
        """The embedded engine's writes, from its reopened state (it is not running)."""
        assert all(p.slot != EMBEDDED or not p.alive() for p in self.workers.values())
        with self.lock:
            mark = self.ledgers[EMBEDDED].mark()
        got = await self._reopened(EMBEDDED, ["--dir", str(self.embedded_dir)])
        if got is None:
            with self.lock:
                self.ledgers[EMBEDDED].unmark()
            return
        with self.lock:
            result = self.ledgers[EMBEDDED].check(mark, *got)
        self._record(EMBEDDED, result, EMBEDDED)

    def _record(self, what: str, result: CheckResult, domain: str) -> None:
        self.totals[domain].add(result)
        say(
            f"check {what}: {result.keys_checked} keys and {result.chunks_checked} chunks, "
            f"lost {result.lost}, duplicated {result.duplicated}, in doubt resolved "
            f"{result.resolved_applied} applied / {result.resolved_not_applied} not, "
            f"torn {result.partial}, phantom {result.phantom}"
            + (f"; e.g. {result.samples[:3]}" if result.samples else "")
        )

    # --- samples -----------------------------------------------------------------------------

    def pids(self) -> dict[str, int]:
        found: dict[str, int] = dict(devcluster.read_pids(self.cluster_dir))
        for name, process in self.tns.items():
            if process is not None and process.process.poll() is None:
                found[name] = process.pid
        for slot, proc in self.workers.items():
            if proc.alive():
                found[slot] = proc.pid
        found["soak"] = os.getpid()
        return found

    async def sample(self, writer: Any, csv_file: TextIO) -> None:
        row: dict[str, float | None] = {"t_s": round(time.monotonic() - self.started_s, 1)}
        pids = self.pids()
        for label in PROCESS_LABELS:
            pid = pids.get(label)
            row[f"{label}_rss_mib"] = None if pid is None else rss_mib(pid)
            row[f"{label}_fds"] = None if pid is None else open_fds(pid)
        first = next_lsn = None
        with contextlib.suppress(Exception):  # no leader right now: an empty cell
            first, next_lsn = await asyncio.wait_for(self._retained(), STATUS_WAIT_S_MAX)
        row["logsvc_first_lsn"], row["logsvc_next_lsn"] = first, next_lsn
        row["logsvc_retained_entries"] = (
            None if first is None or next_lsn is None else next_lsn - first
        )
        row["embedded_wal_bytes"] = files_under(self.embedded_dir / "wal")[1]
        assert self.pair is not None
        row["tn_objects"] = files_under(self.pair.objects)[0]
        row["embedded_objects"] = files_under(self.embedded_dir / "objects")[0]
        self.samples.append(row)
        writer.writerow(row)
        csv_file.flush()

    async def _retained(self) -> tuple[int, int]:
        config = load_client_config(self.client_config)
        client = await connect(config.addresses, config.token, options=STATUS_PROBE)
        try:
            status = await client.leader_status(SHARD)
        finally:
            await client.close()
        return status.first_lsn, status.next_lsn

    async def sampler(self) -> None:
        with open(self.out / "samples.csv", "w", newline="") as csv_file:
            writer = csv.DictWriter(csv_file, CSV_COLUMNS)
            writer.writeheader()
            while True:
                started = time.monotonic()
                try:
                    await self.sample(writer, csv_file)
                except Exception as exc:
                    say(f"sample failed: {exc!r}")
                await asyncio.sleep(
                    max(0.0, self.args.sample_every_s - (time.monotonic() - started))
                )

    # --- the whole run -----------------------------------------------------------------------

    async def run(self) -> None:
        await self.start()
        sampler = asyncio.ensure_future(self.sampler())
        try:
            deadline = self.started_s + self.args.minutes * 60
            next_kill = time.monotonic() + self._interval()
            try:
                while time.monotonic() < deadline:
                    if sampler.done():
                        sampler.result()
                    await self.watch()
                    if time.monotonic() >= next_kill:
                        await self.kill_one()
                        next_kill = time.monotonic() + self._interval()
                    await asyncio.sleep(1.0)
            except RunEnded:
                say("the run cannot go on: the final checks (no active TN: the WAL reopened)")
                await self.finish()
                raise
            say("time is up: the final checks")
            await self.finish()
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sampler

    def _interval(self) -> float:
        return float(self.args.kill_every_s * (0.75 + 0.5 * self.rng.random()))

    async def finish(self) -> None:
        """Every worker stopped (SIGKILL), then both ledgers checked a last time."""
        for slot in CN_SLOTS:
            await asyncio.to_thread(self.workers[slot].kill)
        await self.check_cns()
        await asyncio.to_thread(self.workers[EMBEDDED].kill)
        await self.check_embedded()

    def stop_everything(self) -> None:
        """Every process this run started, by PID, whatever happened."""
        for proc in (*self.workers.values(), *self.retired):
            with contextlib.suppress(Exception):
                proc.kill()
        stop_all(*self.tns.values())
        if self.cluster_up:
            devcluster.down(self.cluster_dir)

    # --- the report --------------------------------------------------------------------------

    def report(self, harness_error: str | None, interrupted: bool) -> dict[str, Any]:
        times = [float(row["t_s"] or 0.0) for row in self.samples]
        growths = {
            name: growth(times, [row.get(name) for row in self.samples], unit)
            for name, unit in SERIES
        }
        grew = sorted(n for n, g in growths.items() if g.grew and not n.startswith("soak_"))
        harness_grew = sorted(n for n, g in growths.items() if g.grew and n.startswith("soak_"))
        totals = self.totals
        everyone = [*self.workers.values(), *self.retired]
        scans_bad = [bad for proc in everyone for bad in proc.scans_bad]
        ledgers = self.ledgers
        report: dict[str, Any] = {
            "duration_s": round(time.monotonic() - self.started_s, 1),
            "minutes": self.args.minutes,
            "seed": self.args.seed,
            "kills": dict(self.kills),
            "kills_survived": dict(self.survived),
            "commits_acknowledged": sum(ledger.acked for ledger in ledgers.values()),
            "commits_refused": sum(ledger.failed for ledger in ledgers.values()),
            "lost": sum(t.lost for t in totals.values()),
            "duplicated": sum(t.duplicated for t in totals.values()),
            "in_doubt": sum(ledger.in_doubt_total for ledger in ledgers.values()),
            "in_doubt_resolved": {
                "applied": sum(t.resolved_applied for t in totals.values()),
                "not_applied": sum(t.resolved_not_applied for t in totals.values()),
                "torn": sum(t.partial for t in totals.values()),
                "unresolved": sum(len(ledger.doubt) for ledger in ledgers.values()),
            },
            "phantom_rows": sum(t.phantom for t in totals.values()),
            "checks": {domain: t.checks for domain, t in totals.items()},
            "by_domain": {
                domain: {"acknowledged": ledgers[domain].acked, **asdict(t)}
                for domain, t in totals.items()
            },
            "scans": {
                "ok": sum(p.scans for p in everyone),
                "skipped": sum(p.scans_skipped for p in everyone),
                "mismatched": len(scans_bad),
            },
            "workers": {proc.name: proc.summary() for proc in everyone},
            "growth": {name: asdict(g) for name, g in growths.items() if g.samples},
            "grew": grew,
            "harness_grew": harness_grew,
            "problems": self.problems,
            "takeover_failure": self.takeover_failure,
            "interrupted": interrupted,
            "harness_error": harness_error,
            "out": str(self.out),
            "csv": str(self.out / "samples.csv"),
        }
        if scans_bad:
            self.problems.append(f"scans at one timestamp gave different rows: {scans_bad[:5]}")
        bad = (
            report["lost"]
            or report["duplicated"]
            or report["in_doubt_resolved"]["torn"]
            or report["phantom_rows"]
            or grew
            or self.problems
        )
        report["exit"] = 2 if harness_error or interrupted else (1 if bad else 0)
        return report


def _arrays(table: Any) -> tuple[np.ndarray, np.ndarray]:
    ids = table.column("id").to_numpy().astype(np.int64)
    values = table.column("v").to_numpy().astype(np.int64)
    return ids, values


# --- the chart -----------------------------------------------------------------------------------


def chart(soak: Soak, path: Path, deps_dir: str) -> str:
    """samples.png (matplotlib, installed into `deps_dir` when missing); what happened."""
    if not soak.samples:
        return "skipped: no samples"
    try:
        plt = _pyplot(deps_dir)
    except Exception as exc:
        return f"skipped: matplotlib unavailable ({exc})"
    times_min = [float(row["t_s"] or 0.0) / 60 for row in soak.samples]
    figure, axes = plt.subplots(4, 1, figsize=(14, 14), sharex=True)
    panels: list[tuple[str, list[tuple[str, str, float]]]] = [
        ("RSS (MiB)", [(label, f"{label}_rss_mib", 1.0) for label in PROCESS_LABELS]),
        ("open fds", [(label, f"{label}_fds", 1.0) for label in PROCESS_LABELS]),
        (
            "retained WAL",
            [
                ("logsvc shard entries", "logsvc_retained_entries", 1.0),
                ("embedded WAL (KiB)", "embedded_wal_bytes", 1 / 1024),
            ],
        ),
        (
            "objects (files)",
            [("TN objects", "tn_objects", 1.0), ("embedded objects", "embedded_objects", 1.0)],
        ),
    ]
    for ax, (title, lines) in zip(axes, panels, strict=True):
        for label, column, scale in lines:
            values = [
                None if row.get(column) is None else float(row[column] or 0) * scale
                for row in soak.samples
            ]
            if any(v is not None for v in values):
                ax.plot(times_min, [float("nan") if v is None else v for v in values], label=label)
        for at_s, _ in soak.kill_times:
            ax.axvline(at_s / 60, color="grey", linestyle=":", linewidth=0.8)
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    for at_s, kind in soak.kill_times:
        axes[0].annotate(
            kind,
            (at_s / 60, 1.0),
            xycoords=("data", "axes fraction"),
            fontsize=6,
            rotation=90,
            va="top",
        )
    axes[-1].set_xlabel("minutes since start (dotted: kill -9)")
    figure.suptitle(f"engine soak: {soak.args.minutes} min, kills {dict(soak.kills)}")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return str(path)


def _pyplot(deps_dir: str) -> Any:
    os.makedirs(deps_dir, exist_ok=True)
    if deps_dir not in sys.path:
        sys.path.append(deps_dir)  # last: the venv's own numpy etc. stay first
        importlib.invalidate_caches()
    if importlib.util.find_spec("matplotlib") is None:
        say(f"matplotlib missing: pip install {MATPLOTLIB_PIN} into {deps_dir}")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--quiet",
                "--target",
                deps_dir,
                MATPLOTLIB_PIN,
            ],
            capture_output=True,
            text=True,
            timeout=INSTALL_WAIT_S_MAX,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            raise RuntimeError(" ".join((done.stderr or done.stdout).strip().splitlines()[-2:]))
        importlib.invalidate_caches()
    matplotlib = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


# --- main ----------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak.engine_soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--kill-every-s", type=float, default=120.0)
    parser.add_argument("--kinds", default=",".join(KINDS), help="what may be killed")
    parser.add_argument("--out", help="output directory (default: soak-out/<UTC time>)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--shards", type=int, default=1, help="shards of the dev-cluster")
    parser.add_argument("--sample-every-s", type=float, default=10.0)
    parser.add_argument("--checkpoint-ms", type=int, default=30_000, help="the TNs' checkpoints")
    parser.add_argument("--pace-s", type=float, default=0.05, help="each writer's pause")
    parser.add_argument("--large-every-s", type=float, default=90.0)
    parser.add_argument("--cn-large-rows", type=int, default=worker.CHUNK_ROWS_MAX)
    parser.add_argument("--embedded-large-rows", type=int, default=200_000)
    parser.add_argument("--deps-dir", default=DEPS_DIR_DEFAULT, help="matplotlib goes here")
    parser.add_argument("--no-chart", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.kinds = tuple(k for k in args.kinds.split(",") if k)
    if not set(args.kinds) <= set(KINDS) or not args.kinds:
        print(f"error: --kinds is a comma-separated subset of {','.join(KINDS)}", file=sys.stderr)
        return 2
    if args.minutes <= 0 or args.kill_every_s <= 0 or args.sample_every_s <= 0:
        print("error: --minutes, --kill-every-s, --sample-every-s must be > 0", file=sys.stderr)
        return 2
    if args.cn_large_rows > worker.CHUNK_ROWS_MAX:
        print(
            f"error: --cn-large-rows at most {worker.CHUNK_ROWS_MAX} (the CN workspace)",
            file=sys.stderr,
        )
        return 2
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
    if args.out is None:
        args.out = os.path.join("soak-out", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    os.makedirs(args.out, exist_ok=True)
    # Every process this starts imports this tree's code.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    soak = Soak(args)
    harness_error: str | None = None
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        asyncio.run(soak.run())
    except RunEnded:
        pass  # recorded as a problem
    except KeyboardInterrupt:
        interrupted = True
        say("interrupted: stopping every process")
    except Exception as exc:
        harness_error = f"{exc!r}"
        traceback.print_exc()
    finally:
        signal.signal(signal.SIGTERM, previous)
        with _no_interrupts():
            soak.stop_everything()
    report = soak.report(harness_error, interrupted)
    report["chart"] = (
        "skipped: --no-chart"
        if args.no_chart
        else chart(soak, soak.out / "samples.png", args.deps_dir)
    )
    line = json.dumps(report, separators=(",", ":"))
    (soak.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(line, flush=True)
    return int(report["exit"])


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """Ctrl-C while everything is being stopped would leave processes behind: ignored."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    sys.exit(main())
