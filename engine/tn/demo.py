"""The TN/CN part of `logsvc demo` (`./dev demo`): the engine as a service on one machine.

An active TN and a standby TN (`python -m engine serve`, engine/tn/local.py) on a logsvc
shard; two compute nodes (engine/cn) commit concurrently through `NetworkTN` and query at
timestamps; the shard's logsvc leader is SIGKILLed under their commits; the active TN
checkpoints by itself (a 2 s `[maintenance] checkpoint_interval_ms` here, so it happens
within the demo)
and truncates the WAL; the active TN is SIGKILLed under commits and the standby takes over;
every acknowledged commit is read back through a fresh compute node, exactly once (a ledger
of acknowledged keys); the old TN, restarted, is fenced.

Everything printed is measured in this run: counts from the ledger and from reads, the
checkpoint from the TN's own listing, retained LSNs from logsvc's leader, roles from the TNs'
status, times from the clock. The ledger's check (`check_ledger`) is pure; the rest starts
and stops processes, every wait bounded, every process stopped by PID before `run` returns.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from engine import Column, Schema
from engine.cn.client import NetworkTN
from engine.cn.node import ComputeNode
from engine.compaction import Policy
from engine.errors import WriteConflict
from engine.objects.store import LocalDirStore
from engine.testing.demo import shard_leader
from engine.tn.limits import ClientOptions
from engine.tn.local import LocalPair, TNProcess, role_of, stop_all, wait_role, write_pair
from logsvc import devcluster
from logsvc.client import connect
from logsvc.config import load_client_config

PROGRESS_WAIT_S_MAX = 30.0
"""Every "until N more commits are acknowledged" wait gives up after this."""
CHECKPOINT_WAIT_S_MAX = 20.0
EXIT_WAIT_S_MAX = 20.0
CHECKPOINT = Policy(
    checkpoint_interval_ms=2000, checkpoint_wal_reserve_entries=100, history_retention_ms=0
)
"""A checkpoint every 2 s while commits arrive (the default is 60 s), keeping 100 WAL entries
below it and no history window (the default keeps an hour of WAL for time travel, decision
0010): short enough that the demo sees one truncate the WAL."""
CNS = ("cn-1", "cn-2")
WRITERS_PER_CN = 4
ACKS_PER_STEP = 150
"""Commits acknowledged before each event (and after it, to show commits go on)."""
INSERT_ATTEMPTS_MAX = 5
KEYS_PER_CN = 10**9
CLIENT = ClientOptions(connect_timeout_s=1.0, request_timeout_s=5.0, failover_wait_s_max=15.0)
ROWS = Schema([Column("id", "int64"), Column("cn", "string")], primary_key=["id"])
DB, TABLE = "shop", "orders"

Say = Callable[[str], None]


# --- the ledger (pure) -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LedgerCheck:
    """Acknowledged keys against the keys read back."""

    acked: int
    present: int
    """Acknowledged keys that were read back."""
    duplicated: int
    """Keys read back more than once."""
    unacknowledged: int
    """Keys read back that no client saw acknowledged (in flight when a TN died)."""

    @property
    def lost(self) -> int:
        return self.acked - self.present

    def line(self) -> str:
        return (
            f"{self.present} of {self.acked} acknowledged commits present, {self.lost} lost, "
            f"{self.duplicated} duplicated, {self.unacknowledged} present but never acknowledged"
        )


def check_ledger(acked: Iterable[int], read_back: Iterable[int]) -> LedgerCheck:
    acked_keys = set(acked)
    counts = Counter(read_back)
    return LedgerCheck(
        acked=len(acked_keys),
        present=len(acked_keys & counts.keys()),
        duplicated=sum(1 for n in counts.values() if n > 1),
        unacknowledged=len(counts.keys() - acked_keys),
    )


LOG_LINES_SHOWN = 60
"""Lines of each TN's log the demo prints when it fails (the whole logs stay in its
directory)."""

# --- logsvc ---------------------------------------------------------------------------------


async def _retained(client_config: str, shard: int) -> tuple[int, int]:
    """The shard's retained LSNs [first, next), as its leader answers after a barrier."""
    config = load_client_config(client_config)
    client = await connect(config.addresses, config.token)
    try:
        status = await client.leader_status(shard)
    finally:
        await client.close()
    return status.first_lsn, status.next_lsn


# --- the story ---------------------------------------------------------------------------------


