"""`decode_entries` (engine/wal/batch.py) is `decode_entry` many at a time: on random entries of
random schemas (every column type, nulls, one to 40 rows so both AppendColumns and Arrow IPC
appends, two tables, catalog commands, deletes, checkpoints, versions 1 and 2) and on damaged
copies of them - a flipped byte, a cut, and the same behind a resealed (valid) checksum, which
is what reaches the field checks - every entry decodes to what `decode_entry` gives or fails
with the same `WalCorruption` (DSN, reason, offset); the same entries at places in one buffer
with other bytes between them (`decode_entries_at`) decode alike. One-row appends of one
schema take the columnar path (checked, so the test cannot pass by decoding everything one by one).
"""

from __future__ import annotations

import datetime
import random

import numpy as np
import pyarrow as pa
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import FrozenBitMap

from engine.errors import WalCorruption
from engine.schema import KEY_TYPES, TYPES, Column, Schema
from engine.wal.batch import KIND_DAMAGED, KIND_FAST, KIND_ONE, decode_entries, decode_entries_at
from engine.wal.codec import decode_entry, encode_entry
from engine.wal.entry import (
    Append,
    AppendInfo,
    CatalogKind,
    CatalogOp,
    CheckpointEntry,
    Delete,
    MemoItem,
    TxnEntry,
    UpdateCatalog,
)


def _value(rng: random.Random, type_name: str) -> object:
    if type_name == "bool":
        return rng.random() < 0.5
    if type_name in ("float32", "float64"):
        return rng.choice([0.0, -1.5, 3.25, rng.random() * 1e6])
    if type_name == "string":
        return "".join(rng.choice("ab\u00e9\u4e2d\U0001f600") for _ in range(rng.randrange(6)))
    if type_name == "binary":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
    if type_name == "date32":
        return datetime.date(2000, 1, 1) + datetime.timedelta(days=rng.randrange(9000))
    if type_name == "timestamp[us]":
        return datetime.datetime(2020, 1, 1) + datetime.timedelta(
            microseconds=rng.randrange(10**12)
        )
    arrow_type = TYPES[type_name]
    bits = arrow_type.bit_width
    if type_name.startswith("uint"):
        return rng.randrange(1 << bits)
    return rng.randrange(-(1 << (bits - 1)), 1 << (bits - 1))


def _schema(rng: random.Random) -> Schema:
    names = list(TYPES)
    key_type = rng.choice(sorted(KEY_TYPES))
    columns = [Column("k", key_type)]
    for index in range(rng.randrange(4)):
        columns.append(Column(f"c{index}", rng.choice(names), nullable=rng.random() < 0.6))
    return Schema(columns, ["k"])


