"""A 3-replica shard whose stores journal into a node journal keeps every acknowledged record
across kills (docs/decisions/0011-shared-journal.md).

How: the kill tests of test_replica.py, run on replicas opened with `node_journal` (one
`NodeJournal` per replica, standing for its node). A kill abandons the replica's store and
then its node journal (nothing more is written or synced: kill -9 of the node), and the
restart opens the node journal again, which replays what the journal holds into the store
before the replica opens, so the replica's segments alone would not have the entries.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from logsvc.shard.replica import ReplicaConfig, ShardReplica
from logsvc.store.journal import JOURNAL_DIR_NAME, NodeJournal

from . import test_replica
from .test_replica import LIMITS, Shard


class JournaledShard(Shard):
    def __init__(self, base: Path) -> None:
        super().__init__(base)
        self.journals: dict[str, NodeJournal] = {}

    def journal(self, address: str) -> NodeJournal:
        found = self.journals.get(address)
        if found is None:
            data_dir = str(self.base / address.replace(":", "_"))
            found = NodeJournal.open(
                os.path.join(data_dir, JOURNAL_DIR_NAME), base_dir=data_dir, store_limits=LIMITS
            )
            self.journals[address] = found
        return found

    def config(self, address: str, peers: list[str]) -> ReplicaConfig:
        return dataclasses.replace(
            super().config(address, peers), node_journal=self.journal(address)
        )

    def start(self, address: str, peers: list[str] | None = None) -> ShardReplica:
        replica = ShardReplica(self.config(address, peers or self.addresses))
        replica.start()
        self.replicas[address] = replica
        return replica

    def kill(self, address: str) -> None:
        self.replicas.pop(address).kill()
        self.journals.pop(address).abandon()

    def close(self) -> None:
        super().close()
        for journal in self.journals.values():
            journal.close()
        self.journals.clear()


@pytest.fixture
def shard(tmp_path: Path) -> Iterator[Shard]:
    cluster = JournaledShard(tmp_path)
    try:
        yield cluster
    finally:
        cluster.close()


def test_a_whole_cluster_kill_and_restart_keeps_every_acknowledged_record(shard: Shard) -> None:
    test_replica.test_a_whole_cluster_kill_and_restart_keeps_every_acknowledged_record(shard)
    journaled = [j for j in shard.journals.values()]  # type: ignore[attr-defined]
    assert journaled
    assert all(j.stats().syncs > 0 for j in journaled)


def test_kill_any_replica_at_any_time_keeps_acked_records_and_replicas_identical(
    shard: Shard,
) -> None:
    test_replica.test_kill_any_replica_at_any_time_keeps_acked_records_and_replicas_identical(shard)
