"""Real node processes on loopback (`logsvc dev-cluster`), stopped by PID whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from logsvc import devcluster
from logsvc.client import SyncClient
from logsvc.config import load_client_config


class LocalCluster:
    def __init__(self, dir_path: Path, shards: int = 2, nodes: int = 3) -> None:
        self.dir = str(dir_path)
        self.shards = shards
        devcluster.up(self.dir, nodes=nodes, shards=shards)
        self.client_config = load_client_config(f"{self.dir}/client.toml")

    def client(self) -> SyncClient:
        return SyncClient(self.client_config.addresses, self.client_config.token)

    def node_of(self, data_address: str) -> str:
        position = self.client_config.addresses.index(data_address)
        return f"n{position + 1}"

    def close(self) -> None:
        devcluster.down(self.dir)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    started = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    started = LocalCluster(tmp_path, shards=1)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def four_nodes(tmp_path: Path) -> Iterator[LocalCluster]:
    """Four node processes on loopback hosting one shard (membership and learner tests)."""
    started = LocalCluster(tmp_path, shards=1, nodes=4)
    try:
        yield started
    finally:
        started.close()
