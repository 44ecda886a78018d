"""`restore_catalog` (engine/checkpoint/plan.py), the one restore of a checkpoint's catalog that
the engine's open and spark_jobs' replay share: a database or table listed twice, or a table of
an unknown database, is `CheckpointCorrupt` naming the object (the engine's own copy asserted
on duplicates before); a good catalog restores every table and moves the id allocator on."""

from __future__ import annotations

import pytest

from engine.catalog import Catalog
from engine.checkpoint.errors import CheckpointCorrupt
from engine.checkpoint.layout import CatalogRow
from engine.checkpoint.plan import restore_catalog
from engine.schema import Column, Schema

SCHEMA = Schema([Column("k", "int64")], ["k"])
DB = CatalogRow("database", 1, 0, "db", 10, None, 0, 0)
TABLE = CatalogRow("table", 1, 2, "t", 11, SCHEMA, 0, 1)


def test_a_good_catalog_restores_its_tables() -> None:
    catalog = Catalog()
    tables = restore_catalog(catalog, [TABLE, DB], 40, "ckp/1/catalog.parquet")
    assert list(tables) == [2] and tables[2].name == "t"
    assert catalog.next_id >= 40


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        ([DB, DB], "database 1 twice"),
        ([DB, TABLE, TABLE], "table 2 twice"),
        ([TABLE], "table 't' of an unknown database"),
    ],
)
def test_a_bad_catalog_is_corrupt(rows: list[CatalogRow], reason: str) -> None:
    with pytest.raises(CheckpointCorrupt) as raised:
        restore_catalog(Catalog(), rows, 1, "ckp/1/catalog.parquet")
    assert (raised.value.name, raised.value.reason) == ("ckp/1/catalog.parquet", reason)
