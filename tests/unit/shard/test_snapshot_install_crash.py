"""A snapshot installation cut by a power loss at any of its sync points restarts into the
snapshot's state and configuration, never into a replica that cannot tell its members.

Found by chaos C8 (seed 2): a follower installed a received snapshot, its members file
(rewritten durably for the snapshot's configuration) reached the disk, the journal's two
new entries did not (the new segment's name was not durable yet), and the power went: at
restart the members file named a configuration at the snapshot's raft index that the log
did not hold, and the replica stopped for good ("no configuration ... matches its log").
The snapshot itself was durable before any of this, so the configuration it carries is
committed state: the restart must finish the installation.

The installation at start (a snapshot ahead of the journal) runs the same code as one
received from a leader, so the test starts a replica on such a snapshot under a tracing
`FaultFS` and restarts it from every crash state of that run.
"""

from __future__ import annotations

import random
from pathlib import Path

from logsvc.shard import snapshot_file
from logsvc.shard.raft.node import RaftNode
from logsvc.store import Entry, ShardStore
from tests.support.faultfs import FaultFS

from .raft_harness import LIMITS, RecordingHandler, wait_until
from .test_raft_fixes import NO_OP, config

SNAPSHOT_LAST = 10


class SnapshotHandler(RecordingHandler):
    def __init__(self) -> None:
        super().__init__()
        self.installed: list[int] = []

    def install_snapshot(self, raft_index: int, state: bytes) -> None:
        self.installed.append(raft_index)


def _write_durably(fs: FaultFS, path: str, data: bytes) -> None:
    handle = fs.open_write(path, create=True)
    handle.write(data)
    handle.fdatasync()
    handle.close()
    fs.fsync_dir("/r")


def _run(
    fs: FaultFS, cfg_kwargs: dict[str, object]
) -> tuple[RaftNode, ShardStore, SnapshotHandler]:
    store = ShardStore.open("/r/journal", fs=fs, limits=LIMITS)
    handler = SnapshotHandler()
    node = RaftNode(config(Path("/r"), **cfg_kwargs), store, handler, file_system=fs)
    node.start()
    return node, store, handler


def _setup() -> tuple[FaultFS, dict[str, object], tuple[str, ...], bytes]:
    """A replica's files before the install: journal [1, 3] durable, members file as
    configured; and the snapshot to install, naming a member the replica never heard of."""
    base = config(Path("/r"))
    cluster = tuple(sorted((base.self_address, base.peers[0], "127.0.0.1:1")))
    cfg_kwargs: dict[str, object] = {"self_address": base.self_address, "peers": base.peers}
    fs = FaultFS()
    fs.makedirs("/r")
    store = ShardStore.open("/r/journal", fs=fs, limits=LIMITS)
    store.append([Entry(i, 1, NO_OP) for i in range(1, 4)])
    store.sync()
    RaftNode(config(Path("/r"), **cfg_kwargs), store, RecordingHandler(), file_system=fs).stop()
    store.close()
    snapshot = snapshot_file.SnapshotFile(
        last=snapshot_file.JournalEntry(SNAPSHOT_LAST, 2, NO_OP),
        prev=snapshot_file.JournalEntry(SNAPSHOT_LAST - 1, 2, NO_OP),
        cluster=cluster,
        state=b"state",
    )
    return fs, cfg_kwargs, cluster, snapshot_file.encode(snapshot)


def test_a_power_loss_anywhere_in_a_received_snapshots_install_restarts_into_it() -> None:
    fs, cfg_kwargs, cluster, encoded = _setup()
    store = ShardStore.open("/r/journal", fs=fs, limits=LIMITS)
    handler = SnapshotHandler()
    node = RaftNode(config(Path("/r"), **cfg_kwargs), store, handler, file_system=fs)
    try:
        fs.start_trace()
        # What pysyncobj does with a snapshot it received in full: the file renamed into
        # place (unsynced), then loaded with the journal cleared. Not started: the test's
        # thread is the tick.
        handle = fs.open_write("/r/snapshot", create=True)
        handle.write(encoded)
        handle.close()
        node._raft._SyncObj__loadDumpFile(clearJournal=True)
        assert handler.installed == [SNAPSHOT_LAST]
        assert node.members == cluster
        store.sync()
    finally:
        node.stop()
        store.close()
    _restart_from_every_crash_state(fs, cfg_kwargs, cluster, could_lack_snapshot=True)


def test_a_power_loss_anywhere_in_a_snapshot_install_restarts_into_the_snapshot() -> None:
    fs, cfg_kwargs, cluster, encoded = _setup()
    _write_durably(fs, "/r/snapshot", encoded)

    fs.start_trace()
    node, store, handler = _run(fs, cfg_kwargs)
    try:
        wait_until(lambda: handler.installed != [] or node.fatal is not None, "the install")
        assert node.fatal is None
        store.sync()
    finally:
        node.stop()
        store.close()
    _restart_from_every_crash_state(fs, cfg_kwargs, cluster, could_lack_snapshot=False)


def _restart_from_every_crash_state(
    fs: FaultFS, cfg_kwargs: dict[str, object], cluster: tuple[str, ...], could_lack_snapshot: bool
) -> None:
    """Every state a power loss could leave restarts either as before the install (only
    where the snapshot itself may be lost: `could_lack_snapshot`) or into the snapshot."""
    before = 0
    states = list(fs.crash_states(random.Random(11), 2, names=("revert", "keep")))
    assert len(states) > 5  # the install really went through several sync points
    for state in states:
        has_snapshot = state.exists("/r/snapshot")
        assert has_snapshot or could_lack_snapshot, state.crash_point
        node, store, handler = _run(state, cfg_kwargs)
        try:
            context = f"{state.crash_point}: {node.fatal}"
            if not has_snapshot:  # lost with the power before the install relied on it
                before += 1
                assert (store.first_index, store.last_index) == (1, 3), context
                assert node.members != cluster, context
                continue
            wait_until(
                lambda: handler.installed != [] or node.fatal is not None,  # noqa: B023
                f"{state.crash_point}: the restart to install or stop",
            )
            assert node.fatal is None, context
            assert handler.installed == [SNAPSHOT_LAST], context
            assert (store.first_index, store.last_index) == (SNAPSHOT_LAST - 1, SNAPSHOT_LAST)
            assert node.members == cluster, context
            assert node.config_index == SNAPSHOT_LAST, context
        finally:
            node.stop()
            store.close()
    assert before < len(states)
