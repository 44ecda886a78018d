"""The node configuration: one TOML file per node, loaded into frozen dataclasses.

    logsvc serve --config /etc/logsvc/n1.toml

`load_node_config(path)` reads and checks the file; `parse_node_config(data, source=...)`
checks an already-parsed TOML document (it touches the file system only to read
`secret_file` / `token_file`, through a reader that tests may replace). Every problem is a
`ConfigError` whose message names the key path and the rule:

    config error: shards[1].replicas: must list 3 or 5 distinct node ids (got 2)

Key paths are dotted, with 0-based indexes into arrays of tables (`cluster.nodes[0].id`);
a problem with a whole file names the file instead. The CLI prints the message (no
traceback) and exits 2 (`main_config_error`). Validation stops at the first problem, in
file order: unknown keys of a table are reported before its values.

Schema (the documented examples are in `configs/`; only [node] differs between the
files of one cluster, every other section must be identical on every node):

    [node]           id, data_dir, log_level = "info" (debug|info|warning|error),
                     log_format = "text" (text|json: one JSON object a line, logsvc/logs.py),
                     journal = "shard" (shard: each replica's store syncs its own files;
                     node: one shared node journal, docs/decisions/0011-shared-journal.md)
    [cluster]        secret | secret_file (exactly one), token | token_file (exactly one)
    [[cluster.nodes]] id, data_address, admin_address, raft_host, raft_port_base
    [[shards]]       id, replicas (3 or 5 distinct ids of cluster.nodes)
    [limits.store]   optional, the fields of `StoreLimits` (validated by it)
    [limits.shard]   optional, the fields of `ShardLimits` (identical on every node!)
    [limits.server]  optional, the fields of `ServerLimits` (logsvc/node/limits.py)
    [raft]           optional, election_timeout_ms_min/max, heartbeat_ms,
                     leader_fallback_ms, connection_timeout_ms, quiesce_after_ms
                     (`RaftConfig`; 0 = never quiesce), threads (the node's Raft
                     scheduler threads, logsvc/shard/scheduler.py), leader_moves_per_s
                     (leadership transfers a second to balance leaders, 0 = never;
                     logsvc/shard/leader_balance.py)

Rules beyond each key's own (why, in the comments where they are checked):
* unknown keys are errors everywhere (pysyncobj silently ignores unknown settings; a typo
  in a timeout must not silently run with the default), with a "did you mean";
* TOML types are checked and a boolean is never an integer;
* addresses are "host:port" (IPv6 as "[::1]:7101"), ports 1..65535, no wildcard hosts:
  each address is where the node listens *and* where others connect;
* the Raft port of a replica is `raft_port_base + shard id` on `raft_host`; every
  (host, port) of the cluster (data, admin, and the Raft port of every node for every
  shard) is distinct;
* relative paths (`data_dir`, `*_file`) are resolved against the config file's directory;
* secrets (ARCHITECTURE.md §9): the cluster secret guards the Raft port, which executes
  pickles, so it is mandatory, at least 16 characters, and differs from the token (which
  clients hold). A file holding a secret (the config file with an inline `secret` or
  `token`, a `secret_file`, a `token_file`) must not be readable or writable by group or
  others: the error names the file and `chmod 600`. Secret values never appear in errors
  or in `repr()`.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import math
import os
import re
import stat
import tomllib
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time
from typing import TYPE_CHECKING, Final, TypeVar

from logsvc.client_config import ClientConfig as ClientConfig
from logsvc.client_config import client_address as client_address
from logsvc.client_config import load_client_config as load_client_config
from logsvc.config_files import (
    CONFIG_FILE_BYTES_MAX,
    KIB,
    PORT_DIGITS,
    SECRET_FILE_MODE_FORBIDDEN,
    read_private_file,
    read_secret_file,
    split_address,
    toml_error_rule,
)
from logsvc.config_files import EXIT_CONFIG_ERROR as EXIT_CONFIG_ERROR
from logsvc.config_files import PORT_MAX as PORT_MAX
from logsvc.config_files import SECRET_FILE_BYTES_MAX as SECRET_FILE_BYTES_MAX
from logsvc.config_files import ConfigError as ConfigError
from logsvc.config_files import main_config_error as main_config_error
from logsvc.node.limits import ServerLimits
from logsvc.shard.limits import ShardLimits
from logsvc.shard.raft.config import RaftConfig
from logsvc.shard.replica import ReplicaConfig
from logsvc.shard.scheduler import WORKERS_DEFAULT, WORKERS_MAX
from logsvc.store.limits import StoreLimits

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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
_NODE_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{NODE_ID_CHARS_MAX - 1}}}")
_HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


# ---------------------------------------------------------------------------- the values


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
# 0 means "never" for these.
_RAFT_ZERO_ALLOWED: Final = frozenset({"quiesce_after_ms"})
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


# --------------------------------------------------------------------------- loading

# Reads a secret file: (absolute path, key path for errors) -> contents, stripped.
SecretReader = Callable[[str, str], str]


def load_node_config(path: str) -> NodeConfig:
    """Read, parse and validate the node configuration at `path`."""
    data_bytes, mode = read_private_file(path, path, CONFIG_FILE_BYTES_MAX)
    try:
        text = data_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, f"is not UTF-8 text (bad byte at offset {exc.start})") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, toml_error_rule(exc)) from None
    inline = _inline_secret_keys(document)
    if inline and mode & SECRET_FILE_MODE_FORBIDDEN:
        raise ConfigError(
            path,
            f"holds {' and '.join(inline)} but is readable or writable by group or others "
            f"(mode {stat.S_IMODE(mode):04o}); run `chmod 600 {path}`, or move the value "
            "to a file named by secret_file / token_file",
        )
    config = parse_node_config(document, source=path)
    dial = parse_test_raft_dial(os.environ.get(TEST_RAFT_DIAL_ENV), config)
    return dataclasses.replace(config, raft_dial=dial) if dial else config


# Test only: the chaos suite routes each node's Raft connections through its proxy mesh
# (tests/chaos/harness/proxy.py) by setting this to a JSON object
# {"<canonical raft address>": "<host:port to dial instead>", ...}. Never set in production.
TEST_RAFT_DIAL_ENV: Final = "LOGSVC_TEST_RAFT_DIAL"
TEST_RAFT_DIAL_CHARS_MAX = 64 * KIB


def parse_test_raft_dial(value: str | None, config: NodeConfig) -> tuple[tuple[str, str], ...]:
    """Parse LOGSVC_TEST_RAFT_DIAL (None or "" = no overrides). Every key must be a Raft
    address of the cluster (a typo would silently bypass the proxy and make a chaos test
    vacuous); every value "host:port". A ConfigError names the variable."""
    if not value:
        return ()
    key = TEST_RAFT_DIAL_ENV
    if len(value) > TEST_RAFT_DIAL_CHARS_MAX:
        raise ConfigError(key, f"is longer than {TEST_RAFT_DIAL_CHARS_MAX} characters")
    try:
        document = json.loads(value)
    except ValueError as exc:
        raise ConfigError(key, f"is not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise ConfigError(key, 'must be a JSON object {"raft address": "host:port", ...}')
    known = {node.raft_address(shard.id) for node in config.nodes for shard in config.shards}
    overrides: list[tuple[str, str]] = []
    for canonical, dial in document.items():
        if canonical not in known:
            raise ConfigError(key, f"{canonical!r} is not the Raft address of any replica")
        host, _, port = dial.rpartition(":") if isinstance(dial, str) else ("", "", "")
        if not (host and PORT_DIGITS.fullmatch(port) and 1 <= int(port) <= PORT_MAX):
            raise ConfigError(key, f'{canonical!r} must map to "host:port" (got {dial!r})')
        overrides.append((canonical, dial))
    return tuple(sorted(overrides))


def _inline_secret_keys(document: Mapping[str, object]) -> list[str]:
    cluster = document.get("cluster")
    if not isinstance(cluster, dict):
        return []
    return [f"cluster.{name}" for name in ("secret", "token") if name in cluster]


# --------------------------------------------------------------------------- parsing

TOP_KEYS: Final = ("node", "cluster", "shards", "limits", "raft")
NODE_KEYS: Final = ("id", "data_dir", "log_level", "log_format", "journal")
CLUSTER_KEYS: Final = ("secret", "secret_file", "token", "token_file", "nodes")
CLUSTER_NODE_KEYS: Final = ("id", "data_address", "admin_address", "raft_host", "raft_port_base")
SHARD_KEYS: Final = ("id", "replicas")
LIMITS_KEYS: Final = ("store", "shard", "server")


def parse_node_config(
    data: Mapping[str, object],
    *,
    source: str,
    read_secret: SecretReader = read_secret_file,
) -> NodeConfig:
    """Validate a parsed TOML document (a dict from `tomllib`) completely.

    `source` is the config file's path: relative paths in the document are resolved
    against its directory. `read_secret` reads `secret_file` / `token_file`.
    """
    base_dir = os.path.dirname(os.path.abspath(source))
    root = _Table(data, "", TOP_KEYS)

    node = root.table("node", NODE_KEYS)
    node_id = _node_id(node, "id")
    data_dir = _path(node, "data_dir", base_dir)
    log_level = node.string("log_level", default="info")
    if log_level not in LOG_LEVELS:
        raise ConfigError(
            node.key("log_level"), f"must be one of {', '.join(LOG_LEVELS)} (got {log_level!r})"
        )
    log_format = node.string("log_format", default="text")
    if log_format not in LOG_FORMATS:
        raise ConfigError(
            node.key("log_format"),
            f"must be one of {', '.join(LOG_FORMATS)} (got {log_format!r})",
        )

    journal_mode = node.string("journal", default="shard")
    if journal_mode not in JOURNAL_MODES:
        raise ConfigError(
            node.key("journal"),
            f"must be one of {', '.join(JOURNAL_MODES)} (got {journal_mode!r})",
        )

    cluster = root.table("cluster", CLUSTER_KEYS)
    secret = _secret(cluster, "secret", base_dir, read_secret)
    token = _secret(cluster, "token", base_dir, read_secret)
    token_key = cluster.key("token_file" if "token_file" in cluster else "token")
    if not all(0x21 <= ord(char) <= 0x7E for char in token):
        # It travels in an HTTP Authorization header and in data-plane frames.
        raise ConfigError(token_key, "must be printable ASCII without spaces")
    if token == secret:
        # Every client holds the token; the secret guards the Raft port, which executes
        # pickles. Sharing one value would hand clients the Raft port.
        raise ConfigError(token_key, "must differ from the cluster secret")
    nodes = _cluster_nodes(cluster)

    if node_id not in {n.id for n in nodes}:
        raise ConfigError(
            node.key("id"),
            f"{node_id!r} is not one of the ids in cluster.nodes "
            f"({', '.join(n.id for n in nodes)})",
        )

    shards = _shards(root, nodes)
    _check_ports(cluster, nodes, shards)

    limits = root.optional_table("limits", LIMITS_KEYS)
    store_limits = _limits(limits, "store", StoreLimits, lambda x: x.validate())
    shard_limits = _limits(
        limits,
        "shard",
        ShardLimits,
        lambda x: x.validate(store_limits.record_payload_bytes_max),
    )
    server_limits = _limits(limits, "server", ServerLimits, lambda x: x.validate(shard_limits))
    raft = _raft(root.optional_table("raft", RAFT_KEYS), secret)

    return NodeConfig(
        source=source,
        node_id=node_id,
        data_dir=data_dir,
        log_level=log_level,
        log_format=log_format,
        journal_mode=journal_mode,
        nodes=nodes,
        shards=shards,
        store_limits=store_limits,
        shard_limits=shard_limits,
        server_limits=server_limits,
        raft=raft,
        secret=secret,
        token=token,
    )


def _node_id(table: _Table, name: str) -> str:
    value = table.string(name)
    if not _NODE_ID.fullmatch(value):
        raise ConfigError(
            table.key(name),
            f"must be 1 to {NODE_ID_CHARS_MAX} letters, digits, '_', '-' or '.', starting "
            f"with a letter or digit (got {value!r})",
        )
    return value


def _path(table: _Table, name: str, base_dir: str) -> str:
    value = table.string(name)
    if not value or "\0" in value:
        raise ConfigError(table.key(name), "must be a non-empty path")
    return os.path.normpath(os.path.join(base_dir, value))


def _secret(cluster: _Table, name: str, base_dir: str, read_secret: SecretReader) -> str:
    """`name` inline or `name_file`: exactly one of them."""
    file_name = f"{name}_file"
    if name in cluster and file_name in cluster:
        raise ConfigError(cluster.key(name), f"set either {name} or {file_name}, not both")
    if name not in cluster and file_name not in cluster:
        raise ConfigError(
            cluster.key(name),
            f"required: set {file_name} (a file holding it, mode 600) or {name}",
        )
    if file_name in cluster:
        key = cluster.key(file_name)
        path = _path(cluster, file_name, base_dir)
        value = read_secret(path, key)
        where = f"the {name} in {path} "
    else:
        key = cluster.key(name)
        value = cluster.string(name).strip()
        where = ""
    if not SECRET_CHARS_MIN <= len(value) <= SECRET_CHARS_MAX:
        raise ConfigError(
            key,
            f"{where}must be {SECRET_CHARS_MIN} to {SECRET_CHARS_MAX} characters "
            f"(got {len(value)})",
        )
    return value


def _cluster_nodes(cluster: _Table) -> tuple[ClusterNode, ...]:
    tables = cluster.tables("nodes", CLUSTER_NODE_KEYS)
    if not 1 <= len(tables) <= NODES_MAX:
        raise ConfigError(
            cluster.key("nodes"), f"must list 1 to {NODES_MAX} nodes (got {len(tables)})"
        )
    nodes: list[ClusterNode] = []
    seen: set[str] = set()
    for table in tables:
        node_id = _node_id(table, "id")
        if node_id in seen:
            raise ConfigError(table.key("id"), f"duplicate node id {node_id!r}")
        seen.add(node_id)
        data_address = _address(table, "data_address")
        admin_address = _address(table, "admin_address")
        raft_host = _raft_host(table, "raft_host")
        raft_port_base = table.integer("raft_port_base")
        if not 0 <= raft_port_base < PORT_MAX:
            raise ConfigError(
                table.key("raft_port_base"),
                f"must be in 0..{PORT_MAX - 1} (got {raft_port_base})",
            )
        nodes.append(ClusterNode(node_id, data_address, admin_address, raft_host, raft_port_base))
    return tuple(nodes)


def _shards(root: _Table, nodes: Sequence[ClusterNode]) -> tuple[ShardConfig, ...]:
    tables = root.tables("shards", SHARD_KEYS)
    if not 1 <= len(tables) <= SHARDS_MAX:
        raise ConfigError("shards", f"must list 1 to {SHARDS_MAX} shards (got {len(tables)})")
    known = [n.id for n in nodes]
    shards: list[ShardConfig] = []
    seen: set[int] = set()
    for table in tables:
        shard_id = table.integer("id")
        if shard_id < 1:
            raise ConfigError(table.key("id"), f"must be a positive integer (got {shard_id})")
        if shard_id in seen:
            raise ConfigError(table.key("id"), f"duplicate shard id {shard_id}")
        seen.add(shard_id)
        replicas = table.strings("replicas")
        for index, replica in enumerate(replicas):
            if replica not in known:
                raise ConfigError(
                    f"{table.key('replicas')}[{index}]",
                    f"unknown node id {replica!r} (cluster.nodes has {', '.join(known)})",
                )
        distinct = len(set(replicas))
        if distinct != len(replicas) or distinct not in REPLICA_COUNTS:
            repeated = sorted({r for r in replicas if replicas.count(r) > 1})
            got = f"{distinct}"
            if repeated:
                got = f"{len(replicas)}, with {', '.join(map(repr, repeated))} repeated"
            raise ConfigError(
                table.key("replicas"), f"must list 3 or 5 distinct node ids (got {got})"
            )
        shards.append(ShardConfig(shard_id, tuple(replicas)))
    return tuple(shards)


def _check_ports(
    cluster: _Table, nodes: Sequence[ClusterNode], shards: Sequence[ShardConfig]
) -> None:
    """Every (host, port) this cluster listens on is distinct.

    Raft ports are checked for every node and every shard, not only the replicas placed
    today, so a membership change can put a replica of any shard on any node.
    """
    used: dict[tuple[str, int], str] = {}  # (host, port) -> who uses it

    def claim(host: str, port: int, key: str, user: str) -> None:
        where = (_host_identity(host), port)
        other = used.get(where)
        if other is not None:
            what = f"{user}: port" if user else "port"
            raise ConfigError(key, f"{what} {port} on {host} is also used by {other}")
        used[where] = f"{key} ({user})" if user else key

    nodes_key = cluster.key("nodes")
    for index, node in enumerate(nodes):
        for name in ("data_address", "admin_address"):
            host, port = split_address(getattr(node, name))
            claim(host, port, f"{nodes_key}[{index}].{name}", "")
    shard_id_max = max(shard.id for shard in shards)
    for index, node in enumerate(nodes):
        key = f"{nodes_key}[{index}].raft_port_base"
        if node.raft_port_base + shard_id_max > PORT_MAX:
            raise ConfigError(
                key,
                f"raft_port_base + shard id must be at most {PORT_MAX} "
                f"(shard {shard_id_max} gives {node.raft_port_base + shard_id_max})",
            )
        for shard in shards:
            port = node.raft_port_base + shard.id
            claim(node.raft_host, port, key, f"Raft port of shard {shard.id}")


_L = TypeVar("_L", bound="DataclassInstance")


def _limits(
    limits: _Table | None, name: str, cls: type[_L], validate: Callable[[_L], object]
) -> _L:
    """One [limits.<name>] table: exactly the fields of the limits class `cls` (each an int,
    or an int or float where the field is a float), then `cls`'s own checks. Any frozen
    dataclass of numbers with a `validate()` raising "field: rule" fits here."""
    names = tuple(limit.name for limit in dataclasses.fields(cls))
    hints = typing.get_type_hints(cls)
    path = _join("limits", name)
    table = None if limits is None else limits.optional_table(name, names)
    values: dict[str, float] = {}
    for field_name in names:
        if table is not None and field_name in table:
            hint = hints[field_name]
            assert hint in (int, float), f"{cls.__name__}.{field_name}: int or float only"
            is_float = hint is float
            values[field_name] = table.number(field_name) if is_float else table.integer(field_name)
    result = cls(**values)
    try:
        validate(result)
    except ValueError as exc:
        raise _config_error_of(path, names, exc) from None
    return result


def _raft(table: _Table | None, secret: str) -> RaftTimings:
    values: dict[str, int] = {}
    if table is not None:
        for name in RAFT_MS_KEYS:
            if name in table:
                value = table.integer(name)
                low = 0 if name in _RAFT_ZERO_ALLOWED else 1
                if not low <= value <= RAFT_MS_MAX:
                    raise ConfigError(
                        table.key(name), f"must be in {low}..{RAFT_MS_MAX} ms (got {value})"
                    )
                values[name] = value
        if "threads" in table:
            threads = table.integer("threads")
            if not 1 <= threads <= RAFT_THREADS_MAX:
                raise ConfigError(
                    table.key("threads"), f"must be in 1..{RAFT_THREADS_MAX} (got {threads})"
                )
            values["threads"] = threads
        if "leader_moves_per_s" in table:
            moves = table.integer("leader_moves_per_s")
            if not 0 <= moves <= LEADER_MOVES_PER_S_MAX:
                raise ConfigError(
                    table.key("leader_moves_per_s"),
                    f"must be in 0..{LEADER_MOVES_PER_S_MAX} (got {moves})",
                )
            values["leader_moves_per_s"] = moves
    timings = RaftTimings(**values)
    try:
        # RaftConfig holds the rules relating the timings; check them now, not at start.
        timings.raft_config("127.0.0.1:1", (), secret, "")
    except ValueError as exc:
        raise _config_error_of("raft", RAFT_KEYS, exc) from None
    return timings


def _config_error_of(path: str, names: Sequence[str], exc: ValueError) -> ConfigError:
    """Map a limits class's ValueError ("field: rule", or RaftConfig's "raft: field rule")
    to a ConfigError on the key path of the field."""
    message = str(exc)
    head, sep, rest = message.partition(": ")
    if sep and head in names:
        return ConfigError(_join(path, head), rest)
    if sep and head == "raft":
        word, _, tail = rest.partition(" ")
        if word in names and tail:
            return ConfigError(_join(path, word), tail)
    return ConfigError(path, message)


# ---------------------------------------------------------------- addresses and hosts


def _address(table: _Table, name: str) -> str:
    value = table.string(name)
    try:
        host, _ = split_address(value)
    except ValueError as exc:
        raise ConfigError(table.key(name), str(exc)) from None
    problem = _host_problem(host)
    if problem:
        raise ConfigError(table.key(name), problem)
    return value


def _raft_host(table: _Table, name: str) -> str:
    value = table.string(name)
    host = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        if ":" in host:
            raise ConfigError(
                table.key(name),
                f"must be a host without a port (got {value!r}); the Raft port of "
                "shard s is raft_port_base + s",
            ) from None
    problem = _host_problem(host)
    if problem:
        raise ConfigError(table.key(name), problem)
    return host


def _host_problem(host: str) -> str:
    """Why `host` is unusable, or "" if it is fine."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if _HOSTNAME.fullmatch(host):
            return ""
        return f"{host!r} is not a host name or IP address"
    if ip.is_unspecified:
        # Every address is both where this node listens and where the others (and
        # clients) connect; "any interface" is not something one can connect to.
        return f"must be an address others can connect to, not the wildcard {host}"
    return ""


