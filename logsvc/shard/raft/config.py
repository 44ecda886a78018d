"""A replica's Raft settings and the names its callers handle: `RaftConfig`, `RaftHandler`,
`FailReason`, `RaftFatal`. Imports no pysyncobj (logsvc/config.py reads `RaftConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# How soon a refused or dropped peer connection is dialled again (RaftConfig says why).
CONNECTION_RETRY_MS_DEFAULT = 1000


class FailReason:
    """pysyncobj's command failure codes (pysyncobj.config.FAIL_REASON, 0.3.17), spelled
    out so that no other module imports pysyncobj; patches.py asserts they match."""

    SUCCESS = 0
    QUEUE_FULL = 1
    MISSING_LEADER = 2
    DISCARDED = 3
    NOT_LEADER = 4
    LEADER_CHANGED = 5
    REQUEST_DENIED = 6
    UNKNOWN_OUTCOME = 7


class MissingClusterSecret(ValueError):
    """The Raft port carries pickles: it never runs without the cluster secret."""


class RaftFatal(RuntimeError):
    """The replica cannot go on safely (bad snapshot, journal/snapshot mismatch, store
    failure). It stops ticking and reports this; it never continues with an empty state."""


class RaftHandler(Protocol):
    """What the replica gives the Raft layer. Every call runs on the tick thread."""

    def apply(self, raft_index: int, encoded: bytes) -> object: ...

    def compaction_point(self) -> tuple[int, bytes] | None:
        """(raft index T, state after T) of the newest compactable snapshot point."""

    def install_snapshot(self, raft_index: int, state: bytes) -> None: ...


@dataclass(frozen=True, slots=True)
class RaftConfig:
    self_address: str  # "host:port" of this replica's Raft port
    peers: tuple[str, ...]  # the other replicas' Raft addresses
    secret: str  # the cluster secret (pysyncobj `password`)
    snapshot_path: str
    election_timeout_ms_min: int = 1000
    election_timeout_ms_max: int = 2500
    heartbeat_ms: int = 100
    leader_fallback_ms: int = 5000  # a leader without a majority steps down after this
    connection_timeout_ms: int = 3500
    # How soon a peer that refused or dropped a connection is dialled again (pysyncobj's
    # 5 s default): a replica joining a shard is refused by its peers until the leader adds
    # it, and with 5 s it would wait that long to start catching up; a restarted peer is
    # likewise found sooner. One connection attempt a second to a dead peer costs nothing.
    connection_retry_ms: int = CONNECTION_RETRY_MS_DEFAULT
    # A leader with nothing new for this long asks its followers to go quiet (quiescence.py:
    # no heartbeats, no election timers; node liveness stands in). 0 = never quiesce.
    quiesce_after_ms: int = 1000
    commands_queue_max: int = 10_000
    # How soon after an entry commits the leader tells its followers, when nothing else it
    # sends would (pysyncobj sends a commit-index-only AppendEntries to every follower in
    # the very tick that applied it). Under appends, the next AppendEntries carries the new
    # commit index anyway: a lone writer's every round then cost one message, a follower
    # tick and one leader tick per follower more (a third of the Raft messages, on the
    # CPU the next append needs). A follower applies and serves reads of an entry at most
    # this much later than before; the leader's acknowledgement is not delayed. 0 = at
    # once (pysyncobj's behaviour). Below heartbeat_ms, which bounds it anyway.
    commit_notice_ms: int = 5
    # Test only (the chaos suite's proxy mesh, tests/chaos/harness/proxy.py): canonical
    # peer address -> "host:port" to dial instead. Peers keep their canonical ids, so the
    # identity handshake and every vote, log and snapshot still name canonical addresses.
    # Empty in production (set only from LOGSVC_TEST_RAFT_DIAL, see logsvc/config.py).
    dial_overrides: tuple[tuple[str, str], ...] = ()
    # Started to join a running shard (an admin API membership change): `peers` are the
    # members as the leader knew them; elections wait until this replica's own `add` is in
    # its log (membership.py). Only read when the replica has no members file yet.
    joining: bool = False
    # A non-voting learner (Raft thesis §4.2.1; docs/decisions/0005, "Learners"): it opens
    # no Raft port and dials the members as pysyncobj's read-only node; the leader
    # replicates to it but it counts in no majority, never votes and never stands. It is
    # promoted by being restarted as a joining voter on the same journal. Implies joining.
    learner: bool = False

    def validate(self) -> RaftConfig:
        if not self.secret:
            raise MissingClusterSecret(
                "raft.secret: the cluster secret is required (the Raft port would otherwise "
                "execute pickles from anyone who can connect)"
            )
        if not 0 < 3 * self.heartbeat_ms < self.election_timeout_ms_min:
            raise ValueError("raft: election_timeout_ms_min must exceed 3 x heartbeat_ms")
        if not 0 <= self.commit_notice_ms < self.heartbeat_ms:
            raise ValueError("raft: commit_notice_ms must be at least 0 and below heartbeat_ms")
        if self.election_timeout_ms_max <= self.election_timeout_ms_min:
            raise ValueError("raft: election_timeout_ms_max must exceed the minimum")
        if self.leader_fallback_ms <= self.election_timeout_ms_max:
            raise ValueError("raft: leader_fallback_ms must exceed election_timeout_ms_max")
        if self.learner and not self.joining:
            raise ValueError("raft: learner must be joining too (it is no member yet)")
        if self.quiesce_after_ms and self.quiesce_after_ms < 2 * self.heartbeat_ms:
            raise ValueError(
                "raft: quiesce_after_ms must be 0 (never) or at least 2 x heartbeat_ms"
            )
        for canonical, dial in self.dial_overrides:
            host, _, port = dial.rpartition(":")
            if not (host and port.isdigit() and 1 <= int(port) <= 65535):
                raise ValueError(
                    f"raft: dial_overrides[{canonical!r}] must be 'host:port' (got {dial!r})"
                )
        return self
