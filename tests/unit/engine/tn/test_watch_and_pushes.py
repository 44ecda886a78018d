"""The pure cores of the TN daemon: the standby's failure detector (engine/tn/watch.py) and a
subscriber's bounded queue (engine/tn/pushes.py).

How: driven through their inputs only (probe rounds with their times; entries offered and
taken), no sockets, no sleeps. The watch promotes after exactly `failures_to_promote`
consecutive rounds without an active TN inside the window, never on a streak an active
answer (or a standby ahead of it) broke or on failures older than the window; a policy
that could never promote is refused naming its field. The queue keeps commit order,
bounds count and bytes, always hands out at least one entry, and once over a bound is
dropped for good.
"""

from __future__ import annotations

import pytest

from engine.logtail import TailEntry
from engine.tn.pushes import SubscriberQueue
from engine.tn.watch import Decision, Seen, Watch, WatchPolicy

A, D, N = Seen.ACTIVE, Seen.DEFERRED, Seen.NO_ACTIVE
W, P = Decision.WAIT, Decision.PROMOTE
POLICY = WatchPolicy(
    probe_interval_ms=250, probe_timeout_ms=500, failures_to_promote=4, failure_window_ms_max=4000
)

TRANSCRIPTS: list[tuple[str, list[tuple[int, Seen]], list[Decision]]] = [
    ("the active answers", [(0, A), (250, A), (500, A)], [W, W, W]),
    ("four failures in a row", [(0, N), (250, N), (500, N), (750, N)], [W, W, W, P]),
    ("an answer breaks the streak", [(0, N), (250, N), (500, N), (750, A), (1000, N)], [W] * 5),
    ("failures spread too thin", [(0, N), (2000, N), (4500, N), (9000, N)], [W, W, W, W]),
    (
        "old failures leave the window",
        [(0, N), (3000, N), (3500, N), (4100, N), (4200, N)],
        [W, W, W, W, P],
    ),
    ("no peer ever active", [(0, N), (1, N), (2, N), (3, N)], [W, W, W, P]),
    ("a standby ahead promotes first", [(0, N), (250, D), (500, N), (750, N), (1000, N)], [W] * 5),
    (
        "then the one ahead dies too",
        [(0, D), (250, N), (500, N), (750, N), (1000, N)],
        [W, W, W, W, P],
    ),
]


@pytest.mark.parametrize(
    ("rounds", "decisions"),
    [case[1:] for case in TRANSCRIPTS],
    ids=[case[0] for case in TRANSCRIPTS],
)
def test_the_watch_follows_its_rule(
    rounds: list[tuple[int, Seen]], decisions: list[Decision]
) -> None:
    watch = Watch(POLICY)
    assert [watch.observe(now_ms, seen) for now_ms, seen in rounds] == decisions


def test_the_default_policy_promotes_within_a_few_seconds() -> None:
    policy = WatchPolicy()
    assert policy.problem() is None
    worst_ms = policy.failures_to_promote * (policy.probe_interval_ms + policy.probe_timeout_ms)
    assert worst_ms <= 3000


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        (WatchPolicy(probe_interval_ms=1), "probe_interval_ms"),
        (WatchPolicy(probe_timeout_ms=0), "probe_timeout_ms"),
        (WatchPolicy(failures_to_promote=0), "failures_to_promote"),
        (WatchPolicy(failure_window_ms_max=100), "failure_window_ms_max"),
    ],
)
def test_a_policy_that_cannot_work_is_refused_naming_its_field(
    policy: WatchPolicy, field: str
) -> None:
    problem = policy.problem()
    assert problem is not None and problem.startswith(f"{field}:")


def entry(ts: int, size: int = 10) -> TailEntry:
    return TailEntry(ts, ts, b"x" * size)


def test_the_queue_keeps_order_and_hands_out_batches_within_bounds() -> None:
    queue = SubscriberQueue(entries_max=10, bytes_max=1000)
    for ts in range(1, 6):
        assert queue.offer(entry(ts, 100))
    assert [e.commit_ts for e in queue.take(entries_max=2, bytes_max=10_000)] == [1, 2]
    assert [e.commit_ts for e in queue.take(entries_max=10, bytes_max=150)] == [3]
    assert [e.commit_ts for e in queue.take(entries_max=10, bytes_max=50)] == [4]  # one always
    assert queue.bytes == 100 and len(queue) == 1
    assert [e.commit_ts for e in queue.take(entries_max=10, bytes_max=10_000)] == [5]
    assert queue.take(entries_max=10, bytes_max=10_000) == ()
    assert queue.bytes == 0


@pytest.mark.parametrize(("entries_max", "bytes_max", "offers_ok"), [(3, 10_000, 3), (100, 250, 2)])
def test_the_queue_is_dropped_for_good_past_a_bound(
    entries_max: int, bytes_max: int, offers_ok: int
) -> None:
    queue = SubscriberQueue(entries_max, bytes_max)
    results = [queue.offer(entry(ts, 100)) for ts in range(1, 6)]
    assert results == [True] * offers_ok + [False] * (5 - offers_ok)
    assert queue.dropped and len(queue) == 0 and queue.bytes == 0
    assert not queue.offer(entry(99, 1))  # never again


@pytest.mark.parametrize(
    ("roles", "seen"),
    [
        ({"127.0.0.1:7902": "active"}, A),
        ({"127.0.0.1:7902": ""}, N),
        ({"127.0.0.1:7902": "standby"}, N),  # behind this one: this one promotes
        ({"127.0.0.1:7900": "standby"}, D),  # ahead: that one promotes
        ({"127.0.0.1:7900": "", "127.0.0.1:7902": "standby"}, N),
        ({"127.0.0.1:7900": "standby", "127.0.0.1:7902": "active"}, A),
    ],
)
def test_a_round_of_answers_is_seen_as(roles: dict[str, str], seen: Seen) -> None:
    from engine.tn.daemon import _seen

    assert _seen("127.0.0.1:7901", roles) is seen
