"""One authenticated client connection to a TN (engine/tn/FORMAT.md): pipelined calls
matched to replies by request id, and the pushes of at most one subscription.

Used by engine/cn/client.py's `NetworkTN`, by the standby's probes of the active TN, and by
`engine promote`. Failover and retries live in `NetworkTN`; a channel only says what
happened, in three kinds (the difference decides whether a commit's outcome is known):

* `ChannelClosed` (a `ConnectionError`): the request was never written; nothing happened;
* `ConnectionLost` (a `ConnectionError`) or `TimeoutError`: it was written and no answer
  came: it may or may not have been carried out;
* an answer: the reply, or the engine's typed error rebuilt from an ErrorReply
  (engine/tn/errors.py), raised.

Every wait is bounded: connect and authentication by `connect_timeout_s`, each call by its
timeout (one timer per call).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable

from engine.logtail import TailEntry
from engine.tn import limits, messages
from engine.tn.errors import BadReply, exception_of
from engine.tn.limits import ClientOptions
from engine.tn.messages import Reply, Request
from logsvc.frame_writer import FrameWriter
from logsvc.wire.frames import ProtocolError

log = logging.getLogger("engine.tn.channel")

WRITE_BUFFER_BYTES_MAX = 16 * limits.MiB
"""Requests queued on a channel before a call waits for the TN to read them."""


class ChannelClosed(ConnectionError):
    """The channel was closed before the request was written: nothing was sent."""


class ConnectionLost(ConnectionError):
    """The connection ended after the request was written and before its answer."""


PushHandler = Callable[[tuple[TailEntry, ...]], None]
EndHandler = Callable[[BaseException], None]


class _Pushes:
    __slots__ = ("live", "on_end", "on_push", "request_id")

    def __init__(self, request_id: int, on_push: PushHandler, on_end: EndHandler) -> None:
        self.live = False
        """`Subscribed` arrived: an ErrorReply on this id now ends the pushes."""
        self.request_id = request_id
        self.on_push = on_push
        self.on_end = on_end


class Channel:
    """Build with `await Channel.open(address, token)`."""

    def __init__(
        self,
        address: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        options: ClientOptions,
    ) -> None:
        self.address = address
        self._reader = reader
        self._writer = writer
        self._options = options
        self._out = FrameWriter(writer, WRITE_BUFFER_BYTES_MAX)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._pushes: _Pushes | None = None
        self.broken = False
        self._receiver = asyncio.ensure_future(self._receive())

    @classmethod
    async def open(cls, address: str, token: str, options: ClientOptions | None = None) -> Channel:
        """Connect and authenticate, within `connect_timeout_s`. Raises `OSError` /
        `TimeoutError` when the TN cannot be reached, `Unauthorized` for a wrong token."""
        options = options or ClientOptions()
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port), limit=limits.READ_CHUNK_BYTES),
            options.connect_timeout_s,
        )
        channel = cls(address, reader, writer, options)
        try:
            reply = await channel.call(
                messages.Authenticate(token), timeout_s=options.connect_timeout_s
            )
        except BaseException:
            channel.abort()
            raise
        if not isinstance(reply, messages.Authenticated):
            channel.abort()
            raise BadReply(f"Authenticate answered with {type(reply).__name__}")
        return channel

    async def call(
        self, request: Request | messages.Encoded, *, timeout_s: float | None = None
    ) -> Reply:
        """Send `request` (or a body `messages.encode_body` checked already) and wait for its
        answer (see the module docstring for what is raised). `BadRequest` when the request
        breaks a rule: nothing is sent."""
        if self.broken:
            raise ChannelClosed(f"the connection to {self.address} is closed")
        request_id = next(self._ids)
        frame = messages.encode_request(request_id, request)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        timeout = self._options.request_timeout_s if timeout_s is None else timeout_s
        try:
            self._out.write(frame)
            try:  # the wait for the TN to read the request counts against the timeout too
                async with asyncio.timeout(timeout):  # no task per call (`wait_for` makes one)
                    if self._out.over_limit():
                        await self._out.drain_if_over()
                    reply = await future
            except TimeoutError:
                raise TimeoutError(
                    f"no answer from the TN at {self.address} within {timeout} s"
                ) from None
        finally:
            self._pending.pop(request_id, None)
        if isinstance(reply, messages.ErrorReply):
            raise exception_of(reply.code, reply.message, reply.args)
        return reply

    async def subscribe(self, on_push: PushHandler, on_end: EndHandler) -> int:
        """Subscribe on this channel; returns `from_ts`. `on_push(entries)` is then called,
        in commit order, with every entry visible after from_ts (possibly before this
        returns: the pushes that follow `Subscribed` in the same read); `on_end(exc)` once,
        when the subscription ends (`SubscriberDropped`, or the connection's loss)."""
        assert self._pushes is None, "one subscription per channel"
        request_id = next(self._ids)
        self._pushes = _Pushes(request_id, on_push, on_end)
        frame = messages.encode_request(request_id, messages.Subscribe())
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            self._out.write(frame)
            reply = await asyncio.wait_for(future, self._options.request_timeout_s)
        except BaseException:
            self._pushes = None
            raise
        finally:
            self._pending.pop(request_id, None)
        if isinstance(reply, messages.ErrorReply):
            self._pushes = None
            raise exception_of(reply.code, reply.message, reply.args)
        if not isinstance(reply, messages.Subscribed):
            self._pushes = None
            raise BadReply(f"Subscribe answered with {type(reply).__name__}")
        return reply.from_ts

    async def _receive(self) -> None:
        decoder = messages.reply_decoder()
        ended: BaseException = ConnectionLost(f"the connection to {self.address} was lost")
        try:
            while True:
                data = await self._reader.read(limits.READ_CHUNK_BYTES)
                if not data:
                    decoder.end_of_stream()
                    break
                decoder.feed(data)
                while (frame := decoder.next_frame()) is not None:
                    self._deliver(frame)
        except (ConnectionError, ProtocolError, BadReply) as exc:
            if isinstance(exc, (ProtocolError, BadReply)):
                log.warning("dropping the connection to %s: %s", self.address, exc)
                ended = ConnectionLost(f"the TN at {self.address} sent a bad frame: {exc}")
        finally:
            self.broken = True
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ended)
                    future.exception()  # retrieved even if its caller gave up
            self._end_pushes(ended)
            self._writer.close()

    def _deliver(self, frame: messages.Frame) -> None:
        reply = messages.decode_reply(frame)  # BadReply: the whole connection is dropped
        pushes = self._pushes
        if pushes is not None and frame.request_id == pushes.request_id:
            if isinstance(reply, messages.Pushed):
                pushes.on_push(reply.entries)
                return
            if isinstance(reply, messages.ErrorReply) and pushes.live:
                self._end_pushes(exception_of(reply.code, reply.message, reply.args))
                return
            if isinstance(reply, messages.Subscribed):
                pushes.live = True
        if frame.request_id == 0:
            assert isinstance(reply, messages.ErrorReply)
            log.warning("the TN at %s closes the connection: %s", self.address, reply.message)
            return
        future = self._pending.get(frame.request_id)
        if future is not None and not future.done():
            future.set_result(reply)

    def _end_pushes(self, exc: BaseException) -> None:
        pushes, self._pushes = self._pushes, None
        if pushes is not None:
            pushes.on_end(exc)

    def abort(self) -> None:
        """Hang up now (synchronous: an unsubscribe, or a failed open)."""
        self.broken = True
        self._writer.transport.abort()

    async def close(self) -> None:
        self.abort()
        receiver = self._receiver
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(receiver, self._options.connect_timeout_s)


async def probe(
    address: str, token: str, options: ClientOptions
) -> tuple[Channel, messages.StatusReply]:
    """Open a channel and ask for the TN's status (bounded by the options)."""
    channel = await Channel.open(address, token, options)
    try:
        reply = await channel.call(messages.Status(), timeout_s=options.connect_timeout_s)
    except BaseException:
        channel.abort()
        raise
    if not isinstance(reply, messages.StatusReply):
        channel.abort()
        raise BadReply(f"Status answered with {type(reply).__name__}")
    return channel, reply
