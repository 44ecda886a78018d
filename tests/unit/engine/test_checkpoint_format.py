"""The checkpoint's codecs (engine/checkpoint/FORMAT.md): the manifest's golden vector and
every way it can be damaged, and the catalog and block lists' columns.

Proves: a fixed manifest encodes to exactly the checked-in bytes and decodes back; a changed
field, a bad checksum, another format or version, a wrong type, a ckp_ts other than the
directory's, and bytes that are not JSON are `CheckpointCorrupt` naming the object; the
catalog and block lists round-trip through Parquet with the documented columns, and a list of
other columns is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from engine.checkpoint import layout
from engine.checkpoint.errors import CheckpointCorrupt
from engine.checkpoint.layout import BlockRow, CatalogRow, Manifest
from engine.schema import Column, Schema

GOLDEN = Path(__file__).parent / "golden" / "manifest_v1.json"

MANIFEST = Manifest(
    ckp_ts=(1_700_000_000_000 << 16) | 3,
    ckp_dsn=4242,
    kind=layout.KIND_INCREMENTAL,
    previous=layout.manifest_name(layout.directory(1_700_000_000_000 << 16, "0badcafe")),
    catalog=layout.directory((1_700_000_000_000 << 16) | 3, "5eed1e55") + "catalog.parquet",
    blocks=layout.directory((1_700_000_000_000 << 16) | 3, "5eed1e55") + "blocks.parquet",
    next_id=9,
    tables=1,
    block_count=2,
    live_rows=8290,
    objects=(
        "ckp/00111411200000000003-5eed1e55/blocks.parquet",
        "ckp/00111411200000000003-5eed1e55/catalog.parquet",
        "ckp/00111411200000000003-5eed1e55/l0-2-4.parquet",
        "data/2/0a1b2c.parquet",
    ),
    created_wall_ms=1_700_000_000_123,
)


def test_the_golden_manifest_encodes_exactly_and_decodes_back() -> None:
    encoded = MANIFEST.encode()
    assert encoded == GOLDEN.read_bytes()
    assert Manifest.decode(encoded, MANIFEST.name) == MANIFEST
    body = json.loads(encoded)
    assert body["format"] == "engine-checkpoint" and body["version"] == 1
    assert len(body["checksum"]) == 16


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda b: b.update(ckp_dsn=4243), "checksum"),
        (lambda b: b.update(checksum="0" * 16), "checksum"),
        (lambda b: b.update(format="delta"), "not an engine checkpoint"),
        (lambda b: b.update(version=2), "version"),
        (lambda b: b.pop("checksum"), "checksum"),
    ],
)
def test_a_damaged_manifest_is_refused(change: object, reason: str) -> None:
    body = json.loads(MANIFEST.encode())
    change(body)  # type: ignore[operator]
    with pytest.raises(CheckpointCorrupt, match=reason) as caught:
        Manifest.decode(json.dumps(body).encode(), "ckp/x/manifest.json")
    assert caught.value.name == "ckp/x/manifest.json"


def resealed(body: dict[str, object]) -> bytes:
    body.pop("checksum", None)
    body["checksum"] = layout._checksum(body)
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    "change",
    [
        lambda b: b.update(ckp_ts=-1),
        lambda b: b.update(ckp_ts="12"),
        lambda b: b.update(kind="partial"),
        lambda b: b.update(objects="data/1"),
        lambda b: b.update(catalog=""),
        lambda b: b.pop("next_id"),
    ],
)
def test_fields_out_of_the_rules_are_refused_behind_a_valid_checksum(change: object) -> None:
    body = json.loads(MANIFEST.encode())
    change(body)  # type: ignore[operator]
    with pytest.raises(CheckpointCorrupt, match="out of the rules"):
        Manifest.decode(resealed(body), "ckp/x/manifest.json")


def test_garbage_and_a_misplaced_manifest_are_refused() -> None:
    for data in (b"", b"\xff\xfe", b"[1, 2]", b"{"):
        with pytest.raises(CheckpointCorrupt):
            Manifest.decode(data, "m")
    elsewhere = layout.manifest_name(layout.directory(MANIFEST.ckp_ts + 1, "5eed1e55"))
    with pytest.raises(CheckpointCorrupt, match="directory"):
        Manifest.decode(MANIFEST.encode(), elsewhere)
    assert layout.ckp_ts_of(layout.manifest_name(layout.directory(77, "ab"))) == 77
    assert layout.ckp_ts_of("ckp/77/manifest.json") is None
    assert layout.ckp_ts_of("ckp/00000000000000000077/manifest.json") is None
    assert layout.ckp_ts_of("data/1/x.parquet") is None


def test_the_lists_round_trip_with_the_documented_columns() -> None:
    schema = Schema([Column("id", "int64"), Column("n", "string", nullable=True)], ["id"])
    catalog = [
        CatalogRow("database", 1, 0, "shop", 10, None, 0, 0),
        CatalogRow("table", 1, 2, "orders", 11, schema, 5, 4),
    ]
    data = layout.encode_catalog(catalog)
    assert layout.decode_catalog(data, "c") == catalog
    assert layout.read_parquet(data, "c").schema.names == layout.CATALOG_SCHEMA.names
    blocks = [
        BlockRow(2, 3, 1, "data/2/a.parquet", 0, 8192, 12, "ckp/x/delta-2.parquet", 7),
        BlockRow(2, 4, 0, "ckp/x/l0-2-4.parquet", 0, 10, 13, None, 0),
    ]
    assert layout.decode_blocks(layout.encode_blocks(blocks), "b") == blocks
    other = layout.write_parquet(pa.table({"table_id": [1]}))
    with pytest.raises(CheckpointCorrupt, match="columns"):
        layout.decode_blocks(other, "b")
    with pytest.raises(CheckpointCorrupt, match="Parquet"):
        layout.decode_catalog(b"PAR1 nothing", "c")
