"""The engine's part of `logsvc demo` (`./dev demo`): an engine process committing
transactions through a logsvc shard, killed with SIGKILL and reopened with nothing lost, the
shard's logsvc leader killed under its commits, and a second engine fencing the first.

Everything printed is measured in this run: counts come from the engine process's own
acknowledgements (`python -m engine.workload` prints each commit once it returned) and from
reopening the WAL (`--verify`), times from the clock. Every engine process it starts is
stopped by PID before it returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from engine.workload import LINES_PER_ORDER, Verified, WorkloadProcess, verify
from logsvc import devcluster
from logsvc.client import ClientOptions, LogsvcError, connect
from logsvc.config import load_client_config

ACKS_WAIT_S_MAX = 30.0
LEADER_WAIT_S_MAX = 30.0
_PROBE = ClientOptions(request_timeout_s=2.0, retry_s_max=1.0)


async def shard_leader(client_config: str, shard: int) -> str:
    """The data address of the node that says it leads `shard` (asked node by node: a
    status from a follower may be stale). Bounded by LEADER_WAIT_S_MAX."""
    config = load_client_config(client_config)
    deadline = time.monotonic() + LEADER_WAIT_S_MAX
    while True:
        for address in config.addresses:
            client = await connect([address], config.token, options=_PROBE)
            try:
                status = await client.status(shard)
            except LogsvcError:
                continue
            finally:
                await client.close()
            if status.is_leader:
                return address
        if time.monotonic() > deadline:
            raise TimeoutError(f"no node says it leads shard {shard}")
        await asyncio.sleep(0.1)


def run(base: str, shard: int, say: Callable[[str], None]) -> None:
    client_config = f"{base}/client.toml"
    addresses = load_client_config(client_config).addresses
    args = [
        "--dir", f"{base}/engine", "--wal", "logsvc",
        "--client-config", client_config, "--shard", str(shard),
    ]  # fmt: skip
    say(
        f"\n== the engine: transactions committed through logsvc shard {shard} "
        f"(each an order and {LINES_PER_ORDER} lines, in two tables) =="
    )
    first = WorkloadProcess([*args, "--writers", "8", "--seconds", "60"])
    try:
        first.wait_acks(300, ACKS_WAIT_S_MAX)
    finally:
        first.kill()
    say(
        f"engine process (pid {first.pid}, 8 concurrent writers) killed with SIGKILL after "
        f"{len(first.acked)} acknowledged commits"
    )
    _report(verify(args), first.acked, say)

    say(f"\n== the logsvc leader of shard {shard} is killed while the engine commits ==")
    second = WorkloadProcess([*args, "--writers", "8", "--seconds", "60", "--run-id", "2"])
    victim = ""
    try:
        second.wait_acks(200, ACKS_WAIT_S_MAX)
        leader = asyncio.run(shard_leader(client_config, shard))
        victim = f"n{addresses.index(leader) + 1}"
        before = second.acks()
        killed_at = time.monotonic()
        devcluster.kill_node(base, victim)
        resumed = second.wait_acks(before + 1, ACKS_WAIT_S_MAX)
        gap_s = time.monotonic() - killed_at
        second.wait_acks(before + 300, ACKS_WAIT_S_MAX)
        after = second.acks() - before
    finally:
        second.kill()
        if victim:
            devcluster.start_node(base, victim)
    new_leader = asyncio.run(shard_leader(client_config, shard))
    say(
        f"killed {victim} ({leader}, the leader) after {before} commits; "
        + (
            f"the next commit was acknowledged {gap_s:.2f} s later, {after} more after it; "
            if resumed
            else f"no commit was acknowledged within {ACKS_WAIT_S_MAX:.0f} s; "
        )
        + f"new leader {new_leader}; {victim} restarted"
    )
    _report(verify(args), first.acked + second.acked, say)

    say("\n== a second engine on the same shard fences the first ==")
    old = WorkloadProcess([*args, "--writers", "4", "--seconds", "60", "--run-id", "3"])
    try:
        old.wait_acks(50, ACKS_WAIT_S_MAX)
        new = WorkloadProcess([*args, "--writers", "2", "--txns", "20", "--run-id", "4"])
        new_code = new.wait(timeout_s=60)
        old_code = old.wait(timeout_s=ACKS_WAIT_S_MAX)
    finally:
        old.kill()
    lines = old.stderr.strip().splitlines()
    said = lines[-1].split(" (", 1)[0] if lines else "nothing"
    say(
        f"engine A committed {len(old.acked)}; engine B opened the shard (a new lease epoch) "
        f"and committed {len(new.acked)} (exit code {new_code}); A's next commit was refused "
        f'and A exited with code {old_code}, saying "{said}"'
    )
    _report(verify(args), first.acked + second.acked + old.acked + new.acked, say)


def _report(found: Verified, acked: list[int], say: Callable[[str], None]) -> None:
    present = set(found.orders)
    missing = sum(1 for txn in acked if txn not in present)
    extra = len(present) - len(set(acked) & present)
    say(
        f"reopened (replay {found.replay_s:.2f} s): {len(acked) - missing} of {len(acked)} "
        f"acknowledged commits present, {missing} lost; {extra} more committed but not "
        f"acknowledged before a kill; "
        + ("every transaction whole" if found.whole() else "SOME TRANSACTIONS ARE PARTIAL")
    )
