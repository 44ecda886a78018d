"""The WAL driver over the logsvc backend, against a real local cluster (issue 7).

One cluster of 3 node processes (`dev-cluster`) serves the whole module, stopped by PID
whatever happens; every test takes fresh shards from it, so LSNs start at 1 for each.

* The conformance suite of tests/unit/tae_driver/test_conformance.py, the very same test
  functions, run here against `LogsvcBackend` (the unit suite runs them on memory and file).
* The driver end to end: a window of records in flight, then FOR_READ replay after a reopen
  gives exactly the DSNs in order; truncate by DSN lands as a logsvc truncate at the mapped
  LSN, and a reopen replays from there; the shard leader's node is SIGKILLed and restarted
  during appends, and the engine still sees a gap-free, duplicate-free DSN sequence with
  every completed entry, and the log holds each record once; a second instance with a higher
  lease epoch fences the first (its next append fails with `BackendFenced` as the cause, and
  so does its truncate, refused by the shard); a tailing reader follows a writer, then takes
  the lease and is promoted to writer.
* The benchmark entry point over the cluster; `close()` ends calls in flight; an unreachable
  cluster is a bounded `BackendUnavailable`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from logsvc import devcluster
from logsvc.client import ClientOptions, LogsvcError, Truncated, connect
from tae_driver import ReplayMode, bench, open_driver
from tae_driver.backend import RecordKind
from tae_driver.backends import logsvc as logsvc_backend
from tae_driver.backends.logsvc import LogsvcBackend
from tae_driver.errors import BackendClosed, BackendFenced, BackendUnavailable, DriverFailed
from tae_driver.record import EntriesRecord, decode
from tests.unit.tae_driver import test_conformance as conformance
from tests.unit.tae_driver.harness import BackendHarness, LogsvcTarget, Recorder, apply_all

from .conftest import LocalCluster

# The conformance suite, collected here too: pytest picks up these module attributes, and
# their `harness` argument resolves to this module's fixture (a logsvc shard).
CONFORMANCE_TESTS: dict[str, Callable[..., None]] = {
    name: test for name, test in vars(conformance).items() if name.startswith("test_")
}
assert len(CONFORMANCE_TESTS) >= 9
globals().update(CONFORMANCE_TESTS)

SHARDS = len(CONFORMANCE_TESTS) + 12  # one per conformance test, the rest for the tests below
SETTLE_S_MAX = 30.0
LEADER_WAIT_S_MAX = 30.0
PROBE = ClientOptions(request_timeout_s=2.0, retry_s_max=1.0)  # one node; a dead one is skipped


class Shards:
    """The module's cluster, and fresh shards from it."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self._next = itertools.count(1)

    def take(self) -> int:
        shard = next(self._next)
        assert shard <= self.cluster.shards, "raise SHARDS"
        return shard

    def target(self, shard: int | None = None) -> LogsvcTarget:
        config = self.cluster.client_config
        return LogsvcTarget(config.addresses, config.token, shard or self.take())

    async def backend(
        self, shard: int, *, lease: bool = True, epoch: int | None = None
    ) -> LogsvcBackend:
        config = self.cluster.client_config
        return await LogsvcBackend.open(
            config.addresses, config.token, shard, lease=lease, epoch=epoch
        )

    async def leader(self, shard: int) -> tuple[str, int]:
        """The shard leader's node id and its term, from the leader itself: a status comes
        from whichever node answers, and a restarted or lagging one may not yet know the
        current term (bounded poll over the nodes)."""
        config = self.cluster.client_config
        deadline = time.monotonic() + LEADER_WAIT_S_MAX
        while True:
            for address in config.addresses:
                client = await connect([address], config.token, options=PROBE)
                try:
                    status = await client.status(shard)
                except LogsvcError:
                    continue
                finally:
                    await client.close()
                if status.is_leader:
                    return self.cluster.node_of(address), status.term
            assert time.monotonic() < deadline, f"no node of shard {shard} says it leads"
            await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shards]:
    dir_path = tmp_path_factory.mktemp("tae-logsvc")
    try:
        yield Shards(LocalCluster(dir_path, shards=SHARDS))
    finally:
        devcluster.down(str(dir_path))  # also after a failed start: by the PIDs it wrote


@pytest.fixture
def harness(shards: Shards, tmp_path: Path) -> BackendHarness:
    return BackendHarness(kind="logsvc", dir_path=tmp_path, logsvc=shards.target())


