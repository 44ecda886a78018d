"""The engine in real processes over a real 3-node logsvc cluster, and over its file WAL
(issue 13 "Real processes").

An engine process (`python -m engine.testing.workload`, 8 concurrent writers, each transaction one
order and its lines in two tables) prints every commit once `commit()` returned. The tests
SIGKILL it, or the logsvc leader of its shard, under load, then reopen the engine read-only
(`--verify`) and check: every acknowledged transaction is there, every transaction is whole
(an order has all its lines, no line lacks its order), and a new engine process carries on
the same WAL. A second engine process on the same shard fences the first: its next commit
fails, it exits 3 with a line that says so, and none of its acknowledged commits is lost.

One module-scoped cluster with a shard per test; every process is stopped by PID whatever
happens (the workload by `WorkloadProcess.kill`, the nodes by `devcluster.down`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.testing.demo import Leader, shard_leader
from engine.testing.workload import Verified, WorkloadProcess, verify
from logsvc import devcluster

from .conftest import LocalCluster

ACKS_WAIT_S_MAX = 60.0
RUN_S_MAX = 90.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    dir_path = tmp_path_factory.mktemp("engine-logsvc")
    try:
        yield LocalCluster(dir_path, shards=3)
    finally:
        devcluster.down(str(dir_path))


def logsvc_args(cluster: LocalCluster, tmp_path: Path, shard: int) -> list[str]:
    return [
        "--dir",
        str(tmp_path / f"engine-{shard}"),
        "--wal",
        "logsvc",
        "--client-config",
        f"{cluster.dir}/client.toml",
        "--shard",
        str(shard),
    ]


def check_after(args: list[str], acked: list[int]) -> Verified:
    answer = verify(args)
    present = set(answer.orders)
    missing = [txn for txn in acked if txn not in present]
    assert not missing, f"{len(missing)} acknowledged transactions lost, e.g. {missing[:5]}"
    assert answer.whole(), "a transaction is partly there"
    assert answer.duplicates() == 0, "a transaction is there twice"
    return answer


def leader_of(cluster: LocalCluster, shard: int) -> Leader:
    return asyncio.run(shard_leader(f"{cluster.dir}/client.toml", shard))


def test_an_engine_killed_under_load_loses_no_acknowledged_commit(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    args = logsvc_args(cluster, tmp_path, shard=1)
    first = WorkloadProcess([*args, "--writers", "8", "--seconds", str(RUN_S_MAX)])
    try:
        assert first.wait_acks(150, ACKS_WAIT_S_MAX), first.stderr
    finally:
        running = first.kill()
    assert running, f"the engine process ended before the kill: {first.stderr}"
    answer = check_after(args, first.acked)
    assert len(answer.orders) >= len(first.acked)
    # A new engine process carries on: it fences nothing alive, replays, commits more.
    second = WorkloadProcess([*args, "--writers", "4", "--txns", "40", "--run-id", "2"])
    assert second.wait(timeout_s=RUN_S_MAX) == 0, second.stderr
    assert len(second.acked) == 40
    later = check_after(args, first.acked + second.acked)
    assert later.visible_ts > answer.visible_ts


def test_a_logsvc_leader_killed_under_engine_commits_loses_nothing(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    args = logsvc_args(cluster, tmp_path, shard=2)
    workload = WorkloadProcess([*args, "--writers", "8", "--seconds", str(RUN_S_MAX)])
    try:
        assert workload.wait_acks(100, ACKS_WAIT_S_MAX), workload.stderr
        victim = leader_of(cluster, 2)
        killed_at_s = time.monotonic()
        devcluster.kill_node(cluster.dir, victim.node)
        try:
            # Commits go on once a new leader is elected (the engine process never stops).
            resumed = workload.wait_acks_since(killed_at_s, 150, ACKS_WAIT_S_MAX)
            assert resumed, workload.stderr
        finally:
            devcluster.start_node(cluster.dir, victim.node)
    finally:
        running = workload.kill()
    assert running, f"the engine process ended before the kill: {workload.stderr}"
    assert leader_of(cluster, 2).term > victim.term  # the kill did cost the shard its leader
    check_after(args, workload.acked)


def test_a_second_engine_fences_the_first(cluster: LocalCluster, tmp_path: Path) -> None:
    args = logsvc_args(cluster, tmp_path, shard=3)
    old = WorkloadProcess([*args, "--writers", "4", "--seconds", str(RUN_S_MAX)])
    try:
        assert old.wait_acks(50, ACKS_WAIT_S_MAX), old.stderr
        new = WorkloadProcess([*args, "--writers", "2", "--txns", "30", "--run-id", "2"])
        try:
            assert new.wait(timeout_s=RUN_S_MAX) == 0, new.stderr
        finally:
            new.kill()
        assert old.wait(timeout_s=ACKS_WAIT_S_MAX) == 3
        said = old.stderr.splitlines()[-1]
        assert said.startswith("engine fenced: another engine took the WAL's lease ("), said
    finally:
        old.kill()
    answer = check_after(args, old.acked + new.acked)
    assert set(new.acked) <= set(answer.orders)


def test_an_engine_on_its_file_wal_killed_under_load_loses_nothing(tmp_path: Path) -> None:
    args = ["--dir", str(tmp_path / "engine"), "--wal", "file"]
    workload = WorkloadProcess([*args, "--writers", "8", "--seconds", str(RUN_S_MAX)])
    try:
        assert workload.wait_acks(500, ACKS_WAIT_S_MAX), workload.stderr
    finally:
        running = workload.kill()
    assert running, f"the engine process ended before the kill: {workload.stderr}"
    check_after(args, workload.acked)
    again = WorkloadProcess([*args, "--txns", "20", "--run-id", "2"])
    assert again.wait(timeout_s=RUN_S_MAX) == 0, again.stderr
    check_after(args, workload.acked + again.acked)
