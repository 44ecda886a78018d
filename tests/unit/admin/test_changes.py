"""The membership and leadership-change rules (changes.py), on statuses built by hand.

How: from the example's shard 1 (n1 leading n2 caught up and n3 behind), each rule is
hit once: unknown node, already / not a member, the 3-member floor and the one-above-5
ceiling, the leader removing itself, transfer targets behind or disconnected, and the
choice of the most caught-up connected follower when no target is named; and when a
follower counts as caught up.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

import pytest

from logsvc.admin import changes
from logsvc.admin.errors import AlreadyAReplica, ChangeRefused, NotAReplica, UnknownNode
from logsvc.admin.port import example_view
from logsvc.admin.status import ReplicaStatus, ShardStatus
from logsvc.node.node_view import confirm_removal

NODES = ("n1", "n2", "n3", "n4", "n5", "n6", "n7")


def shard1(*extra: ReplicaStatus) -> ShardStatus:
    status = example_view().status_now(1)
    return dataclasses.replace(status, replicas=(*status.replicas, *extra))


def test_add() -> None:
    changes.check_add(shard1(), "n4", NODES)
    with pytest.raises(UnknownNode):
        changes.check_add(shard1(), "n9", NODES)
    with pytest.raises(AlreadyAReplica):
        changes.check_add(shard1(), "n3", NODES)
    six = shard1(ReplicaStatus("n4"), ReplicaStatus("n5"), ReplicaStatus("n6"))
    assert len(six.replicas) == changes.MEMBERS_MAX
    with pytest.raises(ChangeRefused, match="the most allowed is 6"):
        changes.check_add(six, "n7", NODES)


def test_remove() -> None:
    four = shard1(ReplicaStatus("n4"))
    changes.check_remove(four, "n3", NODES)
    with pytest.raises(UnknownNode):
        changes.check_remove(four, "n9", NODES)
    with pytest.raises(NotAReplica):
        changes.check_remove(four, "n5", NODES)
    with pytest.raises(ChangeRefused, match="transfer leadership first"):
        changes.check_remove(four, "n1", NODES)
    with pytest.raises(ChangeRefused, match="fewer than 3"):
        changes.check_remove(shard1(), "n3", NODES)


def test_an_unreachable_member_may_be_removed_below_the_minimum_to_be_rebuilt() -> None:
    status = shard1()
    unreachable = tuple(
        dataclasses.replace(r, connected=False) if r.node_id == "n3" else r for r in status.replicas
    )
    changes.check_remove(dataclasses.replace(status, replicas=unreachable), "n3", NODES)
    with pytest.raises(ChangeRefused, match="fewer than 3"):  # a reachable one may not
        changes.check_remove(dataclasses.replace(status, replicas=unreachable), "n2", NODES)


def test_a_removal_below_the_minimum_waits_for_the_link_to_stay_down() -> None:
    """The CI failure this answers: right after an election the leader's link to a live
    follower may not be up yet; removing it then left the shard with two members. The
    node's confirmation reads the leader's status again and refuses the moment the link is
    back; a link down throughout lets the removal go on."""
    status = shard1()
    n3_down = dataclasses.replace(
        status,
        replicas=tuple(
            dataclasses.replace(r, connected=False) if r.node_id == "n3" else r
            for r in status.replicas
        ),
    )
    assert changes.removal_below_minimum(n3_down)
    assert not changes.removal_below_minimum(shard1(ReplicaStatus("n4")))

    def reads_of(*statuses: ShardStatus) -> tuple[list[int], Callable[[], Awaitable[ShardStatus]]]:
        count = [0]

        async def read() -> ShardStatus:
            count[0] += 1
            return statuses[min(count[0], len(statuses)) - 1]

        return count, read

    count, read = reads_of(n3_down, n3_down, status)  # back up on the third sample
    with pytest.raises(ChangeRefused, match="fewer than 3"):
        asyncio.run(confirm_removal(read, "n3", NODES, window_s=60.0, sample_s=0.001))
    assert count[0] == 3

    count, read = reads_of(n3_down)
    asyncio.run(confirm_removal(read, "n3", NODES, window_s=0.05, sample_s=0.005))
    assert count[0] >= 1


def test_transfer_to_a_named_target() -> None:
    status = shard1()
    assert changes.choose_transfer_target(status, "n2", NODES) == "n2"
    assert changes.choose_transfer_target(status, "n1", NODES) == "n1"  # already leads
    with pytest.raises(ChangeRefused, match="5 entries behind"):
        changes.choose_transfer_target(status, "n3", NODES)
    with pytest.raises(NotAReplica):
        changes.choose_transfer_target(status, "n4", NODES)
    with pytest.raises(UnknownNode):
        changes.choose_transfer_target(status, "n9", NODES)
    unknown_lag = shard1(ReplicaStatus("n4"))
    with pytest.raises(ChangeRefused, match="unknown number of entries"):
        changes.choose_transfer_target(unknown_lag, "n4", NODES)


def test_transfer_to_any_picks_the_most_caught_up_connected_follower() -> None:
    caught_up = ReplicaStatus("n4", match_index=120, lag_entries=0, connected=True)
    assert changes.choose_transfer_target(shard1(caught_up), None, NODES) == "n4"  # ties: id
    disconnected = ReplicaStatus("n4", match_index=120, lag_entries=0, connected=False)
    assert changes.choose_transfer_target(shard1(disconnected), None, NODES) == "n2"
    status = shard1()
    alone = dataclasses.replace(status, replicas=(status.replicas[0], status.replicas[2]))
    with pytest.raises(ChangeRefused, match="no connected, caught-up follower"):
        changes.choose_transfer_target(alone, None, NODES)


def test_caught_up() -> None:
    bound = changes.CAUGHT_UP_LAG_ENTRIES_MAX
    assert changes.caught_up(None) is None  # a follower's view: unknown
    assert changes.caught_up(0) is True
    assert changes.caught_up(bound) is True
    assert changes.caught_up(bound + 1) is False
    # A replica just added: 4 entries behind a short log, but without the entry that
    # added it (raft index 5), it has not caught up.
    assert changes.caught_up(4, match_index=0, config_index=5) is False
    assert changes.caught_up(0, match_index=5, config_index=5) is True