async def raw_user_records(backend: LogsvcBackend) -> list[tuple[int, bytes]]:
    """Every retained record of the backend's shard, through the backend (leader-checked)."""
    out: list[tuple[int, bytes]] = []
    lsn = await backend.truncated() + 1
    while True:
        records, lsn = await backend.read(lsn, 1 << 20)
        if not records:
            return out
        assert all(r.kind is RecordKind.USER for r in records)
        out.extend((r.lsn, r.payload) for r in records)


def test_a_window_of_appends_replays_for_read_in_dsn_order(shards: Shards) -> None:
    shard = shards.take()
    entries = [b"entry-%05d-" % i + bytes(i % 97) for i in range(1500)]

    async def scenario() -> None:
        backend = await shards.backend(shard)
        driver = open_driver(backend, window=16)
        await driver.replay(apply_all)
        dsns = await asyncio.gather(*(driver.append(e) for e in entries))
        assert dsns == list(range(1, len(entries) + 1))
        appended = driver.stats().records_appended
        assert 1 < appended < len(entries)  # group commit packed entries into records
        await driver.close()
        await backend.close()

        reader = await shards.backend(shard, lease=False)  # a reader fences nobody
        replica = open_driver(reader, read_batch_bytes=4096)  # many pages
        recorder = Recorder()
        summary = await replica.replay(recorder, mode=ReplayMode.FOR_READ)
        assert recorder.handled == list(range(1, len(entries) + 1))
        assert [recorder.entries[d] for d in recorder.handled] == entries
        assert summary.duplicates_ignored == 0
        # Exactly once in the log: one record per append the driver made, none twice.
        assert len(await raw_user_records(reader)) == appended
        await replica.close()
        await reader.close()

    asyncio.run(scenario())


def test_truncate_by_dsn_maps_to_a_logsvc_truncate_and_a_reopen_replays_from_it(
    shards: Shards,
) -> None:
    shard = shards.take()
    config = shards.cluster.client_config

    async def scenario() -> None:
        backend = await shards.backend(shard)
        driver = open_driver(backend, window=8)
        await driver.replay(apply_all)
        await asyncio.gather(*(driver.append(b"e%04d" % i) for i in range(400)))
        known = driver.lsn_map()
        driver.truncate(200)
        truncated_lsn = await driver.truncation_settled()
        assert truncated_lsn > 0
        # The largest LSN at or below which every record holds only DSNs <= 200 (§2.4).
        assert all(r.end_dsn <= 200 for r in known if r.lsn <= truncated_lsn)
        assert any(r.end_dsn > 200 for r in known if r.lsn == truncated_lsn + 1)
        assert await backend.truncated() == truncated_lsn
        await driver.close()
        await backend.close()

        # In logsvc's own terms: first retained LSN = truncated LSN + 1.
        client = await connect(config.addresses, config.token)
        try:
            with pytest.raises(Truncated) as raised:
                await client.tail(shard, truncated_lsn, 1 << 20, 0)
            assert raised.value.first_lsn == truncated_lsn + 1
            page = await client.tail(shard, truncated_lsn + 1, 1, 0)
            first = decode(page.records[0])
            assert isinstance(first, EntriesRecord)
            assert first.start_dsn <= 201  # DSN 201 was not truncated away
        finally:
            await client.close()

        backend = await shards.backend(shard)
        driver = open_driver(backend, window=8)
        recorder = Recorder(apply_from=201)
        summary = await driver.replay(recorder, mode=ReplayMode.FOR_WRITE)
        assert summary.truncated_lsn == truncated_lsn
        assert recorder.applied == list(range(201, 401))
        assert recorder.handled == list(range(recorder.handled[0], 401))
        assert await driver.append(b"after") == 401
        await driver.close()
        await backend.close()

    asyncio.run(scenario())


