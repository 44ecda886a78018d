"""TN failover with real processes (issue 15 "Real processes on loopback"): a 3-node logsvc
dev-cluster, an active TN and a standby TN as `python -m engine serve` processes sharing
one object directory, and two compute nodes committing through their own `NetworkTN`.

Proves: with writers on two compute nodes committing concurrently, every commit
acknowledged before and after the active TN is SIGKILLed under them (commits in flight),
while the logsvc leader of the TN's WAL shard is SIGKILLed at the same moment (the standby
promotes itself through a shard electing a new leader), is there when read back through a
fresh compute node, exactly once, and nothing else is (a ledger of acknowledged keys: no
commit was left in doubt); the standby notices on its own (status probes), promotes itself
(takes the WAL's lease with a higher epoch) and both NetworkTNs continue on it within
seconds; the old TN restarted on its own config refuses to take the lease back and exits 3
with one clear line; the promoted TN stops cleanly on SIGTERM.

And (issue 25) a standby SIGSTOPped while the active TN checkpoints and truncates the WAL
past its position several times catches up from the newest checkpoint once resumed, and
takes over with nothing lost.

Every process is stopped by PID whatever happens (`TNProcess.kill`, `devcluster.down`, the
killed logsvc node restarted in a `finally`); every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from engine import Column, Schema
from engine.cn.client import NetworkTN
from engine.cn.node import ComputeNode
from engine.cn.port import TNStatus
from engine.compaction import Policy
from engine.errors import Fenced, WriteConflict
from engine.objects.store import LocalDirStore
from engine.testing.demo import Leader, shard_leader
from engine.tn import local, messages
from engine.tn.channel import Channel, probe
from engine.tn.limits import ClientOptions
from engine.tn.local import LocalPair, TNProcess, stop_all, write_pair
from engine.writeset import Op, WriteSet
from logsvc import devcluster

from .conftest import LocalCluster

pytestmark = pytest.mark.timeout(120)

TOKEN = "tn-e2e-token-0123456789"
ROWS = Schema([Column("id", "int64"), Column("v", "string")], primary_key=["id"])
START_WAIT_S_MAX = 30.0
FAILOVER_S_MAX = 15.0
EXIT_WAIT_S_MAX = 20.0
CLIENT = ClientOptions(
    connect_timeout_s=1.0, request_timeout_s=5.0, failover_wait_s_max=FAILOVER_S_MAX
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Four shards: each test's TN pair has a WAL of its own."""
    started = LocalCluster(tmp_path_factory.mktemp("cluster"), shards=4)
    try:
        yield started
    finally:
        started.close()


def tns(cluster: LocalCluster, base: Path, shard: int) -> tuple[Path, str, str]:
    """Two TN configs (each the other's peer) on `shard` of the cluster, sharing one
    object directory."""
    pair = write_pair(base, cluster.dir, shard, TOKEN)
    return pair.base, pair.a, pair.b


async def role_of(address: str) -> str | None:
    return await local.role_of(address, TOKEN)


async def wait_role(address: str, role: str, process: TNProcess) -> None:
    await local.wait_role(address, TOKEN, role, process, START_WAIT_S_MAX)


def engine_command(base: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=base,
    )


def rows(*ids: int) -> pa.Table:
    return pa.table({"id": list(ids), "v": [f"v{i}" for i in ids]}, schema=ROWS.to_arrow())


SHARD = 1


