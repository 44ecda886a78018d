"""ShardHost's append path: every append handed to `submit_append` gets exactly one answer
through its callback: its result from the group it rode in, `Overloaded` at once when the
queue is full, and a typed error when the host closes or the node shuts down with it still
queued or in flight (the data plane counts appends in flight per connection by these
callbacks, so a lost one would leak a slot for good).

How: a real ShardHost on an asyncio loop over a test double of the replica port that
records proposals and answers them when (and if) the test says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest

from logsvc.node.limits import ServerLimits
from logsvc.node.shard_host import AppendOutcome, ShardHost
from logsvc.shard.commands import AppendBatch, Appended, AppendGroup, Command, GroupAppended
from logsvc.shard.limits import DEFAULT_SHARD_LIMITS
from logsvc.shard.replica import (
    NotLeader,
    OutcomeUnknown,
    Overloaded,
    ReadResult,
    ShardReplica,
)


class _Replica:
    """The part of ShardReplica that ShardHost uses; proposals wait for `answer_all`."""

    shard_limits = DEFAULT_SHARD_LIMITS

    def __init__(self) -> None:
        self.proposed: list[tuple[Command, Callable[[object], None]]] = []
        self.next_lsn = 1

    def add_apply_listener(self, listener: Callable[[int], None]) -> None:
        pass

    def submit(self, command: Command, done: Callable[[object], None]) -> None:
        self.proposed.append((command, done))

    def answer_all(self) -> None:
        for command, done in self.proposed:
            batches = command.batches if isinstance(command, AppendGroup) else (command,)
            results = []
            for batch in batches:
                assert isinstance(batch, AppendBatch)
                results.append(Appended(self.next_lsn, len(batch.records), duplicate=False))
                self.next_lsn += len(batch.records)
            done(GroupAppended(tuple(results)) if isinstance(command, AppendGroup) else results[0])
        self.proposed.clear()


def _host(replica: _Replica, **limits: Any) -> ShardHost:
    return ShardHost(
        1,
        cast(ShardReplica, replica),
        ThreadPoolExecutor(1),
        ServerLimits(**limits),
        lambda node: node,
    )


def _batch(seq: int) -> AppendBatch:
    return AppendBatch("c", seq, 0, (b"r%d" % seq,))


def _submit_each(host: ShardHost, seqs: range) -> dict[int, AppendOutcome]:
    """Submit one batch per seq; the dict fills with each one's outcome."""
    outcomes: dict[int, AppendOutcome] = {}
    for seq in seqs:
        host.submit_append(_batch(seq), functools.partial(outcomes.__setitem__, seq))
    return outcomes


def _appended(seqs: range) -> list[AppendOutcome]:
    """What `_Replica.answer_all` gives appends of one record each, the first at LSN 1."""
    return [Appended(seq, 1, duplicate=False) for seq in seqs]


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not reached")


def test_every_append_of_a_group_gets_its_own_result() -> None:
    async def scenario() -> None:
        replica = _Replica()
        host = _host(replica)
        outcomes = _submit_each(host, range(1, 6))
        await _until(lambda: bool(replica.proposed))
        replica.answer_all()
        await _until(lambda: len(outcomes) == 5)
        assert [outcomes[seq] for seq in range(1, 6)] == _appended(range(1, 6))
        await host.close()

    asyncio.run(scenario())


def test_a_full_queue_refuses_at_once() -> None:
    async def scenario() -> None:
        replica = _Replica()
        host = _host(replica, appends_queued_per_shard_max=2)
        host._batcher.cancel()  # nothing drains the queue
        with contextlib.suppress(asyncio.CancelledError):
            await host._batcher
        host.submit_append(_batch(1), lambda o: None)
        host.submit_append(_batch(2), lambda o: None)
        with pytest.raises(Overloaded):
            host.submit_append(_batch(3), lambda o: None)

    asyncio.run(scenario())


def test_queued_and_inflight_appends_are_answered_when_the_host_goes_away() -> None:
    async def scenario() -> None:
        replica = _Replica()
        host = _host(replica, proposals_inflight_per_shard_max=1, batch_delay_ms_max=0)
        outcomes: dict[int, AppendOutcome] = {}

        def submit(seq: int) -> None:
            host.submit_append(_batch(seq), lambda o: outcomes.__setitem__(seq, o))

        submit(1)
        await _until(lambda: len(replica.proposed) == 1)  # seq 1 in flight, never answered
        submit(2)  # taken by the batcher, waiting for the one proposal slot
        await _until(lambda: not host._queued)
        submit(3)  # still in the queue
        await host.close()  # the node shuts down
        await _until(lambda: len(outcomes) == 3)
        assert isinstance(outcomes[1], OutcomeUnknown)  # proposed: it may have committed
        assert isinstance(outcomes[2], NotLeader)  # never proposed: safe to redirect
        assert isinstance(outcomes[3], NotLeader)

    asyncio.run(scenario())


def _proposed_seqs(replica: _Replica) -> list[list[int]]:
    groups = []
    for command, _ in replica.proposed:
        batches = command.batches if isinstance(command, AppendGroup) else (command,)
        groups.append([batch.seq for batch in batches])  # type: ignore[union-attr]
    return groups


