"""The node's leadership balancer (logsvc/node/leader_balancer.py) over fake replicas: what a
round reads from each replica, the transfers it asks (to the target's Raft address, at most
the configured rate), the moves it remembers until done or given up, and the rounds it
holds: a shard without a leader, or whose leader is on a lapsed node or no longer
connected (its followers are about to elect), moves nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from logsvc.node import leader_balancer
from logsvc.node.leader_balancer import LeaderBalancer
from logsvc.shard.raft.config import RaftFatal
from logsvc.shard.replica import ShardReplica

NODES = ("n1", "n2", "n3")


def _address(node: str, shard_id: int) -> str:
    return f"127.0.0.{NODES.index(node) + 1}:{7000 + shard_id}"


def _node_of(address: str) -> str:
    return NODES[int(address.split(":")[0].rsplit(".", 1)[1]) - 1]


@dataclass
class FakeRaftNode:
    shard_id: int
    leader_node: str | None
    self_node: str = "n1"
    learner: bool = False
    fatal: BaseException | None = None
    disconnected: set[str] = field(default_factory=set)
    transfers: list[str] = field(default_factory=list)
    refuse: bool = False

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(_address(n, self.shard_id) for n in NODES)

    @property
    def is_leader(self) -> bool:
        return self.leader_node == self.self_node

    @property
    def leader(self) -> str | None:
        return None if self.leader_node is None else _address(self.leader_node, self.shard_id)

    def connected_to(self, node: str) -> bool:
        return node not in self.disconnected

    def transfer_leadership(self, address: str, callback: Any) -> None:
        if self.refuse:
            raise RaftFatal("more than 64 calls waiting for the tick")
        self.transfers.append(address)


@dataclass
class FakeReplica:
    node: FakeRaftNode


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _balancer(
    leaders: Sequence[str | None], moves_per_s: int = 50, lapsed: frozenset[str] = frozenset()
) -> tuple[LeaderBalancer, dict[int, FakeReplica], Clock]:
    replicas = {i + 1: FakeReplica(FakeRaftNode(i + 1, leader)) for i, leader in enumerate(leaders)}
    clock = Clock()
    balancer = LeaderBalancer(
        "n1",
        cast("dict[int, ShardReplica]", replicas),
        _node_of,
        lambda node: node not in lapsed,
        moves_per_s,
        clock,
    )
    return balancer, replicas, clock


def _asked(replicas: dict[int, FakeReplica]) -> dict[int, list[str]]:
    return {i: r.node.transfers for i, r in replicas.items() if r.node.transfers}


def test_a_round_asks_transfers_to_the_targets_raft_addresses() -> None:
    balancer, replicas, _ = _balancer(["n1"] * 9)
    assert balancer.round() is True  # moves under way: look again soon
    asked = _asked(replicas)
    assert len(asked) == 6  # n1 keeps 3, n2 and n3 get 3 each
    targets = [_node_of(addresses[0]) for addresses in asked.values()]
    assert sorted(targets) == ["n2"] * 3 + ["n3"] * 3
    for shard_id, addresses in asked.items():
        assert addresses == [_address(_node_of(addresses[0]), shard_id)]
    assert balancer.moves_asked == 6


def test_the_rate_bounds_a_round_and_asked_moves_are_not_asked_again() -> None:
    balancer, replicas, _ = _balancer(["n1"] * 9, moves_per_s=2)
    balancer.round()
    assert len(_asked(replicas)) == 2
    balancer.round()  # nothing happened yet: the two still count as moved
    assert len(_asked(replicas)) == 4
    assert all(len(t) == 1 for t in _asked(replicas).values())


def test_a_move_seen_done_is_forgotten_and_a_stuck_one_given_up_after_the_settle_time() -> None:
    balancer, replicas, clock = _balancer(["n1", "n1", "n2"])  # n1 2, n2 1, n3 0: one move
    balancer.round()
    [(shard_id, [address])] = _asked(replicas).items()
    replicas[shard_id].node.leader_node = _node_of(address)  # the transfer happened
    assert balancer.round() is False  # balanced, nothing pending: the idle interval
    # A transfer pysyncobj denied (the target was behind): asked again once given up on.
    balancer, replicas, clock = _balancer(["n1", "n1", "n2"])
    balancer.round()
    balancer.round()
    assert sum(len(t) for t in _asked(replicas).values()) == 1
    clock.now_s += leader_balancer.MOVE_SETTLE_S + 0.1
    balancer.round()
    assert sum(len(t) for t in _asked(replicas).values()) == 2


def test_rounds_hold_while_a_shard_has_no_live_connected_leader() -> None:
    for change in ("none", "lapsed", "disconnected"):
        balancer, replicas, _ = _balancer(["n1"] * 8 + ["n2"], lapsed=frozenset())
        follower = replicas[9].node
        if change == "none":
            follower.leader_node = None
        elif change == "lapsed":
            balancer, replicas, _ = _balancer(["n1"] * 8 + ["n2"], lapsed=frozenset({"n2"}))
        else:
            follower.disconnected.add("n2")
        assert balancer.round() is True, change  # an election is due: look again soon
        assert _asked(replicas) == {}, change


def test_learners_and_failed_replicas_are_left_out_and_zero_turns_it_off() -> None:
    balancer, replicas, _ = _balancer(["n1"] * 4)
    replicas[1].node.learner = True
    replicas[2].node.fatal = RuntimeError("stopped")
    balancer.round()
    assert set(_asked(replicas)) == {3}  # n1 leads 2 counted shards: one moves
    balancer, replicas, _ = _balancer(["n1"] * 9, moves_per_s=0)
    assert not balancer.enabled
    assert balancer.round() is False
    assert _asked(replicas) == {}


def test_a_replica_whose_tick_calls_are_full_is_skipped_this_round() -> None:
    balancer, replicas, _ = _balancer(["n1"] * 3)
    replicas[1].node.refuse = True
    balancer.round()
    assert 1 not in _asked(replicas)
    assert balancer.moves_asked == len(_asked(replicas))
