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

Where the parts live: this module loads and checks (`load_node_config`, `parse_node_config`,
one function per rule group); the values it returns, with their defaults and bounds, are in
`logsvc/node_config.py`; reading TOML tables and checking addresses is `logsvc/config_table.py`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import tomllib
import typing
from collections.abc import Callable, Mapping, Sequence
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
from logsvc.config_table import _address, _host_identity, _join, _raft_host
from logsvc.config_table import _Table as _Table
from logsvc.node.limits import ServerLimits
from logsvc.node_config import JOURNAL_MODES as JOURNAL_MODES
from logsvc.node_config import LEADER_MOVES_PER_S_DEFAULT as LEADER_MOVES_PER_S_DEFAULT
from logsvc.node_config import LEADER_MOVES_PER_S_MAX as LEADER_MOVES_PER_S_MAX
from logsvc.node_config import LOG_FORMATS as LOG_FORMATS
from logsvc.node_config import LOG_LEVELS as LOG_LEVELS
from logsvc.node_config import NODE_ID_CHARS_MAX as NODE_ID_CHARS_MAX
from logsvc.node_config import NODES_MAX as NODES_MAX
from logsvc.node_config import RAFT_KEYS as RAFT_KEYS
from logsvc.node_config import RAFT_MS_KEYS as RAFT_MS_KEYS
from logsvc.node_config import RAFT_MS_MAX as RAFT_MS_MAX
from logsvc.node_config import RAFT_THREADS_DEFAULT as RAFT_THREADS_DEFAULT
from logsvc.node_config import RAFT_THREADS_MAX as RAFT_THREADS_MAX
from logsvc.node_config import REPLICA_COUNTS as REPLICA_COUNTS
from logsvc.node_config import SECRET_CHARS_MAX as SECRET_CHARS_MAX
from logsvc.node_config import SECRET_CHARS_MIN as SECRET_CHARS_MIN
from logsvc.node_config import SHARDS_MAX as SHARDS_MAX
from logsvc.node_config import ClusterNode as ClusterNode
from logsvc.node_config import NodeConfig as NodeConfig
from logsvc.node_config import RaftTimings as RaftTimings
from logsvc.node_config import ShardConfig as ShardConfig
from logsvc.shard.limits import ShardLimits
from logsvc.store.limits import StoreLimits

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


_NODE_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{NODE_ID_CHARS_MAX - 1}}}")


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

# 0 means "never" for these.
_RAFT_ZERO_ALLOWED: Final = frozenset({"quiesce_after_ms"})

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
