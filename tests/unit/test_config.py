"""The node configuration loader (logsvc/config.py).

What it proves: every example in configs/ loads (the local ones from a copy in a temp dir
with real mode-600 secret files, the production one with its secret files replaced by an
in-memory reader) and yields the placement, Raft addresses and limits the comments promise;
every bad config in a table is refused with a ConfigError naming the exact key path and
the rule; files holding secrets that group or others can read are refused with the file
and `chmod 600`; TOML syntax errors give line and column; secrets never appear in repr().
The client config (client.toml): `admin_addresses` is optional and checked like
`addresses`, a bad value refused naming the key.

How: bad configs are small edits of one valid document (a Python dict, as tomllib returns),
parsed with `parse_node_config`; file-level rules go through `load_node_config` on files
in tmp_path. No sockets, no threads, no sleeps.
"""

from __future__ import annotations

import copy
import os
import shutil
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from logsvc import config as config_module
from logsvc.config import (
    ClusterNode,
    ConfigError,
    NodeConfig,
    load_client_config,
    load_node_config,
    main_config_error,
    parse_node_config,
)
from logsvc.node.limits import ServerLimits
from logsvc.shard.limits import ShardLimits
from logsvc.shard.raft.config import RaftConfig
from logsvc.store.limits import StoreLimits

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SECRET = "s3cret-s3cret-s3cret"
TOKEN = "t0ken-t0ken-t0ken-t0ken"


def valid_document() -> dict[str, Any]:
    """A valid 3-node, 2-shard config with inline secrets: the base every bad case edits."""
    return {
        "node": {"id": "n1", "data_dir": "/var/lib/logsvc/n1"},
        "cluster": {
            "secret": SECRET,
            "token": TOKEN,
            "nodes": [
                {
                    "id": f"n{i}",
                    "data_address": f"127.0.0.1:710{i}",
                    "admin_address": f"127.0.0.1:720{i}",
                    "raft_host": "127.0.0.1",
                    "raft_port_base": 7200 + 100 * i,
                }
                for i in (1, 2, 3)
            ],
        },
        "shards": [
            {"id": 1, "replicas": ["n1", "n2", "n3"]},
            {"id": 2, "replicas": ["n1", "n2", "n3"]},
        ],
    }


def no_secret_files(path: str, key: str) -> str:
    raise AssertionError(f"unexpected secret file read: {path}")


def parse(document: dict[str, Any], source: str = "/etc/logsvc/n1.toml") -> NodeConfig:
    return parse_node_config(document, source=source, read_secret=no_secret_files)


# ------------------------------------------------------------------------------ examples


def test_local_examples_load_with_mode_600_secret_files(tmp_path: Path) -> None:
    for name in ("local-n1.toml", "local-n2.toml", "local-n3.toml"):
        shutil.copy(CONFIGS / name, tmp_path / name)
    for name, value in (("secret", SECRET), ("token", TOKEN)):
        (tmp_path / name).write_text(value + "\n")
        os.chmod(tmp_path / name, 0o600)

    configs = [load_node_config(str(tmp_path / f"local-n{i}.toml")) for i in (1, 2, 3)]

    for i, config in enumerate(configs, start=1):
        assert config.node_id == f"n{i}"
        assert config.data_dir == str(tmp_path / f"n{i}")  # relative to the file
        assert config.secret == SECRET  # file contents, stripped
        assert config.token == TOKEN
        assert [s.id for s in config.shards_hosted()] == [1, 2]
        assert config.store_limits == StoreLimits()
        assert config.shard_limits == ShardLimits()
        assert config.server_limits == ServerLimits()
    n1 = configs[0]
    assert n1.node == ClusterNode("n1", "127.0.0.1:7101", "127.0.0.1:7201", "127.0.0.1", 7300)
    raft = n1.raft_config_for(2)
    assert raft == RaftConfig(
        self_address="127.0.0.1:7302",
        peers=("127.0.0.1:7402", "127.0.0.1:7502"),
        secret=SECRET,
        snapshot_path=str(tmp_path / "n1" / "shards" / "2" / "snapshot"),
    )
    replica = n1.replica_config_for(2)
    assert replica.data_dir == str(tmp_path / "n1" / "shards" / "2")
    assert replica.raft == raft
    # Every node of the cluster computes the same Raft addresses.
    assert {c.raft_address("n3", 1) for c in configs} == {"127.0.0.1:7501"}