def _host_identity(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))  # one spelling per IPv6 address
    except ValueError:
        return host.lower()


# ------------------------------------------------------------------------ TOML tables


def _join(path: str, key: str) -> str:
    shown = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
    return f"{path}.{shown}" if path else shown


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime | date | time):
        return "a date/time"
    return type(value).__name__


class _Table:
    """One TOML table being read: knows its key path; rejects unknown keys up front, so a
    typo is reported as a typo and not as the missing key it was meant to be."""

    __slots__ = ("_data", "path")

    def __init__(self, data: Mapping[str, object], path: str, allowed: Sequence[str]) -> None:
        self._data = data
        self.path = path
        unknown = [key for key in data if key not in allowed]
        if unknown:
            rule = "unknown key"
            close = difflib.get_close_matches(unknown[0], allowed, n=1)
            if close:
                rule += f" (did you mean {close[0]!r}?)"
            if len(unknown) > 1:
                rule += "; also unknown: " + ", ".join(self.key(k) for k in unknown[1:])
            rule += "; allowed here: " + ", ".join(allowed)
            raise ConfigError(self.key(unknown[0]), rule)

    def __contains__(self, name: str) -> bool:
        return name in self._data

    def key(self, name: str) -> str:
        return _join(self.path, name)

    def _get(self, name: str) -> object:
        if name not in self._data:
            raise ConfigError(self.key(name), "required key is missing")
        return self._data[name]

    def _wrong_type(self, name: str, expected: str, value: object) -> ConfigError:
        # The value itself is never shown: it might be a secret.
        return ConfigError(self.key(name), f"must be {expected} (got {_toml_type(value)})")

    def string(self, name: str, *, default: str | None = None) -> str:
        if default is not None and name not in self._data:
            return default
        value = self._get(name)
        if not isinstance(value, str):
            raise self._wrong_type(name, "a string", value)
        return value

    def integer(self, name: str) -> int:
        value = self._get(name)
        if not isinstance(value, int) or isinstance(value, bool):  # bool is an int subclass
            raise self._wrong_type(name, "an integer", value)
        return value

    def number(self, name: str) -> float:
        value = self._get(name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._wrong_type(name, "a number", value)
        if not math.isfinite(value):  # TOML has nan and inf
            raise ConfigError(self.key(name), f"must be a finite number (got {value})")
        return float(value)

    def strings(self, name: str) -> list[str]:
        value = self._get(name)
        if not isinstance(value, list):
            raise self._wrong_type(name, "an array of strings", value)
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise ConfigError(
                    f"{self.key(name)}[{index}]", f"must be a string (got {_toml_type(item)})"
                )
        return [str(item) for item in value]

    def table(self, name: str, allowed: Sequence[str]) -> _Table:
        value = self._get(name)
        if not isinstance(value, dict):
            raise self._wrong_type(name, f"a table ([{self.key(name)}])", value)
        return _Table(value, self.key(name), allowed)

    def optional_table(self, name: str, allowed: Sequence[str]) -> _Table | None:
        return self.table(name, allowed) if name in self._data else None

    def tables(self, name: str, allowed: Sequence[str]) -> list[_Table]:
        value = self._get(name)
        shape = f"an array of tables ([[{self.key(name)}]])"
        if not isinstance(value, list):
            raise self._wrong_type(name, shape, value)
        tables: list[_Table] = []
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise ConfigError(
                    f"{self.key(name)}[{index}]", f"must be a table (got {_toml_type(item)})"
                )
            tables.append(_Table(item, f"{self.key(name)}[{index}]", allowed))
        return tables
