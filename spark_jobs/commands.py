"""Level command: one row per command of every transaction entry (schemas.COMMAND).

`command_rows` makes the rows of one decoded entry (walread's per-entry reader, and here for
entries that are not one-append transactions). `command_level_unbatched` is the level with
`batches=false` (no Arrow IPC re-encoded: what replay reads) many entries at a time
(spark_jobs/entries.py): a one-append transaction's row is built in columns with the others of
its chunk, never as a tuple. Rows come in entry order, then command order.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import xxhash

from engine.wal.batch import KIND_FAST, KIND_ONE
from engine.wal.codec import encode_batch
from engine.wal.entry import (
    Append,
    CreateBlock,
    Delete,
    DropBlock,
    Origin,
    TxnEntry,
    UpdateCatalog,
)
from spark_jobs import schemas
from spark_jobs.entries import EntryChunk, entry_chunks
from spark_jobs.filters import Bounds
from spark_jobs.inputs import Unit
from spark_jobs.records import BackendRecord

BATCH_ROWS_MAX = 4096
"""Rows per Arrow batch handed out."""


def command_level_unbatched(unit: Unit, verify: str, bounds: Bounds) -> Iterator[pa.RecordBatch]:
    """Level command with `batches=false`, a chunk of entries at a time."""
    ts_range = bounds.range("commit_ts")
    lo = ts_range.lo if ts_range.lo is not None else 0
    hi = ts_range.hi if ts_range.hi is not None else (1 << 64) - 1
    for chunk in entry_chunks(unit, verify, bounds.range("lsn"), bounds.range("dsn")):
        decoded = chunk.decoded
        wanted = decoded.is_txn & (decoded.commit_ts >= max(lo, 0))
        if hi < (1 << 64) - 1:
            wanted &= decoded.commit_ts <= hi
        chosen = np.flatnonzero(wanted)
        if not len(chosen):
            continue
        digest = xxhash.xxh3_64_intdigest
        checksums = np.fromiter(
            (digest(chunk.payload(i)) for i in chosen.tolist()), dtype=np.uint64, count=len(chosen)
        ).view(np.int64)  # schemas.signed64, for all at once
        fast = decoded.kinds[chosen] == KIND_FAST
        parts: list[tuple[np.ndarray, pa.RecordBatch]] = []
        if fast.any():
            parts.append((chosen[fast], _fast_rows(unit, chunk, chosen[fast], checksums[fast])))
        slow = np.flatnonzero(decoded.kinds[chosen] == KIND_ONE)
        if len(slow):
            rows: list[tuple[object, ...]] = []
            order: list[int] = []
            for position in slow.tolist():
                index = int(chosen[position])
                entry = decoded.entries[index]
                assert isinstance(entry, TxnEntry)
                found = chunk.record(index)
                rec = BackendRecord(
                    found.segment,
                    found.offset_bytes,
                    int(chunk.lsns[index]),
                    found.raft_index,
                    None,
                    "record",
                )
                dsn = int(decoded.dsns[index])
                checksum = int(checksums[position])
                for row in command_rows(unit, rec, dsn, checksum, entry, False):
                    rows.append(row)
                    order.append(index)
            parts.append((np.asarray(order, dtype=np.int64), _tuples(rows)))
        if len(parts) == 1:
            table = pa.Table.from_batches([parts[0][1]], schema=schemas.COMMAND)
        else:
            order_all = np.argsort(np.concatenate([o for o, _ in parts]), kind="stable")
            table = pa.Table.from_batches([b for _, b in parts], schema=schemas.COMMAND)
            table = table.take(pa.array(order_all))
        yield from table.combine_chunks().to_batches(max_chunksize=BATCH_ROWS_MAX)


def _fast_rows(
    unit: Unit, chunk: EntryChunk, chosen: np.ndarray, checksums: np.ndarray
) -> pa.RecordBatch:
    """The command rows of one-append entries `chosen` (one row each), built in columns."""
    decoded = chunk.decoded
    n = len(chosen)
    entries = np.concatenate([t.entries for t in decoded.tables])
    blocks = np.concatenate([t.block_ids for t in decoded.tables])
    offsets = np.concatenate([t.offsets for t in decoded.tables])
    tables = np.concatenate(
        [np.full(len(t.entries), t.table_id, np.uint64) for t in decoded.tables]
    )
    # An entry's rows are consecutive in its TableRows: its first row gives the info.
    found, first, counts = np.unique(entries, return_index=True, return_counts=True)
    where = np.searchsorted(found, chosen)
    assert (found[where] == chosen).all()
    first, counts = first[where], counts[where]
    info = pa.StructArray.from_arrays(
        [
            pa.array(blocks[first].astype(np.int64)),
            pa.array(offsets[first].astype(np.int64)),
            pa.array(counts.astype(np.int64)),
        ],
        fields=list(schemas.APPEND_INFO),
    )
    infos = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), info)
    values = {
        "replica": pa.array([unit.replica] * n, pa.string()),
        "shard": pa.array(np.full(n, unit.shard, np.int32)),
        "segment": pa.array([chunk.record(i).segment for i in chosen.tolist()], pa.string()),
        "offset_bytes": pa.array(chunk.offsets_bytes(chosen)),
        "lsn": pa.array(chunk.lsns[chosen]),
        "raft_index": pa.array([chunk.record(i).raft_index for i in chosen.tolist()], pa.int64()),
        "dsn": pa.array(decoded.dsns[chosen]),
        "start_ts": pa.array(decoded.start_ts[chosen].astype(np.int64)),
        "commit_ts": pa.array(decoded.commit_ts[chosen].astype(np.int64)),
        "entry_checksum": pa.array(checksums),
        "cmd_index": pa.array(np.zeros(n, np.int32)),
        "cmd_kind": pa.array(["append"] * n, pa.string()),
        "db_id": pa.array(decoded.db_ids[chosen].astype(np.int64)),
        "table_id": pa.array(tables[first].astype(np.int64)),
        "n_rows": pa.array(counts.astype(np.int64)),
        "infos": infos,
    }
    arrays = [values[f.name] if f.name in values else pa.nulls(n, f.type) for f in schemas.COMMAND]
    return pa.RecordBatch.from_arrays(arrays, schema=schemas.COMMAND)


def _tuples(rows: list[tuple[object, ...]]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(columns, schemas.COMMAND, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=schemas.COMMAND)


def command_rows(
    unit: Unit,
    rec: BackendRecord,
    dsn: int,
    entry_checksum: int,
    entry: TxnEntry,
    batches: bool,
) -> Iterator[tuple[object, ...]]:
    head = (
        unit.replica,
        unit.shard,
        rec.segment,
        rec.offset_bytes,
        rec.lsn,
        rec.raft_index,
        dsn,
        entry.start_ts,
        entry.commit_ts,
        entry_checksum,
    )
    for index, cmd in enumerate(entry.commands):
        if isinstance(cmd, UpdateCatalog):
            yield _command_row(
                head,
                index,
                "catalog",
                db_id=cmd.db_id,
                table_id=cmd.table_id or None,
                catalog_kind=cmd.kind.name.lower(),
                catalog_op=cmd.op.name.lower(),
                name=cmd.name,
                schema_json=None if cmd.schema is None else schemas.schema_to_json(cmd.schema),
            )
        elif isinstance(cmd, Append):
            ipc = encode_batch(cmd.batch) if batches else None
            infos = [
                {"block_id": i.block_id, "offset": i.offset, "rows": i.rows} for i in cmd.infos
            ]
            yield _command_row(
                head,
                index,
                "append",
                db_id=cmd.db_id,
                table_id=cmd.table_id,
                n_rows=cmd.batch.num_rows,
                infos=infos,
                batch_ipc=ipc,
                cmd_bytes=None if ipc is None else len(ipc),
            )
        elif isinstance(cmd, CreateBlock):
            yield _command_row(
                head,
                index,
                "create_block",
                db_id=cmd.db_id,
                table_id=cmd.table_id,
                block_id=cmd.block_id,
                n_rows=cmd.rows,
                object=cmd.object_name,
                row_group=cmd.row_group,
                level=int(cmd.level),
            )
        elif isinstance(cmd, DropBlock):
            yield _command_row(
                head,
                index,
                "drop_block",
                db_id=cmd.db_id,
                table_id=cmd.table_id,
                block_id=cmd.block_id,
            )
        elif isinstance(cmd, Origin):
            yield _command_row(head, index, "origin", name=cmd.client_id, origin_seq=cmd.seq)
        else:
            assert isinstance(cmd, Delete)
            offsets = list(cmd.rows)
            yield _command_row(
                head,
                index,
                "delete",
                db_id=cmd.db_id,
                table_id=cmd.table_id,
                block_id=cmd.block_id,
                n_rows=len(offsets),
                del_rows=offsets,
            )


_COMMAND_FIELDS = tuple(schemas.COMMAND.names[schemas.COMMAND.get_field_index("db_id") :])
"""The command level's columns after cmd_kind, in order: each command fills some."""


def _command_row(
    head: tuple[object, ...], index: int, kind: str, **values: object
) -> tuple[object, ...]:
    """A command-level row: `head` (log, position, entry), the command's index and kind, then
    `values` by column name, None where a kind has nothing (cmd_bytes 0 unless given)."""
    assert values.keys() <= set(_COMMAND_FIELDS), values.keys()
    values.setdefault("cmd_bytes", 0)
    return (*head, index, kind, *(values.get(name) for name in _COMMAND_FIELDS))
