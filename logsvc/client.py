"""The logsvc client library: async `Client`, and `SyncClient` for scripts.

    client = await connect(["127.0.0.1:7101", "127.0.0.1:7102"], token)
    client = await connect("client.toml")              # or the addresses and token of a
                                                       # client config (`logsvc dev-cluster
                                                       # up` writes DIR/client.toml)
    lsns = await client.append(1, [b"a", b"b"])        # -> [first, first + 1]
    producer = Producer(client)                        # optional producer-side batching
    lsn = await producer.send(1, b"c")                 # shares an append with its neighbours
    page = await client.read(1, lsns[0], 1 << 20)      # Records(records, first_lsn, next_lsn)
    await client.close()

* One connection per node, opened on first use, authenticated, pipelined: many requests in
  flight, matched to responses by request id (at most `requests_inflight_max` per
  connection; past that the call waits for a slot, bounded by its timeout).
* Leader discovery: writes go to the shard's last known leader, else to any node; a
  `NOT_LEADER` answer names the leader's data address and the client follows it.
* Retries are bounded (`attempts_max`, with back-off) and reuse the same `(client_id, seq)`
  for an append, so a retry after a timeout or a leader change gets the original LSNs back
  instead of a duplicate (the shard deduplicates).
* The shard remembers the last `dedupe_window` seqs of each client id. Retries and
  redirects reorder appends in flight, so the seqs of a client id in flight always lie
  within `dedupe_window` consecutive seqs: concurrent appends are spread over lanes
  (`<client_id>.<n>`), and a lane hands out no seq `dedupe_window` past its lowest one not
  yet answered. A retried seq is then always still remembered.
* Errors are typed (`LogsvcError` subclasses) and carry what the caller needs to act.

The append path costs a few microseconds of Python per call, as it runs tens of thousands of
times a second: a free lane and a free pipelining slot are taken without awaiting anything,
and the per-request timeouts of a connection share one timer (`_Expiries`) instead of
arming one each.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from logsvc.client_config import load_client_config
from logsvc.frame_writer import FrameWriter
from logsvc.wire import messages as wire
from logsvc.wire.frames import FrameDecoder, ProtocolError

T = TypeVar("T")
# Requests queued on one connection before `call` waits for the server to read them.
WRITE_BUFFER_BYTES_MAX = 8 * 1024 * 1024


class LogsvcError(Exception):
    """Base of every error the client raises."""


class ServerError(LogsvcError):
    """The server answered with an error; `code` says which."""

    def __init__(self, response: wire.ErrorResponse) -> None:
        super().__init__(f"{response.code.name}: {response.message}")
        self.code = response.code
        self.response = response


class NotLeader(ServerError):
    pass


class Truncated(ServerError):
    @property
    def first_lsn(self) -> int | None:
        return self.response.first_lsn


class StaleEpoch(ServerError):
    pass


class Overloaded(ServerError):
    pass


class NotLeaseHolder(ServerError):
    """The epoch is above the lease's: acquire the lease at that epoch first."""


class Unauthenticated(ServerError):
    pass


class UnknownShard(LogsvcError):
    """Every node of the client's addresses answered UNKNOWN_SHARD within one call: no
    node hosts the shard (a wrong shard id, or one never created), which retrying cannot
    change (issue 20: `logsvc status --shard 7` retried for 16 s). One node's answer alone is
    retried, since membership changes move a shard's replicas between nodes."""

    def __init__(self, shard: int, addresses: Sequence[str]) -> None:
        super().__init__(
            f"shard {shard} is not hosted by any node of the cluster "
            f"({', '.join(addresses)} each answered UNKNOWN_SHARD)"
        )
        self.shard = shard
        self.addresses = tuple(addresses)


class Unavailable(LogsvcError):
    """No node answered usefully within the attempts allowed."""


class TooManyInFlight(LogsvcError):
    """Every lane already has `dedupe_window` appends in flight and none freed up within
    the request timeout: the caller is sending faster than the cluster answers."""


