"""`python -m engine.testing.workload`: an engine process committing transactions, for crash tests
and the demo.

    python -m engine.testing.workload --dir D --wal logsvc --client-config client.toml --shard 3 \\
        --writers 8 --seconds 10 --run-id 1
    python -m engine.testing.workload --dir D ... --verify          # JSON: what the WAL holds
    python -m engine.testing.workload --dir D --flush-age-ms 200 --merge-l1-blocks 4 \
        --checkpoint-ms 500 --wal-reserve-entries 16 --delete-every 5   # storage busy too

Every transaction inserts one row into `demo.orders` and `LINES_PER_ORDER` rows into
`demo.lines`, all keyed by the transaction's number (`run_id * RUN_SPAN + writer * WRITER_SPAN
+ i`), so a checker can tell that a transaction is wholly there or wholly absent. After each
commit returns (durable: fsynced locally, or on a majority of logsvc replicas) the process
prints `ack <number>` on stdout and flushes: a parent that kills it with SIGKILL knows exactly
which commits were acknowledged.

Storage (issue 14): the objects are where `--objects` says (engine/cli.py: DIR/objects by
default, or an S3 bucket). The engine's own policy flushes, merges and checkpoints on a scale of
minutes; the storage options make it do all of it within a second, so that a kill lands while
it rewrites: `--flush-age-ms` (an open block older than this is sealed and flushed),
`--merge-l1-blocks` (L1 blocks merged into an L2 segment), `--compact-fraction` (a block this
dead is rewritten), `--checkpoint-ms` (the process also takes a checkpoint this often),
`--wal-reserve-entries` (entries kept below a checkpoint when the WAL is truncated),
`--history-retention-ms` (the history window the WAL and objects are kept for; 0: none).
`--delete-every K`: every Kth transaction of a writer deletes, in one transaction, its oldest
order still there with its lines: it prints `deleting <number>` before, `del <number>` once the
delete committed (an order whose deletion was begun and not acknowledged may be either way).
Deletes are what flushes and merges must carry over, and what compactions drop.

Exit codes: 0 done, 3 fenced (another engine took the WAL's lease; one line on stderr says
so), 4 the WAL failed otherwise, 2 bad arguments.

`--verify` opens the engine read-only (replay for reading; over logsvc without a lease, so it
fences nobody) and prints one JSON object: the transaction numbers in `orders`, the number of
lines per order, orphan lines, the digest, the visible commit_ts, how long replay took, the
storage figures (engine/metrics.py `storage_stats`) and the audit of the objects against what
the engine refers to (`audit_objects`: `missing` must be empty; `unreferenced` are what a crash
left behind, deleted by the next writable open).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine import limits as engine_limits
from engine import metrics
from engine.cli import (
    add_object_options,
    add_wal_options,
    objects_from_args,
    objects_options_error,
    wal_options_error,
)
from engine.compaction import Policy
from engine.engine import Engine
from engine.errors import (
    AlreadyExists,
    EngineError,
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
    parser = argparse.ArgumentParser(prog="python -m engine.testing.workload", description=__doc__)
    parser.add_argument("--dir", required=True)
    add_wal_options(parser)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--txns", type=int, default=0, help="stop after this many (0: no limit)")
    parser.add_argument("--seconds", type=float, default=10.0, help="stop after this long")
    parser.add_argument("--run-id", type=int, default=1)
    parser.add_argument("--verify", action="store_true")
    add_object_options(parser)
    storage = parser.add_argument_group("storage (module docstring)")
    storage.add_argument("--flush-age-ms", type=int)
    storage.add_argument("--merge-l1-blocks", type=int)
    storage.add_argument("--compact-fraction", type=float)
    storage.add_argument("--checkpoint-ms", type=int, default=0, help="0: the engine's own")
    storage.add_argument("--wal-reserve-entries", type=int)
    storage.add_argument("--history-retention-ms", type=int, help="0: no history window")
    storage.add_argument("--delete-every", type=int, default=0, help="0: no deletes")
    return parser


def _storage_options_error(args: argparse.Namespace) -> str | None:
    if args.flush_age_ms is not None and args.flush_age_ms < 1:
        return "--flush-age-ms must be >= 1"
    if args.merge_l1_blocks is not None and args.merge_l1_blocks < 2:
        return "--merge-l1-blocks must be >= 2"
    if args.compact_fraction is not None and not 0 < args.compact_fraction <= 1:
        return "--compact-fraction must be in (0, 1]"
    if args.checkpoint_ms < 0 or args.delete_every < 0:
        return "--checkpoint-ms and --delete-every must be >= 0"
    if args.wal_reserve_entries is not None and args.wal_reserve_entries < 0:
        return "--wal-reserve-entries must be >= 0"
    window_max = engine_limits.HISTORY_RETENTION_MS_MAX
    if args.history_retention_ms is not None and not 0 <= args.history_retention_ms <= window_max:
        return f"--history-retention-ms must be in [0, {window_max}]"
    return None


def _policy(args: argparse.Namespace) -> Policy | None:
    """The engine's default policy with what the options change (None: all default)."""
    changes: dict[str, Any] = {}
    if args.flush_age_ms is not None:
        changes["flush_age_ms"] = args.flush_age_ms
    if args.merge_l1_blocks is not None:
        changes["merge_l1_blocks"] = args.merge_l1_blocks
    if args.compact_fraction is not None:
        changes["compact_deleted_fraction"] = args.compact_fraction
    if args.history_retention_ms is not None:
        changes["history_retention_ms"] = args.history_retention_ms
    return dataclasses.replace(Policy(), **changes) if changes else None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    problem = wal_options_error(args) or objects_options_error(args) or _storage_options_error(args)
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
    engine = await Engine.open(
        args.dir,
        wal=args.wal,
        client_config=args.client_config,
        shard=args.shard,
        read_only=read_only,
        objects=objects_from_args(args),
        policy=_policy(args),
    )
    if engine.checkpointer is not None and args.wal_reserve_entries is not None:
        engine.checkpointer.wal_reserve_entries = args.wal_reserve_entries
    return engine


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
    checkpoints: asyncio.Task[None] | None = None
    try:
        await _setup(engine)
        deadline = time.monotonic() + args.seconds
        committed = 0
        out = sys.stdout
        if args.checkpoint_ms and engine.checkpointer is not None:
            checkpoints = asyncio.ensure_future(_checkpoint_every(engine, args.checkpoint_ms))

        async def writer(number: int) -> None:
            nonlocal committed
            base = args.run_id * RUN_SPAN + number * WRITER_SPAN
            mine: collections.deque[int] = collections.deque()
            i = 0
            while time.monotonic() < deadline and (not args.txns or committed < args.txns):
                if i == WRITER_SPAN:
                    return  # the next number would be another writer's
                txn_no = base + i
                i += 1
                committed += 1  # claimed; --txns bounds what is started
                if args.delete_every and i % args.delete_every == 0 and mine:
                    gone = mine.popleft()
                    # Said before it starts: a kill may come after it committed and before
                    # `del`, so the parent must know that this order may be gone.
                    out.write(f"deleting {gone}\n")
                    out.flush()
                    await _delete_order(engine, gone)
                    out.write(f"del {gone}\n")
                    out.flush()
                    continue
                await _commit_order(engine, number, txn_no)
                mine.append(txn_no)
                out.write(f"ack {txn_no}\n")
                out.flush()

        await asyncio.gather(*(writer(n) for n in range(args.writers)))
    finally:
        if checkpoints is not None:
            checkpoints.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checkpoints
        if engine.failed is None:
            await engine.close()
        else:
            await engine.abort()