def test_a_leader_failover_during_appends_loses_and_duplicates_nothing(shards: Shards) -> None:
    shard = shards.take()
    cluster = shards.cluster

    async def scenario() -> None:
        backend = await shards.backend(shard)
        # Small records, many producers: many records in flight when the leader dies.
        driver = open_driver(backend, window=32, record_entries_max=4)
        await driver.replay(apply_all)
        completed: dict[int, bytes] = {}
        order: list[int] = []
        stop = asyncio.Event()

        async def producer(number: int) -> None:
            for i in itertools.count():
                if stop.is_set():
                    return
                entry = b"p%02d-%06d" % (number, i)
                dsn = await driver.append(entry)
                completed[dsn] = entry
                order.append(dsn)

        producers = [asyncio.ensure_future(producer(n)) for n in range(96)]

        async def until_completed(count: int) -> None:
            deadline = time.monotonic() + SETTLE_S_MAX
            while len(completed) < count:
                if any(p.done() for p in producers):
                    return  # one failed: the gather below raises its error
                assert time.monotonic() < deadline, f"stuck at {len(completed)} entries"
                await asyncio.sleep(0.02)

        try:
            await until_completed(500)
            victim, term = await shards.leader(shard)
            in_flight = driver.stats().records_in_flight
            await asyncio.to_thread(devcluster.kill_node, cluster.dir, victim)
            await asyncio.sleep(1.0)
            await asyncio.to_thread(devcluster.start_node, cluster.dir, victim)
            await until_completed(len(completed) + 500)
        finally:
            stop.set()
            await asyncio.gather(*producers)
        assert in_flight > 1  # the kill hit a window of records in flight
        assert (await shards.leader(shard))[1] > term  # another leader took over
        assert order == sorted(order)  # completions in DSN order
        assert sorted(completed) == list(range(1, len(completed) + 1))
        appended = driver.stats().records_appended
        await driver.close()
        await backend.close()

        backend = await shards.backend(shard)
        driver = open_driver(backend)
        recorder = Recorder()
        summary = await driver.replay(recorder, mode=ReplayMode.FOR_WRITE)
        assert recorder.handled == list(range(1, len(completed) + 1))
        assert recorder.entries == completed
        assert summary.trailing_records == 0
        assert summary.duplicates_ignored == 0
        assert len(await raw_user_records(backend)) == appended  # each record once
        await driver.close()
        await backend.close()

    asyncio.run(scenario())


def test_a_higher_lease_epoch_fences_the_older_instance(shards: Shards) -> None:
    shard = shards.take()

    async def scenario() -> None:
        old = await shards.backend(shard)
        old_driver = open_driver(old, window=4)
        await old_driver.replay(apply_all)
        for i in range(5):
            await old_driver.append(b"old-%d" % i)

        new = await shards.backend(shard)  # the next epoch: fences `old`
        assert new.epoch > old.epoch >= 1
        new_driver = open_driver(new, window=4)
        recorder = Recorder()
        await new_driver.replay(recorder, mode=ReplayMode.FOR_WRITE)
        assert recorder.handled == [1, 2, 3, 4, 5]

        with pytest.raises(DriverFailed) as raised:
            await old_driver.append(b"late")
        fenced = raised.value.__cause__
        assert isinstance(fenced, BackendFenced)
        assert (fenced.epoch, fenced.current_epoch) == (old.epoch, new.epoch)
        assert fenced.current_holder == new.holder
        with pytest.raises(BackendFenced):
            await old.append(b"late again")  # refused at once from now on
        with pytest.raises(BackendFenced):
            await old.truncate(1)
        with pytest.raises(BackendFenced):  # an explicit stale epoch is refused at open
            await shards.backend(shard, epoch=old.epoch)
        await old_driver.close()
        await old.close()

        assert await new_driver.append(b"new") == 6
        await new_driver.close()
        await new.close()

        reader = await shards.backend(shard, lease=False)
        replica = open_driver(reader)
        recorder = Recorder()
        await replica.replay(recorder, mode=ReplayMode.FOR_READ)
        assert [recorder.entries[d] for d in recorder.handled] == [
            *(b"old-%d" % i for i in range(5)),
            b"new",
        ]
        await replica.close()
        await reader.close()

    asyncio.run(scenario())


def test_a_fenced_instance_cannot_truncate(shards: Shards) -> None:
    """The shard refuses the fenced instance's truncate itself (its epoch is stale): no
    append of its own told it first that it was fenced."""
    shard = shards.take()

    async def scenario() -> None:
        old = await shards.backend(shard)
        for i in range(4):
            assert await old.append(b"old-%d" % i) == i + 1
        new = await shards.backend(shard)  # the next epoch: fences `old`
        assert old.fenced is None  # it does not know yet

        with pytest.raises(BackendFenced) as raised:
            await old.truncate(2)
        assert (raised.value.epoch, raised.value.current_epoch) == (old.epoch, new.epoch)
        assert raised.value.current_holder == new.holder
        assert old.fenced is not None
        with pytest.raises(BackendFenced):
            await old.append(b"late")  # refused at once from now on
        assert await new.truncated() == 0  # the log was not truncated

        await new.truncate(2)  # the holder truncates
        assert await new.truncated() == 2
        await old.close()
        await new.close()

    asyncio.run(scenario())


