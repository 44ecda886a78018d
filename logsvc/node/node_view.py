"""The admin API's view of this node (`logsvc.admin.port.NodeView`), over the real replicas.

Reads come from each replica's own status (state machine, store, Raft node) on the event
loop; writes go through the shard host like the data plane's. pysyncobj's `getStatus()`
iterates dicts that its tick thread changes, so it is read with a few bounded retries and
the per-replica details are left out if it keeps failing.

Membership changes (docs/decisions/0002-membership.md), on the shard's leader, one at a
time per shard (`MembershipChangeInProgress` otherwise):

* add node X: the rules (`changes.check_add`); X's admin API is asked to start a replica
  that joins the current members (`POST /v1/internal/shards/{id}/host`, the cluster's
  token, bounded); then the leader proposes the change (`addNodeToCluster`) and waits for
  its commit; the answer is the new member list. X catches up by ordinary replication;
  its `caught_up` turns true in this shard's status once it is within a few entries.
* remove node X: the rules (`changes.check_remove`: never the leader, never below the
  minimum but for a member the leader's link to has stayed down for
  `changes.UNREACHABLE_CONFIRM_S`, sampled); the leader proposes `removeNodeFromCluster`
  and waits for its commit, then asks X to stop hosting the shard (`DELETE .../host`: best
  effort, bounded; X archives its replica).

Members are the latest configuration in the answering replica's log (its members file,
logsvc/shard/membership.py), as node ids: Raft addresses map to nodes by the config
(the Raft port of shard s on node n is `raft_port_base + s`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from logsvc.admin import changes, errors
from logsvc.admin.metrics import Metrics
from logsvc.admin.status import ClusterInfo, NodeRef, ReplicaStatus, ShardPlacement, ShardStatus
from logsvc.node import peer_admin
from logsvc.node.hosting import ShardHosting
from logsvc.node.server import DataPlaneServer
from logsvc.node.shard_host import ShardHost
from logsvc.node_config import NodeConfig
from logsvc.shard.commands import NotLeaseHolder as ShardNotLeaseHolder
from logsvc.shard.commands import StaleEpoch, Truncated
from logsvc.shard.raft.config import RaftFatal
from logsvc.shard.raft.node import RaftNode
from logsvc.shard.replica import (
    MembershipChangeInProgress,
    NotLeader,
    OutcomeUnknown,
    Overloaded,
    ReplicaFailed,
)
from logsvc.shard.small_file import SmallFileCorrupt
from logsvc.store import StoreError

log = logging.getLogger("logsvc.admin")

STATUS_READ_ATTEMPTS_MAX = 3
# Bounds of one membership change, inside the admin app's `view_call_s_max` (60 s): the
# new node opening its replica, then the change's commit, then telling a removed node.
PEER_CALL_TIMEOUT_S: Final = 10.0
MEMBERSHIP_COMMIT_TIMEOUT_S: Final = 20.0
# How long an admin change waits for its learner to catch up before answering (the learner
# goes on catching up); with the peer calls and the commit it stays under the admin API's
# view_call_s_max (60 s).
LEARNER_CATCH_UP_S_MAX: Final = 15.0
LEARNER_POLL_S: Final = 0.1


async def confirm_removal(
    read: Callable[[], Awaitable[ShardStatus]],
    node_id: str,
    known_node_ids: Sequence[str],
    window_s: float,
    sample_s: float = changes.UNREACHABLE_SAMPLE_S,
) -> None:
    """Apply `changes.check_remove` to the leader's status again every `sample_s` for
    `window_s`: a removal below the minimum goes ahead only if the member stayed
    unreachable throughout (ChangeRefused, or NotLeader, the moment it does not)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + window_s
    while loop.time() < deadline:
        await asyncio.sleep(sample_s)
        changes.check_remove(await read(), node_id, known_node_ids)


