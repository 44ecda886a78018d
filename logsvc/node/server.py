"""The data plane: an asyncio TCP server speaking logsvc/wire (FORMAT.md there).

Per connection: a sans-I/O frame decoder, an authentication state, and at most
`inflight_requests_per_connection_max` requests being served at once (pipelining; responses
carry the request id and may come back out of order). Per request: decode, check the token
was given, find the shard, run the operation, encode the answer. Bad input never takes the
server down:

* undecodable framing (bad magic, checksum, oversize length): log, count, close *this*
  connection (the byte stream cannot be resynchronised);
* a frame that decodes to a bad request (unknown op, ill-typed field, unknown shard, too
  large): an `ErrorResponse` with a typed code; the connection keeps going;
* a wrong token: an `UNAUTHENTICATED` error and the connection is closed.

The server never blocks the event loop on disk or Raft work: `ShardHost` hands those off.

Appends, the hot path, run without a task of their own: the request goes to its shard's
group commit with a callback that encodes and writes the answer (`_start_append`). Every
other request is a task. Both count against that limit. Back-pressure: while more than
`write_buffer_bytes_max` of answers wait for a peer that does not read them, the connection
reads no further requests. The limits are the node's `[limits.server]` (logsvc/node/limits.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from logsvc.frame_writer import FrameWriter
from logsvc.node.limits import ServerLimits
from logsvc.node.shard_host import AppendOutcome, ShardHost
from logsvc.shard.commands import (
    AppendBatch,
    Appended,
    DuplicateUnknown,
    LeaseGranted,
    NotLeaseHolder,
    StaleEpoch,
    Truncated,
)
from logsvc.shard.errors import CommandInvalid, CommandTooLarge, LsnTruncated, ShardError
from logsvc.shard.replica import NotLeader, OutcomeUnknown, Overloaded, ReplicaFailed
from logsvc.wire import messages as wire
from logsvc.wire.errors import FrameTooLarge
from logsvc.wire.frames import FrameDecoder, ProtocolError
from logsvc.wire.limits import DEFAULT_WIRE_LIMITS

log = logging.getLogger("logsvc.server")

READ_CHUNK_BYTES = 256 * 1024
CLOSE_FLUSH_S_MAX = 2.0  # how long a connection being closed may finish its last replies
# A reply carries at most this many records (the wire's limit: see logsvc/wire/limits.py).
READ_RECORDS_MAX = DEFAULT_WIRE_LIMITS.read_records_max


class DataPlaneServer:
    def __init__(self, hosts: dict[int, ShardHost], token: str, limits: ServerLimits) -> None:
        assert token
        self._hosts = dict(hosts)  # ours: shards come and go through add/remove_host
        self._token = token.encode()
        self._limits = limits
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self.counters: Counter[str] = Counter()  # metrics (issue 6 exports them)

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._accept, host, port, limit=READ_CHUNK_BYTES)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting, give in-flight requests `grace_s`, then drop connections."""
        if self._server is not None:
            self._server.close()
        if self._connections:
            _, pending = await asyncio.wait(list(self._connections), timeout=grace_s)
            # Hang up rather than cancel: the connection tasks then end on their own (a
            # cancelled stream-server task is logged as an error by asyncio in 3.11).
            for task in pending:
                self._connections[task].transport.abort()
            if pending:
                await asyncio.wait(pending, timeout=grace_s)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= self._limits.connections_max:
            self.counters["connections_refused"] += 1
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections[task] = writer
        try:
            await _Connection(self, reader, writer).serve()
        finally:
            self._connections.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def token_matches(self, token: str) -> bool:
        return hmac.compare_digest(token.encode(), self._token)

    def host(self, shard: int) -> ShardHost | None:
        return self._hosts.get(shard)

    def add_host(self, host: ShardHost) -> None:
        """Serve a shard this node started hosting (a membership change). Called on the
        event loop, like every lookup: a request sees the shard or not, never half of it."""
        assert self._hosts.get(host.shard_id) in (None, host), f"shard {host.shard_id} twice"
        self._hosts[host.shard_id] = host

    def remove_host(self, shard: int) -> ShardHost | None:
        """Stop serving a shard (removed from this node): new requests get UNKNOWN_SHARD,
        and a client tries another node; requests already running finish or fail on the
        closed host. Called on the event loop."""
        return self._hosts.pop(shard, None)


