"""The admin API's view of this node (`logsvc.admin.port.NodeView`), over the real replicas.

Reads come from each replica's own status (state machine, store, Raft node) on the event
loop; writes go through the shard host like the data plane's. pysyncobj's `getStatus()`
iterates dicts that its tick thread changes, so it is read with a few bounded retries and
the per-replica details are left out if it keeps failing.

Membership changes through the admin API are refused with a typed `ChangeRefused`: a new
replica must also be started on its node, and this daemon only hosts the shards its config
names at start-up. That is issue 6's remaining work, said so in the refusal.
"""

from __future__ import annotations

from typing import Any

from logsvc.admin import errors
from logsvc.admin.metrics import Metrics
from logsvc.admin.port import ClusterInfo, NodeRef, ReplicaStatus, ShardPlacement, ShardStatus
from logsvc.config import NodeConfig
from logsvc.node.server import DataPlaneServer
from logsvc.node.shard_host import ShardHost
from logsvc.shard.commands import NotLeaseHolder as ShardNotLeaseHolder
from logsvc.shard.commands import StaleEpoch, Truncated
from logsvc.shard.replica import NotLeader, OutcomeUnknown, Overloaded, ReplicaFailed

STATUS_READ_ATTEMPTS_MAX = 3


class DaemonNodeView:
    def __init__(
        self,
        config: NodeConfig,
        hosts: dict[int, ShardHost],
        server: DataPlaneServer,
        metrics: Metrics,
    ) -> None:
        self._config = config
        self._hosts = hosts
        self._server = server
        self._metrics = metrics
        self._stopping = False
        self._raft_to_node = {
            config.raft_address(node_id, shard.id): node_id
            for shard in config.shards
            for node_id in shard.replicas
        }

    def stopping(self) -> None:
        self._stopping = True

    def _ref(self, node_id: str | None) -> NodeRef | None:
        if node_id is None:
            return None
        node = self._config.node_by_id(node_id)
        return NodeRef(node.id, node.data_address, node.admin_address)

    def _host(self, shard_id: int) -> ShardHost:
        shard = next((s for s in self._config.shards if s.id == shard_id), None)
        if shard is None:
            raise errors.UnknownShard(shard_id)
        host = self._hosts.get(shard_id)
        if host is None:
            raise errors.ShardNotHosted(shard_id, shard.replicas)
        return host

    def _leader_node(self, host: ShardHost) -> str | None:
        raft_leader = host.replica.node.leader
        return None if raft_leader is None else self._raft_to_node.get(raft_leader)

    async def cluster(self) -> ClusterInfo:
        nodes = tuple(NodeRef(n.id, n.data_address, n.admin_address) for n in self._config.nodes)
        shards = []
        for shard in self._config.shards:
            host = self._hosts.get(shard.id)
            leader = None if host is None else self._ref(self._leader_node(host))
            shards.append(ShardPlacement(shard.id, shard.replicas, host is not None, leader))
        return ClusterInfo(self._config.node_id, nodes, tuple(shards))

    async def shard_status(self, shard_id: int) -> ShardStatus:
        host = self._host(shard_id)
        replica = host.replica
        status = replica.status()
        leader_node = self._leader_node(host)
        raft_status = _raft_status(host)
        last_index = int(status["journal_last_index"])
        replicas = []
        for node_id in self._config.shard(shard_id).replicas:
            if node_id == self._config.node_id:
                replicas.append(ReplicaStatus(node_id, match_index=last_index, lag_entries=0))
                continue
            # The leader knows each follower's match index (pysyncobj keys it by Raft address).
            key = f"match_idx_server_{self._config.raft_address(node_id, shard_id)}"
            matched = raft_status.get(key) if status["is_leader"] else None
            connected = raft_status.get(
                f"partner_node_status_server_{self._config.raft_address(node_id, shard_id)}"
            )
            replicas.append(
                ReplicaStatus(
                    node_id,
                    match_index=None if matched is None else int(matched),
                    lag_entries=None if matched is None else max(0, last_index - int(matched)),
                    connected=None if connected is None else connected == 2,
                )
            )
        leader_commit = raft_status.get("leader_commit_idx")
        return ShardStatus(
            shard_id=shard_id,
            node_id=self._config.node_id,
            is_leader=bool(status["is_leader"]),
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
            last_election_at=None,
            failed=bool(status["failed"]),
            replicas=tuple(replicas),
        )

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
            if target_node_id not in self._config.shard(shard_id).replicas:
                raise errors.NotAReplica(shard_id, target_node_id)
            if target_node_id == self._config.node_id:
                return target_node_id  # already the leader: a no-op
            target = self._config.raft_address(target_node_id, shard_id)
        host.replica.node.transfer_leadership(target, lambda _result, _reason: None)
        return target_node_id

    async def add_replica(self, shard_id: int, node_id: str) -> tuple[str, ...]:
        self._host(shard_id)
        raise errors.ChangeRefused(
            "membership changes through the admin API are not implemented yet: the new "
            "replica's node must also start hosting the shard (issue 6)"
        )

    async def remove_replica(self, shard_id: int, node_id: str) -> tuple[str, ...]:
        return await self.add_replica(shard_id, node_id)

    async def alive(self) -> bool:
        return not self._stopping

    async def metrics(self) -> bytes:
        self._metrics.absorb_server_counters(self._server.counters)
        for shard_id, host in sorted(self._hosts.items()):
            self._metrics.absorb_store_stats(shard_id, host.replica.store.stats())
            self._metrics.set_shard_status(await self.shard_status(shard_id))
        return self._metrics.exposition()


def _raft_status(host: ShardHost) -> dict[str, Any]:
    for _ in range(STATUS_READ_ATTEMPTS_MAX):
        try:
            return host.replica.node.status()
        except RuntimeError:  # "dictionary changed size during iteration" (tick thread)
            continue
    return {}