_ERRORS: dict[wire.ErrorCode, type[ServerError]] = {
    wire.ErrorCode.NOT_LEADER: NotLeader,
    wire.ErrorCode.TRUNCATED: Truncated,
    wire.ErrorCode.STALE_EPOCH: StaleEpoch,
    wire.ErrorCode.OVERLOADED: Overloaded,
    wire.ErrorCode.NOT_LEASE_HOLDER: NotLeaseHolder,
    wire.ErrorCode.UNAUTHENTICATED: Unauthenticated,
}
# Answers after which the same request may be sent again (to the same or another node).
# UNKNOWN_SHARD: the client's addresses are the cluster's nodes, and membership changes
# move a shard's replicas between them; the node asked does not (or no longer) host it. Once
# every address has answered it in one call, no node hosts the shard: `UnknownShard`.
_RETRYABLE = {
    wire.ErrorCode.NOT_LEADER,
    wire.ErrorCode.OVERLOADED,
    wire.ErrorCode.OUTCOME_UNKNOWN,
    wire.ErrorCode.UNAVAILABLE,
    wire.ErrorCode.UNKNOWN_SHARD,
}


@dataclass(frozen=True, slots=True)
class ClientOptions:
    request_timeout_s: float = 10.0  # one attempt
    # All attempts of one call: long enough to ride out a leader election (election
    # timeouts are 1-2.5 s in the example configs) plus the dead leader's detection.
    retry_s_max: float = 15.0
    attempts_max: int = 64
    backoff_s_first: float = 0.05
    backoff_s_max: float = 1.0
    requests_inflight_max: int = 1024  # per connection
    connect_timeout_s: float = 5.0
    # At most the shard's `dedupe_seqs_per_client` (logsvc/shard/limits.py, 16 by default).
    dedupe_window: int = 16
    lanes_max: int = 1024  # client ids per client: bounds appends in flight to lanes x window


