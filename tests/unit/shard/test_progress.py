"""Elections and follower lag in seconds (logsvc/shard/progress.py), from tick inputs.

How: `RaftProgress.observe` is fed tick by tick with a hand-made clock (monotonic and
wall seconds), leader, term, role, last log index and match indexes; the view is checked
after each step. No threads, no sleeps.
"""

from __future__ import annotations

from logsvc.shard.progress import RaftProgress

WALL = 1_800_000_000.0


def feed(progress: RaftProgress, now: float, **kwargs: object) -> None:
    values: dict[str, object] = {
        "leader": "a",
        "term": 1,
        "leading": True,
        "last_index": 10,
        "match_index": {},
    }
    values.update(kwargs)
    progress.observe(now, WALL + now, **values)  # type: ignore[arg-type]


def test_nothing_known_at_first() -> None:
    progress = RaftProgress()
    view = progress.view(0.0)
    assert view.last_election_at_s is None
    assert view.lag_of("b") is None
    feed(progress, 1.0, leader=None, leading=False)
    assert progress.view(1.0).last_election_at_s is None


def test_an_election_is_a_new_leader_or_term() -> None:
    progress = RaftProgress()
    feed(progress, 1.0, leader="b", leading=False)
    assert progress.view(1.0).last_election_at_s == WALL + 1.0
    feed(progress, 2.0, leader="b", leading=False)  # the same leader: nothing new
    feed(progress, 3.0, leader=None, leading=False)  # an election under way
    assert progress.view(3.0).last_election_at_s == WALL + 1.0
    feed(progress, 4.0, leader="b", term=2, leading=False)  # re-elected: a new term
    assert progress.view(4.0).last_election_at_s == WALL + 4.0
    feed(progress, 5.0, leader="a", term=3)  # this replica
    assert progress.view(5.0).last_election_at_s == WALL + 5.0


def test_lag_seconds_counts_from_the_last_time_caught_up() -> None:
    progress = RaftProgress()
    feed(progress, 10.0, match_index={"b": 10, "c": 7})
    view = progress.view(10.5)
    assert view.lag_of("b") == 0.5  # caught up at 10.0
    assert view.lag_of("c") == 0.5  # never caught up: counts from when leadership began
    feed(progress, 11.0, last_index=12, match_index={"b": 12, "c": 7})
    feed(progress, 12.0, last_index=14, match_index={"b": 13, "c": 14})
    view = progress.view(13.0)
    assert view.lag_of("b") == 2.0  # last equal at 11.0
    assert view.lag_of("c") == 1.0  # caught up at 12.0


def test_a_peer_added_counts_from_then_and_a_removed_one_goes() -> None:
    progress = RaftProgress()
    feed(progress, 1.0, match_index={"b": 10})
    feed(progress, 5.0, match_index={"b": 10, "d": 0})
    assert progress.view(6.0).lag_of("d") == 1.0
    feed(progress, 7.0, match_index={"d": 10})
    view = progress.view(7.0)
    assert view.lag_of("b") is None
    assert view.lag_of("d") == 0.0


def test_followers_report_no_lag_and_a_new_leadership_starts_afresh() -> None:
    progress = RaftProgress()
    feed(progress, 1.0, match_index={"b": 10})
    feed(progress, 2.0, leader="b", term=2, leading=False)
    assert progress.view(3.0).lag_s == ()
    feed(progress, 50.0, leader="a", term=3, match_index={"b": 3})
    assert progress.view(51.0).lag_of("b") == 1.0  # not 50 s: counted from this term