def test_production_example_parses_and_spells_out_the_defaults() -> None:
    files = {"/etc/logsvc/secret": SECRET, "/etc/logsvc/token": TOKEN}
    path = CONFIGS / "production-example.toml"
    config = parse_node_config(
        tomllib.loads(path.read_text()),
        source=str(path),
        read_secret=lambda p, key: files[p],
    )
    assert config.node_id == "n1"
    assert config.data_dir == "/var/lib/logsvc/n1"
    assert len(config.nodes) == 5
    assert [s.id for s in config.shards_hosted()] == [1, 4]
    assert config.raft_config_for(4).peers == ("10.0.1.14:7304", "10.0.1.15:7304")
    # The example documents the defaults: it must not drift from them.
    assert config.store_limits == StoreLimits()
    assert config.journal_mode == "shard"  # today's path unless [node] journal = "node"
    assert config.server_limits == ServerLimits()
    assert config.shard_limits == ShardLimits()
    defaults = RaftConfig(self_address="", peers=(), secret="", snapshot_path="")
    for name in ("election_timeout_ms_min", "election_timeout_ms_max", "heartbeat_ms"):
        assert getattr(config.raft, name) == getattr(defaults, name)
    assert config.raft.leader_fallback_ms == defaults.leader_fallback_ms
    assert config.raft.connection_timeout_ms == defaults.connection_timeout_ms


def test_secrets_are_not_in_repr_and_lookups_fail_loudly() -> None:
    config = parse(valid_document())
    assert SECRET not in repr(config)
    assert TOKEN not in repr(config)
    assert config.log_level == "info"
    with pytest.raises(KeyError):
        config.raft_config_for(3)  # no such shard
    document = valid_document()
    document["cluster"]["nodes"].append(
        {
            "id": "n4",
            "data_address": "127.0.0.1:7104",
            "admin_address": "127.0.0.1:7204",
            "raft_host": "127.0.0.1",
            "raft_port_base": 7700,
        }
    )
    document["node"]["id"] = "n4"
    config = parse(document)
    assert config.shards_hosted() == []
    with pytest.raises(KeyError):
        config.raft_config_for(1)  # a shard this node does not host


def test_ipv6_addresses() -> None:
    document = valid_document()
    node = document["cluster"]["nodes"][0]
    node["data_address"] = "[::1]:7101"
    node["raft_host"] = "::1"
    config = parse(document)
    # pysyncobj splits at the last colon and resolves the host as written.
    assert config.raft_address("n1", 1) == "::1:7301"


# ----------------------------------------------------------------------------- bad configs

Edit = Callable[[dict[str, Any]], None]


def setting(path: str, value: object) -> Edit:
    """Set (or, with value DELETE, remove) `a.b[1].c` in the document."""

    def edit(document: dict[str, Any]) -> None:
        *parents, last = path.replace("[", ".").replace("]", "").split(".")
        target: Any = document
        for part in parents:
            target = target[int(part)] if part.isdigit() else target.setdefault(part, {})
        if value is DELETE:
            del target[last]
        else:
            target[last] = value

    return edit


DELETE = object()