async def _checkpoint_every(engine: Engine, interval_ms: int) -> None:
    """A checkpoint every `interval_ms` on top of the engine's own (`--checkpoint-ms`). An
    object store error is the engine's to count and retry; a failed WAL ends the writers."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        try:
            await engine.checkpoint()
        except EngineError as exc:
            if engine.failed is not None:
                return
            print(f"checkpoint failed, tried again later: {exc!r}", file=sys.stderr)


async def _delete_order(engine: Engine, txn_no: int) -> None:
    """Delete order `txn_no` and its lines in one transaction (`--delete-every`)."""
    for attempt in range(COMMIT_TRIES_MAX):
        try:
            async with engine.transaction() as txn:
                await txn.table(DB, "orders").delete([txn_no])
                await txn.table(DB, "lines").delete(
                    [(txn_no, line) for line in range(LINES_PER_ORDER)]
                )
            return
        except (WriteConflict, Overloaded):
            # A flush or merge moved the rows under this transaction and it could not follow
            # them (decision 0006): nothing was deleted; try again on a new snapshot.
            if attempt + 1 == COMMIT_TRIES_MAX:
                raise
            await asyncio.sleep(RETRY_DELAY_S * (attempt + 1))


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
                    **await _storage_of(engine),
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
            **await _storage_of(engine),
        }
    finally:
        await engine.close()


async def _storage_of(engine: Engine) -> dict[str, object]:
    audit = await asyncio.to_thread(metrics.audit_objects, engine)
    return {
        "storage": dataclasses.asdict(metrics.storage_stats(engine)),
        "audit": dataclasses.asdict(audit),
    }


# --- the parent's side: run the workload as a child process --------------------------------


class WorkloadProcess:
    """A `python -m engine.testing.workload` child, its acknowledged transactions read from its
    stdout by a thread. Stop it with `kill()` (SIGKILL) or wait for it with `wait()`; both are
    bounded, and `kill()` is safe to call in a `finally` whatever happened."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.acked: list[int] = []
        self.deleted: list[int] = []
        """Orders whose deletion was acknowledged (`del <number>`, `--delete-every`)."""
        self.deleting: list[int] = []
        """Orders whose deletion was begun (`deleting <number>`): acknowledged or not."""
        self.acked_at_s: list[float] = []
        """When each ack was read (time.monotonic()), in the order of `acked`."""
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "engine.testing.workload", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
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
            elif line.startswith("del "):
                with self._lock:
                    self.deleted.append(int(line[4:]))
            elif line.startswith("deleting "):
                with self._lock:
                    self.deleting.append(int(line[9:]))

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
    storage: dict[str, Any] = field(default_factory=dict)
    """engine.metrics.StorageStats as JSON."""
    audit: dict[str, Any] = field(default_factory=dict)
    """engine.metrics.ObjectAudit as JSON."""

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


def verify(args: Sequence[str], env: Mapping[str, str] | None = None) -> Verified:
    """Run `--verify` with the same engine arguments in a child process."""
    done = subprocess.run(
        [sys.executable, "-m", "engine.testing.workload", *args, "--verify"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    if done.returncode != 0:  # say why: the child's own words, not only its exit status
        raise VerifyFailed(f"--verify exited {done.returncode}: {done.stderr.strip()[-4000:]}")
    return Verified(**json.loads(done.stdout))


class VerifyFailed(Exception):
    """The `--verify` child could not read the engine back."""


if __name__ == "__main__":
    sys.exit(main())
