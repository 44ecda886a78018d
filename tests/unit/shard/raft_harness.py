"""An in-process cluster of real pysyncobj replicas on loopback, for the Raft tests.

Each replica has its own shard store (on a `FaultFS` when power loss is simulated, on real
files otherwise), its own snapshot file and a recording handler. Waits are polls bounded in
time, never fixed sleeps; every replica is stopped by `close()` whatever happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logsvc.shard import scheduler
from logsvc.shard.liveness import NodeLiveness
from logsvc.shard.raft.config import FailReason, RaftConfig
from logsvc.shard.raft.node import RaftNode
from logsvc.shard.raft.patches import monotonic_s
from logsvc.store import ShardStore, StoreLimits
from logsvc.store.fs import FileSystem
from logsvc.store.journal import JOURNAL_DIR_NAME, NodeJournal
from tests.support.faultfs import FaultFS

WAIT_S_MAX = 20.0
SECRET = "test-cluster-secret"
# Syncs happen only when the Raft layer asks: a missing sync shows up as lost data.
LIMITS = StoreLimits(group_commit_delay_ms_max=3_600_000)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: every probe stays bound until all are chosen (one at
    a time, the kernel may hand out the same port twice: two replicas, one directory)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [int(probe.getsockname()[1]) for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def wait_until(condition: Callable[[], bool], what: str, seconds: float = WAIT_S_MAX) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds} s waiting for {what}")
        time.sleep(0.01)


class RecordingHandler:
    """Applies opaque commands: remembers (raft_index, bytes); snapshots are not used."""

    def __init__(self) -> None:
        self.applied: list[tuple[int, bytes]] = []
        self.lock = threading.Lock()

    def apply(self, raft_index: int, encoded: bytes) -> object:
        with self.lock:
            assert not self.applied or raft_index > self.applied[-1][0]
            self.applied.append((raft_index, encoded))
        return raft_index

    def compaction_point(self) -> tuple[int, bytes] | None:
        return None

    def install_snapshot(self, raft_index: int, state: bytes) -> None:
        raise AssertionError("no snapshots in these tests")

    def commands(self) -> list[bytes]:
        with self.lock:
            return [encoded for _, encoded in self.applied]


@dataclass
class Replica:
    address: str
    dir_path: str
    fs: FileSystem
    store: ShardStore | None = None
    node: RaftNode | None = None
    handler: RecordingHandler = field(default_factory=RecordingHandler)


class Cluster:
    def __init__(
        self,
        base_dir: str,
        size: int = 3,
        *,
        fault_fs: bool = False,
        raft_overrides: dict[str, int] | None = None,
    ) -> None:
        self.raft_overrides = dict(raft_overrides or {})  # RaftConfig fields, for every replica
        addresses = [f"127.0.0.1:{port}" for port in free_ports(size)]
        self.replicas = [
            Replica(address, os.path.join(base_dir, f"r{i}"), FaultFS() if fault_fs else _os_fs())
            for i, address in enumerate(addresses)
        ]
        for replica in self.replicas:
            os.makedirs(replica.dir_path, exist_ok=True)

    def start(self, replica: Replica, *, secret: str = SECRET) -> None:
        replica.handler = RecordingHandler()
        replica.store = ShardStore.open(
            os.path.join(replica.dir_path, "journal"), fs=replica.fs, limits=LIMITS
        )
        peers = tuple(r.address for r in self.replicas if r is not replica)
        config = RaftConfig(
            self_address=replica.address,
            peers=peers,
            secret=secret,
            snapshot_path=os.path.join(replica.dir_path, "snapshot"),
            election_timeout_ms_min=400,
            election_timeout_ms_max=900,
            heartbeat_ms=50,
            leader_fallback_ms=2000,
        )
        config = dataclasses.replace(config, **self.raft_overrides)  # type: ignore[arg-type]
        replica.node = RaftNode(config, replica.store, replica.handler)
        replica.node.start()

    def start_all(self) -> None:
        for replica in self.replicas:
            self.start(replica)

    def stop(self, replica: Replica) -> None:
        if replica.node is not None:
            replica.node.stop()
            replica.node = None
        if replica.store is not None:
            replica.store.close()
            replica.store = None

    def kill(self, replica: Replica) -> None:
        """kill -9: stop ticking and abandon the store; nothing more reaches the disk."""
        if replica.node is not None:
            replica.node.stop()
            replica.node = None
        if replica.store is not None:
            replica.store.abandon()
            replica.store = None

    def close(self) -> None:
        for replica in self.replicas:
            self.stop(replica)

    def leader(self) -> Replica:
        found: list[Replica] = []

        def one_leader() -> bool:
            found[:] = [r for r in self.replicas if r.node is not None and r.node.is_leader]
            return len(found) == 1

        wait_until(one_leader, "exactly one leader")
        return found[0]

    def propose(self, commands: list[bytes]) -> dict[bytes, int]:
        """Propose on the leader; return the commands acknowledged (applied on the leader),
        with the fail reason of the others left out."""
        leader = self.leader()
        assert leader.node is not None
        outcomes: dict[bytes, int] = {}
        done = threading.Event()
        lock = threading.Lock()

        def callback_for(command: bytes) -> Callable[[object, int], None]:
            def callback(_result: object, reason: int) -> None:
                with lock:
                    outcomes[command] = reason
                    if len(outcomes) == len(commands):
                        done.set()

            return callback

        for command in commands:
            leader.node.propose(command, callback_for(command))
        done.wait(WAIT_S_MAX)
        return {c: r for c, r in outcomes.items() if r == FailReason.SUCCESS}


def propose_one(replica: RaftNode, command: bytes, seconds: float = WAIT_S_MAX) -> int:
    """Propose `command` on `replica` and return its fail reason (SUCCESS once applied);
    fails the test if no answer comes within `seconds`."""
    done = threading.Event()
    reasons: list[int] = []

    def callback(_result: object, reason: int) -> None:
        reasons.append(reason)
        done.set()

    replica.propose(command, callback)
    assert done.wait(seconds), "no answer to a proposal"
    return reasons[0]


def _os_fs() -> FileSystem:
    from logsvc.store.fs import OsFileSystem

    return OsFileSystem()


@dataclass(frozen=True, slots=True)
class ShardGrid:
    """`shards` shards with a replica on each of `nodes`: `replicas[(node, shard)]`, each at
    `address[(node, shard)]`; `node_of[address]` names a replica's node."""

    address: dict[tuple[str, int], str]
    node_of: dict[str, str]
    replicas: dict[tuple[str, int], RaftNode]
    liveness: dict[str, NodeLiveness]  # node -> the table its replicas share

    def leaders(self) -> dict[int, RaftNode]:
        return {s: r for (_, s), r in self.replicas.items() if r.is_leader}