def test_the_standby_takes_over_from_a_killed_tn_and_nothing_acknowledged_is_lost(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    base, a, b = tns(cluster, tmp_path / "tns", shard=SHARD)
    active = TNProcess(base / "tn-a.toml")
    standby: TNProcess | None = None
    old: TNProcess | None = None
    try:
        asyncio.run(wait_role(a, "active", active))
        standby = TNProcess(base / "tn-b.toml", standby=True)
        asyncio.run(wait_role(b, "standby", standby))
        rows_acked = asyncio.run(_commits_across_the_kill(cluster, base, a, b, active))
        # The old TN comes back on its own config: it must not take the lease back.
        old = TNProcess(base / "tn-a.toml")
        assert old.wait(EXIT_WAIT_S_MAX) == 3, old.output
        fenced = [line for line in old.output.splitlines() if "TN fenced" in line]
        assert len(fenced) == 1 and b in fenced[0] and "--standby" in fenced[0], old.output
        assert asyncio.run(role_of(b)) == "active"
        # The operator's commands say what is true.
        promote = engine_command(base, "promote", "--config", str(base / "tn-b.toml"))
        assert promote.returncode == 0, promote.stderr
        assert promote.stdout.startswith(f"the TN at {b} was active already (visible_ts ")
        reader = engine_command(
            base,
            "cn",
            "--config",
            str(base / "cn.toml"),
            stdin="status\ntables\nscan d.t --limit 3\nscan d.nope\n",
        )
        assert reader.returncode == 1, reader.stderr  # one command of four failed, the last
        lines = reader.stdout.splitlines()
        assert lines[0].startswith(f"TN {b} (active): visible_ts ")
        assert f"  d.t  rows={rows_acked}  key=(id)" in lines
        scan_at = lines.index("id  v ")
        assert lines[scan_at + 1 : scan_at + 4] == ["0   v0", "1   v1", "2   v2"]
        assert lines[scan_at + 4].startswith(f"(3 of {rows_acked} rows at commit_ts ")
        assert lines[-1].startswith("error: NotFound: ")
        standby.kill(signal.SIGTERM)
        assert standby.process.returncode == 0, standby.output
        assert "stopped" in standby.output.splitlines()[-1]
    finally:
        stop_all(active, standby, old)


CNS = ("cn-1", "cn-2")
WRITERS_PER_CN = 2
ACKS_BEFORE_KILL = 40
ACKS_AFTER_KILL = 40


async def _commits_across_the_kill(
    cluster: LocalCluster, base: Path, a: str, b: str, active: TNProcess
) -> int:
    """Writers on two compute nodes commit while the active TN and the logsvc leader of its
    WAL shard are SIGKILLed under them (commits are in flight at that moment); the number
    of rows acknowledged."""
    tns = [NetworkTN([a, b], TOKEN, CLIENT) for _ in CNS]
    objects = LocalDirStore(str(base / "objects"), read_only=True)
    cns = [ComputeNode(tn, objects, client_id=name) for tn, name in zip(tns, CNS, strict=True)]
    acked: list[int] = []
    keys = iter(range(10**6))
    stop = asyncio.Event()

    async def writer(cn: ComputeNode) -> None:
        while not stop.is_set():
            await _insert(cn, next(keys), acked)

    try:
        async with cns[0].transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        writers = [asyncio.ensure_future(writer(cn)) for cn in cns for _ in range(WRITERS_PER_CN)]
        leader: Leader | None = None
        try:
            await _until(lambda: len(acked) >= ACKS_BEFORE_KILL, writers)
            assert all(tn.address == a for tn in tns)
            leader = await shard_leader(f"{cluster.dir}/client.toml", SHARD)
            await asyncio.gather(
                asyncio.to_thread(devcluster.kill_node, cluster.dir, leader.node),
                asyncio.to_thread(active.kill, signal.SIGKILL),
            )
            killed_at, before = time.monotonic(), len(acked)
            await _until(lambda: len(acked) > before, writers)
            first_after = time.monotonic() - killed_at
            await _until(lambda: len(acked) >= before + ACKS_AFTER_KILL, writers)
        finally:
            stop.set()
            try:
                await asyncio.gather(*writers)  # a writer's failure (OutcomeUnknown...) fails here
            finally:
                if leader is not None:
                    devcluster.start_node(cluster.dir, leader.node)
        assert all(tn.address == b for tn in tns)
        assert first_after < FAILOVER_S_MAX, first_after
        after = await shard_leader(f"{cluster.dir}/client.toml", SHARD)
        assert after.term > leader.term  # the kill did cost the shard its leader
        # Read back through a compute node that starts empty.
        reader = ComputeNode(tns[0], objects)
        try:
            async with reader.snapshot() as view:
                got = (await view.table("d", "t").scan(columns=["id"])).column("id").to_pylist()
        finally:
            await reader.close()
        assert len(got) == len(set(got))  # nothing twice
        missing = sorted(set(acked) - set(got))
        assert not missing, f"acknowledged and lost: {missing}"
        assert set(got) == set(acked)  # and nothing unacknowledged: no commit was in doubt
        return len(acked)
    finally:
        for cn in cns:
            await cn.close()
        for tn in tns:
            await tn.close()
        objects.close()


async def _until(condition: Callable[[], bool], writers: list[asyncio.Task[None]]) -> None:
    deadline = time.monotonic() + FAILOVER_S_MAX + 10
    while not condition():
        for done in (w for w in writers if w.done()):
            done.result()  # a writer that failed: its error
        assert time.monotonic() < deadline, "the writers made no progress"
        await asyncio.sleep(0.01)


async def _insert(cn: ComputeNode, key: int, acked: list[int]) -> None:
    """One insert, committed; a transaction begun before the failover and committed after
    it may get the retryable "snapshot too old" conflict (decision 0007): then again."""
    for _ in range(5):
        try:
            async with cn.transaction() as txn:
                await txn.table("d", "t").insert(rows(key))
        except WriteConflict as exc:
            assert "snapshot too old" in str(exc), exc
            continue
        acked.append(key)
        return
    raise AssertionError(f"key {key} never committed")


def test_a_tn_that_was_paused_while_the_standby_took_over_is_fenced_on_its_first_commit(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    base, a, b = tns(cluster, tmp_path / "tns", shard=2)
    active = TNProcess(base / "tn-a.toml")
    standby: TNProcess | None = None
    try:
        asyncio.run(wait_role(a, "active", active))
        standby = TNProcess(base / "tn-b.toml", standby=True)
        asyncio.run(wait_role(b, "standby", standby))
        active.send(signal.SIGSTOP)  # alive, but it answers nothing: probes time out
        asyncio.run(wait_role(b, "active", standby))
        active.send(signal.SIGCONT)
        # Resumed, it is refused its next commit as fenced, or it already found itself
        # fenced by asking the log (it saw the other TN active) and is exiting or gone:
        # either way it acknowledges nothing.
        with pytest.raises((Fenced, OSError)):  # ConnectionError is an OSError
            asyncio.run(_commit_on(a))
        assert active.wait(EXIT_WAIT_S_MAX) == 3, active.output
        fenced = [line for line in active.output.splitlines() if "TN fenced" in line]
        assert len(fenced) == 1, active.output
        assert "a newer TN took the WAL's lease (epoch" in fenced[0]
        assert f"holder tn@{b}" in fenced[0], fenced[0]
        assert asyncio.run(role_of(b)) == "active"
    finally:
        stop_all(active, standby)


async def _commit_on(address: str) -> None:
    """A commit sent to the TN at `address` alone (no failover)."""
    channel = await Channel.open(address, TOKEN, CLIENT)
    try:
        status = await channel.call(messages.Status())
        assert isinstance(status, messages.StatusReply)
        ops = (Op("create_database", "late"),)
        await channel.call(messages.Commit(WriteSet(status.status.visible_ts, ops, "old", 1)))
    finally:
        await channel.close()


PAUSE_CHECKPOINTS = 3
"""Checkpoints the active TN takes (each truncating the WAL) while the standby is stopped."""
# No history window (decision 0010): each checkpoint truncates the WAL right at itself.
FAST_CHECKPOINTS = Policy(
    checkpoint_interval_ms=300, checkpoint_wal_reserve_entries=0, history_retention_ms=0
)


@contextlib.contextmanager
def running_pair(
    cluster: LocalCluster, base: Path, shard: int, maintenance: Policy | None = None
) -> Iterator[tuple[LocalPair, TNProcess, TNProcess]]:
    """An active TN, then a standby, on `shard`; both stopped by PID at the end."""
    pair = write_pair(base, cluster.dir, shard, TOKEN, maintenance)
    active = TNProcess(pair.config_a)
    standby: TNProcess | None = None
    try:
        asyncio.run(wait_role(pair.a, "active", active))
        standby = TNProcess(pair.config_b, standby=True)
        asyncio.run(wait_role(pair.b, "standby", standby))
        yield pair, active, standby
    finally:
        stop_all(active, standby)


def test_a_standby_paused_past_several_truncations_catches_up_and_takes_over(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Issue 25: the standby is SIGSTOPped while the active TN checkpoints and truncates the
    WAL past its read position several times; resumed, it catches up from the newest
    checkpoint (it never skips an entry), says `standby`, and when the active TN is
    SIGKILLed it takes over with every acknowledged commit there exactly once."""
    with running_pair(cluster, tmp_path / "tns", 3, FAST_CHECKPOINTS) as (pair, active, standby):
        asyncio.run(
            _pause_past_truncations_then_fail_over(pair.base, pair.a, pair.b, active, standby)
        )
        assert "caught up from checkpoint" in standby.output, standby.output
        assert "standby tail failed" not in standby.output, standby.output


async def _pause_past_truncations_then_fail_over(
    base: Path, a: str, b: str, active: TNProcess, standby: TNProcess
) -> None:
    tn = NetworkTN([a, b], TOKEN, CLIENT)
    objects = LocalDirStore(str(base / "objects"), read_only=True)
    cn = ComputeNode(tn, objects, client_id="cn-pause")
    acked: list[int] = []
    keys = iter(range(10**6))
    stop = asyncio.Event()

    async def writer() -> None:
        while not stop.is_set():
            await _insert(cn, next(keys), acked)

    try:
        async with cn.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        writers = [asyncio.ensure_future(writer()) for _ in range(WRITERS_PER_CN)]
        try:
            await _until(lambda: len(acked) >= ACKS_BEFORE_KILL, writers)
            standby.send(signal.SIGSTOP)
            seen: set[int] = set()
            while len(seen) <= PAUSE_CHECKPOINTS:  # the first one seen may predate the stop
                seen.add((await _status_of(a)).checkpoint_ts)
                for done in (w for w in writers if w.done()):
                    done.result()
                await asyncio.sleep(0.05)
            standby.send(signal.SIGCONT)
            target = (await _status_of(a)).visible_ts
            deadline = time.monotonic() + FAILOVER_S_MAX
            while True:  # caught up: a standby at (or past) the active's visible_ts of then
                status = await _status_of(b)
                if status.role == "standby" and status.visible_ts >= target:
                    break
                assert status.role != "failed", standby.output
                assert time.monotonic() < deadline, f"no catch-up: {status}\n{standby.output}"
                await asyncio.sleep(0.05)
            active.kill(signal.SIGKILL)
            before = len(acked)
            await _until(lambda: len(acked) >= before + ACKS_AFTER_KILL, writers)
        finally:
            stop.set()
            await asyncio.gather(*writers)
        assert tn.address == b
        reader = ComputeNode(tn, objects)
        try:
            async with reader.snapshot() as view:
                got = (await view.table("d", "t").scan(columns=["id"])).column("id").to_pylist()
        finally:
            await reader.close()
        assert len(got) == len(set(got))  # nothing twice
        assert not sorted(set(acked) - set(got)), "acknowledged and lost"
        assert set(got) == set(acked)
    finally:
        await cn.close()
        await tn.close()
        objects.close()


async def _status_of(address: str) -> TNStatus:
    channel, reply = await probe(address, TOKEN, CLIENT)
    channel.abort()
    return reply.status


def test_an_idle_tn_fenced_by_a_promotion_stops_saying_active_and_exits(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Issue 20 item 8: `engine promote` on the standby while the active TN is alive and
    idle (no commit to be refused): the old TN sees a second active peer, asks the log for
    its lease, finds itself fenced, and exits 3 with its one line, within seconds rather
    than at its next append."""
    with running_pair(cluster, tmp_path / "tns", 4) as (pair, active, _standby):
        promote = engine_command(pair.base, "promote", "--config", str(pair.config_b))
        assert promote.returncode == 0, promote.stderr
        assert active.wait(EXIT_WAIT_S_MAX) == 3, active.output
        fenced = [line for line in active.output.splitlines() if "TN fenced" in line]
        assert len(fenced) == 1 and f"holder tn@{pair.b}" in fenced[0], active.output
        # Found by asking the log, not by an append refused later:
        assert "this one no longer holds the lease" in active.output, active.output
        assert asyncio.run(role_of(pair.b)) == "active"
