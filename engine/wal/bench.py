"""`python -m engine.wal.bench`: the WAL entry codec's cost per entry, version 1 (every append
as Arrow IPC) against version 2 (small appends as AppendColumns), for appends of 1, 10 and 100
rows of (int64 key, 100-character string); and deletes of 1, 10 and 100 rows without
their keys (a Delete, what builds before version 3 wrote) against version 3 (DeleteKeys, the
rows' int64 keys beside the mask; issue 23). Prints one JSON object: per case, microseconds to
encode and to decode one entry (`decode_entry`, and per entry of `decode_entries` over 16,384
such entries at once: engine/wal/batch.py), and its bytes."""

from __future__ import annotations

import json
import time

from pyroaring import FrozenBitMap

from engine.schema import Column, Schema, to_batch
from engine.wal.batch import decode_entries
from engine.wal.codec import decode_entry, encode_entry
from engine.wal.entry import Append, AppendInfo, Delete, DeletedKeys, MemoItem, TxnEntry

LOOPS = 20_000
BATCH_ENTRIES = 16_384


def main() -> None:
    schema = Schema([Column("id", "int64"), Column("payload", "string")], primary_key=["id"])
    arrow = schema.to_arrow()
    cases: list[tuple[str, TxnEntry, int]] = []
    for rows in (1, 10, 100):
        dicts = [{"id": i, "payload": "x" * 100} for i in range(rows)]
        batch = to_batch(schema, arrow, dicts, "bench.t")
        append = Append(1, 2, (AppendInfo(1, 0, rows),), batch)
        entry = TxnEntry(1, 2, (MemoItem(1, 2, 1),), (append,))
        cases += [(f"rows{rows}_v{version}", entry, version) for version in (1, 2)]
    for rows in (1, 10, 100):
        offsets = range(3, 3 + 7 * rows, 7)
        keys = DeletedKeys(schema.key_columns, tuple(1000 + offset for offset in offsets))
        delete = Delete(1, 2, 1, FrozenBitMap(offsets), keys)
        entry = TxnEntry(1, 2, (MemoItem(1, 2, 1),), (delete,))
        cases += [(f"delete{rows}_v{version}", entry, version) for version in (2, 3)]
    out: dict[str, dict[str, float]] = {}
    for name, entry, version in cases:
        started = time.perf_counter()
        for _ in range(LOOPS):
            data = encode_entry(entry, version=version)
        encode_us = (time.perf_counter() - started) / LOOPS * 1e6
        started = time.perf_counter()
        for _ in range(LOOPS):
            decode_entry(data, 1)
        decode_us = (time.perf_counter() - started) / LOOPS * 1e6
        many = [data] * BATCH_ENTRIES
        dsns = list(range(1, BATCH_ENTRIES + 1))
        decode_entries(many, dsns)  # warm: the definitions' exemplar, caches
        started = time.perf_counter()
        decoded = decode_entries(many, dsns)
        batch_us = (time.perf_counter() - started) / BATCH_ENTRIES * 1e6
        assert not decoded.errors
        out[name] = {
            "encode_us": round(encode_us, 2),
            "decode_us": round(decode_us, 2),
            "decode_entries_us": round(batch_us, 2),
            "bytes": len(data),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
