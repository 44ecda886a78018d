"""The TN's CN-facing port: an asyncio TCP server speaking engine/tn/FORMAT.md over
`TNService`.

Per connection: a bounded frame decoder (logsvc's), an authentication state, at most
`requests_inflight_max` requests served at once (pipelined: replies carry the request id
and may come back out of order, so a commit waiting for the WAL does not hold up a status),
and at most one subscription. A request is never cancelled because its connection is lost:
a commit runs to its outcome, which the engine remembers by origin, so the client's retry
on another connection (or TN) is answered with it instead of running the write set twice.
Such requests count against the TN's `requests_inflight_total_max` until they end.

Bad input never takes the server down (logsvc/node/server.py does the same, for the same
reasons):

* undecodable framing (garbage, a damaged checksum, an oversize length): a last ErrorReply
  when the peer can still parse one (TOO_LARGE for the oversize frame's id, else id 0),
  then *this* connection is closed: its byte stream cannot be resynchronised;
* a whole frame that is not a valid request (unknown op, ill-typed field, over a limit): an
  ErrorReply with its code, and the connection goes on;
* a wrong token or protocol version: UNAUTHORIZED / BAD_REQUEST, and the connection closes;
* an operation that fails (unknown table, conflict, standby asked to commit...): the
  engine's error, typed (engine/tn/errors.py), and the connection goes on.

Subscriptions: `Subscribe` registers a callback with the engine that queues each visible
entry in a bounded `SubscriberQueue`; a task pushes the queue as `Pushed` frames, waiting
for the peer to read (back-pressure). A queue over its bound drops the subscriber with
SUBSCRIBER_DROPPED: the TN never buffers without bound for a slow reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from engine.errors import Overloaded
from engine.logtail import TailEntry
from engine.tn import limits, messages
from engine.tn.errors import BadRequest, ErrorCode, Unauthorized, args_of, code_of
from engine.tn.limits import ServerLimits
from engine.tn.messages import ErrorReply, Reply, Request
from engine.tn.pushes import SubscriberQueue
from engine.tn.service import TNService
from logsvc.frame_writer import FrameWriter
from logsvc.wire.errors import FrameTooLarge
from logsvc.wire.frames import Frame, ProtocolError

log = logging.getLogger("engine.tn.server")


class TNServer:
    def __init__(self, service: TNService, token: str, limits_: ServerLimits | None = None) -> None:
        assert token
        self.service = service
        self._token = token.encode()
        self.limits = limits_ or ServerLimits()
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], _Connection] = {}
        self.subscribers = 0
        self.requests_inflight = 0
        """Over every connection, also those gone (their requests run to the end)."""
        self.counters: Counter[str] = Counter()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(
            self._accept, host, port, limit=limits.READ_CHUNK_BYTES
        )

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def close(self, grace_s: float = limits.CLOSE_GRACE_S) -> None:
        """Stop accepting; end subscriptions; give requests in flight `grace_s` to finish;
        then hang up every connection."""
        if self._server is not None:
            self._server.close()
        connections = list(self._connections.items())
        for _, connection in connections:
            connection.end_subscription()
        inflight = [task for _, c in connections for task in c.inflight]
        if inflight:
            await asyncio.wait(inflight, timeout=grace_s)
        for _, connection in connections:
            connection.hang_up()
        tasks = [task for task, _ in connections]
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= self.limits.connections_max:
            self.counters["connections_refused"] += 1
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        connection = _Connection(self, reader, writer)
        self._connections[task] = connection
        try:
            await connection.serve()
        finally:
            self._connections.pop(task, None)
            connection.end_subscription()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def token_matches(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self._token)


class _Subscription:
    __slots__ = ("on_drop", "pusher", "queue", "request_id", "unsubscribe", "wake")

    def __init__(
        self, request_id: int, queue: SubscriberQueue, on_drop: Callable[[], None]
    ) -> None:
        self.request_id = request_id
        self.queue = queue
        self.on_drop = on_drop
        self.wake = asyncio.Event()
        self.unsubscribe: Callable[[], None] | None = None
        self.pusher: asyncio.Task[None] | None = None

    def offer(self, entry: TailEntry) -> None:
        """The engine's callback: on the event loop, must not block, and must not touch
        the engine's list of subscribers (it is iterating over it)."""
        if self.queue.offer(entry):
            self.wake.set()
        elif self.queue.dropped and self.pusher is not None:
            # At once, not by the pusher: it may be stuck waiting for the peer to read.
            asyncio.get_running_loop().call_soon(self.on_drop)


