"""Replay vectors, as tables, through a MemoryBackend, at several read batch sizes.

Each vector places encoded records at chosen LSNs (`rec(lsn, start, end, safe)`, markers,
skip records, copies, internal records), sets the truncated LSN, and replays with a handle
that answers TRUNCATED below `apply_from` and APPLY from it on (the §4 convention `from=X`).
It then checks, for read batches of 1 byte (one record per read), about two records, about
four, and everything at once:

* the DSNs handed to the handle (strictly increasing, asserted by the handle itself), the
  DSNs applied, and which writer generation's bytes each entry carries;
* the skip record written (pairs of (start DSN, LSN) of every discarded copy), or none;
* `driver.dsn()` and, for FOR_WRITE, that the next append gets `last_dsn + 1`;
* that a restart over the resulting log replays the same sequence plus the new entry and
  finds nothing trailing (the skip record did its job, and duplicate skips are harmless);
* or the error a corrupt log must raise.

Vectors: §4 scenarios 6, 18, 20 (ids `s6`, `s18`, `s20`), the §2.4 truncation shapes, and our
own from §2.5 and §2.7 (Q1 real LSNs, Q2 re-sent batches, Q5 rejected writes, Q7 duplicates
and skip keys), including the one place we differ from MatrixOne: a gap above every safe DSN
is a loss, never a truncated prefix, even before the first applied entry.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from tae_driver import ReplayMode, open_driver
from tae_driver.backend import Record, RecordKind
from tae_driver.backends.memory import MemoryBackend
from tae_driver.errors import (
    DriverFailed,
    ReplayCorruptionError,
    ReplayError,
    ReplayHoleError,
    ReplayOverlapError,
    ReplayTooManyPending,
)
from tae_driver.record import SkipRecord, decode, encode_record, encode_skip
from tae_driver.replay import Replayer
from tests.unit.tae_driver.harness import Recorder

BATCH_BYTES = [1, 100, 250, 1 << 20]

Row = tuple[object, ...]


def rec(lsn: int, start: int, end: int, safe: int, tag: str = "g1") -> Row:
    return ("rec", lsn, start, end, safe, tag)


def marker(lsn: int, start: int, safe: int) -> Row:
    return ("marker", lsn, start, safe)


def internal(lsn: int) -> Row:
    return ("internal", lsn)


def skip(lsn: int, *pairs: tuple[int, int]) -> Row:
    return ("skip", lsn, pairs)


def copy(lsn: int, of_lsn: int) -> Row:
    return ("copy", lsn, of_lsn)


def entry(tag: str, dsn: int) -> bytes:
    return f"{tag}:{dsn}".encode()


@dataclass(frozen=True)
class Vector:
    id: str
    rows: tuple[Row, ...]
    truncated: int = 0
    apply_from: int = 1
    mode: ReplayMode = ReplayMode.FOR_WRITE
    handled: tuple[int, ...] = ()
    applied: tuple[int, ...] | None = None  # default: handled DSNs >= apply_from
    tags: dict[int, str] = field(default_factory=dict)  # DSN -> writer tag if not "g1"
    skip: tuple[tuple[int, int], ...] = ()
    last_dsn: int = 0
    error: type[ReplayError] | None = None


def span(lo: int, hi: int) -> tuple[int, ...]:
    return tuple(range(lo, hi + 1))


VECTORS = [
    Vector(
        "s18_out_of_order_tail_within_the_safe_window",
        (
            rec(12, 30, 31, 0),
            rec(13, 28, 29, 1),
            rec(14, 32, 33, 27),
            rec(15, 36, 37, 28),
            rec(16, 41, 43, 32),
            rec(17, 38, 40, 32),
            rec(18, 34, 35, 32),
        ),
        truncated=13,
        apply_from=39,
        handled=span(32, 43),
        applied=span(39, 43),
        last_dsn=43,
    ),
    Vector(
        "s20_safe_dsn_from_the_first_record_skips_9_silently",
        (rec(1, 10, 20, 9),),
        apply_from=10,
        handled=span(10, 20),
        last_dsn=20,
    ),
    Vector(
        "s6_q5_internal_and_rejected_records_are_ignored",
        (internal(1), internal(2), rec(3, 1, 2, 0), internal(4), rec(5, 3, 3, 2), internal(6)),
        handled=span(1, 3),
        last_dsn=3,
    ),
    Vector(
        "q1_skip_pairs_use_the_records_own_lsns",
        (rec(5, 1, 2, 0), rec(9, 3, 4, 2), rec(12, 6, 7, 2)),
        handled=span(1, 4),
        skip=((6, 12),),
        last_dsn=4,
    ),
    Vector(
        "s2_5_trailing_records_after_a_lost_one_are_skipped_durably",
        (rec(1, 1, 2, 0), rec(2, 5, 6, 2), rec(3, 7, 7, 2)),
        handled=span(1, 2),
        skip=((5, 2), (7, 3)),
        last_dsn=2,
    ),
    Vector(
        "s2_5_for_read_discards_trailing_records_without_writing",
        (rec(1, 1, 2, 0), rec(2, 5, 6, 2), rec(3, 7, 7, 2)),
        mode=ReplayMode.FOR_READ,
        handled=span(1, 2),
        last_dsn=2,
    ),
    Vector(
        "s2_5_reused_dsns_resolve_to_the_new_writers_records",
        (
            rec(1, 1, 2, 0),
            rec(2, 5, 6, 2),
            rec(3, 7, 7, 2),
            skip(4, (5, 2), (7, 3)),
            rec(5, 5, 6, 2, "g2"),
            rec(6, 3, 4, 2, "g2"),
            rec(7, 7, 8, 6, "g2"),
        ),
        handled=span(1, 8),
        tags={3: "g2", 4: "g2", 5: "g2", 6: "g2", 7: "g2", 8: "g2"},
        last_dsn=8,
    ),
    Vector(
        "q7_a_repeated_skip_record_is_harmless",
        (
            rec(1, 1, 2, 0),
            rec(2, 5, 6, 2),
            skip(3, (5, 2)),
            skip(4, (5, 2)),
            rec(5, 3, 5, 2, "g2"),
            skip(6, (5, 2)),
        ),
        handled=span(1, 5),
        tags={3: "g2", 4: "g2", 5: "g2"},
        last_dsn=5,
    ),
    Vector(
        "q7_a_skip_removes_only_the_copy_it_names_by_lsn",
        (
            rec(1, 1, 2, 0),
            rec(2, 5, 6, 2),
            skip(3, (5, 2)),
            rec(4, 5, 6, 2, "g2"),
            skip(5, (5, 2)),  # a late copy of the skip: must not remove g2's record at 4
            rec(6, 3, 4, 2, "g2"),
        ),
        handled=span(1, 6),
        tags={3: "g2", 4: "g2", 5: "g2", 6: "g2"},
        last_dsn=6,
    ),
    Vector(
        "q7_27410_identical_copy_after_the_original_was_applied",
        (rec(1, 1, 2, 0), rec(2, 3, 4, 2), copy(3, 2), rec(4, 5, 5, 4), copy(5, 2)),
        handled=span(1, 5),
        last_dsn=5,
    ),
    Vector(
        "q7_identical_copy_of_a_pending_record",
        (rec(1, 3, 4, 0), copy(2, 1), rec(3, 1, 2, 0)),
        handled=span(1, 4),
        last_dsn=4,
    ),
    Vector(
        "q7_every_copy_of_a_trailing_record_is_skipped",
        (rec(1, 1, 1, 0), rec(2, 3, 3, 1), copy(3, 2)),
        handled=(1,),
        skip=((3, 2), (3, 3)),
        last_dsn=1,
    ),
    Vector(
        "q7_a_copy_of_a_truncated_record_above_the_truncation_point",
        (rec(1, 1, 2, 0), rec(3, 3, 3, 2), copy(4, 1), rec(5, 4, 4, 3)),
        truncated=2,
        apply_from=3,
        handled=span(3, 4),
        last_dsn=4,
    ),
    Vector(
        "q7_a_partial_overlap_is_corruption",
        (rec(1, 1, 3, 0), rec(2, 3, 4, 0)),
        error=ReplayOverlapError,
    ),
    Vector(
        "q7_a_partial_overlap_with_applied_dsns_is_corruption",
        (rec(1, 1, 3, 0), rec(2, 4, 4, 3), rec(3, 2, 5, 0)),
        error=ReplayOverlapError,
    ),
    Vector(
        "q7_same_dsns_with_other_bytes_is_corruption",
        (rec(1, 1, 2, 0), rec(2, 1, 2, 0, "other")),
        error=ReplayOverlapError,
    ),
    Vector(
        "s2_5_a_hole_below_safe_after_an_applied_entry_is_an_error",
        (rec(1, 1, 2, 0), rec(2, 5, 6, 4)),
        error=ReplayHoleError,
    ),
    Vector(
        "s2_5_the_same_gap_before_any_applied_entry_is_a_truncated_prefix",
        (rec(1, 1, 2, 0), rec(2, 5, 6, 4)),
        apply_from=5,
        handled=(1, 2, 5, 6),
        last_dsn=6,
    ),
    Vector(
        "s2_4_the_ragged_prefix_left_by_truncating_at_11",
        (
            rec(11, 1, 5, 0),
            rec(12, 8, 10, 5),
            rec(13, 6, 7, 5),
            rec(14, 11, 12, 10),
            internal(15),
            internal(16),
            rec(17, 13, 13, 12),
        ),
        truncated=11,
        apply_from=8,
        handled=span(6, 13),
        applied=span(8, 13),
        last_dsn=13,
    ),
    Vector(
        "s2_4_lower_dsns_above_the_cut_with_a_covering_marker",
        (rec(11, 3, 5, 0), rec(12, 6, 9, 0), rec(13, 1, 2, 0), marker(14, 10, 9)),
        truncated=11,
        apply_from=6,
        handled=(1, 2, 6, 7, 8, 9),
        applied=span(6, 9),
        last_dsn=9,
    ),
    Vector(
        "ours_a_gap_above_every_safe_dsn_is_a_loss_not_a_prefix",
        (rec(1, 3, 4, 0),),  # MO would apply 3-4 with 1-2 lost in flight
        handled=(),
        skip=((3, 1),),
        last_dsn=0,
    ),
    Vector(
        "ours_without_cover_lower_dsns_then_a_gap_discard_the_rest",
        (rec(12, 6, 9, 0), rec(13, 1, 2, 0)),
        truncated=11,
        apply_from=1,
        handled=(1, 2),
        skip=((6, 12),),
        last_dsn=2,
    ),
    Vector("an_empty_log", ()),
    Vector("only_internal_records", (internal(1), internal(2))),
    Vector(
        "a_marker_alone_after_truncating_everything",
        (rec(1, 1, 5, 0), marker(2, 6, 5)),
        truncated=1,
        last_dsn=5,
    ),
]


def place(backend: MemoryBackend, rows: tuple[Row, ...]) -> None:
    payloads: dict[int, bytes] = {}
    for row in rows:
        kind, lsn = row[0], row[1]
        assert isinstance(lsn, int)
        if kind == "rec":
            _, _, start, end, safe, tag = row
            assert isinstance(start, int) and isinstance(end, int) and isinstance(safe, int)
            payload = encode_record(
                start, safe, [entry(str(tag), d) for d in range(start, end + 1)]
            )
        elif kind == "marker":
            _, _, start, safe = row
            assert isinstance(start, int) and isinstance(safe, int)
            payload = encode_record(start, safe, [])
        elif kind == "skip":
            pairs = row[2]
            assert isinstance(pairs, tuple)
            payload = encode_skip(pairs)
        elif kind == "copy":
            of_lsn = row[2]
            assert isinstance(of_lsn, int)
            payload = payloads[of_lsn]
        else:
            backend.put_internal(lsn)
            continue
        payloads[lsn] = payload
        backend.put(lsn, payload)


async def replay_vector(vector: Vector, backend_of: type[MemoryBackend], batch: int) -> None:
    backend = backend_of()
    place(backend, vector.rows)
    if vector.truncated:
        backend.set_truncated(vector.truncated)
    rows_end = max((int(str(row[1])) for row in vector.rows), default=0)
    driver = open_driver(backend, read_batch_bytes=batch)
    recorder = Recorder(apply_from=vector.apply_from)
    if vector.error is not None:
        with pytest.raises(vector.error):
            await driver.replay(recorder, mode=vector.mode)
        with pytest.raises(DriverFailed):
            await driver.append(b"refused")
        return
    summary = await driver.replay(recorder, mode=vector.mode)
    assert all(first > vector.truncated for first, _ in backend.reads)
    assert tuple(recorder.handled) == vector.handled
    applied = vector.applied
    if applied is None:
        applied = tuple(d for d in vector.handled if d >= vector.apply_from)
    assert tuple(recorder.applied) == applied
    for dsn in recorder.handled:
        assert recorder.entries[dsn] == entry(vector.tags.get(dsn, "g1"), dsn)
    written = [(lsn, r) for lsn, r in backend.user_records() if lsn > rows_end]
    if vector.skip:
        assert len(written) == 1
        assert written[0][1] == SkipRecord(vector.skip)
        assert summary.skip_lsn == written[0][0]
    else:
        assert written == []
    assert driver.dsn() == summary.last_dsn == vector.last_dsn
    if vector.mode is not ReplayMode.FOR_WRITE:
        assert not driver.writable
        await driver.close()
        return
    assert await driver.append(b"next") == vector.last_dsn + 1
    await driver.close()
    # A restart sees the same applied sequence plus the new entry, and nothing trailing.
    # (The writer may have truncated what the engine answered TRUNCATED: MO's
    # truncateDSNIntent = first replayed DSN - 1, §2.5 onReplayDone.)
    again = Recorder(apply_from=vector.apply_from)
    restarted = open_driver(backend, read_batch_bytes=batch)
    summary = await restarted.replay(again, mode=ReplayMode.FOR_READ)
    new_dsn = vector.last_dsn + 1
    assert again.handled[-1] == new_dsn
    assert again.entries[new_dsn] == b"next"
    assert set(again.handled) <= {*recorder.handled, new_dsn}
    assert again.applied == [*applied, new_dsn]
    assert summary.trailing_records == 0
    await restarted.close()


@pytest.mark.parametrize("batch", BATCH_BYTES)
@pytest.mark.parametrize("vector", VECTORS, ids=[v.id for v in VECTORS])
def test_replay_vector(vector: Vector, batch: int) -> None:
    asyncio.run(replay_vector(vector, MemoryBackend, batch))


class ResendingBackend(MemoryBackend):
    """§2.7 Q2: MO's Read returns next == first when a batch reaches the end, even with
    records in it, so a naive tail re-reads (and re-applies) its last batch."""

    async def read(self, first_lsn: int, max_bytes: int) -> tuple[list[Record], int]:
        records, next_lsn = await super().read(first_lsn, max_bytes)
        if records and records[-1].lsn == await self.latest():
            return records, first_lsn
        return records, next_lsn


@pytest.mark.parametrize("batch", BATCH_BYTES)
@pytest.mark.parametrize("vector", VECTORS[:8], ids=[v.id for v in VECTORS[:8]])
def test_q2_a_backend_that_resends_its_last_batch_changes_nothing(
    vector: Vector, batch: int
) -> None:
    asyncio.run(replay_vector(vector, ResendingBackend, batch))


# --- the core's bounds, directly -------------------------------------------------------------


def test_more_pending_records_than_a_legal_log_holds_is_an_error() -> None:
    replayer = Replayer(truncated_lsn=0, pending_records_max=2)
    replayer.offer(Record(1, encode_record(10, 0, [b"a"])))
    replayer.offer(Record(2, encode_record(20, 0, [b"b"])))
    with pytest.raises(ReplayTooManyPending):
        replayer.offer(Record(3, encode_record(30, 0, [b"c"])))


def test_too_many_copies_of_one_record_is_an_error() -> None:
    replayer = Replayer(truncated_lsn=0, copies_max=2)
    payload = encode_record(10, 0, [b"a"])
    replayer.offer(Record(1, payload))
    replayer.offer(Record(2, payload))
    with pytest.raises(ReplayCorruptionError):
        replayer.offer(Record(3, payload))


def test_an_undecodable_user_record_is_corruption_but_internal_bytes_are_not_read() -> None:
    replayer = Replayer(truncated_lsn=0)
    replayer.offer(Record(1, b"not a record", RecordKind.INTERNAL))
    with pytest.raises(ReplayCorruptionError) as info:
        replayer.offer(Record(2, b"not a record"))
    assert info.value.lsn == 2


def test_lsns_that_go_backwards_are_corruption() -> None:
    replayer = Replayer(truncated_lsn=0)
    replayer.offer(Record(5, encode_record(1, 0, [b"a"])))
    with pytest.raises(ReplayCorruptionError):
        replayer.offer(Record(4, encode_record(2, 1, [b"b"])))


def test_decoded_vectors_are_what_the_table_says() -> None:
    """Guard the table helpers themselves: a row becomes exactly the record it names."""
    backend = MemoryBackend()
    place(backend, (rec(3, 5, 7, 4, "t"), marker(4, 8, 7), skip(5, (5, 3))))
    decoded = [decode(r.payload) for r in backend.records()]
    assert decoded[0] == decode(encode_record(5, 4, [b"t:5", b"t:6", b"t:7"]))
    assert decoded[2] == SkipRecord(((5, 3),))