def _batch(rng: random.Random, schema: Schema, rows: int) -> pa.RecordBatch:
    arrow = schema.to_arrow()
    arrays = []
    for column, field in zip(schema.columns, arrow, strict=True):
        values = [
            None if column.nullable and rng.random() < 0.3 else _value(rng, column.type)
            for _ in range(rows)
        ]
        arrays.append(pa.array(values, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow)


def _entries(rng: random.Random, count: int) -> list[bytes]:
    schemas = {2: _schema(rng), 3: _schema(rng)}
    out = []
    ts = 100
    for index in range(count):
        ts += 2
        roll = rng.random()
        table_id = rng.choice([2, 2, 2, 3])
        if roll < 0.05:
            cmd = UpdateCatalog(
                CatalogKind.TABLE, CatalogOp.CREATE, 1, table_id, "t", schemas[table_id]
            )
            entry: TxnEntry | CheckpointEntry = TxnEntry(
                ts - 1, ts, (MemoItem(1, table_id, 0),), (cmd,)
            )
        elif roll < 0.1:
            rows = FrozenBitMap([rng.randrange(100) for _ in range(3)])
            cmd2 = Delete(1, table_id, 7, rows)
            entry = TxnEntry(ts - 1, ts, (MemoItem(1, table_id, 7),), (cmd2,))
        elif roll < 0.13:
            entry = CheckpointEntry(ts, index, f"ckp/{index}")
        else:
            rows_count = 1 if rng.random() < 0.7 else rng.randrange(1, 41)
            batch = _batch(rng, schemas[table_id], rows_count)
            infos = (AppendInfo(1 + index // 7, rng.randrange(1000), rows_count),)
            append = Append(1, table_id, infos, batch)
            entry = TxnEntry(ts - 1, ts, (MemoItem(1, table_id, infos[0].block_id),), (append,))
        out.append(encode_entry(entry, version=1 if rng.random() < 0.1 else 2))
    return out


def _reseal(data: bytearray) -> None:
    if len(data) >= 20:
        digest = xxhash.xxh3_64_intdigest(bytes(data[:12]) + bytes(data[20:]))
        data[12:20] = digest.to_bytes(8, "little")


def _damage(rng: random.Random, payload: bytes) -> bytes:
    data = bytearray(payload)
    how = rng.randrange(5)
    if how == 0:
        at = rng.randrange(len(data))
        data[at] ^= 1 << rng.randrange(8)
    elif how == 1:
        del data[rng.randrange(len(data)) :]
    elif how == 2:  # behind a valid checksum: the field checks must refuse it
        at = rng.randrange(20, len(data)) if len(data) > 20 else 0
        data[at] ^= 1 << rng.randrange(8)
        _reseal(data)
    elif how == 3:  # a field set to a boundary value, resealed
        at = rng.randrange(len(data))
        data[at] = rng.choice([0, 1, 0x20, 0x7F, 0x80, 0xFF])
        _reseal(data)
    else:  # bytes added or removed inside, resealed
        at = rng.randrange(20, len(data)) if len(data) > 20 else 0
        if rng.random() < 0.5:
            data[at:at] = bytes(rng.randrange(1, 5))
        else:
            del data[at : at + rng.randrange(1, 5)]
        _reseal(data)
    return bytes(data)


def _same(payloads: list[bytes], dsns: list[int]) -> list[int]:
    decoded = decode_entries(payloads, dsns)
    assert len(decoded) == len(payloads)
    for index, (payload, dsn) in enumerate(zip(payloads, dsns, strict=True)):
        try:
            expected: object = decode_entry(payload, dsn)
        except WalCorruption as exc:
            expected = exc
        try:
            found: object = decoded.entry(index)
        except WalCorruption as exc:
            found = exc
        if isinstance(expected, WalCorruption):
            assert isinstance(found, WalCorruption), (index, expected, found)
            assert (found.dsn, found.reason, found.offset_bytes) == (
                expected.dsn,
                expected.reason,
                expected.offset_bytes,
            )
            assert decoded.kinds[index] == KIND_DAMAGED
        else:
            assert found == expected, index
            assert decoded.kinds[index] != KIND_DAMAGED
            if isinstance(expected, TxnEntry):
                assert decoded.commit_ts[index] == expected.commit_ts
                assert decoded.start_ts[index] == expected.start_ts
                assert decoded.is_txn[index]
            else:
                assert not decoded.is_txn[index]
    kinds: list[int] = decoded.kinds.tolist()
    return kinds


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 60))
def test_batch_decode_matches_decode_entry(rng: random.Random, count: int) -> None:
    payloads = _entries(rng, count)
    _same(payloads, list(range(1, count + 1)))


@settings(max_examples=150, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 40), st.floats(0.02, 1.0))
def test_batch_decode_matches_decode_entry_on_damage(
    rng: random.Random, count: int, damaged_share: float
) -> None:
    payloads = [
        _damage(rng, p) if rng.random() < damaged_share else p for p in _entries(rng, count)
    ]
    _same(payloads, [10 * i for i in range(count)])


@pytest.mark.parametrize("with_checkpoint", [True, False])
def test_one_row_appends_take_the_columnar_path(with_checkpoint: bool) -> None:
    """With a short entry among them, and without (then every entry's first bytes, read once
    for the fixed fields, also give the checksums' heads: a misread head fails here)."""
    rng = random.Random(7)
    schema = Schema(
        [Column("k", "int64"), Column("s", "string", nullable=True), Column("b", "bool")], ["k"]
    )
    payloads = []
    for index in range(200):
        batch = _batch(rng, schema, 1 + index % 3)
        append = Append(1, 2, (AppendInfo(1, index * 3, batch.num_rows),), batch)
        payloads.append(
            encode_entry(TxnEntry(index + 1, index + 2, (MemoItem(1, 2, 1),), (append,)))
        )
    if with_checkpoint:
        payloads.append(encode_entry(CheckpointEntry(500, 3, "ckp/x")))
    kinds = _same(payloads, list(range(1, len(payloads) + 1)))
    # The exemplar of each definitions is decoded by decode_entry too; all others in columns.
    assert kinds.count(KIND_FAST) >= 195
    assert kinds[-1] == (KIND_ONE if with_checkpoint else KIND_FAST)
    decoded = decode_entries(payloads, list(range(1, len(payloads) + 1)))
    rows = sum(t.columns.num_rows for t in decoded.tables)
    assert rows == sum(1 + i % 3 for i in range(200) if decoded.kinds[i] == KIND_FAST)


