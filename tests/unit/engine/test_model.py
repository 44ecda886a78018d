"""Property: random concurrent transactions on the engine behave exactly like a serial model
of snapshot isolation, and a crash at any point loses no acknowledged commit and leaves every
transaction whole.

How: hypothesis draws a program (a state machine's steps) run against a real engine on a
`MemoryBackend` and, in lockstep, against a model that keeps every committed version of the
database as plain dicts. Up to four transactions are open at once. Steps: begin; insert,
delete, update (one or two keys, from a small range so collisions are common), get, scan
(with and without a filter) in a chosen open transaction, each result checked against the
model's view (the snapshot at its start plus its own writes), and an operation's error
(DuplicateKey, NotFound) checked too; drop and create of the second table (DDL in
transactions); commit, whose outcome must be the model's: success, WriteConflict or
DuplicateKey by first-committer-wins on the keys and tables written since the transaction
started (when several conflicts are possible, any of their kinds is accepted); rollback;
and crash: the engine is aborted (optionally while a commit is in flight, advanced a drawn
number of event-loop steps), reopened on the same backend, and its whole content must equal
the model's committed state, with the in-flight transaction either wholly applied or wholly
absent. Commit timestamps must increase across commits and restarts.

Storage steps interleave with all of this (issue 14): flush (every open block sealed and
flushed to an object, then merges and compactions as the policy asks: two L1 blocks make an
L2 segment, a block a third dead is rewritten), and checkpoint (the state in objects, the WAL
truncated below it). Open transactions keep reading and committing across them, and a crash
may cut a flush or a checkpoint half way; the reopened engine starts from the newest
checkpoint and the WAL tail, over the same object store.

The second table has a compound key (int32, string); the first an int64 key.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine import (
    Column,
    DuplicateKey,
    Engine,
    EngineClosed,
    NotFound,
    Schema,
    Transaction,
    WalFailed,
    WriteConflict,
)
from engine.compaction import Policy
from engine.objects.store import MemoryObjectStore
from tae_driver.backends.memory import MemoryBackend

T1 = Schema([Column("id", "int64"), Column("v", "int64", nullable=True)], primary_key=["id"])
T2 = Schema(
    [Column("a", "int32"), Column("b", "string"), Column("v", "int64", nullable=True)],
    primary_key=["a", "b"],
)
KEYS = 6
OPEN_MAX = 4
POLICY = Policy(merge_l1_blocks=2, compact_deleted_fraction=0.3)

State = dict[str, dict[Any, int | None] | None]
"""table name -> {key: v} (None: the table does not exist)."""


def key_of(table: str, k: int) -> Any:
    return k if table == "t1" else (k % 3, str(k // 3))


def row_of(table: str, key: Any, v: int | None) -> dict[str, Any]:
    if table == "t1":
        return {"id": key, "v": v}
    return {"a": key[0], "b": key[1], "v": v}


@dataclass
class Committed:
    state: State
    t2_ident: int | None
    commit_ts: int


@dataclass
class ModelTxn:
    engine: Transaction
    start: int  # index into Model.versions
    view: State
    t2_ident: int | None
    inserted: dict[str, set[Any]] = field(default_factory=lambda: {"t1": set(), "t2": set()})
    snap_deleted: dict[str, set[Any]] = field(default_factory=lambda: {"t1": set(), "t2": set()})
    t2_ddl: list[str] = field(default_factory=list)
    t2_snapshot_ident: int | None = None


class Model:
    def __init__(self, state: State, t2_ident: int | None, commit_ts: int) -> None:
        self.versions = [Committed(state, t2_ident, commit_ts)]
        self.last_write: dict[tuple[Any, Any], tuple[int, bool]] = {}
        self.last_rows: dict[Any, int] = {}
        self.last_drop: dict[Any, int] = {}
        self.last_name = 0
        self.next_ident = (t2_ident or 0) + 1

    @property
    def latest(self) -> Committed:
        return self.versions[-1]

    def ident(self, txn: ModelTxn, table: str) -> Any:
        return "t1" if table == "t1" else ("t2", txn.t2_ident)

    def outcome(self, txn: ModelTxn) -> set[type[Exception]]:
        """The errors the commit may raise (empty: it succeeds)."""
        errors: set[type[Exception]] = set()
        start = txn.start
        for table in ("t1", "t2"):
            ident = self.ident(txn, table)
            written = txn.inserted[table] | txn.snap_deleted[table]
            for key in written:
                seen = self.last_write.get((ident, key))
                if seen is not None and seen[0] > start:
                    insert_only = key in txn.inserted[table] and key not in txn.snap_deleted[table]
                    errors.add(DuplicateKey if insert_only and seen[1] else WriteConflict)
            if written and self.last_drop.get(ident, 0) > start:
                errors.add(WriteConflict)
        if txn.t2_ddl:
            if self.last_name > start:
                errors.add(WriteConflict)
            if "drop" in txn.t2_ddl and txn.t2_snapshot_ident is not None:
                old = ("t2", txn.t2_snapshot_ident)
                if self.last_rows.get(old, 0) > start or self.last_drop.get(old, 0) > start:
                    errors.add(WriteConflict)
        return errors

    def storage_commit(self, commit_ts: int) -> None:
        """Flushes, merges, compactions commit too (as transactions) and change nothing a
        reader sees: a version equal to the latest."""
        latest = self.latest
        self.versions.append(Committed(copy.deepcopy(latest.state), latest.t2_ident, commit_ts))

    def apply(self, txn: ModelTxn, commit_ts: int) -> None:
        version = len(self.versions)
        state = copy.deepcopy(self.latest.state)
        t2_ident = self.latest.t2_ident
        if txn.t2_ddl:
            if txn.t2_snapshot_ident is not None and "drop" in txn.t2_ddl:
                self.last_drop[("t2", txn.t2_snapshot_ident)] = version
            self.last_name = version
            state["t2"] = copy.deepcopy(txn.view["t2"])
            t2_ident = txn.t2_ident
        for table in ("t1", "t2"):
            ident = self.ident(txn, table)
            written = txn.inserted[table] | txn.snap_deleted[table]
            if written:
                self.last_rows[ident] = version
            target = state[table]
            for key in written:
                live = key in txn.inserted[table]
                self.last_write[(ident, key)] = (version, live)
                if target is None or (table == "t2" and txn.t2_ddl):
                    continue  # a table created (or dropped) by the txn: its view was taken
                if live:
                    view = txn.view[table]
                    assert view is not None
                    target[key] = view[key]
                else:
                    target.pop(key, None)
        self.versions.append(Committed(state, t2_ident, commit_ts))


async def dump(eng: Engine) -> State:
    out: State = {}
    async with eng.transaction() as txn:
        for table in ("t1", "t2"):
            if table not in txn.tables("db"):
                out[table] = None
                continue
            rows = (await txn.table("db", table).scan()).to_pylist()
            out[table] = {(r["id"] if table == "t1" else (r["a"], r["b"])): r["v"] for r in rows}
    return out


Step = tuple[str, int, int, int]
STEPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["begin"] * 4
            + ["insert"] * 6
            + ["delete"] * 3
            + ["update"] * 3
            + ["get"] * 2
            + ["scan"] * 2
            + ["commit"] * 5
            + ["rollback", "drop_t2", "create_t2", "crash", "flush", "flush", "checkpoint"]
        ),
        st.integers(0, OPEN_MAX - 1),
        st.integers(0, KEYS - 1),
        st.integers(0, 3),
    ),
    min_size=20,
    max_size=70,
)


class Run:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.backend = MemoryBackend()
        self.objects = MemoryObjectStore()
        self.open: list[ModelTxn] = []
        self.last_commit_ts = 0

    async def open_engine(self) -> Engine:
        eng = await Engine.open(
            str(self.path),
            wal=self.backend,
            objects=self.objects,
            policy=POLICY,
            maintenance=False,  # the program runs it
        )
        assert eng.checkpointer is not None
        eng.checkpointer.wal_reserve_entries = 0
        return eng

    async def start(self) -> None:
        self.eng = await self.open_engine()
        async with self.eng.transaction() as txn:
            await txn.create_database("db")
            await txn.create_table("db", "t1", T1)
            await txn.create_table("db", "t2", T2)
        self.model = Model({"t1": {}, "t2": {}}, 1, self.eng.visible_ts)
        self.model.next_ident = 2

    async def begin(self) -> None:
        if len(self.open) >= OPEN_MAX:
            return
        txn = await self.eng.begin()
        latest = self.model.latest
        assert txn.start_ts == latest.commit_ts
        self.open.append(
            ModelTxn(
                txn,
                len(self.model.versions) - 1,
                copy.deepcopy(latest.state),
                latest.t2_ident,
                t2_snapshot_ident=latest.t2_ident,
            )
        )

    async def write(self, txn: ModelTxn, op: str, k: int, v: int) -> None:
        table = "t1" if k % 2 == 0 else "t2"
        view = txn.view[table]
        if view is None:
            with pytest.raises(NotFound):
                txn.engine.table("db", table)
            return
        handle = txn.engine.table("db", table)
        keys = [key_of(table, k), key_of(table, (k + v) % KEYS)]
        keys = keys[: 1 + v % 2]
        if op == "insert":
            if len(set(keys)) != len(keys) or any(key in view for key in keys):
                with pytest.raises(DuplicateKey):
                    await handle.insert([row_of(table, key, v) for key in keys])
                return
            assert await handle.insert([row_of(table, key, v) for key in keys]) == len(keys)
            for key in keys:
                view[key] = v
                txn.inserted[table].add(key)
            return
        unique = list(dict.fromkeys(keys))
        live = [key for key in unique if key in view]
        if op == "update":
            assert await handle.update(unique, {"v": v}) == len(live)
            for key in live:
                self._delete(txn, table, key)
                view[key] = v
                txn.inserted[table].add(key)
        else:
            assert await handle.delete(unique) == len(live)
            for key in live:
                self._delete(txn, table, key)

    def _delete(self, txn: ModelTxn, table: str, key: Any) -> None:
        view = txn.view[table]
        assert view is not None
        del view[key]
        if key in txn.inserted[table]:
            txn.inserted[table].discard(key)
            return
        snapshot = self.model.versions[txn.start].state[table]
        created_here = table == "t2" and "create" in txn.t2_ddl
        if not created_here and snapshot is not None and key in snapshot:
            txn.snap_deleted[table].add(key)

    async def read(self, txn: ModelTxn, op: str, k: int, v: int) -> None:
        table = "t1" if k % 2 == 0 else "t2"
        view = txn.view[table]
        if view is None:
            return
        handle = txn.engine.table("db", table)
        if op == "get":
            key = key_of(table, k)
            row = await handle.get(key)
            assert (row is None) == (key not in view)
            if row is not None:
                assert row["v"] == view[key]
            return
        flt = None if v == 0 else pc.field("v") >= v
        got = (await handle.scan(filter=flt)).to_pylist()
        rows = {(r["id"] if table == "t1" else (r["a"], r["b"])): r["v"] for r in got}
        want = {key: x for key, x in view.items() if v == 0 or (x is not None and x >= v)}
        assert rows == want
        assert len(got) == len(rows)

    async def ddl(self, txn: ModelTxn, op: str) -> None:
        exists = txn.view["t2"] is not None
        if op == "drop_t2":
            if not exists:
                with pytest.raises(NotFound):
                    await txn.engine.drop_table("db", "t2")
                return
            await txn.engine.drop_table("db", "t2")
            txn.view["t2"] = None
            txn.inserted["t2"].clear()
            txn.snap_deleted["t2"].clear()
            txn.t2_ddl.append("drop")
            txn.t2_ident = None
        else:
            if exists:
                return
            await txn.engine.create_table("db", "t2", T2)
            txn.view["t2"] = {}
            txn.t2_ddl.append("create")
            txn.t2_ident = self.model.next_ident
            self.model.next_ident += 1

    async def commit(self, txn: ModelTxn) -> None:
        self.open.remove(txn)
        expected = self.model.outcome(txn)
        try:
            await txn.engine.commit()
        except (WriteConflict, DuplicateKey) as exc:
            assert type(exc) in expected, f"engine said {exc!r}, model expected {expected}"
            event(f"commit refused: {type(exc).__name__}")
            return
        assert not expected, f"engine committed, model expected {expected}"
        if txn.engine.commit_ts != txn.engine.start_ts:  # it logged something
            assert txn.engine.commit_ts is not None
            assert txn.engine.commit_ts > self.last_commit_ts
            self.last_commit_ts = txn.engine.commit_ts
            self.model.apply(txn, txn.engine.commit_ts)
            event("commit logged" + (" with DDL" if txn.t2_ddl else ""))

    async def crash(self, slot: int, steps: int) -> None:
        inflight = None
        task = None
        storage: asyncio.Future[Any] | None = None
        writers = [t for t in self.open if self.model.outcome(t) == set()]
        if slot >= 2:  # a flush (slot 2) or a checkpoint (slot 3) is cut by the crash
            storage = asyncio.ensure_future(
                self.eng.maintenance.settle(freeze_all=True)  # type: ignore[union-attr]
                if slot == 2
                else self.eng.checkpoint()
            )
        elif writers and slot == 1:
            inflight = writers[slot % len(writers)]
            task = asyncio.ensure_future(inflight.engine.commit())
        for _ in range(2 * steps):  # 0..6 loop turns: before, during, after the append
            await asyncio.sleep(0)
        await self.eng.abort()
        if storage is not None:
            storage.cancel()
            await asyncio.gather(storage, return_exceptions=True)
        acknowledged = False
        if task is not None:
            try:
                await task
                acknowledged = True
            except (WalFailed, EngineClosed):
                pass  # not acknowledged (EngineClosed: the crash came before it began)
        self.open.clear()
        self.eng = await self.open_engine()
        found = await dump(self.eng)
        # The in-flight commit landed exactly when the log holds a commit after the model's
        # newest (the dump alone cannot tell a commit that changed nothing visible).
        landed = self.eng.visible_ts > self.model.latest.commit_ts
        if acknowledged and inflight is not None:
            logged = inflight.engine.commit_ts != inflight.engine.start_ts
            assert landed == logged, "an acknowledged commit is missing after the crash"
        event(f"crash: in flight {inflight is not None}, landed {landed}")
        if landed and storage is not None:
            self.model.storage_commit(self.eng.visible_ts)  # the cut flush had committed
        elif landed:
            assert inflight is not None, "a commit nobody made appeared after the crash"
            self.model.apply(inflight, self.eng.visible_ts)
        assert found == self.model.latest.state
        assert self.eng.visible_ts >= self.last_commit_ts
        self.last_commit_ts = self.eng.visible_ts

    async def step(self, op: str, slot: int, k: int, v: int) -> None:
        if op == "begin":
            await self.begin()
            return
        if op == "crash":
            await self.crash(slot, v)
            return
        if op == "flush":
            maintenance = self.eng.maintenance
            assert maintenance is not None
            await maintenance.settle(freeze_all=True)
            event("flush: " + ", ".join(f"{k} {n}" for k, n in maintenance.rewrites_done.items()))
            if self.eng.visible_ts > self.model.latest.commit_ts:
                self.model.storage_commit(self.eng.visible_ts)
                self.last_commit_ts = self.eng.visible_ts
            return
        if op == "checkpoint":
            await self.eng.checkpoint()
            return
        if not self.open:
            return
        txn = self.open[slot % len(self.open)]
        if op in ("insert", "delete", "update"):
            await self.write(txn, op, k, v)
        elif op in ("get", "scan"):
            await self.read(txn, op, k, v)
        elif op in ("drop_t2", "create_t2"):
            await self.ddl(txn, op)
        elif op == "commit":
            await self.commit(txn)
        else:
            self.open.remove(txn)
            await txn.engine.rollback()


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(STEPS)
def test_random_transactions_match_the_serial_si_model(
    tmp_path_factory: pytest.TempPathFactory, steps: list[Step]
) -> None:
    async def main() -> None:
        run = Run(tmp_path_factory.mktemp("model"))
        await run.start()
        for op, slot, k, v in steps:
            await run.step(op, slot, k, v)
        for txn in list(run.open):
            await run.commit(txn)
        assert await dump(run.eng) == run.model.latest.state
        await run.eng.close()

    asyncio.run(main())
