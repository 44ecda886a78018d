"""The admin plane's port: what the HTTP app needs from a node, and a fake of it.

`NodeView` is everything `app.create_app` calls. The daemon implements it over its
`ShardReplica`s and `NodeConfig`; tests use `FakeNodeView`, the in-memory implementation
below, which keeps the same contract (the same errors for the same states, the same
change rules from `changes.py`) with no Raft, no disk and no clock.

Every method is a coroutine: the changes wait on Raft (a membership change up to
`MEMBERSHIP_TIMEOUT_S_DEFAULT`, 30 s) and the daemon serves the app on its event loop, so
an implementation runs blocking work in an executor and bounds its own waits. Queries
return frozen dataclasses (the app turns them into its Pydantic response models);
operating failures are the typed errors of `errors.py`, nothing else. None of these values
holds a secret: neither the cluster secret nor the token has a field here, so no endpoint
can return one.

The values themselves, and what their fields mean, are in `status.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from logsvc.admin import changes
from logsvc.admin.errors import (
    NotLeader,
    NotLeaseHolder,
    ShardNotHosted,
    StaleEpoch,
    Unavailable,
    UnknownShard,
)
from logsvc.admin.status import (
    ClusterInfo,
    NodeRef,
    ReplicaStatus,
    ShardPlacement,
    ShardStatus,
)

# /metrics answers with the Prometheus text exposition format, version 0.0.4: what
# `NodeView.metrics()` returns (metrics.py asserts prometheus-client agrees).
EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class NodeView(Protocol):
    """Everything the admin app needs from one node. Errors: `errors.py` only."""

    async def cluster(self) -> ClusterInfo:
        """This node, every node of the cluster, and every shard's placement."""
        ...

    async def shard_status(self, shard_id: int) -> ShardStatus:
        """UnknownShard, ShardNotHosted (the shard lives elsewhere)."""
        ...

    async def truncate(self, shard_id: int, lsn: int, epoch: int) -> int:
        """Truncate the shard's records below `lsn`, fenced by the lease `epoch` like
        `ShardReplica.truncate`; return the first retained LSN after it (also when it was a
        no-op: `first_lsn = max(first_lsn, min(lsn, next_lsn))`). NotLeader, StaleEpoch,
        NotLeaseHolder, Unavailable, Overloaded, OutcomeUnknown, UnknownShard,
        ShardNotHosted."""
        ...

    async def transfer_leader(self, shard_id: int, target_node_id: str | None) -> str | None:
        """Ask the leader to hand leadership to `target_node_id` (None: the node picks the
        most caught-up connected follower, `changes.choose_transfer_target`). Best effort,
        as pysyncobj's: success means the request was sent; poll `shard_status` to see it
        done. Returns the target if known. A target that is already the leader is a no-op.
        NotLeader, UnknownNode, NotAReplica, ChangeRefused (target not caught up, no
        candidate), UnknownShard, ShardNotHosted, OutcomeUnknown."""
        ...

    async def add_replica(self, shard_id: int, node_id: str) -> tuple[str, ...]:
        """Add `node_id` to the shard's members; return the members once the change is
        committed. The new replica first joins as a non-voting learner and is promoted
        (added to the members) only once caught up (`changes.learner_caught_up`), so the
        members' quorum never waits for it; a learner still behind after
        `LEARNER_CATCH_UP_S_MAX` is left catching up and the call answers Unavailable
        (call again to promote it). One change at a time: MembershipChangeInProgress.
        NotLeader, UnknownNode, AlreadyAReplica, ChangeRefused (`changes.check_add`),
        UnknownShard, ShardNotHosted, OutcomeUnknown."""
        ...

    async def remove_replica(self, shard_id: int, node_id: str) -> tuple[str, ...]:
        """Remove `node_id` from the shard's members; return the members once committed.
        NotLeader, UnknownNode, NotAReplica, ChangeRefused (`changes.check_remove`: never
        below the minimum, never the leader itself), MembershipChangeInProgress,
        UnknownShard, ShardNotHosted, OutcomeUnknown."""
        ...

    async def host_shard(
        self, shard_id: int, members: Sequence[str], learner: bool = False
    ) -> tuple[str, ...]:
        """Node to node (a leader adding this node): start hosting a replica of the shard
        that joins `members` (node ids, as the leader knows them; this node is added), as
        a non-voting learner when `learner`. Returns the members the replica starts with.
        Already hosted: the same answer (a retried call). UnknownShard, Unavailable (the
        replica could not open)."""
        ...

    async def promote_shard(self, shard_id: int, members: Sequence[str]) -> tuple[str, ...]:
        """Node to node (the leader, once this node's learner caught up): restart the
        learner as a joining voter on the same journal, about to be added to `members`.
        Already a voter: the same answer (a retried call). UnknownShard, ShardNotHosted,
        Unavailable."""
        ...

    async def release_shard(self, shard_id: int) -> bool:
        """Node to node (a leader that removed this node): stop hosting the shard and
        archive its replica. False when it was not hosted (a retried call). UnknownShard."""
        ...

    async def alive(self) -> bool:
        """False once the node is stopping (so /healthz turns 503 during shutdown)."""
        ...

    async def metrics(self) -> bytes:
        """The Prometheus text exposition (EXPOSITION_CONTENT_TYPE) of the node's metrics,
        refreshed for this scrape (e.g. `Metrics.set_shard_status` for every hosted shard,
        then `Metrics.exposition()`)."""
        ...


