"""tn.toml (`engine serve`, `engine promote`) and cn.toml (`engine cn`), loaded into frozen
dataclasses. The commented examples are configs/tn.toml and configs/cn.toml.

Every problem is a logsvc `ConfigError` naming the key path and the rule, printed without a
traceback by the CLI, which exits 2 (as `logsvc serve` does):

    config error: objects.s3.bucket: required key is missing

The rules are logsvc's (logsvc/config.py; the TOML tables, types, addresses and secret
files are read by its code, so the two products refuse the same mistakes the same way):
unknown keys are errors with a "did you mean"; a boolean is never an integer; addresses are
"host:port"; relative paths are resolved against the config file's directory; a file
holding a secret (the config itself with an inline `token` or S3 key, a `token_file`...)
must not be readable or writable by group or others (`chmod 600`). Secrets never appear in
errors or in `repr()`.

tn.toml:

    [tn]       data_dir, listen, token | token_file, peers = [], cache_bytes,
               log_level = "info", log_format = "text"
    [wal]      client_config (a logsvc client.toml), shard
    [objects]  dir | [objects.s3] endpoint, bucket, prefix = "", region = "us-east-1",
               scheme = "http", access_key | access_key_file, secret_key | secret_key_file
    [watch]    optional: probe_interval_ms, probe_timeout_ms, failures_to_promote,
               failure_window_ms_max (engine/tn/watch.py)
    [maintenance] optional: flush_age_ms, checkpoint_interval_ms,
               checkpoint_wal_reserve_entries, history_retention_ms, snapshot_grace_ms
               (engine/compaction.py Policy; the defaults are engine/limits.py's; 0 ms: no
               history window; snapshot_grace_ms defaults to CN_SNAPSHOT_GRACE_MS)

cn.toml:

    tns = ["host:port", ...], token | token_file, client_id (optional), cache_bytes,
    [objects]  as in tn.toml (read-only for a CN)
    [client]   optional: connect_timeout_ms, request_timeout_ms, failover_wait_ms
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine import limits as engine_limits
from engine.compaction import Policy
from engine.tn import limits
from engine.tn.limits import ClientOptions
from engine.tn.watch import WatchPolicy
from logsvc.client_config import client_address, load_client_config
from logsvc.config_files import (
    CONFIG_FILE_BYTES_MAX,
    SECRET_FILE_MODE_FORBIDDEN,
    ConfigError,
    read_private_file,
    read_secret_file,
    toml_error_rule,
)

# Shared with logsvc's node and client configs on purpose (the module docstring); these are
# logsvc.config_table's private helpers, used here rather than copied.
from logsvc.config_table import _address, _Table
from logsvc.node_config import LOG_FORMATS, LOG_LEVELS

__all__ = [
    "CNConfig",
    "ConfigError",
    "ObjectsConfig",
    "S3Config",
    "TNConfig",
    "load_cn",
    "load_tn",
]

CACHE_BYTES_MIN = 1 * limits.MiB
CACHE_BYTES_MAX = 1024 * 1024 * limits.MiB
"""A cache outside [1 MiB, 1 TiB] is a unit mistake."""

PEERS_MAX = 16
SHARD_MAX = 2**32 - 1
TIMEOUT_MS_MAX = 600_000
"""No client wait above ten minutes: a larger number is a unit mistake."""

_OBJECT_KEYS = ("dir", "s3")
_S3_KEYS = (
    "endpoint",
    "bucket",
    "prefix",
    "region",
    "scheme",
    "access_key",
    "access_key_file",
    "secret_key",
    "secret_key_file",
)


@dataclass(frozen=True, slots=True)
class S3Config:
    endpoint: str
    bucket: str
    prefix: str
    region: str
    scheme: str
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class ObjectsConfig:
    """Exactly one of `dir` (an absolute path) and `s3`."""

    dir: str | None
    s3: S3Config | None


@dataclass(frozen=True, slots=True)
class TNConfig:
    source: str
    data_dir: str
    listen: str
    token: str = field(repr=False)
    peers: tuple[str, ...]
    cache_bytes: int
    log_level: str
    log_format: str
    client_config: str
    shard: int
    objects: ObjectsConfig
    watch: WatchPolicy
    maintenance: Policy = field(default_factory=Policy)


@dataclass(frozen=True, slots=True)
class CNConfig:
    source: str
    tns: tuple[str, ...]
    token: str = field(repr=False)
    client_id: str | None
    cache_bytes: int
    objects: ObjectsConfig
    client: ClientOptions


def load_tn(path: str) -> TNConfig:
    document, mode = _document(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    root = _Table(document, "", ("tn", "wal", "objects", "watch", "maintenance"))
    tn = root.table(
        "tn",
        (
            "data_dir",
            "listen",
            "token",
            "token_file",
            "peers",
            "cache_bytes",
            "log_level",
            "log_format",
        ),
    )
    data_dir = _path(tn, "data_dir", base_dir)
    listen = _address(tn, "listen")
    token = _secret(tn, "token", base_dir, path, mode)
    peers = _addresses(tn, "peers", required=False)
    if listen in peers:
        raise ConfigError(tn.key("peers"), f"lists this TN's own address {listen}")
    cache_bytes = _cache_bytes(tn)
    log_level = tn.string("log_level", default="info")
    if log_level not in LOG_LEVELS:
        raise ConfigError(tn.key("log_level"), f"must be one of {', '.join(LOG_LEVELS)}")
    log_format = tn.string("log_format", default="text")
    if log_format not in LOG_FORMATS:
        raise ConfigError(tn.key("log_format"), f"must be one of {', '.join(LOG_FORMATS)}")
    wal = root.table("wal", ("client_config", "shard"))
    client_config = _path(wal, "client_config", base_dir)
    try:
        load_client_config(client_config)
    except ConfigError as exc:
        rule = f"{client_config}: {exc.key}: {exc.rule}"
        raise ConfigError(wal.key("client_config"), rule) from None
    shard = wal.integer("shard")
    if not 1 <= shard <= SHARD_MAX:
        raise ConfigError(wal.key("shard"), f"must be in 1..{SHARD_MAX} (got {shard})")
    objects = _objects(root, base_dir, path, mode)
    watch = _watch(root.optional_table("watch", [f.name for f in dataclasses.fields(WatchPolicy)]))
    maintenance = _maintenance(root.optional_table("maintenance", MAINTENANCE_KEYS))
    return TNConfig(
        source=path,
        data_dir=data_dir,
        listen=listen,
        token=token,
        peers=peers,
        cache_bytes=cache_bytes,
        log_level=log_level,
        log_format=log_format,
        client_config=client_config,
        shard=shard,
        objects=objects,
        watch=watch,
        maintenance=maintenance,
    )


def load_cn(path: str) -> CNConfig:
    document, mode = _document(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    root = _Table(
        document,
        "",
        ("tns", "token", "token_file", "client_id", "cache_bytes", "objects", "client"),
    )
    tns = _addresses(root, "tns", required=True)
    token = _secret(root, "token", base_dir, path, mode)
    client_id = None
    if "client_id" in root:
        client_id = root.string("client_id")
        if not 1 <= len(client_id.encode()) <= limits.CN_NAME_BYTES_MAX:
            raise ConfigError(
                root.key("client_id"), f"must be 1 to {limits.CN_NAME_BYTES_MAX} bytes"
            )
    cache_bytes = _cache_bytes(root)
    objects = _objects(root, base_dir, path, mode)
    client = _client(
        root.optional_table(
            "client", ("connect_timeout_ms", "request_timeout_ms", "failover_wait_ms")
        )
    )
    return CNConfig(
        source=path,
        tns=tns,
        token=token,
        client_id=client_id,
        cache_bytes=cache_bytes,
        objects=objects,
        client=client,
    )


# --- pieces ------------------------------------------------------------------------------------


def _document(path: str) -> tuple[Mapping[str, object], int]:
    data, mode = read_private_file(path, path, CONFIG_FILE_BYTES_MAX)
    try:
        return tomllib.loads(data.decode("utf-8")), mode
    except UnicodeDecodeError:
        raise ConfigError(path, "is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, toml_error_rule(exc)) from None


def _path(table: _Table, name: str, base_dir: str) -> str:
    value = table.string(name)
    if not value:
        raise ConfigError(table.key(name), "must be a non-empty path")
    return os.path.normpath(os.path.join(base_dir, value))


def _addresses(table: _Table, name: str, *, required: bool) -> tuple[str, ...]:
    if not required and name not in table:
        return ()
    values = table.strings(name)
    if required and not values:
        raise ConfigError(table.key(name), 'must list at least one "host:port"')
    if len(values) > PEERS_MAX:
        raise ConfigError(table.key(name), f"lists more than {PEERS_MAX} addresses")
    checked = tuple(
        client_address(value, f"{table.key(name)}[{index}]") for index, value in enumerate(values)
    )
    if len(set(checked)) != len(checked):
        raise ConfigError(table.key(name), "lists an address twice")
    return checked


def _secret(table: _Table, name: str, base_dir: str, source: str, mode: int) -> str:
    """`name` inline (then the file holding it must be private) or `name`_file (a private
    file); exactly one."""
    file_name = f"{name}_file"
    if (name in table) == (file_name in table):
        raise ConfigError(table.key(name), f"set exactly one of {name} and {file_name}")
    if name in table:
        value = table.string(name)
        if mode & SECRET_FILE_MODE_FORBIDDEN:
            raise ConfigError(
                source,
                f"holds {table.key(name)} but is readable or writable by group or others; "
                f"run `chmod 600 {source}`",
            )
    else:
        value = read_secret_file(_path(table, file_name, base_dir), table.key(file_name))
    if not value or not value.isprintable() or " " in value:
        raise ConfigError(table.key(name), "must be printable, without spaces, not empty")
    if len(value.encode()) > limits.TOKEN_BYTES_MAX:
        raise ConfigError(table.key(name), f"is longer than {limits.TOKEN_BYTES_MAX} bytes")
    return value


def _cache_bytes(table: _Table) -> int:
    if "cache_bytes" not in table:
        return engine_limits.CACHE_BYTES
    value = table.integer("cache_bytes")
    if not CACHE_BYTES_MIN <= value <= CACHE_BYTES_MAX:
        raise ConfigError(
            table.key("cache_bytes"),
            f"must be in {CACHE_BYTES_MIN}..{CACHE_BYTES_MAX} bytes (got {value})",
        )
    return value


def _objects(root: _Table, base_dir: str, source: str, mode: int) -> ObjectsConfig:
    objects = root.table("objects", _OBJECT_KEYS)
    if ("dir" in objects) == ("s3" in objects):
        raise ConfigError(objects.key("dir"), "set exactly one of dir and [objects.s3]")
    if "dir" in objects:
        return ObjectsConfig(_path(objects, "dir", base_dir), None)
    s3 = objects.table("s3", _S3_KEYS)
    endpoint = client_address(s3.string("endpoint"), s3.key("endpoint"))
    bucket = s3.string("bucket")
    if not 3 <= len(bucket) <= 63:
        raise ConfigError(s3.key("bucket"), "must be an S3 bucket name (3 to 63 characters)")
    scheme = s3.string("scheme", default="http")
    if scheme not in ("http", "https"):
        raise ConfigError(s3.key("scheme"), 'must be "http" or "https"')
    return ObjectsConfig(
        None,
        S3Config(
            endpoint=endpoint,
            bucket=bucket,
            prefix=s3.string("prefix") if "prefix" in s3 else "",
            region=s3.string("region", default="us-east-1"),
            scheme=scheme,
            access_key=_secret(s3, "access_key", base_dir, source, mode),
            secret_key=_secret(s3, "secret_key", base_dir, source, mode),
        ),
    )


def _watch(table: _Table | None) -> WatchPolicy:
    if table is None:
        return WatchPolicy()
    values = {
        f.name: table.integer(f.name) for f in dataclasses.fields(WatchPolicy) if f.name in table
    }
    policy = WatchPolicy(**values)
    problem = policy.problem()
    if problem is not None:
        name, _, rule = problem.partition(": ")
        raise ConfigError(table.key(name), rule)
    return policy


MAINTENANCE_KEYS = (
    "flush_age_ms",
    "checkpoint_interval_ms",
    "checkpoint_wal_reserve_entries",
    "history_retention_ms",
    "snapshot_grace_ms",
)
MAINTENANCE_MS_MIN = 100
"""Below this the engine would flush or checkpoint at every maintenance round (every
engine_limits.MAINTENANCE_INTERVAL_MS): surely a typo."""
MAINTENANCE_MS_MAX = 24 * 3600 * 1000
WAL_RESERVE_ENTRIES_MAX = 10_000_000


TN_POLICY = Policy(snapshot_grace_ms=engine_limits.CN_SNAPSHOT_GRACE_MS)
"""A TN's maintenance without a `[maintenance]` table: the engine's defaults, and compute
nodes' snapshots kept for `CN_SNAPSHOT_GRACE_MS` after a rewrite drops them."""


