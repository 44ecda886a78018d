"""A replica's Raft listener that stays up: pysyncobj's `TcpServer` with its accept handling
replaced.

pysyncobj 0.3.17 (`TcpServer.__onNewConnection`) closes the listening socket for good on
any accept error but EAGAIN (EMFILE or ENFILE when descriptors run out, ENOBUFS, ENOMEM,
ECONNABORTED, EPROTO...), on any error while it sets up the accepted connection, and on an
error event; nothing binds it again (the transport stays "ready") and nothing is logged.
From then on the replica is reachable by none of the peers that dial it (every member with
a higher address, and every learner) until its process restarts: a learner added to the
shard then never connects, and a node with a thousand shards that once ran out of
descriptors keeps replicas nobody can reach.

Here a failed accept costs that one connection: it is logged (at most once per
`ACCEPT_ERROR_LOG_INTERVAL_S`) and the listener goes on. An error event on the listening
socket itself closes it and asks the transport to bind it again (`on_lost`).

The reach-ins (pysyncobj's private names of `TcpServer`, as `ShardRaft`'s docstring lists):
`__onNewConnection` (replaced), `__socket`, `__poller`, `__host`, `__port`,
`__sendBufferSize`, `__recvBufferSize`, `__connectionTimeout`, `__keepalive`,
`__onNewConnectionCallback` (read, to set up an accepted connection exactly as pysyncobj).
"""

from __future__ import annotations

import logging
import math
import socket
import time
from collections.abc import Callable

from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.tcp_server import TcpServer

from logsvc.shard.raft import patches as _patches  # noqa: F401  (patched before use)

log = logging.getLogger("logsvc.raft")

# A failing accept is said at most once per this many seconds per listener: descriptors
# running out fail every accept until some are closed.
ACCEPT_ERROR_LOG_INTERVAL_S = 10.0


class SteadyServer(TcpServer):  # type: ignore[misc]
    """`TcpServer` whose listener outlives a failed accept (module doc). Made from a server
    pysyncobj created (`adopt`), so every other behaviour stays pysyncobj's."""

    _logsvc_on_lost: Callable[[], None] | None = None
    _logsvc_error_logged_at: float = -math.inf

    @classmethod
    def adopt(cls, server: TcpServer, on_lost: Callable[[], None]) -> SteadyServer:
        """`server` (a plain `TcpServer` not bound yet), now of this class; `on_lost` is
        called when the listener closed after an error event (bind it again)."""
        assert type(server) is TcpServer
        server.__class__ = cls  # the same attributes: only the accept handling differs
        adopted: SteadyServer = server
        adopted._logsvc_on_lost = on_lost
        return adopted

    def _TcpServer__onNewConnection(self, descr: int, event: int) -> None:
        if event & POLL_EVENT_TYPE.READ:
            self._logsvc_accept()
        if event & POLL_EVENT_TYPE.ERROR:
            log.warning(
                "the Raft listener on %s:%d reported an error: it is closed and bound again",
                self._TcpServer__host,
                self._TcpServer__port,
            )
            self.unbind()
            if self._logsvc_on_lost is not None:
                self._logsvc_on_lost()

    def _logsvc_accept(self) -> None:
        try:
            sock, _ = self._TcpServer__socket.accept()
        except (BlockingIOError, InterruptedError):
            return  # nothing to accept (another event took it), or a signal: next event
        except OSError as exc:
            self._logsvc_say(f"accepting a Raft connection failed ({exc})")
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._TcpServer__sendBufferSize)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._TcpServer__recvBufferSize)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            conn = TcpConnection(
                poller=self._TcpServer__poller,
                socket=sock,
                timeout=self._TcpServer__connectionTimeout,
                sendBufferSize=self._TcpServer__sendBufferSize,
                recvBufferSize=self._TcpServer__recvBufferSize,
                keepalive=self._TcpServer__keepalive,
            )
        except OSError as exc:  # the peer gone already, or no buffer: this one only
            sock.close()
            self._logsvc_say(f"setting up an accepted Raft connection failed ({exc})")
            return
        self._TcpServer__onNewConnectionCallback(conn)

    def _logsvc_say(self, what: str) -> None:
        now = time.monotonic()
        if now - self._logsvc_error_logged_at < ACCEPT_ERROR_LOG_INTERVAL_S:
            return
        self._logsvc_error_logged_at = now
        log.warning(
            "%s on the Raft listener %s:%d; the listener goes on",
            what,
            self._TcpServer__host,
            self._TcpServer__port,
        )
