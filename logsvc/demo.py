"""`logsvc demo`: a local 3-node cluster at work, in well under a minute.

Starts three `logsvc serve` processes on 127.0.0.1 (four shards, three replicas each),
then shows what the service promises: appends acknowledged after a majority fsync, reads,
a long-poll tail, a leader killed with SIGKILL while appends go on (no acknowledged record
lost, none duplicated), the killed node catching up, a fenced writer refused, and
truncation. Then the engine on shard 3 (engine/testing/demo.py): an engine process killed with
SIGKILL under commits and reopened with nothing lost, the shard's leader killed under its
commits, and a second engine fencing the first. Then the engine as a service on shard 4
(engine/tn/demo.py): an active and a standby TN, two compute nodes committing and querying
at timestamps, the shard's leader killed under them, a checkpoint truncating the WAL, the
active TN killed with SIGKILL and the standby taking over with every acknowledged commit
there once, the old TN fenced. Everything it starts is stopped by PID at the end, whatever
happens.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time

from engine.testing import demo as engine_demo
from engine.tn import demo as tn_demo
from logsvc import devcluster, stop_signal
from logsvc.client import Client, LogsvcError, StaleEpoch, Truncated, connect
from logsvc.config import load_client_config

SHARD = 1
ENGINE_SHARD = 3  # not 2: _fencing appends raw records there, which no engine can replay
TN_SHARD = 4  # its own: the TNs' objects directory is not the embedded engine's
SHARDS = 4
WRITERS = 8
CATCH_UP_S_MAX = 30.0
FAILOVER_S_MAX = 30.0
# How long the failover waits for the leadership balancer to finish moving leaders (the first
# node up wins most start-up elections; the moves take a few seconds).
BALANCE_WAIT_S_MAX = 60.0


def _say(text: str) -> None:
    print(text, flush=True)


def run(dir_path: str | None) -> int:
    # SIGTERM stops the cluster as Ctrl-C does (logsvc/stop_signal.py).
    stop_signal.stop_on_sigterm()
    owned = dir_path is None
    base = tempfile.mkdtemp(prefix="logsvc-demo-") if dir_path is None else dir_path
    _say(f"== starting a local cluster in {base} (3 nodes, {SHARDS} shards, 3 replicas each) ==")
    finished = stopped = False
    try:
        pids = devcluster.up(base, nodes=3, shards=SHARDS)
        _say("nodes: " + ", ".join(f"{node} (pid {pid})" for node, pid in pids.items()))
        asyncio.run(_workload(base))
        engine_demo.run(base, ENGINE_SHARD, _say)
        tn_demo.run(base, TN_SHARD, _say)
        finished = True
    except stop_signal.Stopped:
        stopped = True
        _say("\n== stopped by SIGTERM ==")
        raise
    finally:
        stop_signal.ignore_sigterm()  # the stop below is bounded: let it end
        devcluster.down(base)
        _say("cluster stopped (every node process ended by PID)")
        if owned and finished:
            shutil.rmtree(base, ignore_errors=True)
        elif owned:
            how = "was stopped" if stopped else "failed"
            _say(f"the demo {how}: its directory, with every node's and TN's log, is kept: {base}")
    _say("\ndemo finished")
    return 0


async def _workload(base: str) -> None:
    config = load_client_config(f"{base}/client.toml")
    client = await connect(config.addresses, config.token)
    try:
        await _appends_and_reads(client)
        await _failover(client, base, config.addresses)
        await _fencing(client)
        await _truncation(client)
    finally:
        await client.close()


async def _appends_and_reads(client: Client) -> None:
    _say("\n== appends (acknowledged once a majority fsynced them) and reads ==")
    for shard in (1, 2):
        lsns = await client.append(shard, [f"shard {shard} record {i}".encode() for i in range(3)])
        _say(f"shard {shard}: appended 3 records at LSNs {lsns}")
    page = await client.read(SHARD, 1, 1 << 20)
    _say(f"read shard {SHARD} from LSN 1: {[r.decode() for r in page.records]}")
    status = await client.leader_status(SHARD)
    _say(
        f"shard {SHARD}: leader {status.leader}, term {status.term}, next LSN "
        f"{status.next_lsn} (the leader's answer, after a barrier through the log)"
    )

    tail = asyncio.ensure_future(client.tail(SHARD, page.next_lsn, 1 << 20, 10_000))
    await asyncio.sleep(0.2)
    await client.append(SHARD, [b"arrives while the tail waits"])
    waited = await tail
    _say(f"a tail waiting at LSN {page.next_lsn} received: {[r.decode() for r in waited.records]}")


async def _failover(client: Client, base: str, addresses: tuple[str, ...]) -> None:
    _say(f"\n== {WRITERS} writers append to shard {SHARD}; its leader is killed with SIGKILL ==")
    await _await_balanced_leadership(client, addresses)
    old = await client.leader_status(SHARD)  # the leader's own answer, after a barrier
    assert old.leader is not None
    victim = _node_of(addresses, old.leader)
    acked: dict[int, bytes] = {}
    sent = 0
    acks: list[tuple[float, float]] = []  # (sent, acknowledged) of every append
    done = asyncio.Event()

    async def writer(number: int) -> None:
        nonlocal sent
        i = 0
        while not done.is_set() or i < 20:
            payload = f"w{number}-{i}".encode()
            sent += 1
            sent_at = time.monotonic()
            [lsn] = await client.append(SHARD, [payload])
            acked[lsn] = payload
            acks.append((sent_at, time.monotonic()))
            i += 1

    def kill() -> float:
        """The moment of the signal, taken on the thread that sends it. Taken on the loop
        before the thread ran, an append sent in between (on a loaded box, long enough) was
        acknowledged by the live leader; taken once the process was gone, the election
        could be over meanwhile: either way the line said "acknowledged 0.00 s after"."""
        signalled_at = time.monotonic()
        devcluster.kill_node(base, victim)  # SIGKILL at once, then waits until it is gone
        return signalled_at

    def first_ack_after(moment: float) -> float | None:
        after = [acked_at for sent_at, acked_at in acks if sent_at > moment]
        return min(after) if after else None

    async def killer() -> None:
        nonlocal old, victim
        await asyncio.sleep(0.5)
        # Asked again right before the kill: the leadership balancer may have moved the
        # shard since (most likely what made a rehearsal kill a node that no longer led:
        # the appends went on at once, and the demo said the leader was killed).
        old = await client.leader_status(SHARD)
        assert old.leader is not None
        victim = _node_of(addresses, old.leader)
        before = len(acked)
        killed_at = await asyncio.to_thread(kill)
        _say(
            f"killed {victim} (the leader, {old.leader}, term {old.term}) after {before} "
            "acknowledged appends"
        )
        # Acknowledgements of appends sent before the kill may still arrive (committed
        # before it): only an append sent after the kill measures the failover.
        while first_ack_after(killed_at) is None and time.monotonic() - killed_at < FAILOVER_S_MAX:
            await asyncio.sleep(0.01)
        new = await client.leader_status(SHARD)
        first = first_ack_after(killed_at)
        if first is not None:
            waited = f"{first - killed_at:.2f} s after the kill"
            _say(
                f"the first append sent after the kill was acknowledged {waited}; new leader "
                f"{_node_of(addresses, new.leader)} ({new.leader}), term {new.term} "
                "(confirmed by a barrier through the log)"
            )
        else:
            _say(f"no append sent after the kill was acknowledged within {FAILOVER_S_MAX:.0f} s")
        await asyncio.to_thread(devcluster.start_node, base, victim)
        _say(f"restarted {victim}")
        done.set()

    await asyncio.gather(*(writer(n) for n in range(WRITERS)), killer())
    page = await client.tail(SHARD, 1, 1 << 24, 0)  # through the leader: everything committed
    by_lsn = {page.first_lsn + i: record for i, record in enumerate(page.records)}
    lost = [lsn for lsn, payload in acked.items() if by_lsn.get(lsn) != payload]
    duplicated = len(page.records) - len(set(page.records))
    _say(
        f"{len(acked)} appends acknowledged of {sent} sent; lost: {len(lost)}, "
        f"duplicated: {duplicated}"
    )
    await _wait_caught_up(base, addresses, victim, page.next_lsn)


async def _await_balanced_leadership(client: Client, addresses: tuple[str, ...]) -> None:
    """Until each node leads its share of the shards (within one): only then does the
    leadership balancer leave the shards' leaders alone. Killing a leader it was moving
    killed a node that no longer led, and the demo's failover line said 0.00 s."""
    deadline = time.monotonic() + BALANCE_WAIT_S_MAX
    while True:
        leaders = [(await client.leader_status(shard)).leader for shard in range(1, SHARDS + 1)]
        counts = {node: 0 for node in addresses}
        for leader in leaders:
            if leader in counts:
                counts[leader] += 1
        if None not in leaders and max(counts.values()) - min(counts.values()) <= 1:
            led = ", ".join(f"{_node_of(addresses, a)} {n}" for a, n in counts.items())
            _say(f"leaders balanced over the nodes (shards led: {led})")
            return
        if time.monotonic() > deadline:
            _say(f"leaders still moving after {BALANCE_WAIT_S_MAX:.0f} s: going on")
            return
        await asyncio.sleep(0.2)