class _Waiters:
    """Callers waiting, bounded in time, for something another call frees (a lane, a
    pipelining slot): `wait` until woken or the deadline, `wake_one` from the freeing
    side. Whoever is woken checks again: a caller that did not wait may have taken the
    freed thing first."""

    def __init__(self) -> None:
        self._futures: collections.deque[asyncio.Future[None]] = collections.deque()

    async def wait(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Return when woken; `TimeoutError` at `deadline` (loop time)."""
        waiter: asyncio.Future[None] = loop.create_future()
        self._futures.append(waiter)
        try:
            await asyncio.wait_for(waiter, max(0.0, deadline - loop.time()))
        finally:
            if not waiter.done():
                waiter.cancel()

    def wake_one(self) -> None:
        while self._futures:  # skip those that gave up
            waiter = self._futures.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


class _Lanes:
    """Hands out (client id, seq) so that the seqs of one id in flight always lie within
    `window` consecutive seqs: a seq is handed out only while it is less than `window` past
    the lowest seq of its id not yet released. (Bounding only the count in flight is not
    enough: while one append is stuck in retries after a leader change, the others of its id
    complete and new seqs follow them, and once `window` newer seqs are accepted the shard
    forgets below them and answers the stuck retry DUPLICATE_UNKNOWN.)

    Lanes with room are kept on a stack (`_spare`), so taking one is O(1) and never waits
    while one has room; past `lanes_max` lanes x `window`, `acquire` waits (bounded) for a
    release."""

    def __init__(self, client_id: str, window: int, lanes_max: int, wait_s_max: float) -> None:
        assert window >= 1
        assert lanes_max >= 1
        self._wait_s_max = wait_s_max
        self._client_id = client_id
        self._window = window
        self._lanes_max = lanes_max
        self._base: list[int] = []  # per lane: the lowest seq not yet released
        self._done: list[int] = []  # per lane: bit i = seq base + i released already
        self._next_seq: list[int] = []
        self._spare: list[int] = []  # lanes whose next seq is within the window
        self._is_spare: list[bool] = []
        self._waiters = _Waiters()

    async def acquire(self) -> tuple[int, str, int]:
        taken = self.take_nowait()
        if taken is not None:
            return taken
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s_max
        while True:
            try:
                await self._waiters.wait(loop, deadline)
            except TimeoutError:
                raise TooManyInFlight(
                    f"{self._lanes_max} lanes x {self._window} appends in flight"
                ) from None
            taken = self.take_nowait()
            if taken is not None:
                return taken

    def release(self, lane: int, seq: int) -> None:
        base = self._base[lane]
        offset = seq - base
        assert 0 <= offset < self._window
        done = self._done[lane] | (1 << offset)
        while done & 1:
            done >>= 1
            base += 1
        self._done[lane] = done
        self._base[lane] = base
        if not self._is_spare[lane] and self._next_seq[lane] - base < self._window:
            self._is_spare[lane] = True
            self._spare.append(lane)
        self._waiters.wake_one()

    def take_nowait(self) -> tuple[int, str, int] | None:
        """(lane, client id, seq) at once, or None when every lane is full."""
        if self._spare:
            lane = self._spare[-1]
        elif len(self._base) < self._lanes_max:
            lane = len(self._base)
            self._base.append(1)
            self._done.append(0)
            self._next_seq.append(1)
            self._is_spare.append(True)
            self._spare.append(lane)
        else:
            return None
        seq = self._next_seq[lane]
        self._next_seq[lane] = seq + 1
        if seq + 1 - self._base[lane] >= self._window:
            self._spare.pop()
            self._is_spare[lane] = False
        return lane, f"{self._client_id}.{lane}", seq


class _Expiries:
    """The request timeouts of one connection, on one timer. Every request has the same
    timeout, so deadlines come in the order requests were sent: a FIFO of (deadline,
    request id), and one `call_at` for the oldest. Entries of answered requests are
    dropped from the front as they reach it, so the FIFO holds about as many entries as
    there are requests in flight."""

    def __init__(self, timeout_s: float, expire: Callable[[int], None]) -> None:
        self._timeout_s = timeout_s
        self._expire = expire  # called with the id of a request past its deadline
        self._fifo: collections.deque[tuple[float, int]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, loop: asyncio.AbstractEventLoop, request_id: int) -> None:
        deadline = loop.time() + self._timeout_s
        self._fifo.append((deadline, request_id))
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._fire, loop)

    def drop_answered(self, pending: dict[int, Any]) -> None:
        fifo = self._fifo
        while fifo and fifo[0][1] not in pending:
            fifo.popleft()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._fifo.clear()

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        now = loop.time()
        fifo = self._fifo
        while fifo and fifo[0][0] <= now:
            self._expire(fifo.popleft()[1])
        if fifo:
            self._timer = loop.call_at(fifo[0][0], self._fire, loop)


class _Connection:
    def __init__(self, address: str, token: str, options: ClientOptions) -> None:
        self.address = address
        self._token = token
        self._options = options
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._out: FrameWriter | None = None
        self._pending: dict[int, asyncio.Future[object]] = {}
        self._ids = itertools.count(1)
        self._slot_waiters = _Waiters()
        self._expiries = _Expiries(options.request_timeout_s, self._expire)
        self._receiver: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.broken = False
        self.ready = False  # open and authenticated: calls may skip ensure_open

    async def ensure_open(self) -> None:
        if self.ready and not self.broken:
            return
        async with self._lock:
            if self._writer is not None and not self.broken:
                return
            host, _, port = self.address.rpartition(":")
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port)), self._options.connect_timeout_s
            )
            self._reader, self._writer = reader, writer
            self.broken = False
            self._out = FrameWriter(writer, WRITE_BUFFER_BYTES_MAX)
            self._receiver = asyncio.create_task(self._receive())
        answer = await self.call(wire.Authenticate(self._token))
        if isinstance(answer, wire.ErrorResponse):
            await self.close()
            raise _error(answer)
        self.ready = True

    async def call(self, request: object) -> object:
        """Send `request` and wait for its answer: `TimeoutError` after the request
        timeout, `ConnectionError` if the connection is or gets lost."""
        loop = asyncio.get_running_loop()
        if len(self._pending) >= self._options.requests_inflight_max:
            await self._wait_for_slot(loop)
        if self._writer is None or self.broken:
            raise ConnectionError(f"connection to {self.address} is closed")
        request_id = next(self._ids)
        future: asyncio.Future[object] = loop.create_future()
        self._pending[request_id] = future
        self._expiries.add(loop, request_id)
        try:
            out = self._out
            assert out is not None
            # Leaves with the other requests of this loop iteration (one system call).
            out.write(wire.encode_request(request_id, request))  # type: ignore[arg-type]
            if out.over_limit():
                await out.drain_if_over()
            return await future
        finally:
            self._pending.pop(request_id, None)
            self._expiries.drop_answered(self._pending)
            self._slot_waiters.wake_one()  # a slot is free

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait (at most the request timeout) for fewer than `requests_inflight_max`
        requests to be in flight."""
        deadline = loop.time() + self._options.request_timeout_s
        while len(self._pending) >= self._options.requests_inflight_max:
            try:
                await self._slot_waiters.wait(loop, deadline)
            except TimeoutError:
                raise TimeoutError(f"no request slot on {self.address}") from None

    def _expire(self, request_id: int) -> None:
        future = self._pending.get(request_id)
        if future is not None and not future.done():
            future.set_exception(
                TimeoutError(
                    f"no answer from {self.address} within {self._options.request_timeout_s} s"
                )
            )

    async def _receive(self) -> None:
        decoder = FrameDecoder()
        assert self._reader is not None
        try:
            while True:
                data = await self._reader.read(256 * 1024)
                if not data:
                    break
                decoder.feed(data)
                while (frame := decoder.next_frame()) is not None:
                    future = self._pending.get(frame.request_id)
                    if future is None or future.done():
                        continue
                    try:
                        future.set_result(wire.decode_response(frame))
                    except wire.BadResponse as exc:  # fails this request only
                        future.set_exception(exc)
        except (ConnectionError, ProtocolError):
            pass
        finally:
            self.broken = True
            self.ready = False
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError(f"connection to {self.address} lost"))

    async def close(self) -> None:
        self.broken = True
        self.ready = False
        self._expiries.cancel()
        if self._receiver is not None:
            self._receiver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._receiver
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
            self._writer = None