def test_a_tailing_reader_follows_the_writer_then_takes_over(shards: Shards) -> None:
    shard = shards.take()

    async def scenario() -> None:
        writer = await shards.backend(shard)
        writer_driver = open_driver(writer, window=8)
        await writer_driver.replay(apply_all)
        reader = await shards.backend(shard, lease=False)
        reader_driver = open_driver(reader)
        seen: list[int] = []
        recorder = Recorder(on_dsn=seen.append)
        tailing = asyncio.ensure_future(reader_driver.replay(recorder, mode=ReplayMode.FOREVER))
        for i in range(60):
            await writer_driver.append(b"w%02d" % i)
            if i % 20 == 0:
                await asyncio.sleep(0.05)  # let the tail catch up and wait at the leader
        deadline = time.monotonic() + SETTLE_S_MAX
        while len(seen) < 60:
            assert time.monotonic() < deadline, f"the tail saw {len(seen)} of 60"
            await asyncio.sleep(0.02)
        assert not tailing.done()

        await reader.acquire_lease()  # fences the writer before the reader finishes replay
        assert reader.epoch > writer.epoch
        reader_driver.stop_tailing(ReplayMode.FOR_WRITE)
        summary = await asyncio.wait_for(tailing, SETTLE_S_MAX)
        assert summary.mode is ReplayMode.FOR_WRITE
        assert recorder.handled == list(range(1, 61))
        assert await reader_driver.append(b"promoted") == 61
        with pytest.raises(DriverFailed):
            await writer_driver.append(b"stale")
        await writer_driver.close()
        await writer.close()
        await reader_driver.close()
        await reader.close()

    asyncio.run(scenario())


def test_the_bench_runs_over_a_running_cluster(
    shards: Shards, capsys: pytest.CaptureFixture[str]
) -> None:
    shard = shards.take()
    argv = ["--backend", "logsvc", "--window", "4", "--entry-bytes", "64", "--seconds", "0.3"]
    argv += ["--clients", "50", "--client-config", f"{shards.cluster.dir}/client.toml"]
    assert bench.main([*argv, "--shard", str(shard)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["backend"], report["shard"], report["window"]) == ("logsvc", shard, 4)
    assert report["entries"] > 0
    assert report["latency_ms_p50"] <= report["latency_ms_p99"] <= report["latency_ms_max"]


CLOSE_POLL_MS = 20_000


def test_close_ends_the_calls_in_flight(shards: Shards, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long poll of 20 s here (the backend's is at most 1 s), so that ended by the close
    and ended by the poll's own timeout are 10 s apart, not 0.5 s (a collection or a loaded
    box took that, and the 1 s poll could even end before the close was asked)."""
    shard = shards.take()
    monkeypatch.setattr(logsvc_backend, "LOGSVC_TAIL_WAIT_MS_MAX", CLOSE_POLL_MS)
    config = shards.cluster.client_config
    options = ClientOptions(request_timeout_s=2 * CLOSE_POLL_MS / 1000.0)

    async def scenario() -> None:
        backend = await LogsvcBackend.open(config.addresses, config.token, shard, options=options)
        waiting = asyncio.ensure_future(backend.wait_past(0))  # an empty log: a long poll
        await asyncio.sleep(0.1)
        assert not waiting.done()
        # Closed, and the poll ended by the close, well before the poll's own 20 s (a close
        # that waited for its calls instead of cancelling them takes the 20 s).
        async with asyncio.timeout(CLOSE_POLL_MS / 1000.0 / 2):
            await backend.close()
            await waiting
        with pytest.raises(BackendClosed):
            await backend.append(b"too late")

    asyncio.run(scenario())


def test_an_unreachable_cluster_is_a_bounded_backend_unavailable() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    options = ClientOptions(
        request_timeout_s=0.2,
        retry_s_max=0.5,
        connect_timeout_s=0.2,
        backoff_s_first=0.01,
        backoff_s_max=0.05,
    )

    async def scenario() -> None:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await LogsvcBackend.open([address], "token", 1, options=options)
        assert time.monotonic() - started < 5.0

    asyncio.run(scenario())
