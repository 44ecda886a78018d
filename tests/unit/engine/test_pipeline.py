"""The commit pipeline and the conflict index as pure cores: no event loop, no driver, no
clock (issue 13 "Commit pipeline (a pure core, events in, actions out)").

Proves: visibility follows queue order whatever order entries become durable (so visibility
order = commit_ts order = WAL order); first committer wins, against visible and still-logging
commits alike; an insert that collides with a concurrent insert is a duplicate, anything else
a write conflict; catalog guards conflict while marks alone do not; a cancelled prepare leaves
no trace; the queue is bounded; a WAL failure abandons every queued commit; pruning forgets
what no snapshot can conflict with, and a bounded index refuses a snapshot older than what it
remembers instead of missing a conflict. Also the hybrid clock's ordering rules.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.clock import HybridClock, make_ts, ts_logical, ts_physical_ms
from engine.conflicts import ConflictIndex, ConflictKey, KeyConflict, RowWrite, SnapshotTooOld
from engine.errors import Overloaded
from engine.pipeline import CommitPipeline, Ticket


def pipeline(queue_max: int = 8, keys_max: int = 1000) -> CommitPipeline[str]:
    return CommitPipeline(
        visible_ts=0, queue_max=queue_max, conflicts=ConflictIndex(keys_max=keys_max)
    )


def counter(start: int = 100) -> itertools.count[int]:
    return itertools.count(start)


def ins(key: object) -> RowWrite:
    return RowWrite((1, key), insert_only=True, live_after=True)


def upd(key: object) -> RowWrite:
    return RowWrite((1, key), insert_only=False, live_after=True)


def dele(key: object) -> RowWrite:
    return RowWrite((1, key), insert_only=False, live_after=False)


def prepare(
    p: CommitPipeline[str],
    start_ts: int,
    rows: list[RowWrite],
    ts: itertools.count[int],
    name: str = "t",
    guards: Iterable[ConflictKey] = (),
    marks: Iterable[ConflictKey] = (),
) -> Ticket[str] | KeyConflict | SnapshotTooOld:
    return p.prepare(start_ts, rows, guards, marks, ts.__next__, name)


def test_visibility_follows_queue_order_whatever_order_entries_become_durable() -> None:
    p = pipeline()
    ts = counter()
    a, b, c = (prepare(p, 0, [ins(k)], ts, k) for k in "abc")
    assert all(isinstance(t, Ticket) for t in (a, b, c))
    assert isinstance(a, Ticket) and isinstance(b, Ticket) and isinstance(c, Ticket)
    assert p.durable(c) == []
    assert p.durable(b) == []
    assert p.visible_ts == 0
    assert [t.waiter for t in p.durable(a)] == ["a", "b", "c"]
    assert p.visible_ts == c.commit_ts
    assert a.commit_ts < b.commit_ts < c.commit_ts


def test_a_group_is_held_back_only_while_its_next_durable_event_is_on_its_way() -> None:
    """The driver completes a record of many entries at once: their events arrive one by
    one, and the group becomes visible with the last of them, in one pass."""
    p = pipeline()
    ts = counter()
    a, b, c, d = (prepare(p, 0, [ins(k)], ts, k) for k in "abcd")
    assert isinstance(a, Ticket) and isinstance(b, Ticket)
    assert isinstance(c, Ticket) and isinstance(d, Ticket)
    on_its_way = {"b", "c"}  # a, b and c were completed together; d is still being logged
    resolved = on_its_way.__contains__
    assert p.durable(a, resolved) == []  # b's event will release a with it
    assert p.visible_ts == 0
    assert p.durable(b, resolved) == []
    assert [t.waiter for t in p.durable(c, resolved)] == ["a", "b", "c"]
    assert p.visible_ts == c.commit_ts
    assert [t.waiter for t in p.durable(d, resolved)] == ["d"]
    assert p.commits_visible == 4


def test_held_back_commits_are_taken_before_a_failure_fails_the_rest() -> None:
    p = pipeline()
    ts = counter()
    a, b, c = (prepare(p, 0, [ins(k)], ts, k) for k in "abc")
    assert isinstance(a, Ticket) and isinstance(b, Ticket) and isinstance(c, Ticket)
    assert p.durable(a, lambda waiter: waiter == "b") == []
    assert [t.waiter for t in p.take_durable()] == ["a"]
    assert p.visible_ts == a.commit_ts
    assert [t.waiter for t in p.fail()] == ["b", "c"]
    assert p.take_durable() == []


def test_first_committer_wins_even_before_it_is_durable() -> None:
    p = pipeline()
    ts = counter()
    first = prepare(p, 0, [upd("k")], ts)
    assert isinstance(first, Ticket)
    second = prepare(p, 0, [upd("k")], ts)
    assert isinstance(second, KeyConflict)
    assert not second.duplicate
    assert second.commit_ts == first.commit_ts
    # A transaction that started after the first became visible does not conflict.
    p.durable(first)
    assert isinstance(prepare(p, p.visible_ts, [upd("k")], ts), Ticket)


def test_insert_against_concurrent_insert_is_a_duplicate_else_a_conflict() -> None:
    p = pipeline()
    ts = counter()
    assert isinstance(prepare(p, 0, [ins("a"), dele("b")], ts), Ticket)
    dup = prepare(p, 0, [ins("a")], ts)
    assert isinstance(dup, KeyConflict) and dup.duplicate
    # Key b was deleted concurrently: re-inserting it is a conflict, not a duplicate.
    gone = prepare(p, 0, [ins("b")], ts)
    assert isinstance(gone, KeyConflict) and not gone.duplicate
    # Updating a key a concurrent commit inserted is a conflict.
    upd_a = prepare(p, 0, [upd("a")], ts)
    assert isinstance(upd_a, KeyConflict) and not upd_a.duplicate


def test_guards_conflict_with_marks_but_marks_alone_never_conflict() -> None:
    p = pipeline()
    ts = counter()
    rows_key = ("table-rows", 1)
    drop_key = ("table-drop", 1)
    # Two writers of the same table mark its rows key: no conflict between them.
    assert isinstance(prepare(p, 0, [upd("x")], ts, marks=[rows_key], guards=[drop_key]), Ticket)
    assert isinstance(prepare(p, 0, [upd("y")], ts, marks=[rows_key], guards=[drop_key]), Ticket)
    # A drop guards the rows key: it loses to the concurrent writers.
    drop = prepare(p, 0, [], ts, guards=[rows_key, drop_key], marks=[drop_key])
    assert isinstance(drop, KeyConflict) and drop.key == rows_key


def test_cancel_leaves_no_trace() -> None:
    p = pipeline()
    ts = counter()
    keep = prepare(p, 0, [upd("k")], ts)
    assert isinstance(keep, Ticket)
    p.durable(keep)
    doomed = prepare(p, p.visible_ts, [upd("k"), upd("j")], ts)
    assert isinstance(doomed, Ticket)
    p.cancel(doomed)
    assert len(p) == 0
    # The old writer of k is remembered again, j is forgotten.
    assert isinstance(prepare(p, 0, [upd("k")], ts), KeyConflict)
    assert isinstance(prepare(p, keep.commit_ts, [upd("j")], ts), Ticket)


def test_queue_is_bounded() -> None:
    p = pipeline(queue_max=2)
    ts = counter()
    prepare(p, 0, [upd(1)], ts)
    prepare(p, 0, [upd(2)], ts)
    with pytest.raises(Overloaded):
        prepare(p, 0, [upd(3)], ts)


def test_wal_failure_abandons_every_queued_commit() -> None:
    p = pipeline()
    ts = counter()
    tickets = [prepare(p, 0, [upd(k)], ts, str(k)) for k in range(3)]
    assert isinstance(tickets[1], Ticket)
    p.durable(tickets[1])
    assert [t.waiter for t in p.fail()] == ["0", "1", "2"]
    assert p.visible_ts == 0
    assert len(p) == 0


def test_prune_forgets_what_no_snapshot_can_conflict_with() -> None:
    p = pipeline()
    ts = counter()
    t = prepare(p, 0, [upd("k")], ts)
    assert isinstance(t, Ticket)
    p.durable(t)
    p.prune(oldest_snapshot_ts=0)  # a txn at snapshot 0 is still open
    assert len(p.conflicts) == 1
    p.prune(oldest_snapshot_ts=t.commit_ts)
    assert len(p.conflicts) == 0
    assert p.conflicts.floor_ts == 0


def test_a_full_index_refuses_old_snapshots_instead_of_missing_conflicts() -> None:
    p = pipeline(queue_max=100, keys_max=4)
    ts = counter()
    for key in range(6):
        t = prepare(p, p.visible_ts, [upd(key)], ts)
        assert isinstance(t, Ticket)
        p.durable(t)
    p.prune(oldest_snapshot_ts=0)  # a snapshot at 0 is open, yet the index must shrink
    assert len(p.conflicts) <= 4
    old = prepare(p, 0, [upd("new")], ts)
    assert isinstance(old, SnapshotTooOld)
    assert old.floor_ts == p.conflicts.floor_ts > 0
    assert isinstance(prepare(p, p.visible_ts, [upd("new")], ts), Ticket)


STEPS_OF_WRITERS = st.lists(
    st.tuples(st.sampled_from(("begin", "commit", "durable", "prune")), st.integers(0, 7))
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 120), min_size=1, max_size=4),
    st.lists(
        st.tuples(st.sampled_from(["begin", "commit", "durable", "prune"]), st.integers(0, 7))
    ),
)
def test_disjoint_inserts_after_a_bulk_load_are_never_refused_for_bookkeeping(
    loads: list[int], steps: list[tuple[str, int]]
) -> None:
    """Issue 21's cliff, as a model: bulk loads past `keys_max`, then eight writers inserting
    keys nobody else writes. No commit may conflict; one may be refused as too old only if
    more than `keys_max` keys became visible while it was open (the index's real bound)."""
    from engine.conflicts import BulkInsert

    keys_max = 50
    p, ts = pipeline(queue_max=64, keys_max=keys_max), counter()
    next_key = itertools.count(10**6)
    for size in loads:
        load = BulkInsert(1, np.arange(next(next_key) * 1000, next(next_key) * 1000 + size))
        ticket = p.prepare(p.visible_ts, [], (), (), ts.__next__, "load", bulk=[load])
        assert isinstance(ticket, Ticket)
        p.durable(ticket)
    visible_keys: list[tuple[int, int]] = []  # (commit_ts, keys) of writers' visible commits
    open_at: dict[int, int] = {}  # writer -> its transaction's start_ts
    in_flight: list[Ticket[str]] = []
    for op, writer in steps:
        if op == "begin":
            open_at.setdefault(writer, p.visible_ts)
        elif op == "commit" and writer in open_at:
            start_ts = open_at.pop(writer)
            got = prepare(p, start_ts, [ins(next(next_key))], ts)
            since = sum(n for commit_ts, n in visible_keys if commit_ts > start_ts)
            if isinstance(got, SnapshotTooOld):
                assert since > keys_max, (start_ts, got, since)
            else:
                assert isinstance(got, Ticket), got  # disjoint keys: never a conflict
                in_flight.append(got)
        elif op == "durable" and in_flight:
            done = in_flight.pop(0)
            p.durable(done)
            visible_keys.append((done.commit_ts, 1))
        elif op == "prune":
            p.prune(min(open_at.values(), default=p.visible_ts))
        assert p.conflicts.floor_ts <= p.visible_ts


def test_clock_is_strictly_increasing_and_honours_observed_timestamps() -> None:
    now = [1000]
    clock = HybridClock(lambda: now[0])
    first = clock.next()
    assert ts_physical_ms(first) == 1000 and ts_logical(first) == 0
    second = clock.next()  # same millisecond: the logical part counts
    assert second == first + 1
    now[0] = 900  # the wall clock goes back
    assert clock.next() > second
    clock.observe(make_ts(5000, 7))  # a replayed commit from the future
    assert clock.next() == make_ts(5000, 8)
    now[0] = 6000
    assert clock.next() == make_ts(6000)


# --- large transactions: spilled keys as sorted sets ---------------------------------------


def test_a_bulk_insert_conflicts_both_ways_with_rows_and_other_bulks() -> None:
    from engine.conflicts import BulkInsert

    def bulk(*keys: int, table_id: int = 1) -> BulkInsert:
        return BulkInsert(table_id, np.array(sorted(keys), dtype=np.int64))

    p, ts = pipeline(), counter()
    big = p.prepare(0, [], (), (), ts.__next__, "big", bulk=[bulk(5, 7, 9)])
    assert isinstance(big, Ticket)
    clash = prepare(p, 0, [ins(7)], ts)  # started before the bulk: its key was inserted
    assert isinstance(clash, KeyConflict) and clash.duplicate and clash.key == (1, 7)
    p.durable(big)
    later = prepare(p, big.commit_ts, [ins(7)], ts)  # saw it: the engine checks its view
    assert isinstance(later, Ticket)
    other = p.prepare(0, [], (), (), ts.__next__, "b2", bulk=[bulk(1, 2, 9)])
    assert isinstance(other, KeyConflict) and other.duplicate and other.key == (1, 9)
    elsewhere = p.prepare(0, [], (), (), ts.__next__, "b3", bulk=[bulk(5, table_id=2)])
    assert isinstance(elsewhere, Ticket)  # another table

    p2, ts2 = pipeline(), counter()
    first = prepare(p2, 0, [dele(3), ins(4)], ts2)
    assert isinstance(first, Ticket)
    after = p2.prepare(0, [], (), (), ts2.__next__, "big", bulk=[bulk(3)])
    assert isinstance(after, KeyConflict) and not after.duplicate  # deleted: a conflict
    after = p2.prepare(0, [], (), (), ts2.__next__, "big", bulk=[bulk(4)])
    assert isinstance(after, KeyConflict) and after.duplicate


def test_bulk_inserts_are_undone_pruned_and_bounded() -> None:
    from engine.conflicts import BulkInsert

    p, ts = pipeline(keys_max=10), counter()
    keys = BulkInsert(1, np.arange(4, dtype=np.int64))
    cancelled = p.prepare(0, [], (), (), ts.__next__, "big", bulk=[keys])
    assert isinstance(cancelled, Ticket)
    p.cancel(cancelled)
    small = prepare(p, 0, [ins(2)], ts)
    assert isinstance(small, Ticket)  # the undone bulk is forgotten
    big = p.prepare(0, [], (), (), ts.__next__, "big", bulk=[BulkInsert(1, np.arange(20, 40))])
    assert isinstance(big, Ticket)
    p.prune(0)  # over keys_max, but nothing is visible yet: commits in flight stay
    assert p.conflicts.floor_ts == 0
    p.durable(small)
    p.durable(big)
    p.prune(0)  # over keys_max: the oldest visible changes go and the floor rises past them
    assert p.conflicts.floor_ts == big.commit_ts == p.visible_ts
    assert isinstance(prepare(p, 0, [ins(25)], ts), SnapshotTooOld)
