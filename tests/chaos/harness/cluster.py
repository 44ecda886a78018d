"""Real logsvc node processes on loopback for the chaos suite (chaos-plan.md §4.2, §4.4).

`Cluster` writes one config per node (the dev cluster's generator, `logsvc.devcluster`, with
the chaos Raft timings below), starts each node in its own session (so its process group is
its PID), and controls it by PID only: SIGKILL (crash), SIGSTOP/SIGCONT (pause), SIGTERM
(graceful stop), a whole-cluster kill + restart within about 100 ms. Each start can carry
extra environment (failpoints, libfaketime); every start appends to the node's log file
under the run directory, and the node's Raft events go to `events/<node>.jsonl`
(LOGSVC_EVENT_LOG) when the node build supports it.

Leader discovery goes through the product: the data plane's `Status` answered by each node
about itself (`is_leader`, `term`), never through anything the harness infers.

`close()` is the teardown that must run in a `finally`: SIGCONT then SIGKILL every process
group this object started, and wait for each (bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from logsvc import devcluster
from logsvc.client import Client, ClientOptions, LogsvcError, connect
from logsvc.devcluster import NodePorts
from logsvc.wire.messages import ShardStatus
from tests.chaos.harness.artifacts import env_journal
from tests.chaos.history import RaftEvent, read_jsonl

T = TypeVar("T")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

# Plan §4.2: pysyncobj-like defaults, slightly raised so that a loaded 2-core box does not
# churn elections. Safety never depends on these; the liveness windows do.
CHAOS_RAFT_MS: dict[str, int] = {
    "election_timeout_ms_min": 800,
    "election_timeout_ms_max": 2000,
    "heartbeat_ms": 100,
    "leader_fallback_ms": 4000,
    "connection_timeout_ms": 2000,
}

CHAOS_EXTRA_CONFIG = "[limits.store]\nsegment_bytes_max = 262144\n"

STOP_WAIT_S_MAX = 15.0  # SIGTERM -> exit; then SIGKILL
KILL_WAIT_S_MAX = 10.0  # SIGKILL -> reaped (a process in D state may take a moment)
PROBE_TIMEOUT_S = 1.0  # one status probe of one node
READY_WAIT_S_MAX = 60.0
NODE_MAIN = os.path.join(REPO_ROOT, "tests", "chaos", "harness", "node_main.py")


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: int = 3
    shards: int = 1
    replicas: int = 3  # per shard; 3 or 5
    raft_ms: Mapping[str, int] = field(default_factory=lambda: dict(CHAOS_RAFT_MS))
    use_ledger: bool = True  # node_main with a durability ledger, when that module exists
    # Appended to every node's config. Small segments, so that a short run has sealed
    # segments to corrupt (C7) and whole segments for truncation to delete (C8).
    extra_config: str = CHAOS_EXTRA_CONFIG


@dataclass(slots=True)
class Incarnation:
    """One run of a node process: [start_ns, end_ns] on the harness's monotonic clock."""

    number: int
    start_ns: int
    end_ns: int | None
    event_log_path: str
    faketime: str | None  # the FAKETIME spec it ran with, if any

    def read_events(self) -> tuple[list[RaftEvent], bool]:
        """Its events; under libfaketime with a rate, the node's monotonic clock is faked
        (clock.py), so its times are mapped back onto the real clock: the first event at
        the start, the rest at 1/rate, clamped into [start, end] (order kept). Returns
        (events, whether they were remapped)."""
        if not os.path.exists(self.event_log_path):
            return [], False
        events = read_jsonl([self.event_log_path]).events
        end_ns = self.end_ns if self.end_ns is not None else time.monotonic_ns()
        slack_ns = 5_000_000_000
        if all(self.start_ns - slack_ns <= e.time_ns <= end_ns + slack_ns for e in events):
            return events, False
        rate = 1.0
        if self.faketime and " x" in self.faketime:
            rate = float(self.faketime.rpartition(" x")[2])
        first_ns = min(e.time_ns for e in events)
        mapped = []
        for event in events:
            real_ns = self.start_ns + int((event.time_ns - first_ns) / rate)
            real_ns = min(max(real_ns, self.start_ns), end_ns)
            mapped.append(dataclasses.replace(event, time_ns=real_ns))
        return mapped, True


