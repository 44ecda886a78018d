"""The window and the write pipeline (pure cores) follow §2.3 and §4 scenarios 10-12.

Driven through their public inputs with no asyncio: tokens are taken and put back by hand to
replay the blog rule (W=7, record 13 outstanding: 19 may go, 20 blocks); the pipeline is fed
entries and backend completions in chosen orders to check DSN assignment, packing bounds,
safe DSNs, in-order delivery, and the truncation horizon that closes §2.7 Q3. The same
scenarios through the asyncio driver and a held MemoryBackend are in test_driver.py.
"""

from __future__ import annotations

import pytest

from tae_driver import limits
from tae_driver.pipeline import Dispatch, WritePipeline
from tae_driver.record import EntriesRecord, decode
from tae_driver.window import Window


def test_blog_rule_w7_record_13_outstanding() -> None:
    """§2.3 / scenario 10: tokens 1..19 dispatched, 1..12 returned; 19 went, 20 blocks."""
    window = Window(7)
    taken: list[int] = []
    for token in range(1, 20):
        if token > 7:
            window.put_back(token - 7)  # 1..12 return, in order
        assert window.is_open(), token
        taken.append(window.take())
    assert taken == list(range(1, 20))
    assert window.in_flight == 7  # 13..19
    assert not window.is_open()  # 20 < 7 + 13 is false
    window.put_back(13)
    assert window.is_open()  # 20 < 7 + 14
    assert window.take() == 20


def test_blog_rule_counts_from_the_oldest_outstanding_token() -> None:
    """With only 13 outstanding (14..19 put back), 20 still blocks: the rule bounds how far
    ahead of the oldest unreturned record anything may be, not just how many are out."""
    window = Window(7)
    for _ in range(19):
        if window.next_token > 7:
            window.put_back(window.next_token - 7)
        window.take()
    for token in range(14, 20):
        window.put_back(token)
    assert window.in_flight == 1
    assert not window.is_open()
    window.put_back(13)
    assert window.is_open()


def new_pipeline(
    window: int = 8, entries_max: int = limits.RECORD_ENTRIES_MAX, bytes_max: int = 4096
) -> WritePipeline[int]:
    return WritePipeline(
        last_dsn=0,
        lsn_acked_max=0,
        window_records_max=window,
        record_entries_max=entries_max,
        record_bytes_max=bytes_max,
        intake_entries_max=1000,
    )


def enqueue(pipeline: WritePipeline[int], count: int, size: int = 1) -> None:
    for _ in range(count):
        pipeline.enqueue(b"x" * size, pipeline.intake_size)


def drain(pipeline: WritePipeline[int]) -> list[Dispatch]:
    out: list[Dispatch] = []
    while (dispatch := pipeline.next_dispatch()) is not None:
        out.append(dispatch)
    return out


def test_group_commit_packs_120_entries_into_50_50_20() -> None:
    """Scenario 12: 120 entries enqueued at once, 50 per record."""
    pipeline = new_pipeline(bytes_max=limits.RECORD_BYTES_MAX)
    enqueue(pipeline, 120)
    dispatches = drain(pipeline)
    assert [(d.start_dsn, d.end_dsn) for d in dispatches] == [(1, 50), (51, 100), (101, 120)]
    for d in dispatches:
        decoded = decode(d.payload)
        assert isinstance(decoded, EntriesRecord)
        assert (decoded.start_dsn, decoded.count, decoded.safe_dsn) == (d.start_dsn, d.count, 0)
        assert decoded.entries == (b"x",) * d.count


def test_a_record_also_closes_at_the_byte_cap() -> None:
    pipeline = new_pipeline(bytes_max=1000)
    enqueue(pipeline, 10, size=200)  # 204 bytes each with the size prefix
    dispatches = drain(pipeline)
    assert [d.count for d in dispatches] == [4, 4, 2]
    assert all(len(d.payload) <= 1000 for d in dispatches)


def test_window_full_stops_packing_and_entries_wait() -> None:
    pipeline = new_pipeline(window=2, entries_max=1)
    enqueue(pipeline, 5)
    first = drain(pipeline)
    assert len(first) == 2
    assert pipeline.intake_size == 3
    pipeline.on_returned(first[0].token, 1)
    later = drain(pipeline)
    assert [d.start_dsn for d in later] == [3]


