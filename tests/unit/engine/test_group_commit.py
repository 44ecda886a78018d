"""Commits applied per group (engine/pipeline.py holding a group back, engine/state.py
`apply_group`) give exactly the outcomes of one commit at a time (issue 21's differential test).

How: hypothesis draws rounds of transactions over two tables (an int64 key, and a compound
(int32, string) key), keys from a small range so that conflicts and duplicates are common.
Every transaction of a round begins on the same snapshot and runs its operations (one-row
inserts kept as values, 40-row inserts as Arrow batches, deletes, updates, and inserts that
collide: DuplicateKey at the insert or at the commit); then the round commits either all at
once (`gather`: prepared in order in one turn, made durable by one driver record, applied as
one group) or one at a time (each awaited before the next). Both runs must give the same
outcome to every operation and commit (ok, WriteConflict, DuplicateKey), the same content
at each successive commit (the digest at each commit_ts, in commit order: visibility order),
and the same content after a restart that replays the WAL. A last test checks that the
grouped run really applied groups (fewer passes than commits).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Column, Engine, EngineError, Schema, Transaction, limits
from engine.objects.store import MemoryObjectStore
from tae_driver.backends.memory import MemoryBackend

T1 = Schema([Column("id", "int64"), Column("v", "int64", nullable=True)], primary_key=["id"])
T2 = Schema(
    [Column("a", "int32"), Column("b", "string"), Column("v", "int64", nullable=True)],
    primary_key=["a", "b"],
)
KEYS = 6

Op = tuple[str, str, int, int]
"""(kind, table, key, value)."""

ops = st.tuples(
    st.sampled_from(["insert", "insert", "insert", "delete", "update", "bulk"]),
    st.sampled_from(["t1", "t2"]),
    st.integers(0, KEYS - 1),
    st.integers(-5, 5),
)
rounds = st.lists(
    st.lists(st.lists(ops, min_size=1, max_size=3), min_size=1, max_size=6),
    min_size=1,
    max_size=5,
)


def _key(table: str, key: int) -> Any:
    return key if table == "t1" else (key, f"k{key}")


def _row(table: str, key: int, value: int) -> dict[str, Any]:
    if table == "t1":
        return {"id": key, "v": value}
    return {"a": key, "b": f"k{key}", "v": value}


def _bulk(table: str, key: int, value: int) -> pa.RecordBatch:
    """40 rows (more than a small insert): keys 100 + 40 * key .. (collide when keys do)."""
    first = 100 + 40 * key
    ids = list(range(first, first + 40))
    values = [value] * 40
    if table == "t1":
        return pa.RecordBatch.from_pydict({"id": ids, "v": values}, schema=T1.to_arrow())
    names = [f"k{i}" for i in ids]
    return pa.RecordBatch.from_pydict({"a": ids, "b": names, "v": values}, schema=T2.to_arrow())


async def _op(txn: Transaction, op: Op) -> str:
    kind, table, key, value = op
    handle = txn.table("db", table)
    try:
        if kind == "insert":
            await handle.insert([_row(table, key, value)])
        elif kind == "bulk":
            await handle.insert(_bulk(table, key, value))
        elif kind == "delete":
            return f"deleted {await handle.delete([_key(table, key)])}"
        else:
            return f"updated {await handle.update([_key(table, key)], {'v': value})}"
    except EngineError as exc:
        return type(exc).__name__
    return "ok"


async def _commit(txn: Transaction) -> str:
    try:
        await txn.commit()
    except EngineError as exc:
        return type(exc).__name__
    return "ok"


async def _run(
    path: Path, program: list[list[list[Op]]], grouped: bool
) -> tuple[list[str], list[str], str, int, int]:
    backend = MemoryBackend()
    objects = MemoryObjectStore()
    # No maintenance: a flush racing the round would make outcomes depend on timing.
    eng = await Engine.open(str(path), wal=backend, objects=objects, maintenance=False)
    async with eng.transaction() as txn:
        await txn.create_database("db")
        await txn.create_table("db", "t1", T1)
        await txn.create_table("db", "t2", T2)
    outcomes: list[str] = []
    committed: list[Transaction] = []
    for round_ in program:
        txns = [await eng.begin() for _ in round_]
        for txn, txn_ops in zip(txns, round_, strict=True):
            for op in txn_ops:
                outcomes.append(await _op(txn, op))
        if grouped:
            results = await asyncio.gather(*(_commit(txn) for txn in txns))
        else:
            results = [await _commit(txn) for txn in txns]
        outcomes.extend(results)
        committed.extend(t for t, r in zip(txns, results, strict=True) if r == "ok")
    commit_ts = [t.commit_ts for t in committed if t.commit_ts and t.commit_ts != t.start_ts]
    assert commit_ts == sorted(commit_ts)
    digests = [eng.digest(ts) for ts in commit_ts]
    final = eng.digest()
    groups = eng._state.apply_passes
    entries = eng._state.entries_applied
    await eng.close()
    reopened = await Engine.open(str(path), wal=backend, objects=objects, maintenance=False)
    try:
        assert reopened.digest() == final  # the WAL replays to the same content
    finally:
        await reopened.close()
    return outcomes, digests, final, groups, entries


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rounds, st.sampled_from([16, limits.BLOCK_ROWS_MAX]))
def test_grouped_commits_give_the_outcomes_of_one_at_a_time(
    tmp_path: Path, program: list[list[list[Op]]], block_rows: int
) -> None:
    """With 16-row blocks a group's rows (and a 40-row insert's) span several blocks."""

    async def both() -> None:
        base = tmp_path / f"run-{id(program)}"
        grouped = await _run(base / "grouped", program, grouped=True)
        serial = await _run(base / "serial", program, grouped=False)
        assert grouped[0] == serial[0]  # every operation's and commit's outcome
        assert grouped[1] == serial[1]  # the content at each commit, in commit order
        assert grouped[2] == serial[2]

    with mock.patch.object(limits, "BLOCK_ROWS_MAX", block_rows):
        asyncio.run(both())


def test_concurrent_commits_are_applied_in_groups(tmp_path: Path) -> None:
    program = [[[("insert", "t1", 0, 1)], [("insert", "t2", 1, 2)]] * 3]
    program[0] = [[("insert", "t1", k % KEYS, k)] for k in range(KEYS)] + [
        [("insert", "t2", k % KEYS, k)] for k in range(KEYS)
    ]

    async def run() -> tuple[list[str], list[str], str, int, int]:
        return await _run(tmp_path / "g", program, grouped=True)

    outcomes, digests, _, passes, entries = asyncio.run(run())
    assert outcomes.count("ok") == 4 * KEYS  # every insert and every commit succeeded
    assert len(digests) == 2 * KEYS
    assert passes < entries  # 12 commits prepared together: applied in fewer passes
