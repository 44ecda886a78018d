"""The classic isolation anomalies, with two or three interleaved transactions (issue 13).

Snapshot isolation forbids dirty reads, lost updates, read skew and phantoms under a scan;
it allows write skew, and so does the engine (two transactions that read both rows and each
update a different one both commit: the docs say so). Also: a concurrent insert of the same
key is a DuplicateKey for the second committer, a drop racing a writer is a WriteConflict for
whichever commits second, and a snapshot at an older timestamp shows the older state.
Every test interleaves the steps by hand on one event loop: no sleeps, no threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pyarrow.compute as pc
import pytest

from engine import Column, DuplicateKey, Engine, NotFound, Schema, Transaction, WriteConflict

ACCOUNTS = Schema([Column("id", "int64"), Column("balance", "int64")], primary_key=["id"])


def scenario(tmp_path: Path, body: Callable[[Engine], Awaitable[None]]) -> None:
    async def main() -> None:
        eng = await Engine.open(str(tmp_path), wal="memory")
        async with eng.transaction() as txn:
            await txn.create_database("bank")
            await txn.create_table("bank", "accounts", ACCOUNTS)
            await txn.table("bank", "accounts").insert(
                [{"id": 1, "balance": 100}, {"id": 2, "balance": 100}]
            )
        try:
            await body(eng)
        finally:
            await eng.close()

    asyncio.run(main())


async def balance(txn: Transaction, account: int) -> int | None:
    row = await txn.table("bank", "accounts").get(account)
    return None if row is None else int(row["balance"])


async def set_balance(txn: Transaction, account: int, value: int) -> None:
    assert await txn.table("bank", "accounts").update([account], {"balance": value}) == 1


def test_no_dirty_read(tmp_path: Path) -> None:
    async def body(eng: Engine) -> None:
        t1, t2 = await eng.begin(), await eng.begin()
        await set_balance(t1, 1, 0)
        await t1.table("bank", "accounts").insert([{"id": 3, "balance": 5}])
        assert await balance(t2, 1) == 100
        assert await balance(t2, 3) is None
        await t1.commit()
        assert await balance(t2, 1) == 100  # and no non-repeatable read either
        t3 = await eng.begin()
        assert await balance(t3, 1) == 0

    scenario(tmp_path, body)


def test_no_lost_update(tmp_path: Path) -> None:
    async def body(eng: Engine) -> None:
        t1, t2 = await eng.begin(), await eng.begin()
        b1, b2 = await balance(t1, 1), await balance(t2, 1)
        assert b1 is not None and b2 is not None
        await set_balance(t1, 1, b1 + 10)
        await set_balance(t2, 1, b2 + 20)
        await t1.commit()
        with pytest.raises(WriteConflict):
            await t2.commit()
        async with eng.transaction() as retry:  # the retry sees t1's increment
            b = await balance(retry, 1)
            assert b is not None
            await set_balance(retry, 1, b + 20)
        async with eng.transaction() as check:
            assert await balance(check, 1) == 130

    scenario(tmp_path, body)


def test_no_read_skew(tmp_path: Path) -> None:
    async def body(eng: Engine) -> None:
        t1 = await eng.begin()
        assert await balance(t1, 1) == 100
        async with eng.transaction() as t2:  # moves 50 from account 1 to account 2
            await set_balance(t2, 1, 50)
            await set_balance(t2, 2, 150)
        assert await balance(t1, 2) == 100  # the total t1 sees stays 200
        table = await t1.table("bank", "accounts").scan(columns=["balance"])
        assert sum(table.column("balance").to_pylist()) == 200

    scenario(tmp_path, body)


def test_no_phantom_under_a_scan(tmp_path: Path) -> None:
    async def body(eng: Engine) -> None:
        t1 = await eng.begin()
        rich = pc.field("balance") >= 100
        before = await t1.table("bank", "accounts").scan(filter=rich)
        async with eng.transaction() as t2:
            await t2.table("bank", "accounts").insert([{"id": 3, "balance": 500}])
            await t2.table("bank", "accounts").delete([2])
        after = await t1.table("bank", "accounts").scan(filter=rich)
        assert sorted(after.to_pylist(), key=str) == sorted(before.to_pylist(), key=str)
        assert after.num_rows == 2

    scenario(tmp_path, body)


def test_write_skew_is_allowed(tmp_path: Path) -> None:
    """Constraint the application wants: balance(1) + balance(2) >= 0. Each transaction
    checks it on its snapshot and withdraws from a different account; under SI both commit
    and the constraint breaks. Serializable isolation would abort one; SI does not."""

    async def body(eng: Engine) -> None:
        t1, t2 = await eng.begin(), await eng.begin()
        for txn, account in ((t1, 1), (t2, 2)):
            total = (await balance(txn, 1) or 0) + (await balance(txn, 2) or 0)
            assert total - 150 >= 0
            await set_balance(txn, account, (await balance(txn, account) or 0) - 150)
        await t1.commit()
        await t2.commit()
        async with eng.transaction() as check:
            assert (await balance(check, 1) or 0) + (await balance(check, 2) or 0) == -100

    scenario(tmp_path, body)


def test_concurrent_inserts_of_one_key_the_second_committer_gets_duplicate_key(
    tmp_path: Path,
) -> None:
    async def body(eng: Engine) -> None:
        t1, t2, t3 = await eng.begin(), await eng.begin(), await eng.begin()
        for txn in (t1, t2, t3):
            await txn.table("bank", "accounts").insert([{"id": 9, "balance": 1}])
        await t2.commit()
        with pytest.raises(DuplicateKey):
            await t1.commit()
        with pytest.raises(DuplicateKey):
            await t3.commit()
        t4 = await eng.begin()  # after t2: the key is live in its snapshot
        with pytest.raises(DuplicateKey):
            await t4.table("bank", "accounts").insert([{"id": 9, "balance": 2}])

    scenario(tmp_path, body)


@pytest.mark.parametrize("first", ["drop", "write"])
def test_a_drop_racing_a_writer_loses_if_it_commits_second(tmp_path: Path, first: str) -> None:
    async def body(eng: Engine) -> None:
        writer, dropper = await eng.begin(), await eng.begin()
        await set_balance(writer, 1, 1)
        await dropper.drop_table("bank", "accounts")
        winner, loser = (dropper, writer) if first == "drop" else (writer, dropper)
        await winner.commit()
        with pytest.raises(WriteConflict):
            await loser.commit()
        async with eng.transaction() as check:
            if first == "drop":
                with pytest.raises(NotFound):
                    check.table("bank", "accounts")
            else:
                assert await balance(check, 1) == 1

    scenario(tmp_path, body)


def test_concurrent_creates_of_one_name_conflict(tmp_path: Path) -> None:
    async def body(eng: Engine) -> None:
        t1, t2 = await eng.begin(), await eng.begin()
        await t1.create_table("bank", "audit", ACCOUNTS)
        await t2.create_table("bank", "audit", ACCOUNTS)
        await t1.commit()
        with pytest.raises(WriteConflict):
            await t2.commit()

    scenario(tmp_path, body)


def test_a_snapshot_at_an_older_timestamp_shows_the_older_state(tmp_path: Path) -> None:
    async def body(eng: Engine) -> None:
        first = eng.visible_ts
        async with eng.transaction() as txn:
            await set_balance(txn, 1, 7)
            await txn.table("bank", "accounts").delete([2])
        async with eng.snapshot(first) as old:
            assert await balance(old, 1) == 100
            assert await balance(old, 2) == 100
        async with eng.snapshot(eng.visible_ts) as new:
            assert await balance(new, 1) == 7
            assert await balance(new, 2) is None

    scenario(tmp_path, body)