def run(base: str, shard: int, say: Say) -> None:
    pair = write_pair(Path(base) / "tn", base, shard, secrets.token_hex(16), CHECKPOINT)
    say(
        f"\n== the engine as a service on logsvc shard {shard}: an active TN, a standby TN, "
        f"two compute nodes =="
    )
    active = standby = old = None
    try:
        started_s = time.monotonic()
        active = TNProcess(pair.config_a)
        asyncio.run(wait_role(pair.a, pair.token, "active", active))
        standby = TNProcess(pair.config_b, standby=True)
        asyncio.run(wait_role(pair.b, pair.token, "standby", standby))
        say(
            f"TN {pair.a} (pid {active.pid}) says active, TN {pair.b} (pid {standby.pid}) says "
            f"standby, {time.monotonic() - started_s:.1f} s after the first started"
        )
        asyncio.run(_Story(pair, active, f"{base}/client.toml", shard, say).run())
        say("\n== the old TN restarted on its own config ==")
        old = TNProcess(pair.config_a)
        code = old.wait(EXIT_WAIT_S_MAX)
        fenced = [line for line in old.output.splitlines() if "TN fenced" in line]
        said = fenced[0].split("TN fenced", 1)[1] if fenced else old.output.strip()[-200:]
        say(f"it exited with code {code}: TN fenced{said}")
    except BaseException:
        # The next failure must explain itself (issue 25): what each TN logged.
        for name, process in (("A", active), ("B", standby), ("A restarted", old)):
            if process is not None:
                lines = process.output.splitlines()[-LOG_LINES_SHOWN:]
                say(f"\n-- TN {name} (pid {process.pid}), the end of {process.log} --")
                say("\n".join(lines))
        raise
    finally:
        stop_all(active, standby, old)
    say("TN processes stopped by PID")