class Client:
    def __init__(
        self, addresses: Sequence[str], token: str, options: ClientOptions, client_id: str
    ) -> None:
        assert addresses, "at least one node address"
        self._addresses = list(addresses)
        self._token = token
        self._options = options
        self.client_id = client_id
        self._lanes = _Lanes(
            client_id, options.dedupe_window, options.lanes_max, options.request_timeout_s
        )
        self._connections: dict[str, _Connection] = {}
        self._leaders: dict[int, str] = {}
        self._closed = False

    # ------------------------------------------------------------------ operations

    async def append(self, shard: int, payloads: Sequence[bytes], *, epoch: int = 0) -> list[int]:
        """Append records atomically as one batch; return their LSNs (consecutive)."""
        lanes = self._lanes
        taken = lanes.take_nowait()  # the usual case: no coroutine for the acquisition
        lane, lane_id, seq = taken if taken is not None else await lanes.acquire()
        try:
            request = wire.Append(shard, tuple(payloads), lane_id, seq, epoch)
            answer = await self._leader_call(shard, request)
        finally:
            self._lanes.release(lane, seq)
        assert isinstance(answer, wire.Appended), answer
        return list(range(answer.first_lsn, answer.first_lsn + answer.count))

    async def read(self, shard: int, lsn: int, max_bytes: int) -> wire.Records:
        """Committed records from `lsn`. Any replica may answer: one that is catching up
        returns a shorter prefix (never other data). `tail` reads through the leader."""
        answer = await self._any_call(shard, wire.Read(shard, lsn, max_bytes))
        assert isinstance(answer, wire.Records), answer
        return answer

    async def tail(self, shard: int, lsn: int, max_bytes: int, wait_ms: int) -> wire.Records:
        answer = await self._leader_call(shard, wire.Tail(shard, lsn, max_bytes, wait_ms))
        assert isinstance(answer, wire.Records), answer
        return answer

    async def truncate(self, shard: int, lsn: int, *, epoch: int = 0) -> int:
        """Discard every LSN below `lsn`; return the first retained LSN. Fenced like an
        append: `StaleEpoch` when `epoch` is below the shard's lease epoch."""
        answer = await self._leader_call(shard, wire.Truncate(shard, lsn, epoch))
        assert isinstance(answer, wire.TruncatedTo), answer
        return answer.first_lsn

    async def acquire_lease(self, shard: int, holder: str, epoch: int) -> wire.LeaseGranted:
        answer = await self._leader_call(shard, wire.AcquireLease(shard, holder, epoch))
        assert isinstance(answer, wire.LeaseGranted), answer
        return answer

    async def status(self, shard: int) -> wire.ShardStatus:
        """One node's answer (the known leader's if it answers, else any node's):
        `is_leader` true only if it is the leader's, confirmed by a barrier; otherwise that
        node's own, possibly stale, view. `leader_status` insists on the leader's."""
        answer = await self._leader_call(shard, wire.Status(shard), require_leader=False)
        assert isinstance(answer, wire.ShardStatus), answer
        return answer

    async def leader_status(self, shard: int) -> wire.ShardStatus:
        """The shard's status as its leader answers it after a barrier through the log
        (`is_leader` true: the leader a majority follows, its term, every committed LSN
        applied). A follower's answer is followed to the leader it names; bounded retries
        (as every call); `Unavailable` if no leader confirmed itself."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.retry_s_max
        delay = self._options.backoff_s_first
        targets = _Targets(self._addresses)
        last: object = None
        unhosted: set[str] = set()
        address = ""
        for _ in range(self._options.attempts_max):
            address = targets.next(self._leaders.get(shard), address)
            try:
                outcome = await self._call(address, wire.Status(shard))
            except (OSError, ConnectionError, TimeoutError) as exc:
                outcome = exc
            if isinstance(outcome, wire.ShardStatus):
                if outcome.is_leader:
                    self._leaders[shard] = address
                    return outcome
                last = f"{address} is not the leader (it names {outcome.leader})"
                hint = outcome.leader
                if hint and hint != address and self._leaders.get(shard) != hint:
                    self._leaders[shard] = hint
                    continue  # follow a new hint at once (a stale one gets the back-off)
                self._leaders.pop(shard, None)
            elif isinstance(outcome, wire.ErrorResponse):
                if outcome.code not in _RETRYABLE:
                    raise _error(outcome)
                self._check_hosted(shard, address, outcome, unhosted)
                last = _error(outcome)
                self._leaders.pop(shard, None)
            else:
                last = outcome
                self._leaders.pop(shard, None)
            if loop.time() > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._options.backoff_s_max)
        raise Unavailable(f"shard {shard}: no leader confirmed itself after retries: {last}")

    async def close(self) -> None:
        """Close every connection; calls still running fail, and no retry reconnects."""
        self._closed = True
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            await connection.close()

    # ------------------------------------------------------------------ routing

    async def _leader_call(
        self, shard: int, request: object, *, require_leader: bool = True
    ) -> object:
        """Send to the shard's leader, following NOT_LEADER hints, retrying the same request
        (bounded) on retryable answers and lost connections."""
        address = self._leaders.get(shard)
        if address is not None:
            connection = self._connections.get(address)
            if connection is not None and connection.ready and not connection.broken:
                # The usual case: the leader is known and its connection open. Its outcome,
                # unless it is an answer, goes through the retry loop as its first attempt.
                try:
                    answer = await connection.call(request)
                except (OSError, ConnectionError, TimeoutError) as exc:
                    return await self._retrying(shard, request, require_leader, (address, exc))
                if type(answer) is not wire.ErrorResponse:
                    return answer
                return await self._retrying(shard, request, require_leader, (address, answer))
        return await self._retrying(shard, request, require_leader, None)

    async def _retrying(
        self,
        shard: int,
        request: object,
        require_leader: bool,
        first: tuple[str, object] | None,
    ) -> object:
        """`_leader_call`'s loop; `first`: the address and outcome (answer or exception) of
        an attempt already made, which counts as this loop's first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.retry_s_max
        delay = self._options.backoff_s_first
        last: BaseException | None = None
        targets = _Targets(self._addresses)
        unhosted: set[str] = set()
        address = ""
        for _ in range(self._options.attempts_max):
            if first is not None:
                (address, outcome), first = first, None
            else:
                if loop.time() > deadline:
                    break
                address = targets.next(self._leaders.get(shard), address)
                try:
                    outcome = await self._call(address, request)
                except (OSError, ConnectionError, TimeoutError) as exc:
                    outcome = exc
            if isinstance(outcome, (OSError, ConnectionError, TimeoutError)):
                last = outcome
                self._leaders.pop(shard, None)
            elif not isinstance(outcome, wire.ErrorResponse):
                if require_leader:
                    self._leaders[shard] = address
                return outcome
            else:
                if outcome.code not in _RETRYABLE:
                    raise _error(outcome)
                self._check_hosted(shard, address, outcome, unhosted)
                last = _error(outcome)
                hint = outcome.leader_hint
                if outcome.code == wire.ErrorCode.NOT_LEADER and hint and hint != address:
                    self._leaders[shard] = hint
                    continue  # follow a new hint at once (a stale one gets the back-off)
                self._leaders.pop(shard, None)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._options.backoff_s_max)
        raise Unavailable(f"shard {shard}: no usable answer after retries: {last}") from last

    def _check_hosted(
        self, shard: int, address: str, answer: wire.ErrorResponse, unhosted: set[str]
    ) -> None:
        """Note `address`'s UNKNOWN_SHARD in `unhosted` (this call's); `UnknownShard` once
        every address has said so."""
        if answer.code != wire.ErrorCode.UNKNOWN_SHARD:
            return
        unhosted.add(address)
        if unhosted.issuperset(self._addresses):
            raise UnknownShard(shard, self._addresses)

    async def _any_call(self, shard: int, request: object) -> object:
        """Committed reads: any replica may answer; prefer the leader we know."""
        return await self._leader_call(shard, request, require_leader=False)

    async def _call(self, address: str, request: object) -> object:
        if self._closed:
            raise Unavailable("the client is closed")
        connection = self._connections.get(address)
        if connection is not None and connection.ready and not connection.broken:
            return await connection.call(request)  # the usual case: open and authenticated
        if connection is None or connection.broken:
            if connection is not None:
                await connection.close()
            connection = _Connection(address, self._token, self._options)
            self._connections[address] = connection
        await connection.ensure_open()
        return await connection.call(request)


