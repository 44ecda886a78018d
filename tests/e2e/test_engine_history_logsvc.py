"""`python -m engine history` over an engine whose WAL is a logsvc shard (issue 24 item 2).

How: a real 3-node cluster on loopback (`own_cluster`, stopped by PID whatever happens); an
engine opened in this process on its shard commits a table and two inserts and stays open,
holding the shard's lease. The command, run as its own process with `--wal logsvc
--client-config --shard`, lists exactly those commits, and takes no lease: the engine's next
commit after the look is still acknowledged (a lease taken would have fenced it).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from engine import Column, Engine, Schema

from .conftest import LocalCluster

ROWS = Schema([Column("id", "int64")], ["id"])
COMMAND_S_MAX = 120


def test_history_reads_a_logsvc_wal_without_a_lease(
    own_cluster: LocalCluster, tmp_path: Path
) -> None:
    client_config = f"{own_cluster.dir}/client.toml"
    engine_dir = tmp_path / "engine"

    def history() -> list[str]:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "engine",
                "history",
                str(engine_dir),
                "--wal",
                "logsvc",
                "--client-config",
                client_config,
                "--shard",
                "1",
                "--objects",
                "none",
            ],
            capture_output=True,
            text=True,
            timeout=COMMAND_S_MAX,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    async def main() -> tuple[list[int], list[str]]:
        eng = await Engine.open(
            str(engine_dir), wal="logsvc", client_config=client_config, shard=1, objects="none"
        )
        try:
            commits = []
            async with eng.transaction() as txn:
                await txn.create_database("d")
                await txn.create_table("d", "t", ROWS)
            commits.append(eng.visible_ts)
            for first in (0, 10):
                async with eng.transaction() as txn:
                    await txn.table("d", "t").insert([{"id": first + i} for i in range(3)])
                commits.append(eng.visible_ts)
            lines = await asyncio.to_thread(history)
            async with eng.transaction() as txn:  # still the lease holder: not fenced
                await txn.table("d", "t").insert({"id": 99})
            return commits, lines
        finally:
            await eng.close()

    commits, lines = asyncio.run(main())
    rows = lines[1:-1]
    assert [int(line.split()[0]) for line in rows] == commits
    assert rows[0].endswith("create database d; create table d.t")
    assert rows[1].endswith("d.t +3 -0") and rows[2].endswith("d.t +3 -0")
    assert "(3 listed; the retained WAL holds DSN 1..3" in lines[-1]
