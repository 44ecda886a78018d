"""The streaming sources' pure cores, with no cluster and no Spark: the `logsvc` source's offset
codec and micro-batch planning (spark_jobs/stream_offsets.py), and the change stream's reader
(spark_jobs/stream_changes.py) on driver records built with the writers' own encoders: DSN
order out of LSN order, cuts only where nothing is pending, a resumed reader (tae_driver's
Replayer at `resolved_dsn`) continuing exactly, and the catalog rolled back past a cut. A delete
comes with its key (the WAL's DeleteKeys, issue 23; null when logged without keys) and a
rewrite's carried deletes give no change; on a real engine's log every delete's key is its
row's insert's key, byte for byte."""

from __future__ import annotations

import asyncio
import datetime
import json

import pyarrow as pa
import pytest
from pyroaring import FrozenBitMap

from engine import Engine
from engine.schema import Column, Schema
from engine.wal.codec import encode_entry
from engine.wal.entry import (
    Append,
    AppendInfo,
    BlockLevel,
    CatalogKind,
    CatalogOp,
    Command,
    CreateBlock,
    Delete,
    DeletedKeys,
    DropBlock,
    TxnEntry,
    UpdateCatalog,
    memo_of,
)
from spark_jobs.errors import BadInput, ChangesRefused, DataLost
from spark_jobs.stream_changes import Catalog, Change, ChangeReader, ChangesOffset
from spark_jobs.stream_offsets import Lost, Offsets, Retained, plan_end, ranges
from tae_driver.backend import RecordKind
from tae_driver.backends.memory import MemoryBackend
from tae_driver.record import encode_record

# --- offsets and planning -----------------------------------------------------------------


def test_offsets_round_trip_and_refuse_bad_json() -> None:
    offsets = Offsets({2: 7, 1: 0}, {2: Lost(3, (1, 3))})
    raw = offsets.to_json()
    assert raw == {"shards": {"1": 0, "2": 7}, "lost": {"2": {"lsns": 3, "last": [1, 3]}}}
    assert Offsets.from_json(json.loads(json.dumps(raw))) == offsets
    assert Offsets.from_json(json.dumps(raw)) == offsets
    for bad in ("{", '{"shards": {"x": 1}}', '{"shards": {"1": -1}}', '{"shards": {"1": true}}'):
        with pytest.raises(BadInput):
            Offsets.from_json(bad)


def test_plan_reads_to_the_end_within_target_and_budget() -> None:
    start = Offsets({1: 0, 2: 10})
    spans = {1: Retained(1, 101), 2: Retained(1, 21)}
    end, skips = plan_end(start, spans, fail_on_data_loss=True)
    assert end.lsns == {1: 100, 2: 20} and not skips
    end, _ = plan_end(start, spans, fail_on_data_loss=True, target={1: 50, 2: 15})
    assert end.lsns == {1: 50, 2: 15}
    end, _ = plan_end(start, spans, fail_on_data_loss=True, records_max=95)
    assert end.lsns == {1: 95, 2: 10}  # the budget goes shard by shard
    assert ranges(start, Offsets({1: 100, 2: 20}), 40) == [
        (1, 1, 40),
        (1, 41, 80),
        (1, 81, 100),
        (2, 11, 20),
    ]


def test_truncation_past_the_offset_fails_or_is_skipped_and_counted() -> None:
    start = Offsets({1: 4})
    spans = {1: Retained(9, 12)}
    with pytest.raises(DataLost) as caught:
        plan_end(start, spans, fail_on_data_loss=True)
    assert (caught.value.shard, caught.value.lo, caught.value.hi) == (1, 5, 8)
    end, skips = plan_end(start, spans, fail_on_data_loss=False)
    assert end.lsns == {1: 11} and end.lost == {1: Lost(4, (5, 8))}
    assert [(s.shard, s.lo, s.hi) for s in skips] == [(1, 5, 8)]
    assert ranges(start, end, 100) == [(1, 9, 11)]  # the skipped LSNs are not read
    later, _ = plan_end(end, {1: Retained(20, 25)}, fail_on_data_loss=False)
    assert later.lost == {1: Lost(12, (12, 19))}  # counted over the query's life
    assert ranges(end, later, 100) == [(1, 20, 24)]