class ProducerFull(LogsvcError):
    """More records are waiting in the producer than `pending_records_max`: shed load."""


@dataclass(frozen=True, slots=True)
class ProducerOptions:
    linger_ms: float = 2.0  # how long a record may wait for others to share its append
    batch_bytes_max: int = 1 << 20  # payload bytes per append
    batch_records_max: int = 4096  # records per append
    pending_records_max: int = 1 << 20  # records waiting or in flight, all shards


class Producer:
    """Producer-side batching: `await producer.send(shard, payload)` returns that record's
    LSN, but records sent close together share one append (one round trip, one dedupe
    key, one Raft entry). A batch leaves after `linger_ms`, or at once when it reaches
    `batch_bytes_max` / `batch_records_max`. Appends are atomic: a record's LSN is final
    when `send` returns; an error fails every record of that batch."""

    def __init__(self, client: Client, options: ProducerOptions | None = None) -> None:
        self._client = client
        self._options = options or ProducerOptions()
        self._batches: dict[int, _Batch] = {}
        self._pending = 0
        self._flushes: set[asyncio.Task[None]] = set()

    async def send(self, shard: int, payload: bytes) -> int:
        options = self._options
        if self._pending >= options.pending_records_max:
            raise ProducerFull(f"{self._pending} records already waiting")
        batch = self._batches.get(shard)
        if batch is None:
            batch = self._batches[shard] = _Batch()
            batch.timer = asyncio.get_running_loop().call_later(
                options.linger_ms / 1000.0, self._ship, shard, batch
            )
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        batch.payloads.append(payload)
        batch.futures.append(future)
        batch.size_bytes += len(payload)
        self._pending += 1
        if (
            batch.size_bytes >= options.batch_bytes_max
            or len(batch.payloads) >= options.batch_records_max
        ):
            self._ship(shard, batch)
        return await future

    async def flush(self) -> None:
        """Send every waiting batch now and wait for all appends in flight."""
        for shard, batch in list(self._batches.items()):
            self._ship(shard, batch)
        while self._flushes:
            await asyncio.gather(*self._flushes, return_exceptions=True)

    def _ship(self, shard: int, batch: _Batch) -> None:
        if self._batches.get(shard) is not batch:
            return  # already shipped
        del self._batches[shard]
        if batch.timer is not None:
            batch.timer.cancel()
        task = asyncio.ensure_future(self._append(shard, batch))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _append(self, shard: int, batch: _Batch) -> None:
        try:
            lsns = await self._client.append(shard, batch.payloads)
        except BaseException as exc:
            for future in batch.futures:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for future, lsn in zip(batch.futures, lsns, strict=True):
                if not future.done():
                    future.set_result(lsn)
        finally:
            self._pending -= len(batch.futures)


