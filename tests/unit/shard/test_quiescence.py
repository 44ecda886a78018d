"""The quiescence cores (logsvc/shard/quiescence.py) and the node liveness table
(logsvc/shard/liveness.py), driven through their public inputs: no sockets, threads or
sleeps; time is a number.

Proves: a leader asks only when everything is committed and applied, nothing is pending,
every follower on a live node is connected and caught up, and live voters make a
majority, and only after `quiesce_after_s` of nothing new; it is quiet only once every
follower it asked agreed to that very request (stale or refused answers do not count);
anything new, a refusal, or a follower coming back to life wakes it; a follower agrees only
with its own leader in its term at the same last entry. Liveness: a node lapses after
`lapse_s` of silence, comes back with the next message, is never declared lapsed by a
check that itself ran late, and `alive` messages are due once per interval.
"""

from __future__ import annotations

import pytest

from logsvc.shard.liveness import NodeLiveness
from logsvc.shard.quiescence import (
    FollowerQuiescence,
    FollowerView,
    LeaderQuiescence,
    LeaderView,
    Mode,
    Peer,
    QuiesceRequest,
    quiescible,
)

AFTER_S = 1.0
RESEND_S = 0.5


def view(
    *,
    term: int = 3,
    last: int = 10,
    commit: int = 10,
    applied: int = 10,
    busy: bool = False,
    peers: tuple[Peer, ...] | None = None,
) -> LeaderView:
    if peers is None:
        peers = (peer("b"), peer("c"))
    return LeaderView(term, last, 3, commit, applied, busy, peers)


def peer(
    address: str, match: int = 10, connected: bool = True, alive: bool = True, voter: bool = True
) -> Peer:
    return Peer(address, match, connected, alive, voter)


@pytest.mark.parametrize(
    ("case", "leader_view", "expected"),
    [
        ("all caught up", view(), True),
        ("not committed", view(commit=9), False),
        ("not applied", view(applied=9), False),
        ("work pending", view(busy=True), False),
        ("a live follower behind", view(peers=(peer("b"), peer("c", match=9))), False),
        (
            "a live follower not connected",
            view(peers=(peer("b"), peer("c", connected=False))),
            False,
        ),
        (
            "a dead follower behind is left out",
            view(peers=(peer("b"), peer("c", 2, False, False))),
            True,
        ),
        ("no live majority", view(peers=(peer("b", alive=False), peer("c", alive=False))), False),
        ("a learner behind", view(peers=(peer("b"), peer("c"), peer("l", 4, voter=False))), False),
        ("a group of one", view(peers=()), True),
    ],
)
def test_when_a_leader_may_quiesce(case: str, leader_view: LeaderView, expected: bool) -> None:
    assert quiescible(leader_view) is expected, case


def settle(leader: LeaderQuiescence, now_s: float, v: LeaderView | None = None) -> QuiesceRequest:
    """Observe the same view until the leader asks; return its request."""
    v = v or view()
    woke, request = leader.observe(v, now_s)
    assert request is None  # the first look only notes the state
    woke, request = leader.observe(v, now_s + AFTER_S - 0.01)
    assert request is None and not woke  # not idle long enough
    woke, request = leader.observe(v, now_s + AFTER_S)
    assert request is not None and not woke
    return request


def test_a_leader_asks_after_the_idle_time_and_is_quiet_once_all_agreed() -> None:
    leader = LeaderQuiescence(AFTER_S, RESEND_S)
    request = settle(leader, 100.0)
    assert request == QuiesceRequest(3, 1, 10, 3, 10, ("b", "c"))
    assert leader.mode is Mode.QUIESCING
    leader.on_ack("b", 3, 1, True, 101.1)
    assert leader.mode is Mode.QUIESCING  # c has not answered
    leader.on_ack("b", 3, 0, True, 101.1)  # a stale seq
    leader.on_ack("c", 2, 1, True, 101.1)  # an old term
    assert leader.mode is Mode.QUIESCING
    # c is asked again (alone) after the resend interval
    woke, again = leader.observe(view(), 101.0 + RESEND_S)
    assert not woke and again is not None and again.targets == ("c",) and again.seq == 1
    leader.on_ack("c", 3, 1, True, 101.6)
    assert leader.quiet and leader.next_check_s(102.0) is None
    assert leader.observe(view(), 150.0) == (False, None)  # quiet stays quiet


@pytest.mark.parametrize(
    "change",
    [
        view(last=11, commit=10, applied=10),  # a new entry
        view(commit=9),  # not quiescible
        view(busy=True),  # a command queued
        view(term=4),  # a new term
        view(peers=(peer("b"), peer("c", match=9))),  # a follower fell behind
    ],
)
def test_anything_new_wakes_a_quiet_leader(change: LeaderView) -> None:
    leader = LeaderQuiescence(AFTER_S, RESEND_S)
    settle(leader, 0.0)
    leader.on_ack("b", 3, 1, True, 1.0)
    leader.on_ack("c", 3, 1, True, 1.0)
    assert leader.quiet
    woke, request = leader.observe(change, 5.0)
    assert woke and request is None and leader.mode is Mode.ACTIVE