# --- the change reader --------------------------------------------------------------------

SCHEMA = Schema([Column("id", "int64"), Column("note", "string", nullable=True)], ["id"])


def _entry(ts: int, *commands: Command) -> bytes:
    return encode_entry(TxnEntry(ts, ts + 1, memo_of(commands), tuple(commands)))


def _insert(block: int, offset: int, ids: list[int]) -> Append:
    batch = pa.record_batch(
        [pa.array(ids, pa.int64()), pa.array([f"n{i}" for i in ids], pa.string())],
        names=["id", "note"],
    )
    return Append(1, 10, (AppendInfo(block, offset, len(ids)),), batch)


CREATE = _entry(
    10,
    UpdateCatalog(CatalogKind.DATABASE, CatalogOp.CREATE, 1, 0, "d", None),
    UpdateCatalog(CatalogKind.TABLE, CatalogOp.CREATE, 1, 10, "t", SCHEMA),
)
# Records in LSN order: DSN 1 (catalog), DSN 3 before DSN 2 (an out-of-order completion),
# then DSN 4 (a delete).
RECORDS = [
    (1, encode_record(1, 0, [CREATE])),
    (2, encode_record(3, 1, [_entry(30, _insert(7, 2, [5]))])),
    (3, encode_record(2, 1, [_entry(20, _insert(7, 0, [1, 2]))])),
    (4, encode_record(4, 3, [_entry(40, Delete(1, 10, 7, FrozenBitMap([1])))])),
]


def _read(
    start: ChangesOffset, catalog: Catalog, records: list[tuple[int, bytes]]
) -> tuple[list[Change], list[ChangesOffset], ChangesOffset]:
    reader = ChangeReader(start, catalog, 1)
    out: list[Change] = []
    cuts: list[ChangesOffset] = []
    for lsn, payload in records:
        reader.offer(lsn, payload)
        if reader.resolved:
            out.extend(reader.cut())
            cuts.append(reader.point)
    reader.abandon()
    return out, cuts, reader.point


def test_changes_come_in_dsn_order_and_cut_only_where_nothing_waits() -> None:
    out, cuts, point = _read(ChangesOffset(0, 0, False), Catalog(), RECORDS)
    assert [(c[1], c[0], c[2], c[5], c[6]) for c in out] == [
        ("create_database", "d", None, 1, 1),
        ("create_table", "d.t", '["id"]', 1, 1),
        ("insert", "d.t", "1", 2, 3),
        ("insert", "d.t", "2", 2, 3),
        ("insert", "d.t", "5", 3, 2),
        ("delete", "d.t", None, 4, 4),
    ]
    assert json.loads(out[2][3] or "") == {"id": 1, "note": "n1"}
    assert [(c[7], c[8]) for c in out[2:]] == [(7, 0), (7, 1), (7, 2), (7, 1)]
    assert [c[4] for c in out] == sorted(c[4] for c in out)  # commit_ts follows DSN order
    # No cut after LSN 2: DSN 3 waited for DSN 2.
    assert [(p.lsn, p.dsn) for p in cuts] == [(1, 1), (3, 3), (4, 4)]
    assert point == ChangesOffset(4, 4, True)


def test_a_reader_resumed_at_a_cut_continues_exactly() -> None:
    whole, _, _ = _read(ChangesOffset(0, 0, False), Catalog(), RECORDS)
    catalog = Catalog()
    first, _, point = _read(ChangesOffset(0, 0, False), catalog, RECORDS[:2])
    assert point == ChangesOffset(1, 1, True)  # LSN 2 (DSN 3) read past the cut, abandoned
    rest, _, _ = _read(point, catalog, RECORDS[1:])
    assert first + rest == whole
    # Resumed with a fresh catalog, the table is unknown: refused with the reason.
    with pytest.raises(ChangesRefused, match="table 10, whose create is not in the retained"):
        _read(point, Catalog(), RECORDS[1:])


