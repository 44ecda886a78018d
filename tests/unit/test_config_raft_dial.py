"""LOGSVC_TEST_RAFT_DIAL, the chaos suite's dial-address override, from the environment to
the pysyncobj node objects.

What it proves: `load_node_config` reads the variable (and only it: `parse_node_config`
stays free of the environment); each shard's RaftConfig gets the overrides of that shard's
addresses only; a malformed value is a ConfigError naming the variable; the node object
pysyncobj dials keeps its canonical id and address but dials the override, and pickles
(into a membership command) as a plain canonical TCPNode. No sockets, no threads.
"""

from __future__ import annotations

import json
import pickle
import tomllib
from pathlib import Path

import pytest
from pysyncobj.node import TCPNode

from logsvc.config import (
    TEST_RAFT_DIAL_ENV,
    ConfigError,
    NodeConfig,
    load_node_config,
    parse_node_config,
    parse_test_raft_dial,
)
from logsvc.shard.raft.config import RaftConfig
from logsvc.shard.raft.transport import _DialNode

TOML = """
[node]
id = "n1"
data_dir = "data"

[cluster]
secret = "s3cret-s3cret-s3cret"
token = "t0ken-t0ken-t0ken-t0ken"

{nodes}

[[shards]]
id = 1
replicas = ["n1", "n2", "n3"]

[[shards]]
id = 2
replicas = ["n1", "n2", "n3"]
"""
NODE = """[[cluster.nodes]]
id = "n{i}"
data_address = "127.0.0.1:710{i}"
admin_address = "127.0.0.1:720{i}"
raft_host = "127.0.0.1"
raft_port_base = {base}
"""


def write_config(tmp_path: Path) -> str:
    nodes = "\n".join(NODE.format(i=i, base=7200 + 100 * i) for i in (1, 2, 3))
    path = tmp_path / "n1.toml"
    path.write_text(TOML.format(nodes=nodes))
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def config_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delenv(TEST_RAFT_DIAL_ENV, raising=False)
    return write_config(tmp_path)


def test_unset_means_no_overrides(config_path: str) -> None:
    config = load_node_config(config_path)
    assert config.raft_dial == ()
    assert config.raft_config_for(1).dial_overrides == ()


def test_each_shard_gets_the_overrides_of_its_own_addresses(
    config_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    dial = {
        "127.0.0.1:7501": "127.0.0.1:40001",  # n3, shard 1
        "127.0.0.1:7502": "127.0.0.1:40002",  # n3, shard 2
        "127.0.0.1:7401": "127.0.0.1:40003",  # n2, shard 1
    }
    monkeypatch.setenv(TEST_RAFT_DIAL_ENV, json.dumps(dial))
    config = load_node_config(config_path)
    assert config.raft_config_for(1).dial_overrides == (
        ("127.0.0.1:7401", "127.0.0.1:40003"),
        ("127.0.0.1:7501", "127.0.0.1:40001"),
    )
    assert config.raft_config_for(2).dial_overrides == (("127.0.0.1:7502", "127.0.0.1:40002"),)
    assert config.raft_config_for(2).peers == ("127.0.0.1:7402", "127.0.0.1:7502")  # canonical


def test_parse_node_config_does_not_read_the_environment(
    config_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TEST_RAFT_DIAL_ENV, "not json")
    with open(config_path, "rb") as handle:
        document = tomllib.load(handle)
    assert parse_node_config(document, source=config_path).raft_dial == ()


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("{", "is not JSON"),
        ('["127.0.0.1:7201"]', "must be a JSON object"),
        ('{"127.0.0.1:9999": "127.0.0.1:1"}', "is not the Raft address of any replica"),
        ('{"127.0.0.1:7301": 5}', 'must map to "host:port"'),
        ('{"127.0.0.1:7301": "127.0.0.1"}', 'must map to "host:port"'),
        ('{"127.0.0.1:7301": "127.0.0.1:0"}', 'must map to "host:port"'),
        ('{"127.0.0.1:7301": ":80"}', 'must map to "host:port"'),
        ('{"127.0.0.1:7301": "127.0.0.1:70000"}', 'must map to "host:port"'),
    ],
)
def test_a_malformed_value_is_a_config_error_naming_the_variable(
    config_path: str, monkeypatch: pytest.MonkeyPatch, value: str, rule: str
) -> None:
    monkeypatch.setenv(TEST_RAFT_DIAL_ENV, value)
    with pytest.raises(ConfigError) as raised:
        load_node_config(config_path)
    assert raised.value.key == "LOGSVC_TEST_RAFT_DIAL"
    assert rule in raised.value.rule
    assert str(raised.value).startswith("config error: LOGSVC_TEST_RAFT_DIAL: ")


def test_an_oversized_value_is_refused(config_path: str) -> None:
    config: NodeConfig = load_node_config(config_path)
    with pytest.raises(ConfigError, match="longer than"):
        parse_test_raft_dial("{" + " " * 70_000 + "}", config)
    assert parse_test_raft_dial("", config) == ()


def test_raft_config_checks_override_values() -> None:
    base = RaftConfig("127.0.0.1:1", ("127.0.0.1:2",), "secret-secret-secret", "/tmp/s")
    base.validate()
    with pytest.raises(ValueError, match="dial_overrides"):
        RaftConfig(
            "127.0.0.1:1",
            ("127.0.0.1:2",),
            "secret-secret-secret",
            "/tmp/s",
            dial_overrides=(("127.0.0.1:2", "nowhere"),),
        ).validate()


def test_the_dial_node_keeps_its_identity_and_pickles_as_a_plain_node() -> None:
    node = _DialNode("127.0.0.1:7301", "127.0.0.1:40003")
    assert (node.id, node.address, node.host) == ("127.0.0.1:7301", "127.0.0.1:7301", "127.0.0.1")
    assert (node.ip, node.port) == ("127.0.0.1", 40003)
    assert node == TCPNode("127.0.0.1:7301")
    assert hash(node) == hash(TCPNode("127.0.0.1:7301"))
    copied = pickle.loads(pickle.dumps(node))
    assert type(copied) is TCPNode
    assert (copied.address, copied.port) == ("127.0.0.1:7301", 7301)
