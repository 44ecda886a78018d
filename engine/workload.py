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
import itertools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.cli import add_wal_options, wal_options_error
from engine.engine import Engine
from engine.errors import (
    AlreadyExists,
    Fenced,
    NotFound,
    Overloaded,
    WalFailed,
    WriteConflict,
)
from engine.schema import Column, Schema
from tae_driver.errors import BackendFenced

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
RUN_ID_MAX = (2**63 - 1) // RUN_SPAN - 1  # every transaction number fits an int64 key
WRITERS_MAX = 256
assert WRITERS_MAX * WRITER_SPAN <= RUN_SPAN  # one run's numbers never reach the next run's
SETUP_TRIES_MAX = 8
COMMIT_TRIES_MAX = 8
"""Tries of one transaction after a WriteConflict or Overloaded, each rolled back."""
RETRY_DELAY_S = 0.01
READER_JOIN_S_MAX = 30.0
"""How long the parent waits for a dead child's output pipes to drain."""
STDERR_LINES_MAX = 1000
CAUSES_MAX = 16
"""Links of an exception's cause chain followed to find what fenced the engine."""


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
    if (
        not 1 <= args.writers <= WRITERS_MAX
        or args.seconds <= 0
        or args.txns < 0
        or not 0 <= args.run_id <= RUN_ID_MAX
    ):
        print(
            f"error: --writers in [1, {WRITERS_MAX}], --seconds > 0, --txns >= 0, "
            f"--run-id in [0, {RUN_ID_MAX}]",
            file=sys.stderr,
        )
        return 2
    if args.verify:
        try:
            found = asyncio.run(_verify(args))
        except NotFound as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(json.dumps(found), flush=True)
        return 0
    try:
        asyncio.run(_run(args))
    except Fenced as exc:
        print(_fenced_line(exc), file=sys.stderr)
        return 3
    except WalFailed as exc:
        print(f"engine stopped: the WAL failed ({exc})", file=sys.stderr)
        return 4
    return 0


def _fenced_line(exc: Fenced) -> str:
    """One line saying who fenced this engine, from the backend's `BackendFenced` when the
    error carries it as a cause (a commit that was in flight), else the error's own text."""
    cause: BaseException | None = exc
    for _ in range(CAUSES_MAX):
        if cause is None or isinstance(cause, BackendFenced):
            break
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, BackendFenced):
        return (
            f"engine fenced: another engine took the WAL's lease (epoch {cause.current_epoch}, "
            f"holder {cause.current_holder}; this engine's epoch was {cause.epoch}); exiting"
        )
    return f"engine fenced: another engine took the WAL's lease; exiting ({exc})"


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
                if i == WRITER_SPAN:
                    return  # the next number would be another writer's
                txn_no = base + i
                i += 1
                committed += 1  # claimed; --txns bounds what is started
                await _commit_order(engine, number, txn_no)
                out.write(f"ack {txn_no}\n")
                out.flush()

        await asyncio.gather(*(writer(n) for n in range(args.writers)))
    finally:
        if engine.failed is None:
            await engine.close()
        else:
            await engine.abort()


async def _commit_order(engine: Engine, writer: int, txn_no: int) -> None:
    """Commit order `txn_no` and its lines in one transaction. A `WriteConflict` or a full
    queue (`Overloaded`) rolled it back, so it is tried again, a bounded number of times: keys
    are unique to each transaction, so neither should happen at all."""
    for attempt in range(COMMIT_TRIES_MAX):
        try:
            async with engine.transaction() as txn:
                await txn.table(DB, "orders").insert(
                    [{"id": txn_no, "writer": writer, "amount": txn_no % 1000 * 0.5, "note": None}]
                )
                await txn.table(DB, "lines").insert(
                    [
                        {"order_id": txn_no, "line": line, "qty": line + 1}
                        for line in range(LINES_PER_ORDER)
                    ]
                )
            return
        except (WriteConflict, Overloaded):
            if attempt + 1 == COMMIT_TRIES_MAX:
                raise
            await asyncio.sleep(RETRY_DELAY_S * (attempt + 1))
    raise AssertionError("unreachable")


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
        self.acked_at_s: list[float] = []
        """When each ack was read (time.monotonic()), in the order of `acked`."""
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "engine.workload", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._stderr_lines: list[str] = []
        self._reaped = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # stderr is drained as it comes, so a child that writes much there never blocks on
        # a full pipe; kept up to STDERR_LINES_MAX lines.
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith("ack "):
                txn_no = int(line[4:])
                now_s = time.monotonic()
                with self._lock:
                    self.acked.append(txn_no)
                    self.acked_at_s.append(now_s)

    @property
    def stderr(self) -> str:
        """What it wrote on stderr so far (all of it once `wait()` or `kill()` returned)."""
        with self._lock:
            return "".join(self._stderr_lines)

    def _read_stderr(self) -> None:
        assert self._process.stderr is not None
        for line in self._process.stderr:
            with self._lock:
                if len(self._stderr_lines) < STDERR_LINES_MAX:
                    self._stderr_lines.append(line)

    def acks(self) -> int:
        with self._lock:
            return len(self.acked)

    def acks_since(self, since_s: float) -> int:
        """Acknowledgements read at or after `since_s` (a time.monotonic() value)."""
        with self._lock:
            return sum(1 for at_s in self.acked_at_s if at_s >= since_s)

    def longest_wait_s(self, since_s: float) -> float:
        """The longest time without an acknowledgement from `since_s` on: between `since_s`
        and the first ack after it, or between two acks after it (up to now if none came)."""
        with self._lock:
            times_s = [since_s, *(at_s for at_s in self.acked_at_s if at_s >= since_s)]
        if len(times_s) == 1:
            return time.monotonic() - since_s
        return max(later - earlier for earlier, later in itertools.pairwise(times_s))

    def wait_acks_since(self, since_s: float, count: int, timeout_s: float) -> bool:
        """True once `count` commits were acknowledged at or after `since_s`; False if the
        process ended or the time ran out first."""
        return self._wait(lambda: self.acks_since(since_s) >= count, timeout_s)

    def wait_acks(self, count: int, timeout_s: float) -> bool:
        """True once `count` commits were acknowledged; False if the process ended or the
        time ran out first."""
        return self._wait(lambda: self.acks() >= count, timeout_s)

    def _wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not done():
            if self._process.poll() is not None:
                self._reader.join(timeout=READER_JOIN_S_MAX)  # the acks it printed last
                return done()
            if time.monotonic() > deadline:
                return done()
            time.sleep(0.01)
        return True

    def kill(self) -> bool:
        """SIGKILL (a crash), then collect every ack it printed before it died. True if it
        was still running (the kill is what ended it)."""
        running = self._process.poll() is None
        if running:
            self._process.kill()
        self.wait(timeout_s=READER_JOIN_S_MAX)
        return running

    def wait(self, timeout_s: float) -> int:
        """Its exit code, once it has exited (SIGKILLed after `timeout_s`)."""
        if self._reaped:
            return self._process.returncode
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=30)
        self._reader.join(timeout=READER_JOIN_S_MAX)
        self._stderr_reader.join(timeout=READER_JOIN_S_MAX)
        for pipe, reader in (
            (self._process.stdout, self._reader),
            (self._process.stderr, self._stderr_reader),
        ):
            if pipe is not None and not reader.is_alive():
                pipe.close()
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

    def duplicates(self) -> int:
        """Orders present more than once (a primary key is unique: always 0)."""
        return len(self.orders) - len(set(self.orders))

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
