"""`logsvc dev-cluster up` writes node configs the real config loader accepts, for every
cluster size the CLI allows (3..7 nodes): each shard gets 3 or 5 replicas, spread over the
nodes, with distinct ports. Pure: configs are generated and parsed, nothing is started."""

from __future__ import annotations

import os
import tomllib

import pytest

from logsvc import devcluster
from logsvc.config import parse_node_config


def fake_secret(path: str, key: str) -> str:
    return "a-secret-long-enough" if path.endswith("secret") else "a-token-long-enough"


@pytest.mark.parametrize("nodes", [3, 4, 5, 6, 7])
def test_generated_configs_are_valid_for_every_allowed_size(nodes: int) -> None:
    ports = devcluster._allocate(nodes, shards=3)
    for node in ports:
        text = devcluster._node_config(node, ports, shards=3)
        config = parse_node_config(
            tomllib.loads(text), source=f"/tmp/{node.node_id}.toml", read_secret=fake_secret
        )
        for shard in config.shards:
            assert len(shard.replicas) == (5 if nodes >= 5 else 3)
        hosting = {shard.replicas[0] for shard in config.shards}
        assert len(hosting) == min(3, nodes)  # each shard's replicas start at another node


def test_nodes_run_the_checkout_the_starting_process_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node starts in its data directory: its `logsvc` must be this process's (the one
    a benchmark or the demo imported), found first on its path, not whatever checkout the
    virtualenv was installed from."""
    import logsvc

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    path = devcluster.node_env()["PYTHONPATH"].split(":")
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(logsvc.__file__)))
    assert path == [package_root, "/elsewhere"]