def test_a_refusal_wakes_the_leader_and_the_next_request_has_a_new_seq() -> None:
    leader = LeaderQuiescence(AFTER_S, RESEND_S)
    first = settle(leader, 0.0)
    leader.on_ack("b", 3, 1, False, 1.1)
    assert leader.mode is Mode.ACTIVE
    leader.on_ack("b", 3, 1, True, 1.2)  # a late agreement to the old request: ignored
    leader.on_ack("c", 3, 1, True, 1.2)
    assert leader.mode is Mode.ACTIVE
    _, second = leader.observe(view(), 1.1 + AFTER_S)
    assert second is not None and second.seq == first.seq + 1


def test_a_follower_back_to_life_wakes_a_quiet_leader() -> None:
    dead_c = (peer("b"), peer("c", match=2, connected=False, alive=False))
    leader = LeaderQuiescence(AFTER_S, RESEND_S)
    request = settle(leader, 0.0, view(peers=dead_c))
    assert request.targets == ("b",)  # only the live follower is asked
    leader.on_ack("b", 3, 1, True, 1.0)
    assert leader.quiet
    back = (peer("b"), peer("c", match=10, connected=True, alive=True))
    woke, _ = leader.observe(view(peers=back), 2.0)
    assert woke  # it did not agree to this quiet: catch it up, then ask again


def test_explicit_wake_and_a_group_of_one() -> None:
    leader = LeaderQuiescence(AFTER_S, RESEND_S)
    assert not leader.wake(0.0)  # active already
    alone = view(peers=())
    leader.observe(alone, 0.0)
    assert leader.observe(alone, AFTER_S) == (False, None)
    assert leader.quiet  # nobody to ask
    assert leader.wake(5.0) and leader.mode is Mode.ACTIVE


def follower_view(**changes: object) -> FollowerView:
    fields: dict[str, object] = {
        "term": 3,
        "is_follower": True,
        "leader": "a",
        "last_index": 10,
        "last_term": 3,
    }
    fields.update(changes)
    return FollowerView(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("case", "sender", "own", "agrees"),
    [
        ("its leader, same term and last entry", "a", follower_view(), True),
        ("another node", "b", follower_view(), False),
        ("an older term", "a", follower_view(term=4), False),
        ("a candidate", "a", follower_view(is_follower=False), False),
        ("a longer log", "a", follower_view(last_index=11), False),
        ("a different last term", "a", follower_view(last_term=2), False),
        ("no leader known", "a", follower_view(leader=None), False),
    ],
)
def test_when_a_follower_agrees(case: str, sender: str, own: FollowerView, agrees: bool) -> None:
    follower = FollowerQuiescence()
    request = QuiesceRequest(3, 1, 10, 3, 10, ())
    assert follower.on_request(sender, request, own) is agrees, case
    assert follower.quiet is agrees
    assert follower.wake() is agrees
    assert not follower.quiet


def test_liveness_lapses_comes_back_and_never_blames_its_own_stall() -> None:
    live = NodeLiveness("n1", interval_s=0.1, lapse_s=1.0, now_s=0.0)
    assert not live.lapsed("n2", 0.9)  # counted as heard at our start
    assert live.lapsed("n2", 1.1)
    assert live.check(["n2", "n3"], 0.5).lapsed == ()
    assert live.check(["n2", "n3"], 1.0).lapsed == ()
    changes = live.check(["n2", "n3"], 1.1)
    assert changes.lapsed == ("n2", "n3")
    live.heard("n2", 1.2)
    changes = live.check(["n2", "n3"], 1.3)
    assert changes.revived == ("n2",) and changes.lapsed == ()
    assert live.check(["n2", "n3"], 1.4).revived == ()
    # A check that ran 3 s late (this process paused) declares no new lapse.
    assert live.check(["n2"], 4.4).lapsed == ()
    assert live.check(["n2"], 4.5).lapsed == ("n2",)  # the next, on time, does
    assert not live.lapsed("n1", 100.0)  # never itself
    live.heard("n1", 5.0)
    assert live.last_heard("n1") == 0.0


def test_alive_messages_are_due_once_per_interval() -> None:
    live = NodeLiveness("n1", interval_s=0.1, lapse_s=1.0, now_s=0.0)
    assert live.send_due("n2", 0.0)
    live.sent("n2", 0.0)
    assert not live.send_due("n2", 0.05)
    assert live.send_due("n2", 0.1)