# ------------------------------------------------------------------------ the fake


class FakeNodeView:
    """A test double of `NodeView`: one node's view of a cluster, held in memory.

    Changes take effect at once (no Raft): a truncate moves `first_lsn`, a transfer makes
    the target the leader (this node a follower, the term one higher), a membership change
    edits the member list, all under the same rules and errors as the real view
    (`changes.py`, the errors of `NodeView`'s docstrings). `fail_next(exc)` makes the next
    call raise `exc` (any exception: 5xx and bug paths); `hold()` makes every call wait
    until `release()` (requests overlapping in time, a node that does not answer);
    `set_alive` and `put_status` change what health and readiness see. `metrics` returns
    the bytes of the `metrics` callable given (tests pass a real `Metrics(...).exposition`),
    b"" without one.
    """

    def __init__(
        self,
        node_id: str,
        nodes: Sequence[NodeRef],
        statuses: Sequence[ShardStatus],
        remote_shards: Sequence[ShardPlacement] = (),
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self.node_id = node_id
        self._nodes = {node.node_id: node for node in nodes}
        assert node_id in self._nodes
        self._statuses = {status.shard_id: status for status in statuses}
        for status in statuses:
            assert status.node_id == node_id
        self._remote = {placement.shard_id: placement for placement in remote_shards}
        assert not set(self._remote) & set(self._statuses)
        for placement in remote_shards:
            assert not placement.hosted
            assert node_id not in placement.replicas
        self._metrics = metrics
        self._alive = True
        self._fail_next: BaseException | None = None
        self._held: asyncio.Event | None = None
        self._held_methods: frozenset[str] = frozenset()
        self.calls: list[str] = []  # method names, in call order

    # ---------------------------------------------------------------- test controls

    def fail_next(self, exc: BaseException) -> None:
        self._fail_next = exc

    def hold(self, *methods: str) -> None:
        """From now on every call (of `methods` only, if named) waits, after being
        recorded, until `release()`."""
        self._held = asyncio.Event()
        self._held_methods = frozenset(methods)

    def release(self) -> None:
        if self._held is not None:
            self._held.set()
        self._held = None

    def set_alive(self, alive: bool) -> None:
        self._alive = alive

    def put_status(self, status: ShardStatus) -> None:
        """Replace (or add) a hosted shard's status."""
        assert status.node_id == self.node_id
        self._remote.pop(status.shard_id, None)
        self._statuses[status.shard_id] = status

    def status_now(self, shard_id: int) -> ShardStatus:
        return self._statuses[shard_id]

    # ---------------------------------------------------------------- NodeView

    async def cluster(self) -> ClusterInfo:
        await self._enter("cluster")
        placements = [status.placement() for status in self._statuses.values()]
        placements.extend(self._remote.values())
        return ClusterInfo(
            node_id=self.node_id,
            nodes=tuple(self._nodes.values()),
            shards=tuple(sorted(placements, key=lambda placement: placement.shard_id)),
        )

    async def shard_status(self, shard_id: int) -> ShardStatus:
        await self._enter("shard_status")
        return self._hosted(shard_id)

    async def truncate(self, shard_id: int, lsn: int, epoch: int) -> int:
        await self._enter("truncate")
        assert lsn >= 1
        assert epoch >= 0
        status = self._leader_status(shard_id)
        if epoch < status.lease_epoch:
            raise StaleEpoch(status.lease_holder, status.lease_epoch)
        if epoch > status.lease_epoch:
            raise NotLeaseHolder(status.lease_holder, status.lease_epoch)
        first_lsn = max(status.first_lsn, min(lsn, status.next_lsn))
        self._statuses[shard_id] = dataclasses.replace(status, first_lsn=first_lsn)
        return first_lsn

    async def transfer_leader(self, shard_id: int, target_node_id: str | None) -> str | None:
        await self._enter("transfer_leader")
        status = self._leader_status(shard_id)
        target = changes.choose_transfer_target(status, target_node_id, self._nodes.keys())
        if target == self.node_id:
            return target
        self._statuses[shard_id] = dataclasses.replace(
            status,
            is_leader=False,
            leader=self._nodes[target],
            term=status.term + 1,
            last_election_at=_later(status.last_election_at),
            replicas=tuple(ReplicaStatus(replica.node_id) for replica in status.replicas),
        )
        return target

    async def add_replica(self, shard_id: int, node_id: str) -> tuple[str, ...]:
        await self._enter("add_replica")
        status = self._leader_status(shard_id)
        changes.check_add(status, node_id, self._nodes.keys())
        # A new replica starts empty: it trails the leader by the whole log until the
        # leader has sent it every retained entry (or the snapshot).
        joining = ReplicaStatus(
            node_id,
            match_index=0,
            lag_entries=status.commit_index,
            connected=True,
            caught_up=status.commit_index <= changes.CAUGHT_UP_LAG_ENTRIES_MAX,
        )
        updated = dataclasses.replace(status, replicas=(*status.replicas, joining))
        self._statuses[shard_id] = updated
        return updated.member_ids

    async def remove_replica(self, shard_id: int, node_id: str) -> tuple[str, ...]:
        await self._enter("remove_replica")
        status = self._leader_status(shard_id)
        changes.check_remove(status, node_id, self._nodes.keys())
        kept = tuple(replica for replica in status.replicas if replica.node_id != node_id)
        updated = dataclasses.replace(status, replicas=kept)
        self._statuses[shard_id] = updated
        return updated.member_ids

    async def host_shard(
        self, shard_id: int, members: Sequence[str], learner: bool = False
    ) -> tuple[str, ...]:
        await self._enter("host_shard")
        status = self._statuses.get(shard_id)
        if status is not None:
            return status.member_ids
        if shard_id not in self._remote:
            raise UnknownShard(shard_id)
        del self._remote[shard_id]
        member_ids = tuple(sorted({*members, self.node_id}))
        self._statuses[shard_id] = ShardStatus(
            shard_id=shard_id,
            node_id=self.node_id,
            is_leader=False,
            leader=None,
            term=0,
            commit_index=0,
            applied_index=0,
            leader_commit_index=None,
            first_lsn=1,
            next_lsn=1,
            lease_holder=None,
            lease_epoch=0,
            journal_first_index=1,
            journal_physical_first_index=1,
            last_election_at=None,
            failed=False,
            replicas=tuple(ReplicaStatus(node_id) for node_id in member_ids),
            joining=True,
            learner=learner,
        )
        return member_ids

    async def promote_shard(self, shard_id: int, members: Sequence[str]) -> tuple[str, ...]:
        await self._enter("promote_shard")
        status = self._hosted(shard_id)
        self._statuses[shard_id] = dataclasses.replace(status, learner=False)
        return status.member_ids

    async def release_shard(self, shard_id: int) -> bool:
        await self._enter("release_shard")
        status = self._statuses.pop(shard_id, None)
        if status is None:
            if shard_id not in self._remote:
                raise UnknownShard(shard_id)
            return False
        others = tuple(m for m in status.member_ids if m != self.node_id)
        self._remote[shard_id] = ShardPlacement(shard_id, others, hosted=False, leader=None)
        return True

    async def alive(self) -> bool:
        await self._enter("alive")
        return self._alive

    async def metrics(self) -> bytes:
        await self._enter("metrics")
        return b"" if self._metrics is None else self._metrics()

    # ---------------------------------------------------------------- internals

    async def _enter(self, name: str) -> None:
        self.calls.append(name)
        exc, self._fail_next = self._fail_next, None
        if exc is not None:
            raise exc
        held = self._held
        if held is not None and (not self._held_methods or name in self._held_methods):
            await held.wait()

    def _hosted(self, shard_id: int) -> ShardStatus:
        status = self._statuses.get(shard_id)
        if status is not None:
            return status
        placement = self._remote.get(shard_id)
        if placement is not None:
            raise ShardNotHosted(shard_id, placement.replicas)
        raise UnknownShard(shard_id)

    def _leader_status(self, shard_id: int) -> ShardStatus:
        status = self._hosted(shard_id)
        if status.failed:
            raise Unavailable(f"shard {shard_id}: the replica on this node has failed")
        if not status.is_leader:
            raise NotLeader(status.leader)
        return status


def _later(when: datetime | None) -> datetime:
    """The fake has no clock: a new election is a second after the last one."""
    base = when if when is not None else datetime(2026, 1, 1, tzinfo=UTC)
    return base + timedelta(seconds=1)


def example_view(metrics: Callable[[], bytes] | None = None) -> FakeNodeView:
    """A small cluster seen from n1, for tests and demos of the admin API.

    Nodes n1..n4. Shard 1: replicas n1 (leader), n2 (caught up), n3 (5 entries behind).
    Shard 2: replicas n1, n2 (leader), n3; n1 a follower. Shard 3: n2, n3, n4, not hosted
    on n1.
    """
    nodes = tuple(
        NodeRef(f"n{i}", f"127.0.0.1:{7100 + i}", f"127.0.0.1:{7200 + i}") for i in range(1, 5)
    )
    elected = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
    shard1 = ShardStatus(
        shard_id=1,
        node_id="n1",
        is_leader=True,
        leader=nodes[0],
        term=3,
        commit_index=120,
        applied_index=120,
        leader_commit_index=120,
        first_lsn=11,
        next_lsn=501,
        lease_holder="engine-a",
        lease_epoch=2,
        journal_first_index=40,
        journal_physical_first_index=1,
        last_election_at=elected,
        failed=False,
        replicas=(
            ReplicaStatus("n1", match_index=120, lag_entries=0, lag_records=0, lag_seconds=0.0),
            ReplicaStatus("n2", match_index=120, lag_entries=0, lag_records=0, connected=True),
            ReplicaStatus("n3", match_index=115, lag_entries=5, lag_seconds=0.2, connected=True),
        ),
    )
    shard2 = ShardStatus(
        shard_id=2,
        node_id="n1",
        is_leader=False,
        leader=nodes[1],
        term=5,
        commit_index=77,
        applied_index=77,
        leader_commit_index=77,
        first_lsn=1,
        next_lsn=1,
        lease_holder=None,
        lease_epoch=0,
        journal_first_index=1,
        journal_physical_first_index=1,
        last_election_at=None,
        failed=False,
        replicas=(ReplicaStatus("n1"), ReplicaStatus("n2"), ReplicaStatus("n3")),
    )
    shard3 = ShardPlacement(3, ("n2", "n3", "n4"), hosted=False, leader=None)
    return FakeNodeView("n1", nodes, (shard1, shard2), (shard3,), metrics=metrics)