@dataclass(slots=True)
class _Batch:
    payloads: list[bytes] = field(default_factory=list)
    futures: list[asyncio.Future[int]] = field(default_factory=list)
    size_bytes: int = 0
    timer: asyncio.TimerHandle | None = None


class _Targets:
    """Where a call's attempts go: the shard's leader while one is known, else the
    addresses in turn, the round starting after the address that just failed (timed out,
    lost its connection, or was no leader): a stale leader cut off from its shard holds a
    request until the request timeout, and a round starting at `addresses[0]` again asked
    it first once more (chaos C4: every retry paid a timeout there)."""

    __slots__ = ("_addresses", "_round")

    def __init__(self, addresses: Sequence[str]) -> None:
        self._addresses = addresses
        self._round: Iterator[str] | None = None

    def next(self, leader: str | None, failed: str) -> str:
        if leader is not None:
            return leader
        if self._round is None:
            addresses = self._addresses
            if failed in addresses:
                at = addresses.index(failed) + 1
                addresses = [*addresses[at:], *addresses[:at]]
            self._round = itertools.cycle(addresses)
        return next(self._round)


def _error(response: wire.ErrorResponse) -> ServerError:
    return _ERRORS.get(response.code, ServerError)(response)


# Where a client connects: the data-plane addresses ("host:port", any number of the
# cluster's nodes), or the path of a client config file holding them and the token.
Nodes = Sequence[str] | str | os.PathLike[str]