@dataclass(slots=True)
class NodeProc:
    node_id: str
    ports: NodePorts
    config_path: str
    data_dir: str
    log_path: str
    events_dir: str
    ledger_path: str
    env: dict[str, str] = field(default_factory=dict)  # for every start (e.g. the dial map)
    popen: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0
    log_offset: int = 0  # where the current incarnation's output starts in log_path
    last_returncode: int | None = None
    incarnations: list[Incarnation] = field(default_factory=list)
    popen_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. its own gid (netns)

    @property
    def data_address(self) -> str:
        return f"127.0.0.1:{self.ports.data}"

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def shard_data_dir(self, shard: int) -> str:
        return os.path.join(self.data_dir, "shards", str(shard))


class Cluster:
    def __init__(self, run_dir: str, spec: ClusterSpec) -> None:
        assert spec.replicas in (3, 5)
        assert spec.replicas <= spec.nodes
        self.run_dir = run_dir
        self.spec = spec
        self.cluster_dir = os.path.join(run_dir, "cluster")
        self.logs_dir = os.path.join(run_dir, "logs")
        self.events_dir = os.path.join(run_dir, "events")
        for path in (self.cluster_dir, self.logs_dir, self.events_dir):
            os.makedirs(path, exist_ok=True)
        devcluster._write_private(
            os.path.join(self.cluster_dir, "secret"), "chaos-secret-" + os.urandom(12).hex()
        )
        self.token = "chaos-token-" + os.urandom(12).hex()
        devcluster._write_private(os.path.join(self.cluster_dir, "token"), self.token)
        ports = devcluster._allocate(spec.nodes, spec.shards)
        self.nodes: dict[str, NodeProc] = {}
        for node in ports:
            config_path = os.path.join(self.cluster_dir, f"{node.node_id}.toml")
            text = devcluster._node_config(
                node,
                ports,
                spec.shards,
                replica_count=spec.replicas,
                raft_ms=dict(spec.raft_ms),
                journal=env_journal(),
            )
            devcluster._write_private(config_path, text + "\n" + spec.extra_config)
            self.nodes[node.node_id] = NodeProc(
                node_id=node.node_id,
                ports=node,
                config_path=config_path,
                data_dir=os.path.join(self.cluster_dir, node.node_id),
                log_path=os.path.join(self.logs_dir, f"{node.node_id}.log"),
                events_dir=self.events_dir,
                ledger_path=os.path.join(self.cluster_dir, f"{node.node_id}.ledger"),
            )
        self.replicas_of: dict[int, list[str]] = {
            shard: [ports[(shard - 1 + i) % len(ports)].node_id for i in range(spec.replicas)]
            for shard in range(1, spec.shards + 1)
        }
        # Replicas that refused to start on detected corruption and were left down (an
        # operator would rebuild them): no restart, no convergence poll, no dump.
        self.quarantined: set[str] = set()
        self._prober = _Prober(self.token)

    # ------------------------------------------------------------------ addresses

    @property
    def node_ids(self) -> list[str]:
        return list(self.nodes)

    @property
    def shards(self) -> list[int]:
        return list(self.replicas_of)

    def data_addresses(self) -> list[str]:
        return [node.data_address for node in self.nodes.values()]

    def node_of_address(self, data_address: str) -> str | None:
        for node in self.nodes.values():
            if node.data_address == data_address:
                return node.node_id
        return None

    def raft_address(self, node_id: str, shard: int) -> str:
        return f"127.0.0.1:{self.nodes[node_id].ports.raft_base + shard}"

    def uses_node_main(self) -> bool:
        return self.spec.use_ledger and os.path.exists(NODE_MAIN)

    # ------------------------------------------------------------------ processes

    def start(self, node_id: str, extra_env: Mapping[str, str] | None = None) -> int:
        """Start (or restart) one node; returns its PID (= its process group)."""
        node = self.nodes[node_id]
        assert not node.running(), f"{node_id} is running"
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env.update(node.env)
        env.update(extra_env or {})
        if self.uses_node_main():
            command = [sys.executable, "-m", "tests.chaos.harness.node_main"]
            command += ["--config", node.config_path, "--ledger", node.ledger_path]
        else:
            command = [sys.executable, "-m", "logsvc.cli", "serve", "--config", node.config_path]
        node.starts += 1
        # One event log per incarnation: a clock-skewed one needs its times mapped back.
        event_log = os.path.join(node.events_dir, f"{node_id}-{node.starts:03d}.jsonl")
        env["LOGSVC_EVENT_LOG"] = event_log
        shown = {k: v for k, v in {**node.env, **(extra_env or {})}.items()}
        with open(node.log_path, "ab") as log:
            header = f"=== harness: start #{node.starts} at {time.monotonic_ns()} env={shown}\n"
            log.write(header.encode())
            log.flush()
            node.log_offset = log.tell()
            node.popen = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: signals reach it whole
                **node.popen_kwargs,
            )
        node.paused = False
        node.incarnations.append(
            Incarnation(node.starts, time.monotonic_ns(), None, event_log, env.get("FAKETIME"))
        )
        return node.popen.pid

    def start_all(self, extra_env: Mapping[str, Mapping[str, str]] | None = None) -> None:
        for node_id in self.nodes:
            if not self.nodes[node_id].running() and node_id not in self.quarantined:
                self.start(node_id, (extra_env or {}).get(node_id))

    def kill(self, node_id: str) -> int | None:
        """SIGKILL (crash) and reap; returns the exit status (-9 when the kill did it)."""
        node = self.nodes[node_id]
        if node.popen is None:
            return node.last_returncode
        if node.popen.poll() is None:
            _signal_group(node.popen.pid, signal.SIGKILL)
            _signal_group(node.popen.pid, signal.SIGCONT)  # a stopped process dies too
        return self._reap(node, KILL_WAIT_S_MAX)

    def terminate(self, node_id: str, wait_s: float = STOP_WAIT_S_MAX) -> int | None:
        """SIGTERM (graceful), SIGKILL after `wait_s`; returns the exit status."""
        node = self.nodes[node_id]
        if node.popen is None:
            return node.last_returncode
        if node.popen.poll() is None:
            _signal_group(node.popen.pid, signal.SIGCONT)
            _signal_group(node.popen.pid, signal.SIGTERM)
            try:
                node.popen.wait(wait_s)
            except subprocess.TimeoutExpired:
                _signal_group(node.popen.pid, signal.SIGKILL)
        return self._reap(node, KILL_WAIT_S_MAX)

    def terminate_all(self, wait_s: float = STOP_WAIT_S_MAX) -> dict[str, int | None]:
        """SIGTERM every node at once (one signal each: a second one could land after the
        node removed its handler and kill it mid-shutdown), SIGKILL after `wait_s`."""
        for node in self.nodes.values():
            if node.running():
                assert node.popen is not None
                _signal_group(node.popen.pid, signal.SIGCONT)
                _signal_group(node.popen.pid, signal.SIGTERM)
                node.paused = False
        deadline = time.monotonic() + wait_s
        statuses: dict[str, int | None] = {}
        for node_id, node in self.nodes.items():
            if node.popen is None:
                statuses[node_id] = node.last_returncode
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.popen.wait(max(0.1, deadline - time.monotonic()))
            statuses[node_id] = self.kill(node_id)  # reaps; SIGKILL only if still running
        return statuses

    def pause(self, node_id: str) -> bool:
        """SIGSTOP; True when /proc shows the process stopped."""
        node = self.nodes[node_id]
        assert node.popen is not None and node.running(), f"{node_id} is not running"
        _signal_group(node.popen.pid, signal.SIGSTOP)
        node.paused = True
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if process_state(node.popen.pid) in ("T", "t"):
                return True
            time.sleep(0.01)
        return False

    def resume(self, node_id: str) -> bool:
        node = self.nodes[node_id]
        node.paused = False
        if node.popen is None or not node.running():
            return False
        _signal_group(node.popen.pid, signal.SIGCONT)
        return True

    def kill_all_and_restart(
        self, extra_env: Mapping[str, Mapping[str, str]] | None = None
    ) -> tuple[dict[str, int | None], float]:
        """Whole-cluster crash: SIGKILL every node, then start them all at once. Returns
        the exit statuses and the spread (seconds) between the first and last start."""
        statuses = self.kill_all()
        started = []
        for node_id in self.nodes:
            started.append(time.monotonic())
            self.start(node_id, (extra_env or {}).get(node_id))
        return statuses, started[-1] - started[0]

    def kill_all(self) -> dict[str, int | None]:
        for node in self.nodes.values():
            if node.running():
                assert node.popen is not None
                _signal_group(node.popen.pid, signal.SIGKILL)
                _signal_group(node.popen.pid, signal.SIGCONT)
        return {node_id: self._reap(node, KILL_WAIT_S_MAX) for node_id, node in self.nodes.items()}

    def _reap(self, node: NodeProc, wait_s: float) -> int | None:
        assert node.popen is not None
        try:
            node.popen.wait(wait_s)
        except subprocess.TimeoutExpired:
            _signal_group(node.popen.pid, signal.SIGKILL)
            node.popen.wait(wait_s)
        node.last_returncode = node.popen.returncode
        if node.incarnations and node.incarnations[-1].end_ns is None:
            node.incarnations[-1].end_ns = time.monotonic_ns()
        node.paused = False
        return node.last_returncode

    def close(self) -> None:
        """Teardown (run it in a finally): SIGCONT then SIGKILL every process group this
        object started, and wait for each (bounded)."""
        try:
            for node in self.nodes.values():
                if node.popen is not None and node.popen.poll() is None:
                    _signal_group(node.popen.pid, signal.SIGCONT)
                    _signal_group(node.popen.pid, signal.SIGKILL)
            for node in self.nodes.values():
                if node.popen is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        node.popen.wait(KILL_WAIT_S_MAX)
                    # Children of the node (none today) live in its group: kill it again.
                    _signal_group(node.popen.pid, signal.SIGKILL)
        finally:
            self._prober.close()

    def disconnect_probes(self) -> None:
        self._prober.disconnect()

    def online_dump(self, node_id: str, shard: int) -> tuple[int, list[bytes]]:
        return self._prober.read_all(self.nodes[node_id].data_address, shard)

    def read_events(self) -> tuple[list[RaftEvent], list[str]]:
        """Every node's Raft events (all incarnations), and which incarnations' times had
        to be mapped back from a faked clock."""
        events: list[RaftEvent] = []
        remapped: list[str] = []
        for node in self.nodes.values():
            for incarnation in node.incarnations:
                got, moved = incarnation.read_events()
                events.extend(got)
                if moved:
                    remapped.append(f"{node.node_id}#{incarnation.number}")
        return events, remapped

    def running_nodes(self) -> list[str]:
        return [n for n, node in self.nodes.items() if node.running() and not node.paused]

    def log_since_start(self, node_id: str) -> str:
        """The current (or last) incarnation's output."""
        node = self.nodes[node_id]
        try:
            with open(node.log_path, "rb") as f:
                f.seek(node.log_offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def failpoint_hits(self, node_id: str) -> list[str]:
        """`FAILPOINT <name> <action>` lines of the current incarnation."""
        return [
            line.strip()
            for line in self.log_since_start(node_id).splitlines()
            if line.startswith("FAILPOINT ")
        ]

    # ------------------------------------------------------------------ product views

    def status(self, node_id: str, shard: int) -> ShardStatus | None:
        """The node's own view of the shard (None: not running, paused or not answering)."""
        node = self.nodes[node_id]
        if not node.running() or node.paused:
            return None
        return self._prober.status(node.data_address, shard)

    def statuses(self, shard: int) -> dict[str, ShardStatus | None]:
        """Every replica's own view of the shard, probed at once: a replica that does not
        answer (a cut-off leader, whose status waits on a barrier that cannot commit) costs
        one probe timeout for the round, not one before each replica after it. Probed one
        after another, an isolated leader listed first took ~1-3 s of each round, so the
        new leader was asked at most once or twice in a 4.5 s `wait_leader` (chaos C4, the
        one-way partition), and each round overran that deadline by the stale probes."""
        node_ids = [n for n in self.replicas_of[shard] if n not in self.quarantined]
        reachable = {
            node_id: self.nodes[node_id].data_address
            for node_id in node_ids
            if self.nodes[node_id].running() and not self.nodes[node_id].paused
        }
        answers = self._prober.statuses(list(reachable.values()), shard)
        return {
            node_id: answers.get(reachable[node_id]) if node_id in reachable else None
            for node_id in node_ids
        }

    def leader(self, shard: int) -> tuple[str, int] | None:
        """(node, term) of the replica that says it leads the shard, highest term first."""
        claims = [
            (status.term, node_id)
            for node_id, status in self.statuses(shard).items()
            if status is not None and status.is_leader
        ]
        if not claims:
            return None
        term, node_id = max(claims)
        return node_id, term

    def wait_leader(
        self, shard: int, timeout_s: float, *, not_node: str | None = None, term_above: int = -1
    ) -> tuple[str, int] | None:
        """Poll (bounded) until a running replica leads the shard (optionally another node
        than `not_node`, or in a term above `term_above`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.leader(shard)
            if found is not None and found[0] != not_node and found[1] > term_above:
                return found
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)

    def wait_ready(self, timeout_s: float = READY_WAIT_S_MAX) -> None:
        """Every running node's data plane listens, then every shard has a leader."""
        deadline = time.monotonic() + timeout_s
        for node_id in self.running_nodes():
            node = self.nodes[node_id]
            while not listening(node.ports.data):
                if not node.running():
                    raise RuntimeError(
                        f"{node_id} exited ({node.popen.returncode if node.popen else None}) "
                        f"while starting; see {node.log_path}"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{node_id} is not listening after {timeout_s} s")
                time.sleep(0.05)
        for shard in self.shards:
            if self.wait_leader(shard, max(0.0, deadline - time.monotonic())) is None:
                raise TimeoutError(f"shard {shard} has no leader after {timeout_s} s")

    def describe(self) -> dict[str, Any]:
        return {
            "nodes": {
                n: {
                    "data": node.data_address,
                    "admin": f"127.0.0.1:{node.ports.admin}",
                    "raft_base": node.ports.raft_base,
                    "pid": node.popen.pid if node.popen else None,
                }
                for n, node in self.nodes.items()
            },
            "replicas_of": self.replicas_of,
            "raft_ms": dict(self.spec.raft_ms),
            "node_main": self.uses_node_main(),
        }

    def write_description(self) -> None:
        with open(os.path.join(self.run_dir, "cluster.json"), "w") as f:
            json.dump(self.describe(), f, indent=2)


class _Prober:
    """Status probes of single nodes, from a private event loop thread (the harness is
    synchronous). One client per node address, one short attempt per probe."""

    OPTIONS = ClientOptions(
        request_timeout_s=PROBE_TIMEOUT_S,
        retry_s_max=PROBE_TIMEOUT_S,
        attempts_max=1,
        backoff_s_first=0.0,
        connect_timeout_s=PROBE_TIMEOUT_S,
    )

    def __init__(self, token: str) -> None:
        self._token = token
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._clients: dict[str, Client] = {}

    def _run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout_s)

    def status(self, address: str, shard: int) -> ShardStatus | None:
        return self.statuses([address], shard)[address]

    def statuses(self, addresses: list[str], shard: int) -> dict[str, ShardStatus | None]:
        """One probe of each address, all at once on the prober's loop (None: no answer)."""

        async def probe(address: str) -> ShardStatus | None:
            try:
                client = self._clients.get(address)
                if client is None:
                    client = await connect([address], self._token, options=self.OPTIONS)
                    self._clients[address] = client
                return await asyncio.wait_for(client.status(shard), 3 * PROBE_TIMEOUT_S)
            except (LogsvcError, OSError, TimeoutError):
                return None

        async def probe_all() -> dict[str, ShardStatus | None]:
            answers = await asyncio.gather(*(probe(address) for address in addresses))
            return dict(zip(addresses, answers, strict=True))

        try:
            return self._run(probe_all(), 5 * PROBE_TIMEOUT_S)
        except TimeoutError:
            return dict.fromkeys(addresses)

    def read_all(self, address: str, shard: int) -> tuple[int, list[bytes]]:
        """(first LSN, every committed record) as one node serves them (an online dump,
        for when the offline reader is not available)."""

        async def read() -> tuple[int, list[bytes]]:
            client = await connect([address], self._token, options=self.OPTIONS)
            try:
                status = await client.status(shard)
                records: list[bytes] = []
                lsn = status.first_lsn
                while lsn < status.next_lsn:
                    page = await client.read(shard, lsn, 1 << 20)
                    if not page.records:
                        break
                    records.extend(page.records)
                    lsn = page.next_lsn
                return status.first_lsn, records
            finally:
                await client.close()

        return self._run(read(), 60.0)

    def disconnect(self) -> None:
        """Close the probe connections (a node's graceful stop waits for its clients)."""

        async def close_all() -> None:
            clients, self._clients = list(self._clients.values()), {}
            for client in clients:
                with contextlib.suppress(Exception):
                    await client.close()

        with contextlib.suppress(Exception):
            self._run(close_all(), 5.0)

    def close(self) -> None:
        async def close_all() -> None:
            for client in self._clients.values():
                with contextlib.suppress(Exception):
                    await client.close()

        with contextlib.suppress(Exception):
            self._run(close_all(), 5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        if not self._thread.is_alive():
            self._loop.close()


def process_state(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat (R, S, D, T, Z...), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text.rpartition(")")[2].split()[0]


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)