def grid_addresses(nodes: Sequence[str], shards: int) -> dict[tuple[str, int], str]:
    """A free loopback Raft address for each (node, shard)."""
    ports = free_ports(len(nodes) * shards)
    return {
        (n, s): f"127.0.0.1:{ports[i * shards + s]}"
        for i, n in enumerate(nodes)
        for s in range(shards)
    }


@contextlib.contextmanager
def shard_grid(
    base: Path,
    nodes: Sequence[str],
    shards: int,
    *,
    node_journals: bool = False,
    address: dict[tuple[str, int], str] | None = None,
    dial_overrides: dict[str, dict[str, str]] | None = None,
    **config: Any,
) -> Iterator[ShardGrid]:
    """Nodes as a node process runs them, on loopback: one `RaftScheduler` each (one worker,
    a 2 s liveness lapse: longer than a node's 1 s, so that a worker starved on a loaded
    machine does not lapse a live node), with `node_journals` one `NodeJournal` each that
    every store of the node writes through; each shard a replica on every node (`config`:
    RaftConfig fields beyond the addresses). `address`: the replicas' addresses
    (`grid_addresses`; default: fresh ones); `dial_overrides`: node -> the addresses its
    replicas dial instead (a proxy mesh's `dial_map`). Everything is stopped and closed on
    exit."""
    if address is None:
        address = grid_addresses(nodes, shards)
    assert set(address) == {(n, s) for n in nodes for s in range(shards)}
    dials = dial_overrides or {}
    node_of = {a: n for (n, _), a in address.items()}
    now = monotonic_s()
    scheds = {
        n: scheduler.RaftScheduler(
            NodeLiveness(n, interval_s=0.1, lapse_s=2.0, now_s=now),
            lambda a: node_of.get(a, a),
            workers=1,
            reconnect_s=1.0,
            clock=monotonic_s,
        )
        for n in nodes
    }
    journals: dict[str, NodeJournal] = {}
    replicas: dict[tuple[str, int], RaftNode] = {}
    stores: list[ShardStore] = []
    try:
        for n in nodes:
            os.makedirs(base / n)
            if node_journals:
                journals[n] = NodeJournal.open(
                    str(base / n / JOURNAL_DIR_NAME), base_dir=str(base / n), store_limits=LIMITS
                )
            scheds[n].start()
        for (n, s), own in address.items():
            path = base / n / str(s)
            os.makedirs(path)
            store = ShardStore.open(str(path / "journal"), limits=LIMITS, journal=journals.get(n))
            stores.append(store)
            raft_config = RaftConfig(
                self_address=own,
                peers=tuple(address[(m, s)] for m in nodes if m != n),
                secret=SECRET,
                snapshot_path=str(path / "snapshot"),
                dial_overrides=tuple(sorted(dials.get(n, {}).items())),
                **config,
            )
            replicas[(n, s)] = RaftNode(
                raft_config, store, RecordingHandler(), raft_scheduler=scheds[n]
            )
            replicas[(n, s)].start()
        yield ShardGrid(address, node_of, replicas, {n: s.liveness for n, s in scheds.items()})
    finally:
        for replica in replicas.values():
            replica.stop()
        for sched in scheds.values():
            sched.close()
        for store in stores:
            store.close()
        for journal in journals.values():
            journal.close()