def test_the_catalog_past_the_last_cut_is_rolled_back() -> None:
    catalog = Catalog()
    pending = [(1, encode_record(2, 0, [CREATE]))]  # DSN 2 waits for DSN 1
    _, cuts, point = _read(ChangesOffset(0, 0, False), catalog, pending)
    assert cuts == [] and point == ChangesOffset(0, 0, False)
    assert catalog.table(10) is None and catalog.database(1) is None


# --- deletes with their keys (issue 23) ------------------------------------------------------


def test_a_delete_comes_with_its_key_and_a_rewrite_gives_no_change() -> None:
    keyed = Delete(1, 10, 7, FrozenBitMap([1]), DeletedKeys((("id", "int64"),), (2,)))
    flush = (
        CreateBlock(1, 10, 8, BlockLevel.L1, "data/10/8.parquet", 0, 2),
        Delete(1, 10, 8, FrozenBitMap([1])),  # carried: repeats the delete of DSN 3
        DropBlock(1, 10, 7),
    )
    records = [
        (1, encode_record(1, 0, [CREATE])),
        (2, encode_record(2, 1, [_entry(20, _insert(7, 0, [1, 2]))])),
        (3, encode_record(3, 2, [_entry(30, keyed)])),
        (4, encode_record(4, 3, [_entry(40, *flush)])),
        (5, encode_record(5, 4, [_entry(50, Delete(1, 10, 8, FrozenBitMap([0])))])),
    ]
    out, _, _ = _read(ChangesOffset(0, 0, False), Catalog(), records)
    assert [(c[1], c[2], c[5], c[7], c[8]) for c in out[2:]] == [
        ("insert", "1", 2, 7, 0),
        ("insert", "2", 2, 7, 1),
        ("delete", "2", 3, 7, 1),
        ("delete", None, 5, 8, 0),  # logged without keys (an older build): null
    ]


def test_an_engines_deletes_carry_the_keys_their_inserts_had() -> None:
    """A real engine's log: each delete's key is, byte for byte, its row's insert's key (a
    compound key of a string, a date and binary: JSON strings, ISO dates, base64)."""
    schema = Schema(
        [
            Column("s", "string"),
            Column("d", "date32"),
            Column("b", "binary"),
            Column("n", "int64", nullable=True),
        ],
        ["d", "s", "b"],
    )
    day = datetime.date(2026, 11, 27)

    def key(i: int) -> tuple[datetime.date, str, bytes]:
        return (day + datetime.timedelta(days=i), f"ü{i}", bytes([i, 255]))

    async def main() -> MemoryBackend:
        wal = MemoryBackend()
        eng = await Engine.open("unused", wal, maintenance=False, objects="none")
        try:
            async with eng.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", schema)
            async with eng.transaction() as txn:
                rows = [{"s": key(i)[1], "d": key(i)[0], "b": key(i)[2], "n": i} for i in range(12)]
                await txn.table("d", "t").insert(rows)
            async with eng.transaction() as txn:
                await txn.table("d", "t").delete([key(9), key(2)])
            async with eng.transaction() as txn:
                await txn.table("d", "t").update([key(4)], {"n": -1})
        finally:
            await eng.close()
        return wal

    wal = asyncio.run(main())
    records = [(r.lsn, r.payload) for r in wal.records() if r.kind == RecordKind.USER]
    out, _, _ = _read(ChangesOffset(0, 0, False), Catalog(), records)
    inserted = {(c[7], c[8]): c[2] for c in out if c[1] == "insert"}
    deleted = [c for c in out if c[1] == "delete"]
    assert [(c[7], c[8]) for c in deleted] == [(1, 2), (1, 9), (1, 4)]
    for change in deleted:
        assert change[2] is not None and change[2] == inserted[(change[7], change[8])]
    assert json.loads(deleted[0][2] or "") == ["2026-11-29", "ü2", "Av8="]