def _maintenance(table: _Table | None) -> Policy:
    if table is None:
        return TN_POLICY
    values: dict[str, int] = {"snapshot_grace_ms": TN_POLICY.snapshot_grace_ms}
    for name in MAINTENANCE_KEYS:
        if name in table:
            value = table.integer(name)
            if name == "checkpoint_wal_reserve_entries":
                low, high = 0, WAL_RESERVE_ENTRIES_MAX
            elif name == "history_retention_ms":
                low, high = 0, engine_limits.HISTORY_RETENTION_MS_MAX  # 0: no window
            elif name == "snapshot_grace_ms":
                low, high = 0, MAINTENANCE_MS_MAX  # 0: a flush may refuse in-flight CN txns
            else:
                low, high = MAINTENANCE_MS_MIN, MAINTENANCE_MS_MAX
            if not low <= value <= high:
                unit = "" if name == "checkpoint_wal_reserve_entries" else " ms"
                raise ConfigError(table.key(name), f"must be in {low}..{high}{unit}")
            values[name] = value
    return Policy(**values)


def _client(table: _Table | None) -> ClientOptions:
    if table is None:
        return ClientOptions()
    values: dict[str, float] = {}
    for name, option in (
        ("connect_timeout_ms", "connect_timeout_s"),
        ("request_timeout_ms", "request_timeout_s"),
        ("failover_wait_ms", "failover_wait_s_max"),
    ):
        if name in table:
            value = table.integer(name)
            if not 1 <= value <= TIMEOUT_MS_MAX:
                raise ConfigError(table.key(name), f"must be in 1..{TIMEOUT_MS_MAX} ms")
            values[option] = value / 1000
    return ClientOptions(**values)  # type: ignore[arg-type]