def test_out_of_order_completion_delivers_in_dsn_order() -> None:
    """Scenario 11: A=[1..5], B=[6..8], C=[9]; the backend commits C->10, A->11, B->12."""
    pipeline = new_pipeline(entries_max=50)
    enqueue(pipeline, 5)
    a = pipeline.next_dispatch()
    enqueue(pipeline, 3)
    b = pipeline.next_dispatch()
    enqueue(pipeline, 1)
    c = pipeline.next_dispatch()
    assert a and b and c
    assert [(x.start_dsn, x.end_dsn, x.safe_dsn) for x in (a, b, c)] == [
        (1, 5, 0),
        (6, 8, 0),
        (9, 9, 0),
    ]
    watermarks = [pipeline.committed_dsn]
    assert pipeline.on_returned(c.token, 10) == []  # nothing completes before A
    watermarks.append(pipeline.committed_dsn)
    delivered = pipeline.on_returned(a.token, 11)
    assert [(d.start_dsn, d.lsn, d.tickets) for d in delivered] == [(1, 11, (0, 1, 2, 3, 4))]
    watermarks.append(pipeline.committed_dsn)
    delivered = pipeline.on_returned(b.token, 12)
    assert [(d.start_dsn, d.lsn) for d in delivered] == [(6, 12), (9, 10)]
    watermarks.append(pipeline.committed_dsn)
    assert watermarks == [0, 0, 5, 9]


def test_safe_dsn_is_the_watermark_at_dispatch() -> None:
    pipeline = new_pipeline()
    enqueue(pipeline, 2)
    a = pipeline.next_dispatch()
    assert a is not None
    enqueue(pipeline, 2)
    b = pipeline.next_dispatch()
    assert b is not None
    pipeline.on_returned(a.token, 1)
    enqueue(pipeline, 2)
    c = pipeline.next_dispatch()
    assert c is not None
    assert (a.safe_dsn, b.safe_dsn, c.safe_dsn) == (0, 0, 2)


def test_horizon_is_the_lowest_floor_of_unreturned_records() -> None:
    """§2.7 Q3: a record's LSN will be above the highest LSN acked before it left."""
    pipeline = new_pipeline(entries_max=1)
    enqueue(pipeline, 1)
    a = pipeline.next_dispatch()
    assert a is not None
    assert pipeline.horizon_lsn() == 0
    pipeline.on_returned(a.token, 10)
    assert pipeline.horizon_lsn() is None
    enqueue(pipeline, 2)
    b, c = drain(pipeline)
    pipeline.on_returned(c.token, 11)  # C returned, B (floor 10) still out
    assert pipeline.horizon_lsn() == 10
    pipeline.on_returned(b.token, 12)
    assert pipeline.horizon_lsn() is None


def test_coverage_request_dispatches_an_empty_marker_once() -> None:
    pipeline = new_pipeline()
    enqueue(pipeline, 3)
    first = pipeline.next_dispatch()
    assert first is not None
    pipeline.on_returned(first.token, 1)
    pipeline.request_coverage()
    pipeline.request_coverage()
    marker = pipeline.next_dispatch()
    assert marker is not None
    assert (marker.count, marker.start_dsn, marker.safe_dsn) == (0, 4, 3)
    assert pipeline.next_dispatch() is None
    assert pipeline.coverage_pending
    pipeline.on_returned(marker.token, 2)
    assert not pipeline.coverage_pending
    assert pipeline.allocated_dsn == pipeline.committed_dsn == 3


def test_failure_hands_back_every_waiting_ticket() -> None:
    pipeline = new_pipeline(window=1, entries_max=2)
    enqueue(pipeline, 5)
    assert pipeline.next_dispatch() is not None
    assert sorted(pipeline.fail()) == [0, 1, 2, 3, 4]
    assert pipeline.next_dispatch() is None


def test_an_lsn_below_the_floor_is_a_backend_bug() -> None:
    pipeline = new_pipeline()
    enqueue(pipeline, 1)
    a = pipeline.next_dispatch()
    assert a is not None
    with pytest.raises(AssertionError):
        pipeline.on_returned(a.token, 0)  # an LSN not above the floor: a backend bug