BAD: list[tuple[str, list[Edit], str, str]] = [
    # (case, edits, key, rule: the exact rule, or its start when it ends with "...")
    (
        "unknown key",
        [setting("node.dta_dir", "/x")],
        "node.dta_dir",
        "unknown key (did you mean 'data_dir'?); allowed here: id, data_dir, log_level, "
        "log_format, journal",
    ),
    (
        "unknown key in a node entry",
        [setting("cluster.nodes[1].raft_port", 7000)],
        "cluster.nodes[1].raft_port",
        "unknown key (did you mean 'raft_port_base'?)...",
    ),
    (
        "unknown top-level table",
        [setting("limit", {})],
        "limit",
        "unknown key (did you mean 'limits'?)...",
    ),
    (
        "unknown limit",
        [setting("limits.store.segment_size", 1)],
        "limits.store.segment_size",
        "unknown key...",
    ),
    (
        "wrong type",
        [setting("cluster.nodes[0].raft_port_base", "7300")],
        "cluster.nodes[0].raft_port_base",
        "must be an integer (got a string)",
    ),
    (
        "bool as int",
        [setting("shards[0].id", True)],
        "shards[0].id",
        "must be an integer (got a boolean)",
    ),
    (
        "bool as int in limits",
        [setting("limits.server.connections_max", True)],
        "limits.server.connections_max",
        "must be an integer (got a boolean)",
    ),
    (
        "float as int",
        [setting("raft.heartbeat_ms", 100.0)],
        "raft.heartbeat_ms",
        "must be an integer (got a float)",
    ),
    (
        "duplicate port",
        [setting("cluster.nodes[1].admin_address", "127.0.0.1:7101")],
        "cluster.nodes[1].admin_address",
        "port 7101 on 127.0.0.1 is also used by cluster.nodes[0].data_address",
    ),
    (
        "raft port clashes with another node's derived raft port",
        [setting("cluster.nodes[1].raft_port_base", 7301)],
        "cluster.nodes[1].raft_port_base",
        "Raft port of shard 1: port 7302 on 127.0.0.1 is also used by "
        "cluster.nodes[0].raft_port_base (Raft port of shard 2)",
    ),
    (
        "raft port clashes with a data address",
        [setting("cluster.nodes[0].raft_port_base", 7100)],
        "cluster.nodes[0].raft_port_base",
        "Raft port of shard 1: port 7101 on 127.0.0.1 is also used by "
        "cluster.nodes[0].data_address",
    ),
    (
        "raft port past 65535",
        [setting("cluster.nodes[2].raft_port_base", 65534)],
        "cluster.nodes[2].raft_port_base",
        "raft_port_base + shard id must be at most 65535 (shard 2 gives 65536)",
    ),
    (
        "replicas count 2",
        [setting("shards[1].replicas", ["n1", "n2"])],
        "shards[1].replicas",
        "must list 3 or 5 distinct node ids (got 2)",
    ),
    (
        "replicas count 4",
        [setting("shards[0].replicas", ["n1", "n2", "n3", "n1"])],
        "shards[0].replicas",
        "must list 3 or 5 distinct node ids (got 4, with 'n1' repeated)",
    ),
    (
        "unknown replica node",
        [setting("shards[0].replicas", ["n1", "n2", "n9"])],
        "shards[0].replicas[2]",
        "unknown node id 'n9' (cluster.nodes has n1, n2, n3)",
    ),
    (
        "replica not a string",
        [setting("shards[0].replicas", ["n1", "n2", 3])],
        "shards[0].replicas[2]",
        "must be a string (got an integer)",
    ),
    (
        "duplicate shard id",
        [setting("shards[1].id", 1)],
        "shards[1].id",
        "duplicate shard id 1",
    ),
    ("shard id zero", [setting("shards[0].id", 0)], "shards[0].id", "must be a positive..."),
    ("no shards", [setting("shards", [])], "shards", "must list 1 to 4096 shards (got 0)"),
    (
        "missing node id",
        [setting("node.id", DELETE)],
        "node.id",
        "required key is missing",
    ),
    (
        "node id not in the cluster",
        [setting("node.id", "n7")],
        "node.id",
        "'n7' is not one of the ids in cluster.nodes (n1, n2, n3)",
    ),
    (
        "bad node id",
        [setting("cluster.nodes[0].id", "n 1")],
        "cluster.nodes[0].id",
        "must be 1 to 64 letters, digits...",
    ),
    (
        "duplicate node id",
        [setting("cluster.nodes[2].id", "n1")],
        "cluster.nodes[2].id",
        "duplicate node id 'n1'",
    ),
    ("missing [node]", [setting("node", DELETE)], "node", "required key is missing"),
    (
        "[node] not a table",
        [setting("node", "n1")],
        "node",
        "must be a table ([node]) (got a string)",
    ),
    (
        "nodes not an array of tables",
        [setting("cluster.nodes", {"id": "n1"})],
        "cluster.nodes",
        "must be an array of tables ([[cluster.nodes]]) (got a table)",
    ),
    (
        "bad journal mode",
        [setting("node.journal", "shared")],
        "node.journal",
        "must be one of shard, node (got 'shared')",
    ),
    (
        "bad log level",
        [setting("node.log_level", "verbose")],
        "node.log_level",
        "must be one of debug, info, warning, error (got 'verbose')",
    ),
    (
        "both secret and secret_file",
        [setting("cluster.secret_file", "/etc/logsvc/secret")],
        "cluster.secret",
        "set either secret or secret_file, not both",
    ),
    (
        "neither secret nor secret_file",
        [setting("cluster.secret", DELETE)],
        "cluster.secret",
        "required: set secret_file (a file holding it, mode 600) or secret",
    ),
    (
        "neither token nor token_file",
        [setting("cluster.token", DELETE)],
        "cluster.token",
        "required: set token_file (a file holding it, mode 600) or token",
    ),
    (
        "short secret",
        [setting("cluster.secret", "  short-secret  ")],
        "cluster.secret",
        "must be 16 to 4096 characters (got 12)",
    ),
    (
        "secret of the wrong type (its value is not echoed)",
        [setting("cluster.secret", 1234567890123456789)],
        "cluster.secret",
        "must be a string (got an integer)",
    ),
    (
        "token equal to the secret",
        [setting("cluster.token", SECRET)],
        "cluster.token",
        "must differ from the cluster secret",
    ),
    (
        "token with a space",
        [setting("cluster.token", "token with spaces in it")],
        "cluster.token",
        "must be printable ASCII without spaces",
    ),
    (
        "bad address: no port",
        [setting("cluster.nodes[0].data_address", "127.0.0.1")],
        "cluster.nodes[0].data_address",
        "must be \"host:port\" (got '127.0.0.1')",
    ),
    (
        "bad address: port out of range",
        [setting("cluster.nodes[0].admin_address", "127.0.0.1:70000")],
        "cluster.nodes[0].admin_address",
        "port must be in 1..65535 (got 70000)",
    ),
    (
        "bad address: port zero",
        [setting("cluster.nodes[0].admin_address", "127.0.0.1:0")],
        "cluster.nodes[0].admin_address",
        "port must be in 1..65535 (got 0)",
    ),
    (
        "bad address: bare IPv6",
        [setting("cluster.nodes[0].data_address", "::1:7101")],
        "cluster.nodes[0].data_address",
        'must be "host:port" (got \'::1:7101\'); write an IPv6 host in brackets: "[::1]:7101"',
    ),
    (
        "bad address: wildcard",
        [setting("cluster.nodes[0].data_address", "0.0.0.0:7101")],
        "cluster.nodes[0].data_address",
        "must be an address others can connect to, not the wildcard 0.0.0.0",
    ),
    (
        "bad address: not a host",
        [setting("cluster.nodes[0].data_address", "local host:7101")],
        "cluster.nodes[0].data_address",
        "'local host' is not a host name or IP address",
    ),
    (
        "raft_host with a port",
        [setting("cluster.nodes[0].raft_host", "127.0.0.1:7300")],
        "cluster.nodes[0].raft_host",
        "must be a host without a port (got '127.0.0.1:7300')...",
    ),
    (
        "limits out of range",
        [setting("limits.store.segment_bytes_max", 0)],
        "limits.store.segment_bytes_max",
        "must be positive, got 0",
    ),
    (
        "limits: a relation between store limits",
        [setting("limits.store.cache_bytes_max", 1024)],
        "limits.store.cache_bytes_max",
        "must be at least write_buffer_bytes_max...",
    ),
    (
        "limits: a shard batch that no longer fits a store record",
        [setting("limits.store.record_payload_bytes_max", 1024 * 1024)],
        "limits.shard.batch_bytes_max",
        "a full batch encodes to...",
    ),
    (
        "limits: server batch above the shard's group limit",
        [setting("limits.server.batch_bytes_max", 15 * 1024 * 1024)],
        "limits.server.batch_bytes_max",
        "must be at most the shard's group_bytes_max (14680064), got 15728640",
    ),
    (
        "limits: the frame size is the protocol's, not a node setting (the key was removed)",
        [setting("limits.server.frame_body_bytes_max", 16 * 1024 * 1024)],
        "limits.server.frame_body_bytes_max",
        "unknown key...",
    ),
    (
        "raft: a relation between timings",
        [setting("raft.heartbeat_ms", 400)],
        "raft.election_timeout_ms_min",
        "must exceed 3 x heartbeat_ms",
    ),
    (
        "raft: out of range",
        [setting("raft.leader_fallback_ms", 0)],
        "raft.leader_fallback_ms",
        "must be in 1..3600000 ms (got 0)",
    ),
]


