"""A replica's Raft listener outlives a failed accept (logsvc/shard/raft/listener.py).

pysyncobj's own server closes its listening socket for good on any accept error but EAGAIN
(EMFILE when descriptors run out, ENOBUFS, ...): every peer that dials the replica (higher
addresses, learners) is then refused until the process restarts. With real sockets on
loopback and the accept's failure made by a test double of the listening socket (the OS's
answer, EMFILE, once):

* the failed accept costs nothing but that attempt: the connection waiting in the backlog
  and the next ones are accepted (pysyncobj's server refuses the next connection);
* an error event on the listening socket closes it and binds it again (`on_lost`, as the
  transport does): a connection made after it is accepted.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from typing import Any

import pytest
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_server import TcpServer

from logsvc.shard.raft.listener import SteadyServer
from tests.unit.shard.raft_harness import free_port


class Poller:
    """pysyncobj's poller interface, recording the subscriptions; events are delivered by
    the test (`deliver`)."""

    def __init__(self) -> None:
        self.callbacks: dict[int, Callable[[int, int], None]] = {}

    def subscribe(self, descr: int, callback: Callable[[int, int], None], mask: int) -> None:
        self.callbacks[descr] = callback

    def unsubscribe(self, descr: int) -> None:
        self.callbacks.pop(descr, None)

    def deliver(self, descr: int, event: int) -> None:
        self.callbacks[descr](descr, event)


class FailingAccept:
    """The listening socket, whose next `failures` accepts fail as the OS says when this
    process has no descriptor left (EMFILE)."""

    def __init__(self, real: socket.socket, failures: int) -> None:
        self.real = real
        self.failures = failures

    def accept(self) -> tuple[socket.socket, Any]:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return self.real.accept()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def listening(
    server_class: type, on_lost: Callable[[], None] | None = None
) -> tuple[Any, Poller, int, list[Any]]:
    poller = Poller()
    port = free_port()
    accepted: list[Any] = []
    server = TcpServer(poller, "127.0.0.1", port, onNewConnection=accepted.append)
    if server_class is SteadyServer:
        server = SteadyServer.adopt(server, on_lost or (lambda: None))
    server.bind()
    return server, poller, port, accepted


def listener_fd(poller: Poller) -> int:
    """The listening socket's descriptor: the poller's one subscription before any accept."""
    [descr] = poller.callbacks
    return descr


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def test_a_failed_accept_costs_that_attempt_not_the_listener() -> None:
    server, poller, port, accepted = listening(SteadyServer)
    clients: list[socket.socket] = []
    try:
        fd = listener_fd(poller)
        server._TcpServer__socket = FailingAccept(server._TcpServer__socket, failures=1)
        clients.append(connect(port))
        poller.deliver(fd, POLL_EVENT_TYPE.READ)  # EMFILE: nothing accepted
        assert accepted == []
        poller.deliver(fd, POLL_EVENT_TYPE.READ)  # the waiting connection, now
        clients.append(connect(port))  # and one made after the failure
        poller.deliver(fd, POLL_EVENT_TYPE.READ)
        assert len(accepted) == 2
    finally:
        for client in clients:
            client.close()
        for conn in accepted:
            conn.disconnect()
        server.unbind()


def test_pysyncobjs_own_server_refuses_every_connection_after_a_failed_accept() -> None:
    """What the replacement is for (so that this file fails if pysyncobj's server comes
    back): the listener is closed by the one failed accept."""
    server, poller, port, accepted = listening(TcpServer)
    client = connect(port)
    try:
        fd = listener_fd(poller)
        server._TcpServer__socket = FailingAccept(server._TcpServer__socket, failures=1)
        poller.deliver(fd, POLL_EVENT_TYPE.READ)
        with pytest.raises(ConnectionRefusedError):
            connect(port)
        assert accepted == []
    finally:
        client.close()


def test_an_error_event_on_the_listener_binds_it_again() -> None:
    rebound: list[int] = []
    server: Any = None

    def on_lost() -> None:  # what the transport does (transport.py `_listener_lost`)
        server.bind()
        rebound.append(listener_fd(poller))

    server, poller, port, accepted = listening(SteadyServer, on_lost)
    client = None
    try:
        poller.deliver(listener_fd(poller), POLL_EVENT_TYPE.ERROR)
        assert len(rebound) == 1
        client = connect(port)
        poller.deliver(rebound[0], POLL_EVENT_TYPE.READ)
        assert len(accepted) == 1
    finally:
        if client is not None:
            client.close()
        for conn in accepted:
            conn.disconnect()
        server.unbind()
