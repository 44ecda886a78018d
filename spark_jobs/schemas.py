"""The columns of every reader level, as Arrow schemas, and their Spark DDL.

One definition serves both engines: the readers build Arrow batches of these schemas; the
Spark Data Sources declare the DDL derived from them; the local engine keeps the Arrow
tables. Unsigned 64-bit checksums are stored as signed BIGINT (the same 64 bits, `signed64`):
Spark has no unsigned type and values >= 2**63 would overflow (shared/reference/spark.md §5.5).
"""

from __future__ import annotations

import json

import pyarrow as pa

from engine.schema import Column, Schema
from spark_jobs.errors import BadInput

I64 = pa.int64()
I32 = pa.int32()
STR = pa.string()
BOOL = pa.bool_()

_LOG = [
    ("replica", STR),
    ("shard", I32),
    ("segment", STR),
    ("offset_bytes", I64),
]

# logsvc_segments: one row per Raft entry of a replica's journal (or per damage found).
RAFT_ENTRY = pa.schema(
    [
        *_LOG,
        ("raft_index", I64),
        ("term", I64),
        ("kind", STR),
        ("outcome", STR),
        ("records", I32),
        ("lsn_first", I64),
        ("lsn_count", I32),
        ("payload_bytes", I64),
        ("checksum", I64),
        ("checksum_ok", BOOL),
        ("error", STR),
    ]
)

# tae_wal level=record: one row per copy of an entry (per DSN), per safe marker, per skip
# pair, per TRUNCATE frame, per damage; no engine decoding.
RECORD = pa.schema(
    [
        *_LOG,
        ("lsn", I64),
        ("raft_index", I64),
        ("kind", STR),
        ("record_start_dsn", I64),
        ("record_count", I32),
        ("safe_dsn", I64),
        ("record_checksum", I64),
        ("dsn", I64),
        ("entry_index", I32),
        ("entry_bytes", I64),
        ("entry_checksum", I64),
        ("skip_dsn", I64),
        ("skip_lsn", I64),
        ("checksum_ok", BOOL),
        ("error", STR),
    ]
)

# tae_wal level=audit: what lsn_audit and replay's plan read, one row per backend record
# (not per DSN copy: a driver record holds up to 50 entries): its kind (entry: a record of
# entries; marker, skip, truncate, corrupt, torn_tail as in the record level), DSN range,
# safe DSN, record checksum, the checksums of its entries in DSN order (empty for other
# kinds), a skip record's pairs. The Python Data Source API cannot prune columns, so a
# narrow level is how Spark reads less; per-DSN rows are made by Spark (posexplode) or numpy.
AUDIT = pa.schema(
    [
        *_LOG,
        ("lsn", I64),
        ("kind", STR),
        ("record_start_dsn", I64),
        ("record_count", I32),
        ("safe_dsn", I64),
        ("record_checksum", I64),
        ("entry_checksums", pa.list_(I64)),
        ("skip_dsns", pa.list_(I64)),
        ("skip_lsns", pa.list_(I64)),
        ("error", STR),
    ]
)

MEMO_ITEM = pa.struct([("db_id", I64), ("table_id", I64), ("block_id", I64)])

# tae_wal level=entry: the record level plus the decoded transaction context.
ENTRY = pa.schema(
    [
        *RECORD,
        ("entry_type", STR),
        ("start_ts", I64),
        ("commit_ts", I64),
        ("memo", pa.list_(MEMO_ITEM)),
        ("n_catalog", I32),
        ("n_append", I32),
        ("n_delete", I32),
        ("rows_appended", I64),
        ("rows_deleted", I64),
        ("ckp_ts", I64),
        ("ckp_truncate_dsn", I64),
        ("ckp_location", STR),
    ]
)

APPEND_INFO = pa.struct([("block_id", I64), ("offset", I64), ("rows", I64)])

