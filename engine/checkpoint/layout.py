"""A checkpoint's objects and their codecs: the manifest (JSON), the catalog and the block
list (Parquet), L0 dumps (Parquet). Bytes in, values out; no I/O (engine/checkpoint/FORMAT.md).

Why Parquet and JSON (shared/reference/spark.md §4.2 "Checkpoints"; Delta Lake's checkpoint +
log model): a checkpoint is read by the engine at restart and, unchanged, by the Spark jobs,
DuckDB or pandas. The manifest is written last and names every object the checkpoint needs,
so a checkpoint is complete exactly when its manifest exists, and a reader lists nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from engine.checkpoint.errors import CheckpointCorrupt
from engine.errors import SchemaError
from engine.schema import Column, Schema

PREFIX = "ckp/"
FORMAT_NAME = "engine-checkpoint"
VERSION = 1
MANIFEST_NAME = "manifest.json"
MANIFEST_BYTES_MAX = 64 * 1024 * 1024
"""A manifest names every object of the checkpoint (about 60 bytes each): room for a
million objects."""

KIND_GLOBAL = "global"
KIND_INCREMENTAL = "incremental"

LEVEL_L0_DUMP = 0


def directory(ckp_ts: int, tag: str) -> str:
    """ckp/<ckp_ts, 20 digits>-<tag>/: names sort in checkpoint order; the tag (random) keeps
    two attempts at one ckp_ts (a restart, a zombie writer) apart."""
    assert tag and tag.isalnum()
    return f"{PREFIX}{ckp_ts:020d}-{tag}/"


def manifest_name(directory_: str) -> str:
    return directory_ + MANIFEST_NAME


def ckp_ts_of(manifest: str) -> int | None:
    """The ckp_ts in a manifest's name, None if the name is not a manifest's."""
    parts = manifest.split("/")
    if len(parts) != 3 or parts[0] + "/" != PREFIX or parts[2] != MANIFEST_NAME:
        return None
    digits, _, tag = parts[1].partition("-")
    if len(digits) != 20 or not digits.isdigit() or not tag.isalnum():
        return None
    return int(digits)


def dump_name(directory_: str, table_id: int, block_id: int) -> str:
    return f"{directory_}l0-{table_id}-{block_id}.parquet"


def delta_name(directory_: str, table_id: int) -> str:
    return f"{directory_}delta-{table_id}.parquet"


# --- manifest -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Manifest:
    ckp_ts: int
    """Every commit with commit_ts <= ckp_ts is in the checkpoint, none above it."""
    ckp_dsn: int
    """The DSN of the last WAL entry with commit_ts <= ckp_ts: the WAL from ckp_dsn + 1 on
    holds everything after the checkpoint."""
    kind: str
    previous: str | None
    catalog: str
    blocks: str
    next_id: int
    """The catalog's id allocator (ids are never reused)."""
    tables: int
    block_count: int
    live_rows: int
    objects: tuple[str, ...]
    """Every object the checkpoint needs, its catalog and block list included."""
    created_wall_ms: int

    @property
    def directory(self) -> str:
        """The checkpoint's own directory (its lists live there)."""
        return self.catalog.rsplit("/", 1)[0] + "/"

    @property
    def name(self) -> str:
        return manifest_name(self.directory)

    def encode(self) -> bytes:
        body = self._fields()
        body["checksum"] = _checksum(body)
        return json.dumps(body, indent=1, sort_keys=True).encode()

    def _fields(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": VERSION,
            "ckp_ts": self.ckp_ts,
            "ckp_dsn": self.ckp_dsn,
            "kind": self.kind,
            "previous": self.previous,
            "catalog": self.catalog,
            "blocks": self.blocks,
            "next_id": self.next_id,
            "tables": self.tables,
            "block_count": self.block_count,
            "live_rows": self.live_rows,
            "objects": list(self.objects),
            "created_wall_ms": self.created_wall_ms,
        }

    @classmethod
    def decode(cls, data: bytes, name: str) -> Manifest:
        if len(data) > MANIFEST_BYTES_MAX:
            raise CheckpointCorrupt(name, "manifest larger than manifest_bytes_max")
        try:
            body = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointCorrupt(name, f"manifest is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise CheckpointCorrupt(name, "manifest is not a JSON object")
        if body.get("format") != FORMAT_NAME:
            raise CheckpointCorrupt(name, "not an engine checkpoint manifest")
        if body.get("version") != VERSION:
            raise CheckpointCorrupt(name, f"unknown manifest version {body.get('version')!r}")
        checksum = body.pop("checksum", None)
        if checksum != _checksum(body):
            raise CheckpointCorrupt(name, "manifest checksum mismatch")
        try:
            manifest = cls(
                ckp_ts=_uint(body["ckp_ts"]),
                ckp_dsn=_uint(body["ckp_dsn"]),
                kind=_one_of(body["kind"], (KIND_GLOBAL, KIND_INCREMENTAL)),
                previous=_text_or_none(body["previous"]),
                catalog=_text(body["catalog"]),
                blocks=_text(body["blocks"]),
                next_id=_uint(body["next_id"]),
                tables=_uint(body["tables"]),
                block_count=_uint(body["block_count"]),
                live_rows=_uint(body["live_rows"]),
                objects=tuple(_text(o) for o in _list(body["objects"])),
                created_wall_ms=_uint(body["created_wall_ms"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointCorrupt(name, f"manifest field out of the rules: {exc}") from None
        if manifest.blocks.rsplit("/", 1)[0] + "/" != manifest.directory:
            raise CheckpointCorrupt(name, "the catalog and block lists are apart")
        if ckp_ts_of(name) is not None and (
            ckp_ts_of(name) != manifest.ckp_ts or name != manifest.name
        ):
            raise CheckpointCorrupt(name, "manifest's ckp_ts is not its directory's")
        return manifest


def _checksum(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return f"{xxhash.xxh3_64_intdigest(canonical):016x}"


def _uint(value: object) -> int:
    if type(value) is not int or not 0 <= value < 1 << 64:
        raise ValueError(f"{value!r} is not an unsigned 64-bit integer")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a non-empty string")
    return value


def _text_or_none(value: object) -> str | None:
    return None if value is None else _text(value)


def _one_of(value: object, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{value!r} is not one of {allowed}")
    assert isinstance(value, str)
    return value


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise ValueError(f"{value!r} is not a list")
    return value


# --- catalog.parquet --------------------------------------------------------------------------

CATALOG_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("db_id", pa.uint64(), nullable=False),
        pa.field("table_id", pa.uint64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("create_ts", pa.uint64(), nullable=False),
        pa.field("schema", pa.string()),
        pa.field("next_block_id", pa.uint64(), nullable=False),
        pa.field("open_block_id", pa.uint64(), nullable=False),
    ]
)


@dataclass(frozen=True, slots=True)
class CatalogRow:
    kind: str  # "database" | "table"
    db_id: int
    table_id: int
    name: str
    create_ts: int
    schema: Schema | None
    next_block_id: int
    open_block_id: int
    """The table's open L0 block (appends continue it), 0 when none."""


def schema_json(schema: Schema) -> str:
    return json.dumps(
        {
            "columns": [
                {"name": c.name, "type": c.type, "nullable": c.nullable} for c in schema.columns
            ],
            "primary_key": list(schema.primary_key),
        },
        separators=(",", ":"),
    )


def schema_from_json(text: str, source: str) -> Schema:
    try:
        body = json.loads(text)
        return Schema(
            [Column(c["name"], c["type"], nullable=bool(c["nullable"])) for c in body["columns"]],
            primary_key=list(body["primary_key"]),
        )
    except (json.JSONDecodeError, KeyError, TypeError, SchemaError) as exc:
        raise CheckpointCorrupt(source, f"bad table schema: {exc}") from None


def encode_catalog(rows: list[CatalogRow]) -> bytes:
    table = pa.table(
        {
            "kind": [r.kind for r in rows],
            "db_id": [r.db_id for r in rows],
            "table_id": [r.table_id for r in rows],
            "name": [r.name for r in rows],
            "create_ts": [r.create_ts for r in rows],
            "schema": [None if r.schema is None else schema_json(r.schema) for r in rows],
            "next_block_id": [r.next_block_id for r in rows],
            "open_block_id": [r.open_block_id for r in rows],
        },
        schema=CATALOG_SCHEMA,
    )
    return write_parquet(table)


def decode_catalog(data: bytes, source: str) -> list[CatalogRow]:
    table = read_parquet(data, source, CATALOG_SCHEMA)
    out = []
    for row in table.to_pylist():
        kind = row["kind"]
        if kind not in ("database", "table") or (kind == "table") != (row["schema"] is not None):
            raise CheckpointCorrupt(source, f"bad catalog row {row!r}")
        schema = None if row["schema"] is None else schema_from_json(row["schema"], source)
        out.append(
            CatalogRow(
                kind,
                row["db_id"],
                row["table_id"],
                row["name"],
                row["create_ts"],
                schema,
                row["next_block_id"],
                row["open_block_id"],
            )
        )
    return out


# --- blocks.parquet ---------------------------------------------------------------------------

BLOCKS_SCHEMA = pa.schema(
    [
        pa.field("table_id", pa.uint64(), nullable=False),
        pa.field("block_id", pa.uint64(), nullable=False),
        pa.field("level", pa.uint8(), nullable=False),
        pa.field("object", pa.string(), nullable=False),
        pa.field("row_group", pa.uint32(), nullable=False),
        pa.field("rows", pa.uint32(), nullable=False),
        pa.field("create_ts", pa.uint64(), nullable=False),
        pa.field("delta_object", pa.string()),
        pa.field("deleted", pa.uint32(), nullable=False),
    ]
)


@dataclass(frozen=True, slots=True)
class BlockRow:
    table_id: int
    block_id: int
    level: int
    """0: an L0 block, its rows in the dump object `object`; 1, 2: a persisted block."""
    object: str
    row_group: int
    rows: int
    """Rows of the block at ckp_ts (an L0 block's rows appended at or before it)."""
    create_ts: int
    delta_object: str | None
    """The table's delta object holding this block's deletes at or before ckp_ts."""
    deleted: int


def encode_blocks(rows: list[BlockRow]) -> bytes:
    table = pa.table(
        {
            "table_id": [r.table_id for r in rows],
            "block_id": [r.block_id for r in rows],
            "level": [r.level for r in rows],
            "object": [r.object for r in rows],
            "row_group": [r.row_group for r in rows],
            "rows": [r.rows for r in rows],
            "create_ts": [r.create_ts for r in rows],
            "delta_object": [r.delta_object for r in rows],
            "deleted": [r.deleted for r in rows],
        },
        schema=BLOCKS_SCHEMA,
    )
    return write_parquet(table)


def decode_blocks(data: bytes, source: str) -> list[BlockRow]:
    table = read_parquet(data, source, BLOCKS_SCHEMA)
    out = []
    for row in table.to_pylist():
        if row["level"] > 2 or (row["rows"] == 0 and row["level"] != LEVEL_L0_DUMP):
            raise CheckpointCorrupt(source, f"bad block row {row!r}")
        out.append(BlockRow(**row))
    return out


# --- Parquet helpers ----------------------------------------------------------------------------


def write_parquet(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", write_page_checksum=True)
    return bytes(sink.getvalue().to_pybytes())


def read_parquet(data: bytes, source: str, schema: pa.Schema | None = None) -> pa.Table:
    """A Parquet object's table, checked against `schema` (names, types, nullability)."""
    try:
        table = pq.read_table(pa.BufferReader(data), page_checksum_verification=True)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise CheckpointCorrupt(source, f"not a readable Parquet file: {exc}") from None
    if schema is not None and not table.schema.remove_metadata().equals(schema):
        raise CheckpointCorrupt(source, f"columns {table.schema} are not {schema}")
    return table