def test_a_group_with_bad_utf8_behind_a_valid_checksum_names_the_entry() -> None:
    schema = Schema([Column("k", "int64"), Column("s", "string")], ["k"])
    arrow = schema.to_arrow()
    payloads = []
    for index in range(50):
        batch = pa.RecordBatch.from_arrays(
            [pa.array([index]), pa.array([f"v{index:03d}"])], schema=arrow
        )
        append = Append(1, 2, (AppendInfo(1, index, 1),), batch)
        payloads.append(
            encode_entry(TxnEntry(index + 1, index + 2, (MemoItem(1, 2, 1),), (append,)))
        )
    bad = bytearray(payloads[30])
    bad[-1] = 0xFF  # not UTF-8: only Arrow's validation of the gathered column sees it
    _reseal(bad)
    payloads[30] = bytes(bad)
    kinds = _same(payloads, list(range(1, 51)))
    assert kinds[30] == KIND_DAMAGED
    assert kinds.count(KIND_DAMAGED) == 1


@pytest.mark.parametrize("string_last", [True, False], ids=["sliced", "gathered"])
def test_every_byte_of_a_columnar_entry_damaged_behind_a_valid_checksum(
    string_last: bool,
) -> None:
    """Each byte of a fast-shape entry (set to boundary values, or a bit flipped, then
    resealed) between clean entries of its schema: the columnar path must refuse exactly what
    decode_entry refuses, field by field. Both layouts: the string column last (its values
    run to the entry's end) and a string column followed by others."""
    rng = random.Random(3)
    columns = [
        Column("k", "int64"),
        Column("b", "bool", nullable=True),
        Column("u", "uint16", nullable=True),
    ]
    columns.insert(3 if string_last else 1, Column("s", "string", nullable=True))
    schema = Schema(columns, ["k"])
    arrow = schema.to_arrow()

    def entry(index: int, rows: int) -> bytes:
        values = {
            "k": pa.array(range(index, index + rows), pa.int64()),
            "s": pa.array(["x\u00e9" * (i % 3) if i % 2 else None for i in range(rows)]),
            "b": pa.array([i % 3 == 0 if i % 4 else None for i in range(rows)]),
            "u": pa.array([i if i % 5 else None for i in range(rows)], pa.uint16()),
        }
        batch = pa.RecordBatch.from_arrays([values[c.name] for c in columns], schema=arrow)
        append = Append(1, 2, (AppendInfo(1, index, rows),), batch)
        return encode_entry(TxnEntry(index + 1, index + 2, (MemoItem(1, 2, 1),), (append,)))

    for rows in (1, 3, 9):
        clean = [entry(10 * i, rows) for i in range(4)]
        target = clean[2]
        for at in range(len(target)):
            for value in {0, 1, 0x20, 0x7F, 0x80, 0xFF, target[at] ^ (1 << rng.randrange(8))}:
                damaged = bytearray(target)
                damaged[at] = value
                _reseal(damaged)
                payloads = [*clean[:2], bytes(damaged), clean[3]]
                _same(payloads, [1, 2, 3, 4])


@settings(max_examples=80, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(1, 40), st.floats(0.0, 0.5))
def test_entries_at_places_in_one_buffer_decode_as_the_entries_alone(
    rng: random.Random, count: int, damaged_share: float
) -> None:
    """`decode_entries_at` (entries at places in one buffer, other bytes between them: what a
    reader passes from driver records) decodes each entry as `decode_entries` does it alone,
    damaged or not: nothing between the places is read as part of an entry."""
    payloads = [
        _damage(rng, p) if rng.random() < damaged_share else p for p in _entries(rng, count)
    ]
    dsns = [3 * i + 1 for i in range(count)]
    parts: list[bytes] = []
    starts, ends = [], []
    at = 0
    for payload in payloads:
        gap = bytes(rng.randrange(256) for _ in range(rng.choice([0, 4, 4, 44, rng.randrange(9)])))
        parts += [gap, payload]
        at += len(gap)
        starts.append(at)
        at += len(payload)
        ends.append(at)
    parts.append(bytes(rng.randrange(256) for _ in range(rng.randrange(30))))
    placed = decode_entries_at(
        b"".join(parts), np.asarray(starts, np.int64), np.asarray(ends, np.int64), dsns
    )
    alone = decode_entries(payloads, dsns)
    assert placed.kinds.tolist() == alone.kinds.tolist()
    for index in range(count):
        try:
            expected: object = alone.entry(index)
        except WalCorruption as exc:
            expected = (exc.dsn, exc.reason, exc.offset_bytes)
        try:
            found: object = placed.entry(index)
        except WalCorruption as exc:
            found = (exc.dsn, exc.reason, exc.offset_bytes)
        assert found == expected, index
    assert (placed.commit_ts == alone.commit_ts).all()
