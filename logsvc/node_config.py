"""The node configuration's values: its sections as frozen dataclasses (`NodeConfig`, one
`ClusterNode` per [[cluster.nodes]], one `ShardConfig` per [[shards]], `RaftTimings` for
[raft]), with the defaults and the bounds the loader (`logsvc/config.py`) checks them against.
Building one from a TOML document, and every rule, is the loader's; these are what it returns,
and what the node reads (paths absolute, secrets loaded).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from logsvc.config_files import PORT_MAX
from logsvc.node.limits import ServerLimits
from logsvc.shard.limits import ShardLimits
from logsvc.shard.raft.config import RaftConfig
from logsvc.shard.replica import ReplicaConfig
from logsvc.shard.scheduler import WORKERS_DEFAULT, WORKERS_MAX
from logsvc.store.limits import StoreLimits

# Secrets and tokens: long enough not to be guessed, short enough to be a secret and not
# a misplaced file. Surrounding whitespace is ignored (a file ends with a newline).
SECRET_CHARS_MIN = 16
SECRET_CHARS_MAX = 4096

LOG_LEVELS: Final = ("debug", "info", "warning", "error")
# "text" for a terminal; "json" (one object a line, see logsvc/logs.py) for a log pipeline.
LOG_FORMATS: Final = ("text", "json")
# [node] journal: where replicas make appends durable (docs/decisions/0011-shared-journal.md).
JOURNAL_MODES: Final = ("shard", "node")

# An even replica count tolerates no more failures than the odd count below it, and
# needs a bigger quorum (Raft §5.2), so a shard has 3 or 5 replicas.
REPLICA_COUNTS: Final = (3, 5)

# Bounds on the config itself, so the port check (nodes x shards ports) stays small.
NODES_MAX = 128
SHARDS_MAX = 4096

# No Raft timing is sensibly above an hour; a bigger number is a unit mistake.
RAFT_MS_MAX = 3_600_000
# The node's Raft scheduler threads ([raft] threads).
RAFT_THREADS_DEFAULT = WORKERS_DEFAULT
RAFT_THREADS_MAX = WORKERS_MAX
# Leadership transfers a node asks per second to balance leaders ([raft] leader_moves_per_s;
# logsvc/shard/leader_balance.py). Each is an election (two vote saves, one entry committed):
# 50 a second evens out a skewed start of 1,000 shards within seconds, at a tenth of the
# election rate two survivors sustain in a failover. 0 = never balance.
LEADER_MOVES_PER_S_DEFAULT = 50
LEADER_MOVES_PER_S_MAX = 1000

NODE_ID_CHARS_MAX = 64

RAFT_MS_KEYS: Final = (
    "election_timeout_ms_min",
    "election_timeout_ms_max",
    "heartbeat_ms",
    "leader_fallback_ms",
    "connection_timeout_ms",
    "quiesce_after_ms",
)
# The [raft] keys: the timings of every shard's group, the node's Raft threads, and how
# fast it hands leaderships to less-loaded nodes.
RAFT_KEYS: Final = (*RAFT_MS_KEYS, "threads", "leader_moves_per_s")
_RAFT_DEFAULTS: Final = {
    f.name: f.default
    for f in dataclasses.fields(RaftConfig)
    if f.name in RAFT_MS_KEYS and isinstance(f.default, int)
}
assert set(_RAFT_DEFAULTS) == set(RAFT_MS_KEYS), "RaftConfig changed: update RAFT_MS_KEYS"


@dataclass(frozen=True, slots=True)
class RaftTimings:
    """The [raft] section: the per-node settings of every shard's Raft group. Defaults are
    `RaftConfig`'s (logsvc/shard/raft/config.py says why each is what it is)."""

    election_timeout_ms_min: int = _RAFT_DEFAULTS["election_timeout_ms_min"]
    election_timeout_ms_max: int = _RAFT_DEFAULTS["election_timeout_ms_max"]
    heartbeat_ms: int = _RAFT_DEFAULTS["heartbeat_ms"]
    leader_fallback_ms: int = _RAFT_DEFAULTS["leader_fallback_ms"]
    connection_timeout_ms: int = _RAFT_DEFAULTS["connection_timeout_ms"]
    quiesce_after_ms: int = _RAFT_DEFAULTS["quiesce_after_ms"]
    # Worker threads of the node's Raft scheduler (logsvc/shard/scheduler.py): every hosted
    # replica's ticks and socket events run on them, however many shards the node hosts.
    threads: int = RAFT_THREADS_DEFAULT
    # Leadership transfers a second to balance leaders across nodes (0 = never).
    leader_moves_per_s: int = LEADER_MOVES_PER_S_DEFAULT

    def raft_config(
        self, self_address: str, peers: Sequence[str], secret: str, snapshot_path: str
    ) -> RaftConfig:
        return RaftConfig(
            self_address=self_address,
            peers=tuple(peers),
            secret=secret,
            snapshot_path=snapshot_path,
            election_timeout_ms_min=self.election_timeout_ms_min,
            election_timeout_ms_max=self.election_timeout_ms_max,
            heartbeat_ms=self.heartbeat_ms,
            leader_fallback_ms=self.leader_fallback_ms,
            connection_timeout_ms=self.connection_timeout_ms,
            quiesce_after_ms=self.quiesce_after_ms,
        ).validate()


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One [[cluster.nodes]] entry."""

    id: str
    data_address: str  # "host:port" as written (an IPv6 host in brackets)
    admin_address: str  # "host:port"
    raft_host: str  # a bare host (IPv6 without brackets)
    raft_port_base: int  # the Raft port of shard s on this node is raft_port_base + s

    def raft_address(self, shard_id: int) -> str:
        """The replica's Raft address in pysyncobj's form: pysyncobj splits "host:port" at
        the last colon and resolves the host as is, so an IPv6 host has no brackets."""
        port = self.raft_port_base + shard_id
        assert 1 <= port <= PORT_MAX
        return f"{self.raft_host}:{port}"


@dataclass(frozen=True, slots=True)
class ShardConfig:
    """One [[shards]] entry: the replicas a shard is created with."""

    id: int
    replicas: tuple[str, ...]  # node ids, in file order


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """A validated node configuration. Paths are absolute; secrets are loaded."""

    source: str  # the config file (or the label given to parse_node_config)
    node_id: str
    data_dir: str
    log_level: str  # one of LOG_LEVELS
    log_format: str  # one of LOG_FORMATS
    nodes: tuple[ClusterNode, ...]
    shards: tuple[ShardConfig, ...]
    store_limits: StoreLimits
    shard_limits: ShardLimits
    server_limits: ServerLimits
    raft: RaftTimings
    # Never in repr() (and so never in a log line that prints the config).
    secret: str = field(repr=False)  # the cluster secret: pysyncobj's password
    token: str = field(repr=False)  # the data plane and admin token
    # "shard" (each replica's store syncs its own files) or "node" (one shared journal).
    journal_mode: str = "shard"
    # Test only: canonical Raft address -> address to dial (LOGSVC_TEST_RAFT_DIAL, read by
    # `load_node_config`); empty in production.
    raft_dial: tuple[tuple[str, str], ...] = ()

    @property
    def node(self) -> ClusterNode:
        """This node's [[cluster.nodes]] entry."""
        return self.node_by_id(self.node_id)

    def node_by_id(self, node_id: str) -> ClusterNode:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(f"no node {node_id!r} in cluster.nodes")

    def shard(self, shard_id: int) -> ShardConfig:
        for shard in self.shards:
            if shard.id == shard_id:
                return shard
        raise KeyError(f"no shard {shard_id} in shards")

    def shards_hosted(self) -> list[ShardConfig]:
        """The shards with a replica on this node, in file order."""
        return [shard for shard in self.shards if self.node_id in shard.replicas]

    def raft_address(self, node_id: str, shard_id: int) -> str:
        """The Raft address of `node_id`'s replica of `shard_id`."""
        return self.node_by_id(node_id).raft_address(shard_id)

    def raft_node_of(self) -> Callable[[str], str]:
        """Raft address of any replica (any node, any shard of the cluster) -> its node's
        id; an address of no replica maps to itself. Node liveness is kept per node."""
        nodes = {
            node.raft_address(shard.id): node.id for node in self.nodes for shard in self.shards
        }

        def node_of(address: str) -> str:
            return nodes.get(address, address)

        return node_of

    def shard_data_dir(self, shard_id: int) -> str:
        """This node's directory for one shard replica: journal/ and snapshot inside."""
        return os.path.join(self.data_dir, "shards", str(shard_id))

    def raft_config_for(
        self,
        shard_id: int,
        members: Sequence[str] | None = None,
        joining: bool = False,
        learner: bool = False,
    ) -> RaftConfig:
        """The Raft settings of this node's replica of `shard_id` (KeyError if this node
        hosts none): its own address, the other replicas' addresses, the cluster secret.
        `members` (node ids, this node among them) replaces the [[shards]] placement for a
        replica started at runtime; `joining` marks one that joins a running shard, `learner`
        one that joins as a non-voting learner first (0005)."""
        shard = self.shard(shard_id)
        replicas = shard.replicas if members is None else tuple(members)
        if self.node_id not in replicas:
            raise KeyError(f"shard {shard_id} has no replica on node {self.node_id!r}")
        config = self.raft.raft_config(
            self_address=self.raft_address(self.node_id, shard_id),
            peers=[self.raft_address(n, shard_id) for n in replicas if n != self.node_id],
            secret=self.secret,
            snapshot_path=os.path.join(self.shard_data_dir(shard_id), "snapshot"),
        )
        if joining or learner:
            config = dataclasses.replace(config, joining=True, learner=learner)
        if not self.raft_dial:
            return config
        # Every node's address of this shard: a member added later is dialled through
        # the override too.
        shard_addresses = {node.raft_address(shard_id) for node in self.nodes}
        dial = tuple((a, d) for a, d in self.raft_dial if a in shard_addresses)
        return dataclasses.replace(config, dial_overrides=dial).validate()

    def replica_config_for(
        self,
        shard_id: int,
        members: Sequence[str] | None = None,
        joining: bool = False,
        learner: bool = False,
    ) -> ReplicaConfig:
        """Everything `ShardReplica` needs to open this node's replica of `shard_id`
        (`members`, `joining`, `learner`: as for `raft_config_for`)."""
        return ReplicaConfig(
            data_dir=self.shard_data_dir(shard_id),
            raft=self.raft_config_for(shard_id, members, joining, learner),
            store_limits=self.store_limits,
            shard_limits=self.shard_limits,
            node_id=self.node_id,
            shard=shard_id,
        )