@pytest.mark.parametrize(
    ("edits", "key", "rule"), [case[1:] for case in BAD], ids=[case[0] for case in BAD]
)
def test_bad_config_names_the_key_and_the_rule(edits: list[Edit], key: str, rule: str) -> None:
    document = copy.deepcopy(valid_document())
    for edit in edits:
        edit(document)
    with pytest.raises(ConfigError) as caught:
        parse(document)
    error = caught.value
    assert error.key == key
    if rule.endswith("..."):
        assert error.rule.startswith(rule[:-3])
    else:
        assert error.rule == rule
    assert str(error) == f"config error: {key}: {error.rule}"
    assert SECRET not in str(error)


# ------------------------------------------------------------------- files and permissions


def write(path: Path, text: str, mode: int) -> str:
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


LOCAL_N1_INLINE = (
    (CONFIGS / "local-n1.toml")
    .read_text()
    .replace('secret_file = "secret"', f'secret = "{SECRET}"')
)


def test_world_readable_config_with_inline_secret_is_refused(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(TOKEN)
    os.chmod(tmp_path / "token", 0o600)
    path = write(tmp_path / "n1.toml", LOCAL_N1_INLINE, 0o644)
    with pytest.raises(ConfigError) as caught:
        load_node_config(path)
    assert caught.value.key == path
    assert caught.value.rule.startswith(
        "holds cluster.secret but is readable or writable by group or others (mode 0644); "
        f"run `chmod 600 {path}`"
    )
    os.chmod(path, 0o600)
    assert load_node_config(path).secret == SECRET


def test_config_without_inline_secrets_may_be_world_readable(tmp_path: Path) -> None:
    for name, value in (("secret", SECRET), ("token", TOKEN)):
        write(tmp_path / name, value, 0o600)
    text = (CONFIGS / "local-n1.toml").read_text()
    assert load_node_config(write(tmp_path / "n1.toml", text, 0o644)).node_id == "n1"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_secret_file_readable_or_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    secret = write(tmp_path / "secret", SECRET, mode)
    write(tmp_path / "token", TOKEN, 0o600)
    path = write(tmp_path / "n1.toml", (CONFIGS / "local-n1.toml").read_text(), 0o644)
    with pytest.raises(ConfigError) as caught:
        load_node_config(path)
    assert caught.value.key == "cluster.secret_file"
    assert caught.value.rule == (
        f"{secret} is readable or writable by group or others (mode {mode:04o}); "
        f"run `chmod 600 {secret}`"
    )


def test_secret_file_missing_or_short(tmp_path: Path) -> None:
    write(tmp_path / "token", TOKEN, 0o600)
    path = write(tmp_path / "n1.toml", (CONFIGS / "local-n1.toml").read_text(), 0o644)
    with pytest.raises(ConfigError) as caught:
        load_node_config(path)
    secret = tmp_path / "secret"
    assert (caught.value.key, caught.value.rule) == (
        "cluster.secret_file",
        f"{secret}: cannot open: No such file or directory",
    )
    write(secret, "short\n", 0o600)
    with pytest.raises(ConfigError) as caught:
        load_node_config(path)
    assert (caught.value.key, caught.value.rule) == (
        "cluster.secret_file",
        f"the secret in {secret} must be 16 to 4096 characters (got 5)",
    )


def test_toml_syntax_error_gives_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path / "n1.toml", '[node]\nid = "n1"\ndata_dir = \n', 0o600)
    with pytest.raises(ConfigError) as caught:
        load_node_config(path)
    assert caught.value.key == path
    assert caught.value.rule.startswith("invalid TOML at line 3, column 12: ")