def test_groups_stay_within_their_bounds_and_keep_the_order() -> None:
    async def scenario() -> None:
        replica = _Replica()
        # Each test batch counts 2 + 64 bytes: 3 fit in 200 bytes, a 4th does not.
        host = _host(replica, batch_bytes_max=200, batch_appends_max=8)
        outcomes = _submit_each(host, range(1, 11))
        await _until(lambda: sum(map(len, _proposed_seqs(replica))) == 10)
        assert _proposed_seqs(replica) == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10]]
        replica.answer_all()
        await _until(lambda: len(outcomes) == 10)
        assert [outcomes[seq] for seq in range(1, 11)] == _appended(range(1, 11))
        await host.close()

    asyncio.run(scenario())


def test_a_linger_gathers_appends_that_arrive_while_it_waits() -> None:
    async def scenario() -> None:
        replica = _Replica()
        host = _host(replica, batch_delay_ms_max=200)
        host.submit_append(_batch(1), lambda o: None)
        await _until(lambda: not host._queued and host._wakeup is not None)  # took 1, lingers
        assert not replica.proposed
        host.submit_append(_batch(2), lambda o: None)
        host.submit_append(_batch(3), lambda o: None)
        await _until(lambda: bool(replica.proposed))
        assert _proposed_seqs(replica) == [[1, 2, 3]]
        await host.close()

    asyncio.run(scenario())


def test_close_just_as_a_lingering_batcher_is_woken_still_ends_it() -> None:
    # The batcher lingers for more; an append wakes it and the host closes in the same
    # loop iteration, before the batcher runs. (asyncio.wait_for on Python 3.11 would
    # return the wake-up instead of the cancellation, and close() would never return.)
    async def scenario() -> None:
        replica = _Replica()
        host = _host(replica, batch_delay_ms_max=60_000)
        outcomes: dict[int, AppendOutcome] = {}
        host.submit_append(_batch(1), functools.partial(outcomes.__setitem__, 1))
        await _until(lambda: host._wakeup is not None)  # seq 1 taken, lingering
        host.submit_append(_batch(2), functools.partial(outcomes.__setitem__, 2))
        closing = asyncio.ensure_future(host.close())
        try:
            await _until(closing.done)  # on its own: nothing else cancels the batcher again
        finally:
            closing.cancel()
        assert not replica.proposed
        assert isinstance(outcomes[1], NotLeader)
        assert isinstance(outcomes[2], NotLeader)

    asyncio.run(scenario())


def test_a_group_with_no_answer_times_out_once_and_frees_its_slot() -> None:
    async def scenario() -> None:
        replica = _Replica()
        host = _host(replica, proposals_inflight_per_shard_max=1, proposal_timeout_ms=50)
        first = _submit_each(host, range(1, 2))
        await _until(lambda: len(replica.proposed) == 1)
        late = replica.proposed[0][1]
        await _until(lambda: 1 in first)  # no answer: the timeout answers it
        assert isinstance(first[1], OutcomeUnknown)
        second = _submit_each(host, range(2, 3))  # the slot is free again
        await _until(lambda: len(replica.proposed) == 2)
        late(Appended(1, 1, duplicate=False))  # the tick thread answers after all: ignored
        replica.proposed.pop(0)
        replica.answer_all()
        await _until(lambda: 2 in second)
        assert isinstance(first[1], OutcomeUnknown)
        assert second[2] == Appended(1, 1, duplicate=False)
        await host.close()

    asyncio.run(scenario())


class _TailedReplica(_Replica):
    """Also `read` (records once `apply` made them) and the apply listeners, which `apply`
    calls from another thread as the Raft tick would."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners: list[Callable[[int], None]] = []
        self.records: list[bytes] = []

    def add_apply_listener(self, listener: Callable[[int], None]) -> None:
        self.listeners.append(listener)

    def read(self, lsn: int, max_bytes: int, records_max: int) -> ReadResult:
        return ReadResult(tuple(self.records[lsn - 1 :]), lsn, len(self.records) + 1)

    def apply(self, record: bytes) -> None:
        def tick() -> None:
            self.records.append(record)
            for listener in self.listeners:
                listener(len(self.records) + 1)

        thread = threading.Thread(target=tick)
        thread.start()
        thread.join()


def test_an_apply_wakes_the_loop_only_for_a_tail_read() -> None:
    """With no tail read in progress an apply schedules nothing on the loop (it used to wake
    it for every apply); a tail read waiting for records is woken by the apply at once."""

    async def scenario() -> None:
        replica = _TailedReplica()
        host = _host(replica)
        loop = asyncio.get_running_loop()
        scheduled: list[str] = []  # the host's own wake-ups (the executor's reads use it too)
        real = loop.call_soon_threadsafe

        def counting(callback: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(callback, "__name__", "") == "_wake_tails":
                scheduled.append("wake")
            return real(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]
        try:
            replica.apply(b"nobody-tails")
            assert scheduled == []
            tail = asyncio.ensure_future(host.tail(2, 1 << 20, 30_000, 100))
            await _until(lambda: host._tail_waiters == 1)  # read nothing, now waiting
            replica.apply(b"wanted")
            result = await asyncio.wait_for(tail, 5.0)  # not the tail's 30 s
            assert result.records == (b"wanted",)
            assert scheduled == ["wake"]
        finally:
            loop.call_soon_threadsafe = real  # type: ignore[method-assign]
            await host.close()

    asyncio.run(scenario())