class _Connection:
    def __init__(
        self, server: DataPlaneServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._server = server
        self._reader = reader
        self._writer = writer
        self._decoder = FrameDecoder()
        self._authenticated = False
        self._closing = False
        self._inflight: set[asyncio.Task[None]] = set()
        self._appends_inflight = 0  # appends handed to a group commit, not yet answered
        self._appends_drained: asyncio.Future[None] | None = None  # set while closing
        self._write_lock = asyncio.Lock()
        self._out = FrameWriter(writer, server._limits.write_buffer_bytes_max)
        peer = writer.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if peer else "?"

    async def serve(self) -> None:
        counters = self._server.counters
        try:
            while True:
                if self._closing:  # answer what was asked (bounded), then hang up
                    await self._finish_inflight()
                    break
                if self._out.over_limit():  # the peer is not reading its answers
                    await self._out.drain_if_over()
                data = await self._reader.read(READ_CHUNK_BYTES)
                if not data:
                    break
                try:
                    self._decoder.feed(data)
                    while (frame := self._decoder.next_frame()) is not None:
                        self._dispatch(frame)
                except ProtocolError as exc:
                    counters[f"bad_frames:{type(exc).__name__}"] += 1
                    log.warning("closing %s: undecodable frame: %s", self._peer, exc)
                    await self._last_words(exc)
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            for task in self._inflight:
                task.cancel()
            self._out.flush()  # answers written this iteration leave before the close

    async def _finish_inflight(self) -> None:
        """Wait, at most CLOSE_FLUSH_S_MAX, for the answers still owed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CLOSE_FLUSH_S_MAX
        if self._inflight:
            await asyncio.wait(self._inflight, timeout=CLOSE_FLUSH_S_MAX)
        if self._appends_inflight:
            self._appends_drained = loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._appends_drained, max(0.0, deadline - loop.time()))

    def _dispatch(self, frame: object) -> None:
        counters = self._server.counters
        request_id = frame.request_id  # type: ignore[attr-defined]
        try:
            request = wire.decode_request(frame)  # type: ignore[arg-type]
        except wire.BadRequest as exc:  # UnknownOp, RequestTooLarge too: the connection survives
            counters[f"bad_requests:{type(exc).__name__}"] += 1
            if request_id:  # id 0 is reserved: nothing to answer it with
                self._spawn(self._send(request_id, wire.ErrorResponse(exc.code, exc.reason)))
            return
        if isinstance(request, wire.Authenticate):
            if self._server.token_matches(request.token):
                self._authenticated = True
                self._spawn(self._send(request_id, wire.Authenticated()))
            else:
                counters["auth_failures"] += 1
                log.warning("wrong token from %s", self._peer)
                self._closing = True
                self._spawn(
                    self._send(request_id, _error(wire.ErrorCode.UNAUTHENTICATED, "wrong token"))
                )
            return
        if not self._authenticated:
            counters["auth_failures"] += 1
            self._spawn(
                self._send(request_id, _error(wire.ErrorCode.UNAUTHENTICATED, "authenticate first"))
            )
            return
        inflight = len(self._inflight) + self._appends_inflight
        if inflight >= self._server._limits.inflight_requests_per_connection_max:
            counters["overloaded"] += 1
            self._spawn(
                self._send(
                    request_id, _error(wire.ErrorCode.OVERLOADED, "too many requests in flight")
                )
            )
            return
        if type(request) is wire.Append and self._start_append(request_id, request):
            return
        self._spawn(self._answer(request_id, request))

    def _start_append(self, request_id: int, request: wire.Append) -> bool:
        """Hand an append to its shard's group commit, answered by `_append_done`; False
        (nothing started) when the shard is not hosted here: `_answer` says so."""
        host = self._server.host(request.shard)
        if host is None:
            return False
        batch = AppendBatch(request.client_id, request.seq, request.epoch, request.records)
        try:
            host.submit_append(batch, functools.partial(self._append_done, request_id, host))
        except Overloaded as exc:
            self._reply(request_id, self._error_for(exc))
            return True
        self._appends_inflight += 1
        return True

    def _append_done(self, request_id: int, host: ShardHost, outcome: AppendOutcome) -> None:
        self._appends_inflight -= 1
        drained = self._appends_drained
        if drained is not None and not self._appends_inflight and not drained.done():
            drained.set_result(None)
        if type(outcome) is Appended:
            data = wire.encode_appended(
                request_id, outcome.first_lsn, outcome.count, outcome.duplicate
            )
            self._out.write(data)  # leaves with the other answers of this loop iteration
            return
        response: object
        if isinstance(outcome, Exception):
            response = self._error_for(outcome, host)
        else:
            try:
                response = _result_response(outcome)
            except Exception as exc:
                response = self._error_for(exc, host)
        self._reply(request_id, response)

    def _reply(self, request_id: int, response: object) -> None:
        """Answer without waiting (the read loop applies the back-pressure)."""
        self._out.write(wire.encode_response(request_id, response))  # type: ignore[arg-type]

    async def _last_words(self, exc: ProtocolError) -> None:
        """Before closing on a framing error, say why (typed), if the peer can still parse
        it: for the request the bad frame belonged to when we know its id, else id 0."""
        code = (
            wire.ErrorCode.TOO_LARGE
            if isinstance(exc, FrameTooLarge)
            else wire.ErrorCode.BAD_REQUEST
        )
        request_id = getattr(exc, "request_id", 0)
        with contextlib.suppress(Exception):
            await self._send(request_id, wire.ErrorResponse(code, str(exc)[:1024]))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _answer(self, request_id: int, request: object) -> None:
        shard = getattr(request, "shard", None)
        host = self._server.host(shard) if isinstance(shard, int) else None
        if host is None:
            response: object = _error(
                wire.ErrorCode.UNKNOWN_SHARD, f"shard {shard} is not hosted here"
            )
        else:
            try:
                response = await self._run(request, host)
            except Exception as exc:  # never let one request take the connection down
                response = self._error_for(exc, host)
        await self._send(request_id, response)

    async def _run(self, request: object, host: ShardHost) -> object:
        assert not isinstance(request, wire.Append), "appends are served by _start_append"
        if isinstance(request, wire.Read):
            max_bytes = min(request.max_bytes, self._server._limits.read_bytes_max)
            result = await host.read(request.from_lsn, max_bytes, READ_RECORDS_MAX)
            return wire.Records(result.records, result.first_lsn, result.next_lsn)
        if isinstance(request, wire.Tail):
            # The tail must be read from the real leader: a barrier through the log first.
            if not host.replica.is_leader:
                return _not_leader(host)
            await host.barrier()
            max_bytes = min(request.max_bytes, self._server._limits.read_bytes_max)
            result = await host.tail(request.from_lsn, max_bytes, request.wait_ms, READ_RECORDS_MAX)
            return wire.Records(result.records, result.first_lsn, result.next_lsn)
        if isinstance(request, wire.Truncate):
            return _result_response(await host.truncate(request.lsn, request.epoch))
        if isinstance(request, wire.AcquireLease):
            return _result_response(await host.acquire_lease(request.holder, request.epoch))
        if isinstance(request, wire.Status):
            return await self._status(host)
        return _error(wire.ErrorCode.UNKNOWN_OP, f"{type(request).__name__} is not served here")

    async def _status(self, host: ShardHost) -> wire.ShardStatus:
        """On the leader: a barrier through the log first, so the answer (`is_leader`
        true) comes from a leader a majority still follows, in the term shown, with every
        committed LSN applied. Elsewhere: this replica's own view, `is_leader` false: its
        leader, term and LSNs may be stale (FORMAT.md, ShardStatus)."""
        confirmed = False
        if host.replica.is_leader:
            try:
                await host.barrier()
                confirmed = True
            except NotLeader:
                pass  # it stepped down meanwhile: answer as the follower it now is
        status = host.replica.status()
        return wire.ShardStatus(
            shard=host.shard_id,
            leader=host.leader_address(),
            term=status["term"],
            first_lsn=status["first_lsn"],
            next_lsn=status["next_lsn"],
            commit_index=status["commit_index"],
            is_leader=confirmed and bool(status["is_leader"]),
        )

    def _error_for(self, exc: Exception, host: ShardHost | None = None) -> object:
        if isinstance(exc, NotLeader) and host is not None:
            return _not_leader(host)  # a redirect, not an error: the hint as a data address
        counters = self._server.counters
        counters[f"errors:{type(exc).__name__}"] += 1
        if isinstance(exc, LsnTruncated):
            return wire.ErrorResponse(wire.ErrorCode.TRUNCATED, str(exc), first_lsn=exc.first_lsn)
        if isinstance(exc, Overloaded):
            return _error(wire.ErrorCode.OVERLOADED, str(exc))
        if isinstance(exc, OutcomeUnknown):
            return _error(wire.ErrorCode.OUTCOME_UNKNOWN, str(exc))
        if isinstance(exc, ReplicaFailed):
            return _error(wire.ErrorCode.UNAVAILABLE, str(exc))
        if isinstance(exc, CommandTooLarge):
            return _error(wire.ErrorCode.TOO_LARGE, str(exc))
        if isinstance(exc, CommandInvalid):
            return _error(wire.ErrorCode.BAD_REQUEST, str(exc))
        if isinstance(exc, ShardError):
            return _error(wire.ErrorCode.UNAVAILABLE, str(exc))
        log.exception("internal error serving %s", self._peer, exc_info=exc)
        return _error(wire.ErrorCode.INTERNAL, type(exc).__name__)

    async def _send(self, request_id: int, response: object) -> None:
        data = wire.encode_response(request_id, response)  # type: ignore[arg-type]
        self._out.write(data)  # leaves with the other answers of this loop iteration
        if self._out.over_limit():  # back-pressure on a slow reader; the lock only then
            async with self._write_lock:
                await self._out.drain_if_over()
        if self._closing:
            self._out.flush()
            self._writer.close()


def _error(code: wire.ErrorCode, message: str) -> wire.ErrorResponse:
    return wire.ErrorResponse(code, message)


def _not_leader(host: ShardHost) -> wire.ErrorResponse:
    return wire.ErrorResponse(
        wire.ErrorCode.NOT_LEADER, "not the leader", leader_hint=host.leader_address()
    )


def _result_response(result: object) -> object:
    if isinstance(result, Appended):
        return wire.Appended(result.first_lsn, result.count, result.duplicate)
    if isinstance(result, Truncated):
        return wire.TruncatedTo(result.first_lsn)
    if isinstance(result, LeaseGranted):
        return wire.LeaseGranted(result.holder, result.epoch)
    if isinstance(result, StaleEpoch):
        return wire.ErrorResponse(
            wire.ErrorCode.STALE_EPOCH,
            f"stale epoch: the lease is held by {result.current_holder} at epoch "
            f"{result.current_epoch}",
            current_holder=result.current_holder,
            current_epoch=result.current_epoch,
        )
    if isinstance(result, NotLeaseHolder):
        return wire.ErrorResponse(
            wire.ErrorCode.NOT_LEASE_HOLDER,
            "acquire the lease at this epoch first",
            current_holder=result.current_holder,
            current_epoch=result.current_epoch,
        )
    if isinstance(result, DuplicateUnknown):
        return _error(wire.ErrorCode.DUPLICATE_UNKNOWN, f"seq {result.seq} is too old to know")
    if isinstance(result, Exception):
        raise result
    raise AssertionError(f"unexpected result {result!r}")
