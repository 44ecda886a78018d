"""A node's placement file (logsvc/node/placement.py): the config's placement applies only
the first time and to shards the file has never seen; runtime decisions (host to join,
release) are kept, durably and atomically; a damaged file is a typed error.

How: pure `Placement` transitions; the file through `FaultFS` with a power loss at every
point of a rewrite; damage by hand; `archive_dir` on a real temporary directory.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from logsvc.config import ShardConfig
from logsvc.node import placement
from logsvc.node.placement import Placement, ShardEntry
from logsvc.shard import small_file
from logsvc.shard.small_file import SmallFileCorrupt
from tests.support.faultfs import FaultFS

CONFIG = (
    ShardConfig(1, ("n1", "n2", "n3")),
    ShardConfig(2, ("n2", "n3", "n4")),
)


def test_the_first_placement_is_the_configs() -> None:
    first = placement.from_config("n4", CONFIG)
    assert first.shards == (ShardEntry(1, False), ShardEntry(2, True))
    assert [entry.shard_id for entry in first.hosted] == [2]


def test_runtime_decisions_outlive_the_config() -> None:
    moved = placement.from_config("n4", CONFIG).host(1, ("n1", "n2", "n3")).release(2)
    assert moved.entry(1) == ShardEntry(1, True, ("n1", "n2", "n3", "n4"))
    assert moved.entry(2) == ShardEntry(2, False)
    # The config (nobody edited it) still places n4 on shard 2 and not on 1: no effect.
    assert moved.merged_with(CONFIG) == moved
    # A shard added to the config later is placed by it.
    grown = moved.merged_with((*CONFIG, ShardConfig(3, ("n4", "n1", "n2"))))
    assert grown.entry(3) == ShardEntry(3, True)
    assert grown.entry(1) == moved.entry(1)


def test_file_round_trip_and_node_check() -> None:
    moved = placement.from_config("n4", CONFIG).host(1, ("n1", "n2", "n3"))
    data = placement.encode(moved)
    assert placement.decode("p", data, "n4") == moved
    with pytest.raises(SmallFileCorrupt, match="placement of node 'n4'"):
        placement.decode("p", data, "n1")  # a file copied from another node


@pytest.mark.parametrize(
    ("shards", "reason"),
    [
        ([{"id": 1, "hosted": True}], "id, hosted, join_members"),
        ([{"id": 0, "hosted": True, "join_members": None}], "ill-typed"),
        ([{"id": True, "hosted": True, "join_members": None}], "ill-typed"),
        ([{"id": 1, "hosted": "yes", "join_members": None}], "ill-typed"),
        ([{"id": 1, "hosted": False, "join_members": ["n4"]}], "join_members"),
        ([{"id": 1, "hosted": True, "join_members": ["n2", "n1"]}], "join_members"),
        ([{"id": 1, "hosted": True, "join_members": ["n1"]}], "join_members"),  # not n4
        (
            [
                {"id": 2, "hosted": True, "join_members": None},
                {"id": 1, "hosted": True, "join_members": None},
            ],
            "not increasing",
        ),
    ],
)
def test_bad_documents_are_typed_errors(shards: list[object], reason: str) -> None:
    data = small_file.encode(placement.MAGIC, placement.VERSION, {"node": "n4", "shards": shards})
    with pytest.raises(SmallFileCorrupt, match=reason):
        placement.decode("p", data, "n4")


def test_load_save_and_damage() -> None:
    fs = FaultFS()
    fs.makedirs("/data")
    assert placement.load(fs, "/data/placement", "n4") is None
    first = placement.from_config("n4", CONFIG)
    placement.save(fs, "/data/placement", first)
    assert placement.load(fs, "/data/placement", "n4") == first
    fs.set_bytes("/data/placement", 30, b"\x00")
    with pytest.raises(SmallFileCorrupt):
        placement.load(fs, "/data/placement", "n4")


def test_a_power_loss_during_a_change_leaves_the_old_or_the_new_placement() -> None:
    fs = FaultFS()
    fs.makedirs("/data")
    before = placement.from_config("n4", CONFIG)
    placement.save(fs, "/data/placement", before)
    after = before.host(1, ("n1", "n2", "n3")).release(2)
    fs.start_trace()
    placement.save(fs, "/data/placement", after)
    outcomes = {
        placement.load(state, "/data/placement", "n4")
        for state in fs.crash_states(random.Random(5), torn_variants=3, names=("revert", "keep"))
    }
    assert outcomes == {before, after}
    fs.power_loss("trunc", random.Random(1))  # after save() returned: durable
    assert placement.load(fs, "/data/placement", "n4") == after


def test_archive_moves_a_replica_aside(tmp_path: Path) -> None:
    shard_dir = tmp_path / "shards" / "1"
    (shard_dir / "journal").mkdir(parents=True)
    (shard_dir / "members").write_bytes(b"x")
    moved = placement.archive_dir(str(shard_dir), str(tmp_path), wall_s=0.0)
    assert moved == str(tmp_path / "removed" / "shard-1-19700101T000000Z")
    assert not shard_dir.exists()
    assert (Path(moved) / "members").read_bytes() == b"x"
    (shard_dir / "journal").mkdir(parents=True)  # hosted again, removed again
    again = placement.archive_dir(str(shard_dir), str(tmp_path), wall_s=0.0)
    assert again == moved + ".1"
    assert placement.archive_dir(str(shard_dir), str(tmp_path)) is None  # nothing there
    assert sorted(os.listdir(tmp_path / "removed")) == [
        "shard-1-19700101T000000Z",
        "shard-1-19700101T000000Z.1",
    ]


def test_placement_is_frozen_and_ordered() -> None:
    with pytest.raises(AssertionError):
        Placement("n1", (ShardEntry(2, True), ShardEntry(1, True)))