class _Connection:
    def __init__(
        self, server: TNServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._server = server
        self._reader = reader
        self._writer = writer
        self._decoder = messages.request_decoder(server.limits.request_body_bytes_max)
        self._out = FrameWriter(writer, server.limits.write_buffer_bytes_max)
        self._write_lock = asyncio.Lock()
        self._authenticated = False
        self._closing = False
        self.inflight: set[asyncio.Task[None]] = set()
        self._subscription: _Subscription | None = None
        peer = writer.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if peer else "?"

    async def serve(self) -> None:
        counters = self._server.counters
        try:
            while not self._closing:
                if self._out.over_limit():  # the peer is not reading its replies
                    async with self._write_lock:
                        await self._out.drain_if_over()
                data = await self._reader.read(limits.READ_CHUNK_BYTES)
                if not data:
                    break
                try:
                    self._decoder.feed(data)
                    while not self._closing and (frame := self._decoder.next_frame()) is not None:
                        self._dispatch(frame)
                except ProtocolError as exc:
                    counters[f"bad_frames:{type(exc).__name__}"] += 1
                    log.warning("closing %s: undecodable frame: %s", self._peer, exc)
                    self._last_words(exc)
                    break
            if self._closing and self.inflight:
                await asyncio.wait(self.inflight, timeout=limits.CLOSE_GRACE_S)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            # Requests in flight are not cancelled: a commit goes on to its outcome (the
            # engine remembers it by origin, so the client's retry on another connection
            # finds it instead of running it again); its answer is dropped.
            self.end_subscription()
            self._out.flush()

    def hang_up(self) -> None:
        self._closing = True
        self._writer.transport.abort()

    def _last_words(self, exc: ProtocolError) -> None:
        """Why this connection is closed, typed, when the peer can still parse a reply: for
        the request whose frame was refused when its id is known, else id 0."""
        if isinstance(exc, FrameTooLarge):
            code, request_id = ErrorCode.TOO_LARGE, exc.request_id
        else:
            code, request_id = ErrorCode.BAD_REQUEST, getattr(exc, "request_id", 0)
        self._reply(request_id, ErrorReply.of(code, str(exc)))
        self._out.flush()

    def _reply(self, request_id: int, reply: Reply) -> None:
        self._out.write(messages.encode_reply(request_id, reply))

    async def _send(self, request_id: int, reply: Reply) -> None:
        self._reply(request_id, reply)
        if self._out.over_limit():  # back-pressure on a slow reader
            async with self._write_lock:
                await self._out.drain_if_over()

    def _dispatch(self, frame: Frame) -> None:
        counters = self._server.counters
        request_id = frame.request_id
        try:
            request = messages.decode_request(frame)
        except BadRequest as exc:  # the frame was whole: the connection survives
            counters[f"bad_requests:{exc.code.name}"] += 1
            if request_id:
                self._reply(request_id, ErrorReply.of(exc.code, exc.reason))
            return
        if isinstance(request, messages.Authenticate):
            self._authenticate(request_id, request)
            return
        if not self._authenticated:
            counters["auth_failures"] += 1
            self._reply(request_id, ErrorReply.of(ErrorCode.UNAUTHORIZED, "authenticate first"))
            return
        if isinstance(request, messages.Subscribe):
            self._subscribe(request_id)
            return
        server_limits = self._server.limits
        overloaded = None
        if len(self.inflight) >= server_limits.requests_inflight_max:
            overloaded = Overloaded(
                "requests in flight on this connection", server_limits.requests_inflight_max
            )
        elif self._server.requests_inflight >= server_limits.requests_inflight_total_max:
            overloaded = Overloaded(
                "requests in flight on this TN", server_limits.requests_inflight_total_max
            )
        if overloaded is not None:
            counters["overloaded"] += 1
            self._reply(request_id, _error_of(self._peer, overloaded))
            return
        self._spawn(self._answer(request_id, request))

    def _authenticate(self, request_id: int, request: messages.Authenticate) -> None:
        counters = self._server.counters
        if request.protocol != limits.PROTOCOL:
            counters["protocol_mismatches"] += 1
            self._reply(
                request_id,
                ErrorReply.of(
                    ErrorCode.BAD_REQUEST,
                    f"TN protocol {request.protocol} is not served here (this TN speaks "
                    f"{limits.PROTOCOL})",
                ),
            )
            self._close_after_reply()
        elif self._server.token_matches(request.token):
            self._authenticated = True
            self._reply(request_id, messages.Authenticated())
        else:
            counters["auth_failures"] += 1
            log.warning("wrong token from %s", self._peer)
            self._reply(request_id, ErrorReply.of(ErrorCode.UNAUTHORIZED, "wrong token"))
            self._close_after_reply()

    def _close_after_reply(self) -> None:
        self._closing = True
        self._out.flush()
        self._writer.close()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self.inflight.add(task)
        self._server.requests_inflight += 1
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.inflight.discard(task)
        self._server.requests_inflight -= 1

    async def _answer(self, request_id: int, request: Request) -> None:
        try:
            reply = await self._run(request)
        except Exception as exc:  # never let one request take the connection down
            self._server.counters[f"errors:{type(exc).__name__}"] += 1
            reply = _error_of(self._peer, exc)
        if self._writer.is_closing():
            return  # the peer is gone: nobody to answer
        with contextlib.suppress(ConnectionError):
            await self._send(request_id, reply)

    async def _run(self, request: Request) -> Reply:
        service = self._server.service
        if isinstance(request, messages.Status):
            return messages.StatusReply(service.status())
        if isinstance(request, messages.PullLogtail):
            return service.logtail_page(request.t0, request.t1)
        if isinstance(request, messages.Commit):
            return messages.Committed(await service.commit(request.write_set))
        if isinstance(request, messages.Checkpoints):
            return messages.CheckpointList(service.checkpoints())
        if isinstance(request, messages.Promote):
            return await service.promote()
        raise BadRequest(f"{type(request).__name__} is not served here", ErrorCode.UNKNOWN_OP)

    # --- subscriptions ----------------------------------------------------------------------------

    def _subscribe(self, request_id: int) -> None:
        server = self._server
        limits_ = server.limits
        if self._subscription is not None:
            self._reply(
                request_id,
                ErrorReply.of(ErrorCode.BAD_REQUEST, "one subscription per connection"),
            )
            return
        if server.subscribers >= limits_.subscribers_max:
            server.counters["subscribers_refused"] += 1
            overloaded = Overloaded("subscribers", limits_.subscribers_max)
            self._reply(request_id, _error_of(self._peer, overloaded))
            return
        queue = SubscriberQueue(
            limits_.subscriber_queue_entries_max, limits_.subscriber_queue_bytes_max
        )
        subscription = _Subscription(request_id, queue, lambda: self._drop(subscription))
        from_ts, subscription.unsubscribe = server.service.subscribe(subscription.offer)
        self._subscription = subscription
        server.subscribers += 1
        # Written now, before any push can be: the frame writer keeps the order.
        self._reply(request_id, messages.Subscribed(from_ts))
        subscription.pusher = asyncio.ensure_future(self._push(subscription))

    async def _push(self, subscription: _Subscription) -> None:
        queue = subscription.queue
        while True:
            await subscription.wake.wait()
            subscription.wake.clear()
            while len(queue):
                entries = queue.take(limits.PUSH_ENTRIES_MAX, limits.PUSH_BYTES_MAX)
                await self._send(subscription.request_id, messages.Pushed(entries))

    def _drop(self, subscription: _Subscription) -> None:
        """The subscriber's queue passed its bound: stop pushing (the pusher may be stuck
        waiting for the peer to read) and tell it why, after what was already written."""
        if self._subscription is not subscription:
            return  # ended already
        queue = subscription.queue
        self._server.counters["subscribers_dropped"] += 1
        log.warning(
            "dropped the subscription of %s: over %d entries or %d bytes not yet read",
            self._peer,
            queue.entries_max,
            queue.bytes_max,
        )
        self.end_subscription()
        self._reply(
            subscription.request_id,
            ErrorReply.of(
                ErrorCode.SUBSCRIBER_DROPPED,
                "this subscriber fell too far behind: pull the logtail, then subscribe again",
                (queue.entries_max,),
            ),
        )

    def _stop_subscription(self) -> None:
        subscription, self._subscription = self._subscription, None
        if subscription is None:
            return
        if subscription.unsubscribe is not None:
            subscription.unsubscribe()
        self._server.subscribers -= 1

    def end_subscription(self) -> None:
        """Stop pushing (the connection ends, or the server stops)."""
        subscription = self._subscription
        self._stop_subscription()
        if subscription is not None and subscription.pusher is not None:
            subscription.pusher.cancel()


def _error_of(peer: str, exc: BaseException) -> ErrorReply:
    code = code_of(exc)
    if code is None:
        log.error("internal error serving %s", peer, exc_info=exc)
        return ErrorReply.of(ErrorCode.INTERNAL, f"{type(exc).__name__} (see the TN's log)")
    if isinstance(exc, Unauthorized):
        return ErrorReply.of(code, str(exc))
    return ErrorReply.of(code, str(exc) or type(exc).__name__, args_of(exc))
