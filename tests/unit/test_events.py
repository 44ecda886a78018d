"""The node event log (logsvc/events.py): its lines parse as `tests.chaos.history.RaftEvent`
through `history.from_json_line` (the field list is kept in sync with that class), it is
silent when disabled, and a real single-replica shard emits start, term, vote and leader
when it elects itself, then recovery after a torn tail and corruption after damage at rest.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

import pytest

from logsvc import events
from logsvc.events import EVENT_FIELDS, EVENT_KINDS, ReplicaEvents, encode_event
from logsvc.shard.raft.config import RaftConfig
from logsvc.shard.replica import ReplicaConfig, ShardReplica
from logsvc.store import Corruption, StoreLimits
from tests.chaos import history
from tests.chaos.history import RaftEvent
from tests.unit.shard.raft_harness import SECRET, free_port
from tests.unit.shard.test_replica import Shard

WAIT_S_MAX = 20.0


@pytest.fixture
def event_log(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "events.jsonl"
    events.configure(str(path))
    try:
        yield path
    finally:
        events.configure(None)


def read_events(path: Path) -> list[RaftEvent]:
    if not path.exists():
        return []
    parsed = [history.from_json_line(line) for line in path.read_text().splitlines()]
    assert all(isinstance(event, RaftEvent) for event in parsed)
    return [event for event in parsed if isinstance(event, RaftEvent)]


def test_fields_and_kinds_match_the_history_types() -> None:
    assert RaftEvent.__slots__ == EVENT_FIELDS
    assert get_args(history.RaftEventKind) == EVENT_KINDS


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_round_trip_through_history(kind: events.EventKind) -> None:
    line = encode_event("n2", 3, 123_456, kind, 7, "127.0.0.1:9001", "détail")
    assert history.from_json_line(line) == RaftEvent(
        node_id="n2",
        shard=3,
        time_ns=123_456,
        kind=kind,
        term=7,
        voted_for="127.0.0.1:9001",
        detail="détail",
    )
    assert history.from_json_line(encode_event("n1", 1, 5, kind)) == RaftEvent("n1", 1, 5, kind)


def test_disabled_writes_nothing(tmp_path: Path) -> None:
    events.configure(None)
    assert not events.enabled()
    ReplicaEvents("n1", 1).emit("start", term=3)
    assert os.listdir(tmp_path) == []


def test_emit_appends_one_line_per_event_with_monotonic_time(event_log: Path) -> None:
    sink = ReplicaEvents("n1", 2)
    before = time.monotonic_ns()
    sink.emit("vote", term=4, voted_for="n3")
    sink.emit("leader", term=4)
    got = read_events(event_log)
    assert [(e.kind, e.term, e.voted_for, e.shard) for e in got] == [
        ("vote", 4, "n3", 2),
        ("leader", 4, None, 2),
    ]
    assert before <= got[0].time_ns <= got[1].time_ns <= time.monotonic_ns()


def _single_replica_config(data_dir: str, limits: StoreLimits | None = None) -> ReplicaConfig:
    raft = RaftConfig(
        self_address=f"127.0.0.1:{free_port()}",
        peers=(),
        secret=SECRET,
        snapshot_path=os.path.join(data_dir, "snapshot"),
        election_timeout_ms_min=300,
        election_timeout_ms_max=600,
        heartbeat_ms=50,
        leader_fallback_ms=2000,
    )
    return ReplicaConfig(
        data_dir=data_dir,
        raft=raft,
        store_limits=limits or StoreLimits(segment_bytes_max=4096),
        node_id="n1",
        shard=5,
    )


def _wait_leader(replica: ShardReplica) -> None:
    deadline = time.monotonic() + WAIT_S_MAX
    while not replica.is_leader:
        assert time.monotonic() < deadline, "no leader"
        time.sleep(0.02)


def test_replica_emits_start_term_vote_leader_then_recovery_and_corruption(
    tmp_path: Path, event_log: Path
) -> None:
    data_dir = str(tmp_path / "replica")
    config = _single_replica_config(data_dir)
    replica = ShardReplica(config)
    replica.start()
    try:
        _wait_leader(replica)
        for seq in range(1, 40):  # enough to roll several 4 KiB segments
            replica.append("c", seq, (b"x" * 300,))
        deadline = time.monotonic() + WAIT_S_MAX
        while not any(e.kind == "leader" for e in read_events(event_log)):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        term = replica.node.term
    finally:
        replica.kill()
    got = read_events(event_log)
    kinds = [e.kind for e in got]
    assert kinds[0] == "start"
    assert got[0].term == 0
    assert {"term", "vote", "leader"} <= set(kinds)
    vote = next(e for e in got if e.kind == "vote")
    assert vote.voted_for == config.raft.self_address  # it voted for itself
    assert vote.term == term
    leader = next(e for e in got if e.kind == "leader")
    assert leader.term == term
    assert kinds.index("vote") < kinds.index("leader")
    assert all((e.node_id, e.shard) == ("n1", 5) for e in got)

    # A torn tail: recovery cuts it and says so.
    journal = os.path.join(data_dir, "journal")
    segments = sorted(n for n in os.listdir(journal) if n.endswith(".seg"))
    assert len(segments) >= 3
    with open(os.path.join(journal, segments[-1]), "ab") as f:
        f.write(b"\x07" * 13)
    event_log.write_text("")
    ShardReplica(config).close()
    got = read_events(event_log)
    assert [e.kind for e in got] == ["start", "recovery"]
    assert got[0].term == term
    assert "torn tail" in got[1].detail

    # A bit flipped in a sealed segment: the store refuses to open, and says why.
    with open(os.path.join(journal, segments[0]), "r+b") as f:
        f.seek(100)
        byte = f.read(1)[0]
        f.seek(100)
        f.write(bytes([byte ^ 0x10]))
    event_log.write_text("")
    with pytest.raises(Corruption):
        ShardReplica(config)
    got = read_events(event_log)
    assert [e.kind for e in got] == ["corruption"]
    assert segments[0] in got[0].detail


class _NamedShard(Shard):
    """test_replica's in-process 3-replica shard, each replica named by its address."""

    def config(self, address: str, peers: list[str]) -> ReplicaConfig:
        return dataclasses.replace(super().config(address, peers), node_id=address, shard=1)


def test_a_leader_that_transfers_leadership_emits_follower(tmp_path: Path, event_log: Path) -> None:
    shard = _NamedShard(tmp_path)
    try:
        shard.start_all()
        old = shard.leader()
        target = next(a for a in shard.addresses if a != old.address)
        deadline = time.monotonic() + WAIT_S_MAX
        retry_at = 0.0
        while not any(
            e.kind == "follower" and e.node_id == old.address for e in read_events(event_log)
        ):
            assert time.monotonic() < deadline, "the old leader never stepped down"
            if time.monotonic() >= retry_at and old.node.is_leader:
                # A transfer fails when the target is not caught up yet (a loaded box):
                # ask again, bounded by the deadline.
                old.node.transfer_leadership(target, lambda _result, _reason: None)
                retry_at = time.monotonic() + 2.0
            time.sleep(0.05)
    finally:
        shard.close()
    got = read_events(event_log)
    became = [e for e in got if e.kind == "leader" and e.node_id == old.address]
    stepped_down = [e for e in got if e.kind == "follower" and e.node_id == old.address]
    assert became
    assert stepped_down
    assert stepped_down[0].time_ns > became[0].time_ns
    assert stepped_down[0].term >= became[0].term
    assert {e.node_id for e in got if e.kind == "start"} == set(shard.addresses)