def _node_of(addresses: tuple[str, ...], data_address: str | None) -> str:
    """dev-cluster's name (n1, n2, ...) of the node at `data_address`."""
    if data_address not in addresses:
        return f"an unknown node ({data_address})"
    return f"n{addresses.index(data_address) + 1}"


async def _wait_caught_up(base: str, addresses: tuple[str, ...], node: str, next_lsn: int) -> None:
    config = load_client_config(f"{base}/client.toml")
    own = await connect([addresses[int(node[1:]) - 1]], config.token)
    deadline = time.monotonic() + CATCH_UP_S_MAX
    try:
        while time.monotonic() < deadline:
            try:
                page = await own.read(SHARD, 1, 1 << 24)
                if page.next_lsn >= next_lsn:
                    _say(f"{node} caught up: it serves LSNs 1..{page.next_lsn - 1} itself")
                    return
            except LogsvcError:
                pass
            await asyncio.sleep(0.2)
        _say(f"{node} did not catch up within {CATCH_UP_S_MAX} s")
    finally:
        await own.close()


async def _fencing(client: Client) -> None:
    _say("\n== leases with epochs: a fenced writer is refused ==")
    await client.acquire_lease(2, "engine-a", 1)
    await client.append(2, [b"written by engine-a"], epoch=1)
    await client.acquire_lease(2, "engine-b", 2)
    _say("engine-a held the lease at epoch 1; engine-b took it at epoch 2")
    try:
        await client.append(2, [b"a late write from engine-a"], epoch=1)
    except StaleEpoch as exc:
        _say(f"engine-a's next append was refused: {exc}")


async def _truncation(client: Client) -> None:
    _say("\n== truncation ==")
    first = await client.truncate(SHARD, 10)
    _say(f"shard {SHARD} truncated: the first retained LSN is {first}")
    try:
        await client.read(SHARD, 1, 100)
    except Truncated as exc:
        _say(f"reading LSN 1 now answers: {exc}")