def resolve_nodes(nodes: Nodes, token: str | None) -> tuple[tuple[str, ...], str]:
    """(addresses, token) of `connect`'s arguments. A path (a str or a PathLike) is a client
    config file (logsvc/client_config.py; a bad one raises `ConfigError` naming the key),
    given without a token; a sequence of addresses needs the token."""
    if isinstance(nodes, str | os.PathLike):
        if token is not None:
            raise TypeError(
                "connect(path) reads the token from the client config file; pass a list of "
                "addresses to give a token"
            )
        config = load_client_config(os.fspath(nodes))
        return config.addresses, config.token
    if token is None:
        raise TypeError("connect(addresses, token): the token is required with addresses")
    addresses = tuple(nodes)
    if not addresses:
        raise ValueError("connect: at least one node address")
    return addresses, token


async def connect(
    nodes: Nodes,
    token: str | None = None,
    *,
    options: ClientOptions | None = None,
    client_id: str | None = None,
) -> Client:
    """A client for the cluster: `connect("client.toml")`, or `connect(addresses, token)`
    with `addresses` the "host:port" of data planes (any of the cluster's nodes). Each
    client has its own id (random unless given): its appends are deduplicated per id."""
    addresses, resolved_token = resolve_nodes(nodes, token)
    return Client(
        addresses, resolved_token, options or ClientOptions(), client_id or uuid.uuid4().hex
    )


class SyncClient:
    """The same operations, blocking, for scripts and the CLI. Runs its own event loop on a
    private thread; every call is bounded by the request timeout times the attempts."""

    def __init__(
        self, nodes: Nodes, token: str | None = None, options: ClientOptions | None = None
    ) -> None:
        """`nodes`, `token`: as for `connect` (a client config path, or addresses and the
        token)."""
        addresses, resolved_token = resolve_nodes(nodes, token)  # errors before a thread
        self._options = options or ClientOptions()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client: Client = self._run(connect(addresses, resolved_token, options=self._options))

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        bound = self._options.retry_s_max + self._options.request_timeout_s + 10
        return future.result(bound)

    def append(self, shard: int, payloads: Sequence[bytes], *, epoch: int = 0) -> list[int]:
        return self._run(self._client.append(shard, payloads, epoch=epoch))

    def read(self, shard: int, lsn: int, max_bytes: int) -> wire.Records:
        return self._run(self._client.read(shard, lsn, max_bytes))

    def tail(self, shard: int, lsn: int, max_bytes: int, wait_ms: int) -> wire.Records:
        return self._run(self._client.tail(shard, lsn, max_bytes, wait_ms))

    def truncate(self, shard: int, lsn: int, *, epoch: int = 0) -> int:
        return self._run(self._client.truncate(shard, lsn, epoch=epoch))

    def acquire_lease(self, shard: int, holder: str, epoch: int) -> wire.LeaseGranted:
        return self._run(self._client.acquire_lease(shard, holder, epoch))

    def status(self, shard: int) -> wire.ShardStatus:
        return self._run(self._client.status(shard))

    def leader_status(self, shard: int) -> wire.ShardStatus:
        return self._run(self._client.leader_status(shard))

    def close(self) -> None:
        self._run(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
