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
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import pytest

from logsvc.node.shard_host import AppendOutcome, ShardHost, ShardHostLimits
from logsvc.shard.commands import AppendBatch, Appended, AppendGroup, Command, GroupAppended
from logsvc.shard.limits import DEFAULT_SHARD_LIMITS
from logsvc.shard.replica import NotLeader, OutcomeUnknown, Overloaded, ShardReplica


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
        ShardHostLimits(**limits),
        lambda node: node,
    )


def _batch(seq: int) -> AppendBatch:
    return AppendBatch("c", seq, 0, (b"r%d" % seq,))


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
        outcomes: dict[int, AppendOutcome] = {}
        for seq in range(1, 6):
            host.submit_append(_batch(seq), functools.partial(outcomes.__setitem__, seq))
        await _until(lambda: bool(replica.proposed))
        replica.answer_all()
        await _until(lambda: len(outcomes) == 5)
        assert [outcomes[seq] for seq in range(1, 6)] == [
            Appended(seq, 1, duplicate=False) for seq in range(1, 6)
        ]
        await host.close()

    asyncio.run(scenario())


def test_a_full_queue_refuses_at_once() -> None:
    async def scenario() -> None:
        replica = _Replica()
        host = _host(replica, appends_queued_max=2)
        host._batcher.cancel()  # nothing drains the queue
        await asyncio.sleep(0)
        host.submit_append(_batch(1), lambda o: None)
        host.submit_append(_batch(2), lambda o: None)
        with pytest.raises(Overloaded):
            host.submit_append(_batch(3), lambda o: None)

    asyncio.run(scenario())


def test_queued_and_inflight_appends_are_answered_when_the_host_goes_away() -> None:
    async def scenario() -> None:
        replica = _Replica()
        host = _host(replica, proposals_inflight_max=1)
        outcomes: dict[int, AppendOutcome] = {}

        def submit(seq: int) -> None:
            host.submit_append(_batch(seq), lambda o: outcomes.__setitem__(seq, o))

        submit(1)
        await _until(lambda: len(replica.proposed) == 1)  # seq 1 in flight, never answered
        submit(2)  # taken by the batcher, waiting for the one proposal slot
        await _until(host._queue.empty)
        submit(3)  # still in the queue
        for task in list(host._sending):  # the node shuts down: its tasks are cancelled
            task.cancel()
        await host.close()
        await _until(lambda: len(outcomes) == 3)
        assert isinstance(outcomes[1], OutcomeUnknown)  # proposed: it may have committed
        assert isinstance(outcomes[2], NotLeader)  # never proposed: safe to redirect
        assert isinstance(outcomes[3], NotLeader)

    asyncio.run(scenario())
