"""A soak workload process: a compute node (`--mode cn`: `ComputeNode` over `NetworkTN`) or
an embedded engine (`--mode embedded`: `Engine.open(DIR)`, file WAL) committing a mixed
workload into `soak.kv (id int64 primary key, v int64)` until it is killed.

    python -m tests.soak.worker --mode cn --name cn-1 --key-base 1000000000000 \\
        --tns 127.0.0.1:7301,127.0.0.1:7302 --token-file tn.token --objects DIR/objects
    python -m tests.soak.worker --mode embedded --name embedded --key-base ... --dir D
    python -m tests.soak.worker --mode embedded --dir D --verify --out rows.arrow
    python -m tests.soak.worker --mode tn --dir SCRATCH --client-config client.toml \\
        --shard 1 --objects DIR/objects --verify --out rows.arrow   # the TNs' WAL, no lease

Writers (`--writers`) each own a pool of keys (`--pool`) in [key_base, key_base + 10**12)
and, one transaction after another, insert 1-5 absent keys, update 1-3 present ones, or
delete 1-3 present ones (v is unique to each transaction). A large-transaction loop inserts
`--large-rows` keys in one transaction every `--large-every-s` (the embedded engine's
200,000 rows spill to an object before commit; a compute node's transaction is bounded by
the workspace, 1 MiB, so its large ones are 50,000 rows) and deletes the oldest ones, a
chunk per transaction, so the table stays bounded. A scanner reads its key space at the
newest timestamp every few seconds and again at an older one it read before: the same
timestamp must give the same rows.

Every transaction is announced on stdout before it commits and its end after (one line
each, flushed), for the parent's ledger (tests/soak/ledger.py):

    begin <op> {"w": {"<key>": <v or null>}, "c": [[lo, hi, v or null]]}
    ack <op> <commit_ts> | fail <op> <reason> | unknown <op> <reason>
    scan <ts> <rows> | scanbad <ts> <what> | scanskip <ts>

A key of an `unknown` transaction is never written again by this process.
Exit status: 0 after `--seconds`, 4 the embedded engine's WAL failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather

from engine import Column, Schema
from engine.engine import Engine
from engine.errors import (
    BadInput,
    DuplicateKey,
    OutcomeUnknown,
    Overloaded,
    SnapshotUnavailable,
    TxnTooLarge,
    WalFailed,
    WriteConflict,
)
from engine.tn.errors import TNUnavailable
from engine.txn import Transaction

DB, TABLE = "soak", "kv"
SCHEMA = Schema([Column("id", "int64"), Column("v", "int64")], primary_key=["id"])
KEY_SPACE = 10**12
"""Keys of one worker incarnation: [key_base, key_base + KEY_SPACE)."""
WRITER_SPAN = 10**8
CHUNK_BASE = 5 * 10**11
"""Large transactions' keys start here in a key space (below it: the writers')."""
CHUNK_ROWS_MAX = 50_000
"""Rows of one chunk: one delete transaction (a compute node's workspace holds ~65,000
int64 pairs; TXN_DELETES_MAX is 100,000)."""
LIVE_LARGE_MAX = 2
"""Large inserts kept; older ones are deleted."""
SCAN_EVERY_S = 5.0
SCANS_KEPT = 4
SETUP_TRIES_MAX = 10
NOT_APPLIED = (
    WriteConflict,
    DuplicateKey,
    TxnTooLarge,
    BadInput,
    TNUnavailable,
    Overloaded,
    SnapshotUnavailable,
)
"""A commit that raised one of these wrote nothing (typed answers, or nothing sent)."""


class Out:
    """The announcement lines, flushed one by one (a SIGKILL loses none that was written)."""

    def __init__(self) -> None:
        self.op_no = 0

    def line(self, text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


class Target:
    """What the workload commits through: a compute node or an embedded engine."""

    def __init__(self, node: Any) -> None:
        self.node = node

    def transaction(self) -> Any:
        return self.node.transaction()

    @contextlib.asynccontextmanager
    async def view(self, ts: int | None) -> AsyncIterator[Transaction]:
        if isinstance(self.node, Engine):
            async with self.node.snapshot(self.node.visible_ts if ts is None else ts) as view:
                yield view
        else:
            async with self.node.snapshot(ts) as view:
                yield view


class Workload:
    def __init__(self, args: argparse.Namespace, target: Target, out: Out) -> None:
        self.args = args
        self.target = target
        self.out = out
        self.rng = random.Random(args.seed)
        self.large_no = 0
        self.live: collections.deque[tuple[int, int]] = collections.deque()
        """Chunks [lo, hi) of large inserts this process knows present, oldest first."""
        for text in filter(None, args.adopt.split(",")):
            lo, hi = (int(part) for part in text.split(":"))
            self.live.append((lo, hi))
        self.wal_failed = False

    async def commit(
        self,
        writes: dict[int, int | None],
        chunks: Sequence[tuple[int, int, int | None]],
        body: Callable[[Any], Any],
    ) -> str:
        """Announce, run `body(table)` in a transaction, commit; "ack", "fail" or
        "unknown"."""
        self.out.op_no += 1
        op = f"{self.args.name}/{self.out.op_no}"
        announced = {"w": {str(k): v for k, v in writes.items()}, "c": [list(c) for c in chunks]}
        self.out.line(f"begin {op} {json.dumps(announced, separators=(',', ':'))}")
        try:
            async with self.target.transaction() as txn:
                await body(txn.table(DB, TABLE))
        except NOT_APPLIED as exc:
            self.out.line(f"fail {op} {type(exc).__name__}")
            return "fail"
        except OutcomeUnknown as exc:
            self.out.line(f"unknown {op} {type(exc).__name__}")
            return "unknown"
        except WalFailed as exc:
            self.out.line(f"unknown {op} {type(exc).__name__}")
            self.wal_failed = True
            raise
        except Exception as exc:  # any other end leaves the outcome open
            print(f"{op}: {exc!r}", file=sys.stderr, flush=True)
            self.out.line(f"unknown {op} {type(exc).__name__}")
            return "unknown"
        self.out.line(f"ack {op} {txn.commit_ts}")
        return "ack"

    def value(self) -> int:
        return int(self.args.key_base) + self.out.op_no + 1

    async def writer(self, number: int) -> None:
        base = self.args.key_base + number * WRITER_SPAN
        present: set[int] = set()
        quarantined: set[int] = set()
        rng = random.Random(self.rng.random())
        while True:
            usable_present = sorted(present - quarantined)
            roll = rng.random()
            value = self.value()
            if roll < 0.4 or not usable_present:
                absent = [
                    base + slot
                    for slot in range(self.args.pool)
                    if base + slot not in present and base + slot not in quarantined
                ]
                if not absent:
                    await asyncio.sleep(self.args.pace_s)
                    continue
                keys = rng.sample(absent, min(len(absent), rng.randint(1, 5)))
                kind = "insert"
            elif roll < 0.75:
                keys = rng.sample(usable_present, min(len(usable_present), rng.randint(1, 3)))
                kind = "update"
            else:
                keys = rng.sample(usable_present, min(len(usable_present), rng.randint(1, 3)))
                kind = "delete"
            writes: dict[int, int | None] = {k: None if kind == "delete" else value for k in keys}

            async def body(
                table: Any, kind: str = kind, keys: list[int] = keys, value: int = value
            ) -> None:
                if kind == "insert":
                    await table.insert(rows(keys, value))
                elif kind == "update":
                    await table.update(keys, {"v": value})
                else:
                    await table.delete(keys)

            outcome = await self.commit(writes, (), body)
            if outcome == "ack":
                for key, written in writes.items():
                    (present.add if written is not None else present.discard)(key)
            elif outcome == "unknown":
                quarantined.update(writes)
            await asyncio.sleep(self.args.pace_s)

    async def large(self) -> None:
        chunk_rows = min(CHUNK_ROWS_MAX, self.args.large_rows)
        chunks_per_insert = -(-self.args.large_rows // chunk_rows)
        while True:
            await asyncio.sleep(self.args.large_every_s * (0.5 + self.rng.random()))
            lo = self.args.key_base + CHUNK_BASE + self.large_no * chunks_per_insert * chunk_rows
            self.large_no += 1
            value = self.value()
            chunks = [
                (lo + i * chunk_rows, lo + min((i + 1) * chunk_rows, self.args.large_rows), value)
                for i in range(chunks_per_insert)
            ]

            async def body(table: Any, lo: int = lo, value: int = value) -> None:
                await table.insert(rows(range(lo, lo + self.args.large_rows), value))

            if await self.commit({}, chunks, body) == "ack":
                self.live.extend((c[0], c[1]) for c in chunks)
            while len(self.live) > LIVE_LARGE_MAX * chunks_per_insert:
                c_lo, c_hi = self.live.popleft()

                async def delete(table: Any, c_lo: int = c_lo, c_hi: int = c_hi) -> None:
                    await table.delete(list(range(c_lo, c_hi)))

                if await self.commit({}, [(c_lo, c_hi, None)], delete) == "fail":
                    self.live.appendleft((c_lo, c_hi))  # nothing deleted: again next time
                    break

    async def scanner(self) -> None:
        """Reads at timestamps: the newest, and again one read before (same rows)."""
        seen: collections.OrderedDict[int, tuple[int, int]] = collections.OrderedDict()
        while True:
            await asyncio.sleep(SCAN_EVERY_S)
            newest = await self._read(None)
            if newest is not None:
                seen[newest[0]] = newest[1]
                while len(seen) > SCANS_KEPT:
                    seen.popitem(last=False)
                self.out.line(f"scan {newest[0]} {newest[1][0]}")
            older = next((ts for ts in seen if newest is None or ts != newest[0]), None)
            if older is None:
                continue
            expected = seen.pop(older)
            again = await self._read(older)
            if again is None:
                continue
            if again[1] != expected:
                self.out.line(f"scanbad {older} first {expected} now {again[1]}")
            else:
                self.out.line(f"scan {older} {expected[0]}")

    async def _read(self, ts: int | None) -> tuple[int, tuple[int, int]] | None:
        """(the view's ts, (rows, sum of v)) of this process's key space at `ts` (None:
        the newest); None when the view is unavailable or the read failed."""
        lo, hi = self.args.key_base, self.args.key_base + KEY_SPACE
        where = (pc.field("id") >= lo) & (pc.field("id") < hi)
        try:
            async with self.target.view(ts) as view:
                at = view.start_ts
                got = await view.table(DB, TABLE).scan(columns=["v"], filter=where)
        except SnapshotUnavailable:
            self.out.line(f"scanskip {ts}")
            return None
        except Exception as exc:  # a read during a failover: later
            print(f"scan at {ts}: {exc!r}", file=sys.stderr, flush=True)
            return None
        return at, (got.num_rows, int(pc.sum(got.column("v")).as_py() or 0))


def rows(keys: Sequence[int] | range, value: int) -> pa.Table:
    ids = pa.array(keys, pa.int64())
    return pa.table({"id": ids, "v": pa.repeat(value, len(ids)).cast(pa.int64())})


async def _setup(target: Target) -> None:
    for _ in range(SETUP_TRIES_MAX):
        try:
            async with target.transaction() as txn:
                if DB not in txn.databases():
                    await txn.create_database(DB)
                if TABLE not in txn.tables(DB):
                    await txn.create_table(DB, TABLE, SCHEMA)
            return
        except (WriteConflict, BadInput, TNUnavailable, OutcomeUnknown):
            await asyncio.sleep(1.0)
    raise RuntimeError("could not create the soak table")


async def _open(args: argparse.Namespace) -> tuple[Target, Callable[[], Any]]:
    if args.mode == "embedded":
        engine = await Engine.open(args.dir)
        return Target(engine), engine.close
    from engine.cn.client import NetworkTN
    from engine.cn.node import ComputeNode
    from engine.objects.store import LocalDirStore
    from engine.tn.limits import ClientOptions

    with open(args.token_file) as f:
        token = f.read().strip()
    options = ClientOptions(connect_timeout_s=1.0, request_timeout_s=10.0, failover_wait_s_max=30.0)
    tn = NetworkTN(args.tns.split(","), token, options)
    store = LocalDirStore(args.objects, read_only=True)
    node = ComputeNode(tn, store, client_id=args.name)

    async def close() -> None:
        await node.close()
        await tn.close()
        store.close()

    return Target(node), close


async def _run(args: argparse.Namespace) -> int:
    target, close = await _open(args)
    out = Out()
    try:
        await _setup(target)
        work = Workload(args, target, out)
        tasks = [work.writer(n) for n in range(args.writers)]
        if args.large_rows:
            tasks.append(work.large())
        tasks.append(work.scanner())
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), args.seconds)
        except TimeoutError:
            return 0
        except WalFailed as exc:
            print(f"the WAL failed: {exc!r}", file=sys.stderr, flush=True)
            return 4
        return 0
    finally:
        await close()


async def _verify(args: argparse.Namespace) -> dict[str, object]:
    """The state as an engine reopening its WAL reads it: the embedded engine's own
    directory, or (`--mode tn`) the TNs' WAL on logsvc with their objects, read-only and
    without a lease (the active TN is not fenced)."""
    if args.mode == "tn":
        from engine.objects.store import LocalDirStore

        store = LocalDirStore(args.objects, read_only=True)
        engine = await Engine.open(
            args.dir,
            wal="logsvc",
            client_config=args.client_config,
            shard=args.shard,
            read_only=True,
            objects=store,
            maintenance=False,
        )
    else:
        engine = await Engine.open(args.dir, read_only=True)
    try:
        async with engine.snapshot(engine.visible_ts) as view:
            if DB in view.databases() and TABLE in view.tables(DB):
                table = await view.table(DB, TABLE).scan(columns=["id", "v"])
            else:
                table = pa.table({"id": [], "v": []}, schema=SCHEMA.to_arrow())
        feather.write_feather(table, args.out)
        return {"rows": table.num_rows, "visible_ts": engine.visible_ts}
    finally:
        await engine.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.soak.worker", description=__doc__)
    parser.add_argument("--mode", choices=["cn", "embedded", "tn"], required=True)
    parser.add_argument("--name", default="worker")
    parser.add_argument("--key-base", type=int, default=KEY_SPACE)
    parser.add_argument("--dir", help="the embedded engine's directory")
    parser.add_argument("--tns", help="the TNs' addresses, comma separated (cn)")
    parser.add_argument("--token-file", help="the TNs' token (cn)")
    parser.add_argument("--objects", help="the TNs' object directory (cn, tn)")
    parser.add_argument("--client-config", help="--mode tn: the logsvc cluster's client.toml")
    parser.add_argument("--shard", type=int, default=1, help="--mode tn: the TNs' WAL shard")
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--pool", type=int, default=500)
    parser.add_argument("--pace-s", type=float, default=0.05)
    parser.add_argument("--large-rows", type=int, default=0)
    parser.add_argument("--large-every-s", type=float, default=90.0)
    parser.add_argument("--adopt", default="", help="chunks lo:hi,... to delete later")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("--out", help="--verify: where the rows go (Arrow IPC file)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.mode == "embedded" and not args.dir:
        print("error: --mode embedded needs --dir", file=sys.stderr)
        return 2
    if args.mode == "tn" and not (args.verify and args.client_config and args.objects):
        print("error: --mode tn is --verify only, with --client-config and --objects")
        return 2
    if args.mode == "cn" and not (args.tns and args.token_file and args.objects):
        print("error: --mode cn needs --tns, --token-file and --objects", file=sys.stderr)
        return 2
    if args.key_base % KEY_SPACE or not 1 <= args.pool <= WRITER_SPAN:
        print("error: --key-base must be a multiple of 10**12, --pool in [1, 10**8]")
        return 2
    if args.verify:
        if args.mode == "cn" or not args.out or not args.dir:
            print("error: --verify needs --mode embedded or tn, --dir and --out", file=sys.stderr)
            return 2
        print(json.dumps(asyncio.run(_verify(args))), flush=True)
        return 0
    started = time.monotonic()
    code = asyncio.run(_run(args))
    print(f"stopped after {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
