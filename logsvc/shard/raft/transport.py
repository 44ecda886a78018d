"""The durable transport: pysyncobj's, holding every message that promises durability until
the tick's one sync (holes 1/2), routing received messages through `ShardRaft`'s fixes; and
`_DialNode` (test-only dial overrides)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.node import TCPNode
from pysyncobj.transport import TCPTransport, Transport

from logsvc.failpoints import enabled as failpoints_enabled
from logsvc.failpoints import failpoint
from logsvc.shard.raft import patches as _patches  # noqa: F401  (patched before use)
from logsvc.shard.raft.listener import SteadyServer
from logsvc.store import ShardStore

log = logging.getLogger("logsvc.raft")


class _Journal(Protocol):
    @property
    def store(self) -> ShardStore: ...

    def flush_vote(self) -> None: ...


class TransportOwner(Protocol):
    """What the transport needs of its SyncObj (adapter.ShardRaft), so that this module
    does not import the adapter."""

    _logsvc_journal: _Journal
    _logsvc_learners: dict[Any, str]

    def _logsvc_dial_node(self, node: Any) -> Any: ...

    def _logsvc_on_message(
        self, node: Any, message: dict[str, Any], deliver: Callable[[Any, dict[str, Any]], None]
    ) -> None: ...

    def _logsvc_note_sent(self, node: Any) -> None: ...

    def _logsvc_on_connection(self, node: Any, up: bool) -> None: ...

    def _logsvc_dial_failed(self, node: Any) -> None: ...

    def logsvc_may_dial(self, node: Any) -> bool: ...

    def logsvc_is_connected(self, node: Any) -> bool: ...


# Messages whose meaning depends on our journal being durable (Raft Figure 2: reply to
# AppendEntries only after persisting; term/vote/log durable before a vote leaves).
_AFTER_SYNC = frozenset({"next_node_idx", "request_vote", "response_vote"})
# At most this many held messages; past it the transport syncs and sends at once.
OUTBOX_MESSAGES_MAX = 4096


class _DurableMixin(Transport):  # type: ignore[misc]
    """Holds messages that promise durability until the tick's single sync (group commit),
    and routes incoming messages through the replica's fixes before pysyncobj sees them.
    Mixed into a pysyncobj transport: TCP in production (`_DurableTransport`), the
    simulator's in-memory one in tests (`durable_transport_class`)."""

    def __init__(self, syncObj: TransportOwner, selfNode: Any, otherNodes: Any) -> None:
        self._outbox: list[tuple[Any, dict[str, Any]]] = []
        self._syncObj = syncObj  # TCPTransport sets it too; the base Transport does not
        super().__init__(syncObj, selfNode, otherNodes)

    def addNode(self, node: Any) -> None:
        # Every peer the transport will dial passes here: the configured ones, and those
        # pysyncobj creates later as plain TCPNodes (membership changes, a snapshot's
        # cluster list), so a test's dial override covers them too.
        owner: TransportOwner = self._syncObj
        super().addNode(owner._logsvc_dial_node(node))

    def setOnMessageReceivedCallback(self, callback: Any) -> None:
        if callback is None:
            super().setOnMessageReceivedCallback(None)
            return
        owner: TransportOwner = self._syncObj

        def route(node: Any, message: dict[str, Any]) -> None:
            owner._logsvc_on_message(node, message, callback)

        super().setOnMessageReceivedCallback(route)

    def send(self, node: Any, message: dict[str, Any]) -> bool:
        owner: TransportOwner = self._syncObj
        owner._logsvc_note_sent(node)
        if message.get("type") in _AFTER_SYNC:
            self._outbox.append((node, message))
            if len(self._outbox) >= OUTBOX_MESSAGES_MAX:
                self.flush()
            return True
        # Not held (AppendEntries, our own messages...): still never ahead of the term and
        # vote it was sent in (a no-op unless pysyncobj set them during this tick).
        owner._logsvc_journal.flush_vote()
        return bool(super().send(node, message))

    def _onNodeConnected(self, node: Any) -> None:
        owner: TransportOwner = self._syncObj
        owner._logsvc_on_connection(node, up=True)
        super()._onNodeConnected(node)

    def _onReadonlyNodeConnected(self, node: Any) -> None:
        owner: TransportOwner = self._syncObj
        owner._logsvc_on_connection(node, up=True)  # a learner: a quiet leader wakes
        super()._onReadonlyNodeConnected(node)

    def _onReadonlyNodeDisconnected(self, node: Any) -> None:
        owner: TransportOwner = self._syncObj
        address = owner._logsvc_learners.pop(node, None)
        if address is not None:
            log.info("the learner at %s disconnected", address)
        super()._onReadonlyNodeDisconnected(node)

    def _onNodeDisconnected(self, node: Any) -> None:
        owner: TransportOwner = self._syncObj
        # pysyncobj also reports a dial that failed (a peer that is down, every retry):
        # only a connection that was up is news.
        if owner.logsvc_is_connected(node):
            owner._logsvc_on_connection(node, up=False)
        else:
            owner._logsvc_dial_failed(node)
        super()._onNodeDisconnected(node)

    def _connectIfNecessarySingle(self, node: Any) -> Any:
        # pysyncobj (TCPTransport) dials a peer whose connection is down once per
        # connectionRetryTime, from every replica: a dead node's peers are dialled by
        # their node's liveness table instead, once per interval for all (liveness.py).
        owner: TransportOwner = self._syncObj
        if not owner.logsvc_is_connected(node) and not owner.logsvc_may_dial(node):
            return False
        return super()._connectIfNecessarySingle(node)

    def held(self) -> list[tuple[Any, dict[str, Any]]]:
        return self._outbox

    def flush(self) -> None:
        """Sync the journal, then send what was held. Called after every tick."""
        owner: TransportOwner = self._syncObj
        failpoint("raft_before_flush_sync")
        owner._logsvc_journal.flush_vote()  # the tick's term and vote, in one write
        owner._logsvc_journal.store.sync()
        outbox, self._outbox = self._outbox, []
        # pysyncobj sends a response_vote only to grant a vote (already durable, above).
        if failpoints_enabled() and any(m.get("type") == "response_vote" for _, m in outbox):
            failpoint("raft_after_vote_persisted_before_reply")
        for node, message in outbox:
            super().send(node, message)