def test_unreadable_files(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="cannot open: No such file or directory"):
        load_node_config(missing)
    with pytest.raises(ConfigError, match="is not a regular file"):
        load_node_config(str(tmp_path))
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b'[node]\nid = "\xff"\n')
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(bad byte at offset 13\)"):
        load_node_config(str(binary))


def test_main_config_error_prints_the_message_and_returns_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main_config_error(ConfigError("shards[1].replicas", "must list 3 or 5")) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "config error: shards[1].replicas: must list 3 or 5\n"


@dataclass(frozen=True, slots=True)
class _LingerLimits:
    """A limits class with a float field, like the node's batcher limits."""

    queued_max: int = 8
    linger_ms_max: float = 1.0

    def validate(self) -> _LingerLimits:
        if self.linger_ms_max < 0:
            raise ValueError("linger_ms_max: must not be negative")
        return self


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"linger_ms_max": 2}, _LingerLimits(linger_ms_max=2.0)),
        ({"linger_ms_max": 0.5, "queued_max": 3}, _LingerLimits(3, 0.5)),
        ({"linger_ms_max": -1.0}, "limits.host.linger_ms_max: must not be negative"),
        ({"linger_ms_max": float("nan")}, "limits.host.linger_ms_max: must be a finite number"),
        ({"linger_ms_max": True}, "limits.host.linger_ms_max: must be a number (got a boolean)"),
        ({"queued_max": 1.0}, "limits.host.queued_max: must be an integer (got a float)"),
    ],
)
def test_any_limits_class_plugs_into_a_limits_section(
    values: dict[str, object], expected: object
) -> None:
    """The [limits.*] loader takes any frozen dataclass of ints and floats with validate():
    how the data plane's own limits classes get their section."""
    limits = config_module._Table({"host": values}, "limits", ("host",))
    if isinstance(expected, str):
        with pytest.raises(ConfigError) as caught:
            config_module._limits(limits, "host", _LingerLimits, lambda x: x.validate())
        assert str(caught.value).startswith(f"config error: {expected}")
    else:
        loaded = config_module._limits(limits, "host", _LingerLimits, lambda x: x.validate())
        assert loaded == expected