class _Story:
    """Two compute nodes' writers over the TN pair, and the events between their commits."""

    def __init__(
        self, pair: LocalPair, active: TNProcess, client_config: str, shard: int, say: Say
    ) -> None:
        self.pair, self.active, self.shard, self.say = pair, active, shard, say
        self.client_config = client_config
        self.acked: list[int] = []
        self.acked_at_s: list[float] = []
        self.sent_at_s: list[float] = []
        """When each acknowledged commit's first attempt began (parallel to `acked`)."""
        self.stop = asyncio.Event()
        self.tns: list[NetworkTN] = []
        self.cns: list[ComputeNode] = []
        self.stores: list[LocalDirStore] = []

    def _node(self, client_id: str | None) -> ComputeNode:
        tn = NetworkTN([self.pair.a, self.pair.b], self.pair.token, CLIENT)
        store = LocalDirStore(str(self.pair.objects), read_only=True)
        self.tns.append(tn)
        self.stores.append(store)
        return ComputeNode(tn, store, client_id=client_id)

    async def run(self) -> None:
        self.cns = [self._node(name) for name in CNS]
        try:
            await self._events()
            await self._read_back()
        finally:
            for cn in self.cns:
                await cn.close()
            for tn in self.tns:
                await tn.close()
            for store in self.stores:
                store.close()

    async def _events(self) -> None:
        writers: list[asyncio.Task[None]] = []
        try:
            async with self.cns[0].transaction() as txn:
                await txn.create_database(DB)
                await txn.create_table(DB, TABLE, ROWS)
            writers = [
                asyncio.ensure_future(self._writer(number, cn, writer))
                for number, cn in enumerate(self.cns)
                for writer in range(WRITERS_PER_CN)
            ]
            await self._until_more(ACKS_PER_STEP, writers)
            await self._queries()
            await self._logsvc_leader_killed(writers)
            await self._checkpoint(writers)
            await self._tn_killed(writers)
        finally:
            self.stop.set()
            await asyncio.gather(*writers)  # a writer's failure ends the demo here

    async def _writer(self, number: int, cn: ComputeNode, writer: int) -> None:
        key = number * KEYS_PER_CN + writer
        while not self.stop.is_set():
            await self._insert(cn, key, CNS[number])
            key += WRITERS_PER_CN

    async def _insert(self, cn: ComputeNode, key: int, name: str) -> None:
        """One insert, committed; a transaction begun before a failover and committed after
        it may get the retryable "snapshot too old" conflict (decision 0007): then again."""
        rows = pa.table({"id": [key], "cn": [name]}, schema=ROWS.to_arrow())
        sent_at_s = time.monotonic()
        for _ in range(INSERT_ATTEMPTS_MAX):
            try:
                async with cn.transaction() as txn:
                    await txn.table(DB, TABLE).insert(rows)
            except WriteConflict as exc:
                if "snapshot too old" not in str(exc):
                    raise
                continue
            self.acked.append(key)
            self.acked_at_s.append(time.monotonic())
            self.sent_at_s.append(sent_at_s)
            return
        raise RuntimeError(f"key {key} never committed in {INSERT_ATTEMPTS_MAX} attempts")

    async def _until_more(self, count: int, writers: list[asyncio.Task[None]]) -> None:
        goal = len(self.acked) + count
        await self._until(lambda: len(self.acked) >= goal, f"{count} commits", writers)

    async def _until(
        self, condition: Callable[[], bool], what: str, writers: list[asyncio.Task[None]]
    ) -> None:
        deadline = time.monotonic() + PROGRESS_WAIT_S_MAX
        while not condition():
            for done in (w for w in writers if w.done()):
                done.result()  # a writer that failed: its error
            if time.monotonic() > deadline:
                raise TimeoutError(f"not {what} in {PROGRESS_WAIT_S_MAX} s")
            await asyncio.sleep(0.01)

    async def _count(self, cn: ComputeNode, ts: int | None) -> tuple[int, int]:
        """Rows of the table at `ts` (None: the TN's newest) as `cn` reads them, and the ts."""
        async with cn.snapshot(ts) as view:
            table = await view.table(DB, TABLE).scan(columns=["id"])
            return table.num_rows, view.start_ts

    async def _queries(self) -> None:
        rows_1, ts = await self._count(self.cns[0], None)
        rows_2, _ = await self._count(self.cns[1], ts)
        await asyncio.sleep(0.2)
        rows_later, ts_later = await self._count(self.cns[1], None)
        self.say(
            f"{len(CNS)} CNs x {WRITERS_PER_CN} writers commit one order each; while they do, "
            f"cn-1 reads {rows_1} orders at ts {ts}, cn-2 reads {rows_2} at the same ts, "
            f"and {rows_later} at its newest ts {ts_later} 0.2 s later"
        )

    async def _logsvc_leader_killed(self, writers: list[asyncio.Task[None]]) -> None:
        old = await shard_leader(self.client_config, self.shard)
        base = str(Path(self.client_config).parent)
        killed_at_s = time.monotonic()
        await asyncio.to_thread(devcluster.kill_node, base, old.node)
        try:
            await self._until_more(ACKS_PER_STEP, writers)
        finally:
            await asyncio.to_thread(devcluster.start_node, base, old.node)
        gap_s = self._longest_gap_s(killed_at_s)
        new = await shard_leader(self.client_config, self.shard)
        self.say(
            f"logsvc leader {old.node} of shard {self.shard} (term {old.term}) killed with "
            f"SIGKILL under the commits: they paused up to {gap_s:.2f} s, then went on under "
            f"{new.node} (term {new.term}); {old.node} restarted"
        )

    def _longest_gap_s(self, since_s: float) -> float:
        times = [since_s, *(t for t in self.acked_at_s if t > since_s)]
        return max(b - a for a, b in itertools.pairwise(times))

    async def _checkpoint(self, writers: list[asyncio.Task[None]]) -> None:
        """Until the TN lists a checkpoint and logsvc no longer retains LSN 1."""
        tn = self.tns[0]
        deadline = time.monotonic() + CHECKPOINT_WAIT_S_MAX
        while True:
            for done in (w for w in writers if w.done()):
                done.result()
            listing = await tn.checkpoints()
            first, next_lsn = await _retained(self.client_config, self.shard)
            if listing and first > 1:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"no checkpoint truncated the WAL in {CHECKPOINT_WAIT_S_MAX} s")
            await asyncio.sleep(0.2)
        ckp_ts, manifest = listing[-1]
        self.say(
            "the active TN checkpointed by itself "
            f"(interval {CHECKPOINT.checkpoint_interval_ms} ms here): "
            f"its listing shows {len(listing)}, the newest at ckp_ts {ckp_ts} ({manifest}); "
            f"logsvc shard {self.shard} now retains LSNs [{first}, {next_lsn}): the WAL below "
            f"it, less a reserve of {CHECKPOINT.checkpoint_wal_reserve_entries} entries, "
            "is truncated"
        )

    async def _tn_killed(self, writers: list[asyncio.Task[None]]) -> None:
        """The active TN SIGKILLed; the failover as the CNs see it: from the moment the
        process is gone to the acknowledgement of the first commit begun after that (one
        acknowledged sooner was answered before the kill)."""
        await asyncio.to_thread(self.active.kill, signal.SIGKILL)  # returns once it is reaped
        dead_at_s, before = time.monotonic(), len(self.acked)

        def first_after() -> float | None:
            sent_after = (i for i, sent in enumerate(self.sent_at_s) if sent > dead_at_s)
            index = next(sent_after, None)
            return None if index is None else self.acked_at_s[index] - dead_at_s

        await self._until(lambda: first_after() is not None, "a commit after the kill", writers)
        first_s = first_after()
        assert first_s is not None
        role = await role_of(self.pair.b, self.pair.token)
        await self._until_more(ACKS_PER_STEP, writers)
        # Each CN's client on the new active TN before the line says so: the commits counted
        # above may all be one CN's while the other still looks for a TN (on a loaded box the
        # line said "both CNs now commit through <standby>, None").
        await self._until(
            lambda: all(tn.address == self.pair.b for tn in self.tns),
            "both CNs on the new active TN",
            writers,
        )
        at = {tn.address for tn in self.tns}
        self.say(
            f"active TN {self.pair.a} killed with SIGKILL after {before} acknowledged commits; "
            f"the first commit begun after it was acknowledged {first_s:.2f} s later; TN "
            f"{self.pair.b} says {role}; both CNs now commit through "
            f"{', '.join(sorted(str(a) for a in at))}"
        )

    async def _read_back(self) -> None:
        reader = self._node(None)  # a compute node that starts empty
        self.cns.append(reader)
        async with reader.snapshot() as view:
            table = await view.table(DB, TABLE).scan(columns=["id"])
            ts = view.start_ts
        counts = [(await self._count(cn, ts))[0] for cn in self.cns[: len(CNS)]]
        checked = check_ledger(self.acked, table.column("id").to_pylist())
        self.say(
            f"read back through a fresh CN at ts {ts}: {checked.line()}; cn-1 and cn-2 count "
            f"{counts[0]} and {counts[1]} rows at that ts"
        )
