"""A lone writer's commit costs three turns of the event loop (issue 21, target 2).

What it proves, counting `_run_once` calls of a real selector loop (no timing): a one-row
transaction (begin, insert, commit) over the file WAL takes the writer's own turn, the
driver's pump, and the turn in which the syncer thread hands the group back, where the
commit is applied and its waiter answered (tae_driver/completion.py); over the memory WAL the
same three (the record's task step instead of the syncer's). The old path took a fourth: the
driver's future ran the engine's `_on_durable` a turn after it completed. Maintenance is off
so that no timer adds turns; the bound allows a few for anything else.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine import Column, Engine, Schema

COMMITS = 200
TURNS_PER_COMMIT_MAX = 3
SCHEMA = Schema([Column("id", "int64"), Column("payload", "string")], primary_key=["id"])


class CountingLoop(asyncio.SelectorEventLoop):
    turns = 0

    def _run_once(self) -> None:
        self.turns += 1
        super()._run_once()  # type: ignore[misc]


@pytest.mark.parametrize("wal", ["file", "memory"])
def test_a_one_row_commit_takes_three_loop_turns(tmp_path: Path, wal: str) -> None:
    loop = CountingLoop()

    async def scenario() -> int:
        eng = await Engine.open(str(tmp_path / "e"), wal=wal, objects="none", maintenance=False)
        try:
            async with eng.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", SCHEMA)
            for key in range(20):  # warm up: the syncer thread started, caches filled
                async with eng.transaction() as txn:
                    await txn.table("d", "t").insert({"id": key, "payload": "x"})
            before = loop.turns
            for key in range(100, 100 + COMMITS):
                async with eng.transaction() as txn:
                    await txn.table("d", "t").insert({"id": key, "payload": "x"})
            turns = loop.turns - before
            async with eng.transaction() as txn:
                assert (await txn.table("d", "t").get(100 + COMMITS - 1)) is not None
            return turns
        finally:
            await eng.close()

    try:
        turns = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert turns <= TURNS_PER_COMMIT_MAX * COMMITS + 5, turns / COMMITS
