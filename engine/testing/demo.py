"""The engine's part of `logsvc demo` (`./dev demo`): an engine process committing
transactions through a logsvc shard, killed with SIGKILL and reopened with nothing lost, the
shard's logsvc leader killed under its commits, and a second engine fencing the first.

Everything printed is measured in this run: counts come from the engine process's own
acknowledgements (`python -m engine.testing.workload` prints each commit once it returned) and from
reopening the WAL (`--verify`), times from the clock. Every engine process it starts is
stopped by PID before it returns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.testing.workload import LINES_PER_ORDER, Verified, WorkloadProcess, verify
from logsvc import devcluster
from logsvc.client import ClientOptions, LogsvcError, connect
from logsvc.config import load_client_config

ACKS_WAIT_S_MAX = 30.0
LEADER_WAIT_S_MAX = 30.0
_PROBE = ClientOptions(request_timeout_s=2.0, retry_s_max=1.0)
SAID_CHARS_MAX = 200
"""Of the fenced engine's last line on stderr, shown in the demo."""


@dataclass(frozen=True, slots=True)
class Leader:
    node: str
    """`n1`, `n2`, ...: the node's position in client.toml's addresses (dev-cluster's names)."""
    address: str
    term: int


async def shard_leader(client_config: str, shard: int) -> Leader:
    """The node that says it leads `shard`, and its term (asked node by node: a status from
    a follower may be stale). Bounded by LEADER_WAIT_S_MAX."""
    config = load_client_config(client_config)
    deadline = time.monotonic() + LEADER_WAIT_S_MAX
    while True:
        for position, address in enumerate(config.addresses):
            client = await connect([address], config.token, options=_PROBE)
            try:
                status = await client.status(shard)
            except LogsvcError:
                continue
            finally:
                await client.close()
            if status.is_leader:
                return Leader(f"n{position + 1}", address, status.term)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no node says it leads shard {shard}")
        await asyncio.sleep(0.1)


def run(base: str, shard: int, say: Callable[[str], None]) -> None:
    client_config = f"{base}/client.toml"
    args = [
        "--dir", f"{base}/engine", "--wal", "logsvc",
        "--client-config", client_config, "--shard", str(shard),
    ]  # fmt: skip
    say(
        f"\n== the engine: transactions committed through logsvc shard {shard} "
        f"(each an order and {LINES_PER_ORDER} lines, in two tables) =="
    )
    acked: list[int] = []
    acked += _kill_the_engine(args, say)
    _report(verify(args), acked, say)
    say(f"\n== the logsvc leader of shard {shard} is killed while the engine commits ==")
    acked += _kill_the_leader(args, client_config, shard, base, say)
    _report(verify(args), acked, say)
    say("\n== a second engine on the same shard fences the first ==")
    acked += _fence(args, say)
    _report(verify(args), acked, say)


def _kill_the_engine(args: list[str], say: Callable[[str], None]) -> list[int]:
    """An engine process SIGKILLed under load; its acknowledged commits."""
    started_s = time.monotonic()
    first = WorkloadProcess([*args, "--writers", "8", "--seconds", "60"])
    try:
        first.wait_acks(300, ACKS_WAIT_S_MAX)
    finally:
        killed = first.kill()
    how = "killed with SIGKILL" if killed else f"ended by itself (exit code {first.wait(0)})"
    say(
        f"engine process (pid {first.pid}, 8 concurrent writers) {how} "
        f"{time.monotonic() - started_s:.1f} s after it started, with {len(first.acked)} "
        "commits acknowledged"
    )
    return first.acked


def _kill_the_leader(
    args: list[str], client_config: str, shard: int, base: str, say: Callable[[str], None]
) -> list[int]:
    """The shard's logsvc leader SIGKILLed (then restarted) under an engine's commits; the
    engine's acknowledged commits."""
    second = WorkloadProcess([*args, "--writers", "8", "--seconds", "60", "--run-id", "2"])
    old: Leader | None = None
    try:
        second.wait_acks(200, ACKS_WAIT_S_MAX)
        old = asyncio.run(shard_leader(client_config, shard))
        before = second.acks()
        killed_at_s = time.monotonic()
        devcluster.kill_node(base, old.node)
        resumed = second.wait_acks_since(killed_at_s, 300, ACKS_WAIT_S_MAX)
        longest_wait_s = second.longest_wait_s(killed_at_s)
        after = second.acks_since(killed_at_s)
    finally:
        second.kill()
        if old is not None:
            devcluster.start_node(base, old.node)
    new = asyncio.run(shard_leader(client_config, shard))
    if resumed:
        went_on = (
            f"commits waited up to {longest_wait_s:.2f} s (the longest gap between "
            f"acknowledgements after the kill), then the next commit was acknowledged; "
            f"{after} acknowledged after the kill"
        )
    else:
        went_on = f"only {after} commits acknowledged in the {ACKS_WAIT_S_MAX:.0f} s after it"
    elected = (
        f"new leader {new.node} in term {new.term}"
        if new.term > old.term
        else f"no new term: {new.node} leads in term {new.term}"
    )
    say(
        f"killed {old.node} ({old.address}, the leader in term {old.term}) after {before} "
        f"acknowledged commits; {went_on}; {elected}; {old.node} restarted"
    )
    return second.acked


def _fence(args: list[str], say: Callable[[str], None]) -> list[int]:
    """Engine A commits; engine B opens the same shard (a new lease epoch) and commits; A's
    next commit must fail. Both engines' acknowledged commits."""
    old = WorkloadProcess([*args, "--writers", "4", "--seconds", "60", "--run-id", "3"])
    try:
        old.wait_acks(50, ACKS_WAIT_S_MAX)
        new = WorkloadProcess([*args, "--writers", "2", "--txns", "20", "--run-id", "4"])
        try:
            new_code = new.wait(timeout_s=60)
        finally:
            new.kill()
        old_code = old.wait(timeout_s=ACKS_WAIT_S_MAX)
    finally:
        old.kill()
    lines = old.stderr.strip().splitlines()
    said = lines[-1][:SAID_CHARS_MAX] if lines else "nothing"
    if old_code == 3:
        outcome = f'A\'s next commit was refused and A exited with code 3, saying "{said}"'
    else:
        outcome = f'A WAS NOT FENCED: it exited with code {old_code}, saying "{said}"'
    say(
        f"engine A committed {len(old.acked)}; engine B opened the shard (a new lease epoch) and "
        f"committed {len(new.acked)} (exit code {new_code}); {outcome}"
    )
    return old.acked + new.acked


def _report(found: Verified, acked: list[int], say: Callable[[str], None]) -> None:
    present = set(found.orders)
    missing = sum(1 for txn in acked if txn not in present)
    extra = len(present) - len(set(acked) & present)
    say(
        f"reopened (replay {found.replay_s:.2f} s): {len(acked) - missing} of {len(acked)} "
        f"acknowledged commits present, {missing} lost; {extra} more committed but never "
        "acknowledged (in flight when their engine stopped); "
        + ("every transaction whole" if found.whole() else "SOME TRANSACTIONS ARE PARTIAL")
        + (", none twice" if found.duplicates() == 0 else f", {found.duplicates()} TWICE")
    )