# ------------------------------------------------------------------ client configuration

CLIENT_BASE = 'addresses = ["127.0.0.1:7101", "127.0.0.1:7102"]\ntoken_file = "token"\n'


def client_config_file(tmp_path: Path, extra: str = "") -> str:
    write(tmp_path / "token", TOKEN, 0o600)
    return write(tmp_path / "client.toml", CLIENT_BASE + extra, 0o600)


def test_client_config_admin_addresses_are_optional(tmp_path: Path) -> None:
    config = load_client_config(client_config_file(tmp_path))
    assert config.addresses == ("127.0.0.1:7101", "127.0.0.1:7102")
    assert config.admin_addresses == ()
    assert config.token == TOKEN
    assert TOKEN not in repr(config)


def test_client_config_with_admin_addresses(tmp_path: Path) -> None:
    extra = 'admin_addresses = ["127.0.0.1:7201", "[::1]:7202", "admin.example:7203"]\n'
    config = load_client_config(client_config_file(tmp_path, extra))
    assert config.admin_addresses == ("127.0.0.1:7201", "[::1]:7202", "admin.example:7203")


@pytest.mark.parametrize(
    ("extra", "key", "rule"),
    [
        ('admin_addresses = "127.0.0.1:7201"\n', "admin_addresses", "must be a non-empty list"),
        ("admin_addresses = []\n", "admin_addresses", "must be a non-empty list"),
        ('admin_addresses = ["127.0.0.1:7201", 7202]\n', "admin_addresses[1]", "must be"),
        ('admin_addresses = ["127.0.0.1"]\n', "admin_addresses[0]", 'must be "host:port"'),
        ('admin_addresses = ["127.0.0.1:0"]\n', "admin_addresses[0]", "port must be in"),
        ('admin_addresses = ["::1:7201"]\n', "admin_addresses[0]", "in brackets"),
        ('admin_adresses = ["127.0.0.1:7201"]\n', "admin_adresses", "unknown key"),
    ],
)
def test_client_config_bad_admin_addresses_name_the_key(
    tmp_path: Path, extra: str, key: str, rule: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_client_config(client_config_file(tmp_path, extra))
    assert caught.value.key == key
    assert rule in caught.value.rule