class _KeyedTCPTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCP transport, sending on a connection only once its key exchange is done.

    With an encryptor (ours is mandatory: raft_seal.py), every message after the first on
    a connection carries the receiver's random key, which the dialler learns from the
    peer's first reply. pysyncobj's `send` checks only that the socket is connected: a
    message sent in between (a vote request broadcast while the dial is in flight, the
    usual case at start) left without the key, the peer could not unpack it and dropped
    the connection, and the dialler, which had meanwhile counted it as up, saw it close
    (the quiet-connection test's CI failure, 2026-11-27). Such a message is now not sent,
    as to a peer that is not connected: Raft resends what matters (the next heartbeat,
    the next election)."""

    def send(self, node: Any, message: Any) -> bool:
        connection = self._connections.get(node)
        if (
            connection is not None
            and connection.sendRandKey is None
            and self._syncObj.encryptor is not None
        ):
            return False
        return bool(super().send(node, message))


class _DurableTransport(_DurableMixin, _KeyedTCPTransport):
    """The durable transport over pysyncobj's TCP transport (production), with a listener
    that a failed accept does not close (listener.py), sending only on connections whose
    key exchange is done (`_KeyedTCPTransport`)."""

    def _createServer(self) -> None:
        super()._createServer()
        SteadyServer.adopt(self._server, self._listener_lost)

    def _listener_lost(self) -> None:
        """The listener closed after an error event: bind it again now; failing that, the
        transport is not ready and pysyncobj binds it again every bindRetryTime (its start's
        rule; the replica ticks for that, `_logsvc_next_wakeup_s`)."""
        try:
            self._server.bind()
        except OSError as exc:
            log.warning("binding the Raft listener again failed (%s): retried", exc)
            self._ready = False


_DURABLE_CLASSES: dict[type, type] = {TCPTransport: _DurableTransport}


def durable_transport_class(base: type) -> type:
    """The durable transport over `base`, a `TransportBase` subclass (simulator only; the
    same class for the same base, so pysyncobj and tests see one class per base)."""
    assert issubclass(base, Transport), base
    found = _DURABLE_CLASSES.get(base)
    if found is None:
        found = type(f"Durable{base.__name__}", (_DurableMixin, base), {})
        _DURABLE_CLASSES[base] = found
    return found


class _DialNode(TCPNode):  # type: ignore[misc]
    """A peer known by its canonical address but dialled at another one (test only).

    pysyncobj 0.3.17 dials `node.ip`/`node.port` (TCPTransport._connectIfNecessarySingle)
    while the id, `address`, the higher-address-dials rule and the handshake (the dialler
    announces its own selfNode.address) all use the canonical address; so overriding the
    two dial properties reroutes the connection and nothing else (chaos-plan appendix B).
    """

    def __init__(self, address: str, dial_address: str) -> None:
        super().__init__(address)
        host, _, port = dial_address.rpartition(":")
        self._logsvc_dial_host = host
        self._logsvc_dial_port = int(port)

    @property
    def ip(self) -> Any:
        return globalDnsResolver().resolve(self._logsvc_dial_host)

    @property
    def port(self) -> int:
        return self._logsvc_dial_port

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # pysyncobj pickles a node object into a membership command: the replicated log
        # must carry the plain canonical node, never this replica's test routing.
        return (TCPNode, (self.address,))


# ------------------------------------------------------------------------ the SyncObj
