"""The columns of one group of fast-shape entries (one definitions, one row count), decoded
at once: `_decode_sliced` when every column but the last lies at a fixed place of each entry,
`_decode_gathered` when columns follow a string or binary one; then Arrow's full validation
(`_finish`) and the rows recorded per table (`_record`). An entry whose bytes break a rule is
left to `decode_entry` (engine/wal/batch.py says which rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from engine.wal.batch_gather import _fields, _Gather, _gather_runs, _places
from engine.wal.batch_layout import _AT_DEFINITIONS, _IDS
from engine.wal.columns import _FIXED_BYTES
from engine.wal.decoded_entries import KIND_FAST, DecodedEntries, TableRows
from engine.wal.from_numpy import arrow_array


@dataclass(frozen=True, slots=True)
class _Group:
    """Entries of one definitions and row count, with the fixed bytes of each (n, width)."""

    members: npt.NDArray[np.int64]
    matrix: npt.NDArray[np.uint8]
    rows: int
    definitions_bytes: int
    schema: pa.Schema
    kinds: tuple[tuple[str, bool], ...]

    def subset(self, keep: npt.NDArray[np.bool_]) -> _Group:
        return _Group(
            self.members[keep],
            self.matrix[keep],
            self.rows,
            self.definitions_bytes,
            self.schema,
            self.kinds,
        )


def _fixed_bytes(kinds: tuple[tuple[str, bool], ...], rows: int) -> tuple[int, bool]:
    """The bytes of the columns at fixed places (up to and with the offsets of the first string
    or binary column), and whether any column follows that one (the gathered, slower path)."""
    bitmap_bytes = (rows + 7) >> 3
    size = 0
    for index, (type_name, has_validity) in enumerate(kinds):
        size += bitmap_bytes if has_validity else 0
        width = _FIXED_BYTES.get(type_name)
        if width is not None:
            size += rows * width
        elif type_name == "bool":
            size += bitmap_bytes
        else:
            return size + (rows + 1) * 4, index != len(kinds) - 1
    return size, False


def _bits(
    matrix: npt.NDArray[np.uint8], at: int, rows: int, ok: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """A bitmap of `rows` bits at `at` in every row of `matrix`, as (n, rows) booleans; entries
    with padding bits set are marked not ok."""
    raw = matrix[:, at : at + ((rows + 7) >> 3)]
    if rows & 7:
        ok &= (raw[:, -1] >> (rows & 7)) == 0
    bits: npt.NDArray[np.bool_] = np.unpackbits(raw, axis=1, bitorder="little")[:, :rows].astype(
        bool
    )
    return bits


def _decode_sliced(
    reader: _Gather, group: _Group, out: DecodedEntries, fast: npt.NDArray[np.bool_]
) -> None:
    """Every column at a fixed place of each entry but the last, which may be a string or binary
    column whose values run to the entry's end: read from the group's matrix and one slice."""
    members, matrix, rows = group.members, group.matrix, group.rows
    places = _places(members)
    n = len(members)
    ok = np.ones(n, dtype=np.bool_)
    at = _AT_DEFINITIONS + group.definitions_bytes
    layouts: list[tuple[str, tuple[Any, ...]]] = []
    ends_at_fixed = True
    for type_name, has_validity in group.kinds:
        validity = None
        if has_validity:
            validity = _bits(matrix, at, rows, ok)
            ok &= ~validity.all(axis=1)  # a validity bitmap means at least one null
            at += (rows + 7) >> 3
        width = _FIXED_BYTES.get(type_name)
        if width is not None:
            layouts.append(("fixed", (validity, matrix[:, at : at + rows * width])))
            at += rows * width
        elif type_name == "bool":
            layouts.append(("bool", (validity, _bits(matrix, at, rows, ok))))
            at += (rows + 7) >> 3
        else:
            offsets = _fields(matrix, at, np.dtype(("<u4", (rows + 1,))))
            at += (rows + 1) * 4
            ok &= offsets[:, 0] == 0
            value_starts = reader.starts[places] + at
            totals = reader.ends[places] - value_starts
            ok &= totals == offsets[:, rows]
            tail_offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(totals, out=tail_offsets[1:])
            values = pa.py_buffer(_gather_runs(reader.data, value_starts, totals))
            layouts.append(("tail", (validity, offsets, tail_offsets, values)))
            ends_at_fixed = False
    if ends_at_fixed:
        ok &= (reader.ends[places] - reader.starts[places]) == at
    if not ok.all():
        if ok.any():
            _decode_sliced(reader, group.subset(ok), out, fast)
        return  # the others: decode_entry, one by one
    arrays = []
    for (kind, parts), field in zip(layouts, group.schema, strict=True):
        if kind == "tail":
            validity, offsets, tail_offsets, values = parts
            starts = np.empty(n * rows + 1, dtype=np.int32)
            starts[:-1] = (offsets[:, :rows].astype(np.int64) + tail_offsets[:-1, None]).reshape(-1)
            starts[-1] = tail_offsets[-1]
            arrays.append(
                pa.Array.from_buffers(
                    field.type,
                    n * rows,
                    [_bitmap(validity), pa.py_buffer(starts), values],
                )
            )
        else:
            arrays.append(_array(reader, kind, parts, field.type, n * rows))
    _finish(group, arrays, out, fast)


def _finish(
    group: _Group, arrays: list[pa.Array], out: DecodedEntries, fast: npt.NDArray[np.bool_]
) -> None:
    batch = pa.RecordBatch.from_arrays(arrays, schema=group.schema)
    try:
        batch.validate(full=True)
    except (pa.ArrowException, ValueError):
        return  # decoded one by one: decode_entry names the damaged entry
    _record(group, batch, out, fast)


def _decode_gathered(
    reader: _Gather, group: _Group, out: DecodedEntries, fast: npt.NDArray[np.bool_]
) -> None:
    """Columns after a string or binary column: each column's place differs per entry, so every
    buffer is gathered by computed positions."""
    members, rows = group.members, group.rows
    n = len(members)
    ok = np.ones(n, dtype=np.bool_)
    pos = reader.starts[members] + _AT_DEFINITIONS + group.definitions_bytes
    ends = reader.ends[members]
    bitmap_bytes = (rows + 7) >> 3
    padding = rows & 7
    layouts: list[tuple[str, tuple[Any, ...]]] = []
    for type_name, has_validity in group.kinds:
        validity = None
        if has_validity:
            ok &= pos + bitmap_bytes <= ends
            raw_bits = reader.bytes_at(pos, bitmap_bytes)
            if padding:
                ok &= (raw_bits[:, -1] >> padding) == 0
            validity = np.unpackbits(raw_bits, axis=1, bitorder="little")[:, :rows].astype(bool)
            ok &= ~validity.all(axis=1)
            pos = pos + bitmap_bytes
        width = _FIXED_BYTES.get(type_name)
        if width is not None:
            ok &= pos + rows * width <= ends
            layouts.append(("fixed", (validity, reader.bytes_at(pos, rows * width))))
            pos = pos + rows * width
        elif type_name == "bool":
            ok &= pos + bitmap_bytes <= ends
            raw_bits = reader.bytes_at(pos, bitmap_bytes)
            if padding:
                ok &= (raw_bits[:, -1] >> padding) == 0
            values = np.unpackbits(raw_bits, axis=1, bitorder="little")[:, :rows].astype(bool)
            layouts.append(("bool", (validity, values)))
            pos = pos + bitmap_bytes
        else:
            ok &= pos + (rows + 1) * 4 <= ends
            offsets = _u32_matrix(reader, pos, rows + 1)
            ok &= offsets[:, 0] == 0
            total = offsets[:, rows].astype(np.int64)
            pos = pos + (rows + 1) * 4
            ok &= pos + total <= ends
            layouts.append(("variable", (validity, offsets, pos.copy(), total)))
            pos = pos + np.where(ok, total, 0)
    ok &= pos == ends
    if not ok.all():
        if ok.any():
            _decode_gathered(reader, group.subset(ok), out, fast)
        return
    arrays = [
        _array(reader, kind, parts, field.type, n * rows)
        for (kind, parts), field in zip(layouts, group.schema, strict=True)
    ]
    _finish(group, arrays, out, fast)


def _u32_matrix(reader: _Gather, pos: npt.NDArray[np.int64], count: int) -> npt.NDArray[np.uint32]:
    raw = np.ascontiguousarray(reader.bytes_at(pos, count * 4))
    return raw.view("<u4").reshape(len(pos), count)


def _array(
    reader: _Gather, kind: str, parts: tuple[Any, ...], arrow_type: pa.DataType, length: int
) -> pa.Array:
    if kind == "fixed":
        validity, values = parts
        buffers = [_bitmap(validity), pa.py_buffer(np.ascontiguousarray(values).tobytes())]
        return pa.Array.from_buffers(arrow_type, length, buffers)
    if kind == "bool":
        validity, values = parts
        return pa.Array.from_buffers(arrow_type, length, [_bitmap(validity), _bitmap(values)])
    validity, offsets, starts, totals = parts
    rows = offsets.shape[1] - 1
    bases = np.cumsum(totals) - totals
    global_offsets = np.empty(length + 1, dtype=np.int64)
    global_offsets[:-1] = (offsets[:, :rows].astype(np.int64) + bases[:, None]).reshape(length)
    global_offsets[-1] = int(totals.sum())
    assert global_offsets[-1] < 1 << 31  # decode_entries takes less than 2 GiB per call
    values = _gather_runs(reader.data, starts, totals)
    buffers = [
        _bitmap(validity),
        pa.py_buffer(global_offsets.astype(np.int32).tobytes()),
        pa.py_buffer(values.tobytes()),
    ]
    return pa.Array.from_buffers(arrow_type, length, buffers)


def _bitmap(bits: npt.NDArray[np.bool_] | None) -> pa.Buffer | None:
    if bits is None:
        return None
    return pa.py_buffer(np.packbits(bits.reshape(-1), bitorder="little").tobytes())


def _record(
    group: _Group, batch: pa.RecordBatch, out: DecodedEntries, fast: npt.NDArray[np.bool_]
) -> None:
    members, rows = group.members, group.rows
    head = _fields(group.matrix, 0, _IDS)
    table_ids = head["table_id"]
    block_ids = head["block_id"]
    offsets = head["offset"].astype(np.uint64)
    places = _places(members)
    out.kinds[places] = KIND_FAST
    out.is_txn[places] = True
    out.start_ts[places] = head["start_ts"]
    out.commit_ts[places] = head["commit_ts"]
    out.db_ids[places] = head["db_id"]
    out.memo[places] = head["memo"]
    fast[places] = True
    row_in_info = np.arange(rows, dtype=np.uint64)
    first_table = table_ids[0]
    # Most groups append to one table: one comparison instead of a sort or hash.
    one_table = bool((table_ids == first_table).all())
    for table_id in [int(first_table)] if one_table else np.unique(table_ids).tolist():
        if one_table:
            chosen_members, chosen_blocks, chosen_offsets = members, block_ids, offsets
            columns = batch
        else:
            chosen = np.flatnonzero(table_ids == table_id)
            chosen_members, chosen_blocks = members[chosen], block_ids[chosen]
            chosen_offsets = offsets[chosen]
            row_index = (chosen[:, None] * rows + np.arange(rows)).reshape(-1)
            columns = batch.take(arrow_array(row_index))
        out.tables.append(
            TableRows(
                table_id=int(table_id),
                entries=np.repeat(chosen_members, rows),
                block_ids=np.repeat(chosen_blocks, rows),
                offsets=(chosen_offsets[:, None] + row_in_info).reshape(-1),
                columns=columns,
            )
        )
