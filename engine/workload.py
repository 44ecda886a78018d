"""`python -m engine.workload`: an engine process committing transactions, for crash tests
and the demo.

    python -m engine.workload --dir D --wal logsvc --client-config client.toml --shard 3 \\
        --writers 8 --seconds 10 --run-id 1
    python -m engine.workload --dir D ... --verify          # JSON: what the WAL holds

Every transaction inserts one row into `demo.orders` and `LINES_PER_ORDER` rows into
`demo.lines`, all keyed by the transaction's number (`run_id * RUN_SPAN + writer * WRITER_SPAN
+ i`), so a checker can tell that a transaction is wholly there or wholly absent. After each
commit returns (durable: fsynced locally, or on a majority of logsvc replicas) the process
prints `ack <number>` on stdout and flushes: a parent that kills it with SIGKILL knows exactly
which commits were acknowledged.

Exit codes: 0 done, 3 fenced (another engine took the WAL's lease; one line on stderr says
so), 4 the WAL failed otherwise, 2 bad arguments.

`--verify` opens the engine read-only (replay for reading; over logsvc without a lease, so it
fences nobody) and prints one JSON object: the transaction numbers in `orders`, the number of
lines per order, orphan lines, the digest, the visible commit_ts and how long replay took.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from engine.cli import add_wal_options, wal_options_error
from engine.engine import Engine
from engine.errors import AlreadyExists, Fenced, WalFailed, WriteConflict
from engine.schema import Column, Schema

DB = "demo"
ORDERS = Schema(
    [
        Column("id", "int64"),
        Column("writer", "int32"),
        Column("amount", "float64"),
        Column("note", "string", nullable=True),
    ],
    primary_key=["id"],
)
LINES = Schema(
    [Column("order_id", "int64"), Column("line", "int32"), Column("qty", "int32")],
    primary_key=["order_id", "line"],
)
LINES_PER_ORDER = 2
WRITER_SPAN = 10**7
RUN_SPAN = 10**10
WRITERS_MAX = 256
SETUP_TRIES_MAX = 8


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m engine.workload", description=__doc__)
    parser.add_argument("--dir", required=True)
    add_wal_options(parser)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--txns", type=int, default=0, help="stop after this many (0: no limit)")
    parser.add_argument("--seconds", type=float, default=10.0, help="stop after this long")
    parser.add_argument("--run-id", type=int, default=1)
    parser.add_argument("--verify", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    problem = wal_options_error(args)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not 1 <= args.writers <= WRITERS_MAX or args.seconds <= 0 or args.txns < 0:
        print(
            f"error: --writers in [1, {WRITERS_MAX}], --seconds > 0, --txns >= 0", file=sys.stderr
        )
        return 2
    if args.verify:
        print(json.dumps(asyncio.run(_verify(args))), flush=True)
        return 0
    try:
        asyncio.run(_run(args))
    except Fenced as exc:
        print(
            f"engine fenced: another engine took the WAL's lease; exiting ({exc})", file=sys.stderr
        )
        return 3
    except WalFailed as exc:
        print(f"engine stopped: the WAL failed ({exc})", file=sys.stderr)
        return 4
    return 0


async def _open(args: argparse.Namespace, read_only: bool) -> Engine:
    return await Engine.open(
        args.dir,
        wal=args.wal,
        client_config=args.client_config,
        shard=args.shard,
        read_only=read_only,
    )


async def _setup(engine: Engine) -> None:
    for _ in range(SETUP_TRIES_MAX):
        try:
            async with engine.transaction() as txn:
                if DB not in txn.databases():
                    await txn.create_database(DB)
                tables = txn.tables(DB)
                if "orders" not in tables:
                    await txn.create_table(DB, "orders", ORDERS)
                if "lines" not in tables:
                    await txn.create_table(DB, "lines", LINES)
            return
        except (AlreadyExists, WriteConflict):
            continue  # another process created them meanwhile: look again
    raise RuntimeError("could not create the workload's tables")


async def _run(args: argparse.Namespace) -> None:
    engine = await _open(args, read_only=False)
    try:
        await _setup(engine)
        deadline = time.monotonic() + args.seconds
        committed = 0
        out = sys.stdout

        async def writer(number: int) -> None:
            nonlocal committed
            base = args.run_id * RUN_SPAN + number * WRITER_SPAN
            i = 0
            while time.monotonic() < deadline and (not args.txns or committed < args.txns):
                txn_no = base + i
                i += 1
                committed += 1  # claimed; --txns bounds what is started
                async with engine.transaction() as txn:
                    await txn.table(DB, "orders").insert(
                        [{"id": txn_no, "writer": number, "amount": i * 0.5, "note": None}]
                    )
                    await txn.table(DB, "lines").insert(
                        [
                            {"order_id": txn_no, "line": line, "qty": line + 1}
                            for line in range(LINES_PER_ORDER)
                        ]
                    )
                out.write(f"ack {txn_no}\n")
                out.flush()

        await asyncio.gather(*(writer(n) for n in range(args.writers)))
    finally:
        if engine.failed is None:
            await engine.close()
        else:
            await engine.abort()


async def _verify(args: argparse.Namespace) -> dict[str, object]:
    started = time.monotonic()
    engine = await _open(args, read_only=True)
    replay_s = time.monotonic() - started
    try:
        async with engine.transaction() as txn:
            if DB not in txn.databases():
                return {
                    "orders": [],
                    "lines_per_order": {},
                    "orphan_lines": 0,
                    "digest": engine.digest(),
                    "visible_ts": engine.visible_ts,
                    "replay_s": round(replay_s, 3),
                }
            orders = (await txn.table(DB, "orders").scan(columns=["id"])).column("id").to_pylist()
            lines = (
                (await txn.table(DB, "lines").scan(columns=["order_id"]))
                .column("order_id")
                .to_pylist()
            )
        per_order = Counter(lines)
        order_set = set(orders)
        return {
            "orders": sorted(orders),
            "lines_per_order": {str(k): v for k, v in per_order.items()},
            "orphan_lines": sum(v for k, v in per_order.items() if k not in order_set),
            "digest": engine.digest(),
            "visible_ts": engine.visible_ts,
            "replay_s": round(replay_s, 3),
        }
    finally:
        await engine.close()


# --- the parent's side: run the workload as a child process --------------------------------


class WorkloadProcess:
    """A `python -m engine.workload` child, its acknowledged transactions read from its
    stdout by a thread. Stop it with `kill()` (SIGKILL) or wait for it with `wait()`; both are
    bounded, and `kill()` is safe to call in a `finally` whatever happened."""

    def __init__(self, args: Sequence[str]) -> None:
        self.acked: list[int] = []
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "engine.workload", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr = ""
        self._reaped = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith("ack "):
                with self._lock:
                    self.acked.append(int(line[4:]))

    def acks(self) -> int:
        with self._lock:
            return len(self.acked)

    def wait_acks(self, count: int, timeout_s: float) -> bool:
        """True once `count` commits were acknowledged; False if the process ended or the
        time ran out first."""
        deadline = time.monotonic() + timeout_s
        while self.acks() < count:
            if self._process.poll() is not None or time.monotonic() > deadline:
                return self.acks() >= count
            time.sleep(0.01)
        return True

    def kill(self) -> None:
        """SIGKILL (a crash), then collect every ack it printed before it died."""
        if self._process.poll() is None:
            self._process.kill()
        self.wait(timeout_s=30)

    def wait(self, timeout_s: float) -> int:
        """Its exit code, once it has exited (SIGKILLed after `timeout_s`)."""
        if self._reaped:
            return self._process.returncode
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=30)
        self._reader.join(timeout=30)
        assert self._process.stderr is not None
        self.stderr = self._process.stderr.read()
        self._process.stderr.close()
        self._reaped = True
        return self._process.returncode


@dataclass(frozen=True, slots=True)
class Verified:
    """What `--verify` found in the WAL."""

    orders: list[int]
    lines_per_order: dict[str, int]
    orphan_lines: int
    digest: str
    visible_ts: int
    replay_s: float

    def whole(self) -> bool:
        """Every order has all its lines and no line is without its order."""
        return (
            self.orphan_lines == 0
            and len(self.lines_per_order) == len(self.orders)
            and all(self.lines_per_order.get(str(o)) == LINES_PER_ORDER for o in self.orders)
        )


def verify(args: Sequence[str]) -> Verified:
    """Run `--verify` with the same engine arguments in a child process."""
    done = subprocess.run(
        [sys.executable, "-m", "engine.workload", *args, "--verify"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return Verified(**json.loads(done.stdout))


if __name__ == "__main__":
    sys.exit(main())