class DaemonNodeView:
    def __init__(
        self,
        config: NodeConfig,
        hosting: ShardHosting,
        server: DataPlaneServer,
        metrics: Metrics,
    ) -> None:
        self._config = config
        self._hosting = hosting
        self._server = server
        self._metrics = metrics
        self._stopping = False
        # Any node may hold a replica of any shard (membership changes): every node's
        # Raft address of every shard.
        self._raft_to_node = {
            node.raft_address(shard.id): node.id for node in config.nodes for shard in config.shards
        }
        self._changing: set[int] = set()  # shards with a membership change under way

    def stopping(self) -> None:
        self._stopping = True

    def _ref(self, node_id: str | None) -> NodeRef | None:
        if node_id is None:
            return None
        node = self._config.node_by_id(node_id)
        return NodeRef(node.id, node.data_address, node.admin_address)

    def _shard_exists(self, shard_id: int) -> None:
        if not any(s.id == shard_id for s in self._config.shards):
            raise errors.UnknownShard(shard_id)

    def _host(self, shard_id: int) -> ShardHost:
        self._shard_exists(shard_id)
        host = self._hosting.hosts.get(shard_id)
        if host is None:
            failed = self._hosting.failed.get(shard_id)
            if failed is not None:
                raise errors.Unavailable(
                    f"shard {shard_id}: this node's replica is quarantined ({failed}); "
                    f"repair: remove node {self._config.node_id!r} from the shard on its "
                    "leader, then add it back (it restarts empty and catches up)"
                )
            raise errors.ShardNotHosted(shard_id, self._elsewhere(shard_id))
        return host

    def _elsewhere(self, shard_id: int) -> tuple[str, ...]:
        """Where a shard not hosted here lives, as far as this node knows: the config's
        placement (membership changes elsewhere are not seen here), without this node."""
        replicas = self._config.shard(shard_id).replicas
        return tuple(r for r in replicas if r != self._config.node_id)

    def _leader_node(self, host: ShardHost) -> str | None:
        raft_leader = host.replica.node.leader
        return None if raft_leader is None else self._raft_to_node.get(raft_leader)

    def _member_ids(self, host: ShardHost) -> tuple[str, ...]:
        return tuple(sorted(self._raft_to_node.get(a, a) for a in host.replica.node.members))

    async def cluster(self) -> ClusterInfo:
        nodes = tuple(NodeRef(n.id, n.data_address, n.admin_address) for n in self._config.nodes)
        shards = []
        for shard in self._config.shards:
            host = self._hosting.hosts.get(shard.id)
            if host is None:  # as the config placed it: this node knows no better
                quarantined = shard.id in self._hosting.failed  # hosted, serving nothing
                shards.append(
                    ShardPlacement(shard.id, self._elsewhere(shard.id), quarantined, None)
                )
                continue
            leader = self._ref(self._leader_node(host))
            shards.append(ShardPlacement(shard.id, self._member_ids(host), True, leader))
        return ClusterInfo(self._config.node_id, nodes, tuple(shards))

    async def shard_status(self, shard_id: int) -> ShardStatus:
        host = self._host(shard_id)
        replica = host.replica
        node = replica.node
        status = replica.status()
        leader_node = self._leader_node(host)
        raft_status = _raft_status(host)
        progress = node.progress()
        leading = bool(status["is_leader"])
        last_index = int(status["journal_last_index"])
        replicas = []
        for address in sorted(node.members, key=lambda a: self._raft_to_node.get(a, a)):
            node_id = self._raft_to_node.get(address, address)
            if address == node.self_address and node.learner:
                continue  # a learner is no member (its members file counts it as joining)
            if address == node.self_address:
                replicas.append(
                    ReplicaStatus(
                        node_id,
                        match_index=last_index,
                        lag_entries=0,
                        lag_seconds=0.0 if leading else None,
                        caught_up=True if leading else None,
                    )
                )
                continue
            # The leader knows each follower's match index (pysyncobj keys it by Raft address).
            matched = raft_status.get(f"match_idx_server_{address}") if leading else None
            connected = raft_status.get(f"partner_node_status_server_{address}")
            lag_entries = None if matched is None else max(0, last_index - int(matched))
            replicas.append(
                ReplicaStatus(
                    node_id,
                    match_index=None if matched is None else int(matched),
                    lag_entries=lag_entries,
                    lag_seconds=progress.lag_of(address) if leading else None,
                    connected=None if connected is None else connected == 2,
                    caught_up=changes.caught_up(
                        lag_entries,
                        None if matched is None else int(matched),
                        node.config_index,
                    ),
                )
            )
        leader_commit = raft_status.get("leader_commit_idx")
        elected = progress.last_election_at_s
        return ShardStatus(
            shard_id=shard_id,
            node_id=self._config.node_id,
            is_leader=leading,
            leader=self._ref(leader_node),
            term=int(status["term"]),
            commit_index=int(status["commit_index"]),
            applied_index=int(status["last_applied_raft_index"]),
            leader_commit_index=None if leader_commit is None else int(leader_commit),
            first_lsn=int(status["first_lsn"]),
            next_lsn=int(status["next_lsn"]),
            lease_holder=status["lease_holder"],
            lease_epoch=int(status["lease_epoch"]),
            journal_first_index=int(status["journal_first_index"]),
            journal_physical_first_index=int(status["journal_physical_first_index"]),
            last_election_at=None if elected is None else datetime.fromtimestamp(elected, UTC),
            failed=bool(status["failed"]),
            replicas=tuple(replicas),
            joining=node.joining,
            quiet=node.quiet,
            learner=node.learner,
            learners=self._learners(node, last_index) if leading else (),
        )

    def _learners(self, node: RaftNode, last_index: int) -> tuple[ReplicaStatus, ...]:
        """The learners connected to this leader, with their progress."""
        found = []
        for address, match in sorted(node.learners().items()):
            found.append(
                ReplicaStatus(
                    self._raft_to_node.get(address, address),
                    match_index=match,
                    lag_entries=max(0, last_index - match),
                    connected=True,
                    caught_up=changes.learner_caught_up(match, last_index),
                )
            )
        return tuple(found)

    async def truncate(self, shard_id: int, lsn: int, epoch: int) -> int:
        host = self._host(shard_id)
        try:
            result = await host.truncate(lsn, epoch)
        except NotLeader:
            raise errors.NotLeader(self._ref(self._leader_node(host))) from None
        except Overloaded as exc:
            raise errors.Overloaded(str(exc)) from None
        except OutcomeUnknown as exc:
            raise errors.OutcomeUnknown(str(exc)) from None
        except ReplicaFailed as exc:
            raise errors.Unavailable(str(exc)) from None
        if isinstance(result, StaleEpoch):
            raise errors.StaleEpoch(result.current_holder, result.current_epoch)
        if isinstance(result, ShardNotLeaseHolder):
            raise errors.NotLeaseHolder(result.current_holder, result.current_epoch)
        assert isinstance(result, Truncated), result
        return result.first_lsn

    async def transfer_leader(self, shard_id: int, target_node_id: str | None) -> str | None:
        host = self._host(shard_id)
        if not host.replica.is_leader:
            raise errors.NotLeader(self._ref(self._leader_node(host)))
        target = None
        if target_node_id is not None:
            if target_node_id not in {n.id for n in self._config.nodes}:
                raise errors.UnknownNode(target_node_id)
            if target_node_id not in self._member_ids(host):
                raise errors.NotAReplica(shard_id, target_node_id)
            if target_node_id == self._config.node_id:
                return target_node_id  # already the leader: a no-op
            target = self._config.raft_address(target_node_id, shard_id)
        host.replica.node.transfer_leadership(target, lambda _result, _reason: None)
        return target_node_id

    # ------------------------------------------------------------------ membership

    async def add_replica(self, shard_id: int, node_id: str) -> tuple[str, ...]:
        host, status = await self._leader_status(shard_id)
        changes.check_add(status, node_id, [n.id for n in self._config.nodes])
        async with self._one_change(shard_id):
            members = self._member_ids(host)
            # 1. The new node starts a non-voting learner (Raft thesis §4.2.1): it receives
            #    the log from the leader but counts in no majority, so while it copies the
            #    log the members commit as before (0005, "Learners").
            hosted = await self._ask_peer(
                node_id,
                "POST",
                f"/v1/internal/shards/{shard_id}/host",
                {"members": members, "learner": True},
            )
            # 2. Promoted only once caught up: its addition then commits with it at once.
            #    (A retried change may find it promoted already: nothing to wait for.)
            if hosted.body.get("stage") in (None, "learner"):
                await self._wait_learner(host, shard_id, node_id)
            # 3. The same journal restarted as a joining voter (holds its elections until
            #    its own addition arrives).
            await self._ask_peer(
                node_id, "POST", f"/v1/internal/shards/{shard_id}/promote", {"members": members}
            )
            # 4. The change itself, through the log (one at a time: the replica's lock).
            try:
                await self._change(host.replica.add_member, shard_id, node_id)
            except (errors.NotLeader, errors.MembershipChangeInProgress, errors.Unavailable):
                # Certainly not in the log: the new replica has nothing to join.
                await self._release_on(node_id, shard_id)
                raise
            log.info("shard %d: added node %s", shard_id, node_id)
            return self._member_ids(host)

    async def _wait_learner(self, host: ShardHost, shard_id: int, node_id: str) -> None:
        """Until the learner on `node_id` holds all but a few of this leader's entries
        (`changes.learner_caught_up`), bounded by LEARNER_CATCH_UP_S_MAX: then it is left
        catching up (Unavailable; the same call again promotes it once caught up). Lost
        leadership: the learner is released (the new leader knows nothing of it)."""
        loop = asyncio.get_running_loop()
        address = self._config.raft_address(node_id, shard_id)
        deadline = loop.time() + LEARNER_CATCH_UP_S_MAX
        while True:
            node = host.replica.node
            if not node.is_leader:
                await self._release_on(node_id, shard_id)
                raise errors.NotLeader(self._ref(self._leader_node(host)))
            match = node.learners().get(address)
            last = node.last_index
            if match is not None and changes.learner_caught_up(match, last):
                log.info(
                    "shard %d: the learner on %s caught up (it holds raft index %d of %d): "
                    "promoting it",
                    shard_id,
                    node_id,
                    match,
                    last,
                )
                return
            if loop.time() > deadline:
                behind = "not connected yet" if match is None else f"{last - match} entries behind"
                raise errors.Unavailable(
                    f"shard {shard_id}: the learner on node {node_id} is still catching up "
                    f"({behind} after {LEARNER_CATCH_UP_S_MAX:.0f} s); it goes on: add the "
                    "node again to promote it once caught up"
                )
            await asyncio.sleep(LEARNER_POLL_S)

    async def remove_replica(self, shard_id: int, node_id: str) -> tuple[str, ...]:
        known = [n.id for n in self._config.nodes]
        host, status = await self._leader_status(shard_id)
        changes.check_remove(status, node_id, known)
        if changes.removal_below_minimum(status):

            async def read() -> ShardStatus:
                nonlocal host
                host, now = await self._leader_status(shard_id)
                return now

            await confirm_removal(read, node_id, known, changes.UNREACHABLE_CONFIRM_S)
        async with self._one_change(shard_id):
            await self._change(host.replica.remove_member, shard_id, node_id)
            log.info("shard %d: removed node %s", shard_id, node_id)
            # The change is committed: the removed node may stop (it would anyway be
            # refused by every member, see 0002).
            await self._release_on(node_id, shard_id)
            return self._member_ids(host)

    async def host_shard(
        self, shard_id: int, members: Sequence[str], learner: bool = False
    ) -> tuple[str, ...]:
        self._shard_exists(shard_id)
        known = {n.id for n in self._config.nodes}
        for member in members:
            if member not in known:
                raise errors.UnknownNode(member)
        try:
            host = await self._hosting.host(shard_id, members, learner=learner)
        except (OSError, SmallFileCorrupt, ReplicaFailed) as exc:
            raise errors.Unavailable(f"shard {shard_id}: cannot host a replica: {exc}") from None
        return self._member_ids(host)

    async def promote_shard(self, shard_id: int, members: Sequence[str]) -> tuple[str, ...]:
        self._shard_exists(shard_id)
        try:
            host = await self._hosting.promote(shard_id, members)
        except KeyError:
            raise errors.ShardNotHosted(shard_id, self._elsewhere(shard_id)) from None
        except (OSError, SmallFileCorrupt, ReplicaFailed, StoreError, RaftFatal) as exc:
            raise errors.Unavailable(f"shard {shard_id}: cannot promote: {exc}") from None
        return self._member_ids(host)

    async def release_shard(self, shard_id: int) -> bool:
        self._shard_exists(shard_id)
        host = self._hosting.hosts.get(shard_id)
        if host is not None and host.replica.is_leader:
            raise errors.ChangeRefused(
                f"this node leads shard {shard_id}: remove it from the members first"
            )
        try:
            return await self._hosting.release(shard_id)
        except OSError as exc:
            raise errors.Unavailable(f"shard {shard_id}: cannot release: {exc}") from None

    async def _leader_status(self, shard_id: int) -> tuple[ShardHost, ShardStatus]:
        host = self._host(shard_id)
        if not host.replica.is_leader:
            raise errors.NotLeader(self._ref(self._leader_node(host)))
        return host, await self.shard_status(shard_id)

    def _one_change(self, shard_id: int) -> _OneChange:
        return _OneChange(self._changing, shard_id)

    async def _change(self, change: Any, shard_id: int, node_id: str) -> None:
        """Propose adding or removing `node_id`'s replica and wait for the commit (on the
        default executor: the replica's call blocks), mapping the shard's errors to the
        admin API's."""
        loop = asyncio.get_running_loop()
        raft_address = self._config.raft_address(node_id, shard_id)
        try:
            await loop.run_in_executor(None, change, raft_address, MEMBERSHIP_COMMIT_TIMEOUT_S)
        except NotLeader as exc:
            leader = None if exc.leader_hint is None else self._raft_to_node.get(exc.leader_hint)
            raise errors.NotLeader(self._ref(leader)) from None
        except MembershipChangeInProgress as exc:
            raise errors.MembershipChangeInProgress(shard_id) from exc
        except OutcomeUnknown as exc:
            raise errors.OutcomeUnknown(str(exc)) from None
        except (ReplicaFailed, Overloaded) as exc:
            raise errors.Unavailable(str(exc)) from None

    async def _ask_peer(
        self, node_id: str, method: str, path: str, body: dict[str, Any] | None
    ) -> peer_admin.PeerAnswer:
        node = self._config.node_by_id(node_id)
        try:
            answer = await peer_admin.call(
                node.admin_address, method, path, self._config.token, body, PEER_CALL_TIMEOUT_S
            )
        except peer_admin.PeerUnreachable as exc:
            raise errors.Unavailable(f"node {node_id!r} did not answer: {exc}") from None
        if not answer.ok:
            raise errors.Unavailable(
                f"node {node_id!r} refused ({answer.status} {answer.code}): {answer.message}"
            )
        return answer

    async def _release_on(self, node_id: str, shard_id: int) -> None:
        """Best effort: tell `node_id` to stop hosting `shard_id`; a failure is logged."""
        try:
            await self._ask_peer(node_id, "DELETE", f"/v1/internal/shards/{shard_id}/host", None)
        except errors.AdminError as exc:
            log.warning(
                "shard %d: node %s was not told to stop hosting it: %s",
                shard_id,
                node_id,
                exc.message,
            )

    # ------------------------------------------------------------------ the rest

    async def alive(self) -> bool:
        return not self._stopping

    async def metrics(self) -> bytes:
        self._metrics.absorb_server_counters(self._server.counters)
        for shard_id, host in sorted(self._hosting.hosts.items()):
            self._metrics.absorb_store_stats(shard_id, host.replica.store.stats())
            self._metrics.set_shard_status(await self.shard_status(shard_id))
        return self._metrics.exposition()


class _OneChange:
    """`async with`: marks a shard's membership change under way (event loop only), or
    refuses a second one at once."""

    def __init__(self, changing: set[int], shard_id: int) -> None:
        self._changing = changing
        self._shard_id = shard_id

    async def __aenter__(self) -> None:
        if self._shard_id in self._changing:
            raise errors.MembershipChangeInProgress(self._shard_id)
        self._changing.add(self._shard_id)

    async def __aexit__(self, *_exc: object) -> None:
        self._changing.discard(self._shard_id)


def _raft_status(host: ShardHost) -> dict[str, Any]:
    for _ in range(STATUS_READ_ATTEMPTS_MAX):
        try:
            return host.replica.node.status()
        except RuntimeError:  # "dictionary changed size during iteration" (tick thread)
            continue
    return {}
