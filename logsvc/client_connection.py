"""One client connection to a node's data plane, and the options bounding a client's calls.

`_Connection` is opened on first use, authenticated, and pipelined: many requests in flight,
matched to responses by request id, at most `requests_inflight_max` of them (past that a
call waits for a slot, bounded by its timeout). The request timeouts of a connection share
one timer (`_Expiries`), and callers waiting for something another call frees wait on
`_Waiters` (also the client's lanes, logsvc/async_client.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from logsvc.client_errors import _error
from logsvc.frame_writer import FrameWriter
from logsvc.wire import messages as wire
from logsvc.wire.frames import FrameDecoder, ProtocolError

# Requests queued on one connection before `call` waits for the server to read them.
WRITE_BUFFER_BYTES_MAX = 8 * 1024 * 1024


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