# tae_wal level=command: one row per command of every transaction entry. cmd_kind: catalog,
# append, delete, create_block, drop_block, origin.
COMMAND = pa.schema(
    [
        *_LOG,
        ("lsn", I64),
        ("raft_index", I64),
        ("dsn", I64),
        ("start_ts", I64),
        ("commit_ts", I64),
        ("entry_checksum", I64),
        ("cmd_index", I32),
        ("cmd_kind", STR),
        ("db_id", I64),
        ("table_id", I64),
        ("catalog_kind", STR),
        ("catalog_op", STR),
        ("name", STR),
        ("schema_json", STR),
        ("block_id", I64),
        ("n_rows", I64),
        ("infos", pa.list_(APPEND_INFO)),
        ("batch_ipc", pa.binary()),
        ("del_rows", pa.list_(I64)),
        ("cmd_bytes", I64),
        # create_block: the persisted block's object, row group and level (1 or 2); its rows
        # are n_rows. drop_block names only block_id.
        ("object", STR),
        ("row_group", I64),
        ("level", I32),
        # origin (a compute node's request id, issue 15; changes no data): client id in
        # `name`, its sequence number here.
        ("origin_seq", I64),
    ]
)

# Both sources, level=segment (the inventory): one row per segment file, no payload decoded.
SEGMENT = pa.schema(
    [
        ("replica", STR),
        ("shard", I32),
        ("backend", STR),
        ("segment", STR),
        ("size_bytes", I64),
        ("position", STR),  # what first/last count: "lsn" (file WAL) or "raft_index"
        ("first_position", I64),
        ("last_position", I64),
        ("records", I64),
        ("truncate_lsn", I64),
        ("log_start", I64),
        ("end", STR),
        ("end_offset", I64),
        ("end_reason", STR),
    ]
)

# tae_wal level=rows (one table; its columns follow): where each appended row lives.
ROWS_PREFIX = [("lsn", I64), ("dsn", I64), ("commit_ts", I64), ("block_id", I64), ("offset", I64)]


def signed64(value: int) -> int:
    """An unsigned 64-bit value as the signed BIGINT with the same bits."""
    assert 0 <= value < 1 << 64
    return value - (1 << 64) if value >= 1 << 63 else value


# --- a table's schema as text (a Data Source option) ------------------------------------------


def schema_to_json(schema: Schema) -> str:
    return json.dumps(
        {
            "columns": [[c.name, c.type, c.nullable] for c in schema.columns],
            "primary_key": list(schema.primary_key),
        },
        separators=(",", ":"),
    )


def schema_from_json(text: str) -> Schema:
    try:
        raw = json.loads(text)
        return Schema(
            [
                Column(str(name), str(kind), bool(nullable))
                for name, kind, nullable in raw["columns"]
            ],
            [str(name) for name in raw["primary_key"]],
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"bad table schema {text[:80]!r}: {exc}") from None


# Spark has no unsigned integers: the rows level widens them for Spark (uint64 to a
# decimal(20, 0), the narrowest exact type), and the local engine keeps them as they are.
_SPARK_WIDER = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.decimal128(20, 0),
}


def rows_schema(schema: Schema, *, for_spark: bool) -> pa.Schema:
    fields = [pa.field(name, kind) for name, kind in ROWS_PREFIX]
    for column in schema.columns:
        kind = column.arrow_type
        if for_spark:
            kind = _SPARK_WIDER.get(kind, kind)
        fields.append(pa.field(column.name, kind))
    return pa.schema(fields)


def spark_ddl(schema: pa.Schema) -> str:
    """The Spark DDL of an Arrow schema made of the types above."""
    return ", ".join(f"`{f.name}` {spark_type(f.type)}" for f in schema)


def spark_type(kind: pa.DataType) -> str:
    simple = {
        pa.int8(): "TINYINT",
        pa.int16(): "SMALLINT",
        pa.int32(): "INT",
        pa.int64(): "BIGINT",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
        pa.bool_(): "BOOLEAN",
        pa.string(): "STRING",
        pa.binary(): "BINARY",
        pa.date32(): "DATE",
        pa.timestamp("us"): "TIMESTAMP_NTZ",
    }
    if kind in simple:
        return simple[kind]
    if pa.types.is_decimal(kind):
        return f"DECIMAL({kind.precision}, {kind.scale})"
    if pa.types.is_list(kind):
        return f"ARRAY<{spark_type(kind.value_type)}>"
    if pa.types.is_struct(kind):
        inner = ", ".join(f"`{f.name}`: {spark_type(f.type)}" for f in kind)
        return f"STRUCT<{inner}>"
    raise AssertionError(f"no Spark type for {kind}")
