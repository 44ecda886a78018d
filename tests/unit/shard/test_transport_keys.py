"""The Raft transport sends nothing on a connection before its key exchange ends
(transport.py `_KeyedTCPTransport`).

pysyncobj's TCP transport sends once the socket is connected; with an encryptor, a dialler
learns the key its every later message must carry from the peer's first reply. A message
sent in between (a vote request broadcast while the dial was in flight) reached the peer
without it: the peer dropped the connection, and the dialler, which counted it as up by
then, lost it (the quiet-connection test's CI failure, 2026-11-27; with
`-p tests.support.gcpause` that test failed 8 runs in 36 before the rule, 0 in 28 after).
The rule on stand-in connections.
"""

from __future__ import annotations

import types
from typing import Any

from pysyncobj.tcp_connection import CONNECTION_STATE

from logsvc.shard.raft.transport import _DurableTransport, _KeyedTCPTransport


class _Connection:
    def __init__(self, send_rand_key: bytes | None) -> None:
        self.state = CONNECTION_STATE.CONNECTED
        self.sendRandKey = send_rand_key
        self.sent: list[Any] = []

    def send(self, message: Any) -> None:
        self.sent.append(message)


def _transport(connections: dict[Any, _Connection], encryptor: object | None) -> Any:
    transport = object.__new__(_KeyedTCPTransport)
    transport._connections = connections
    transport._syncObj = types.SimpleNamespace(encryptor=encryptor)
    transport._send_random_sleep_duration = 0
    return transport


def test_nothing_is_sent_on_a_connection_before_its_key_exchange_ends() -> None:
    exchanging, keyed = _Connection(None), _Connection(b"k" * 32)
    transport = _transport({"a": exchanging, "b": keyed}, encryptor=object())
    vote = {"type": "request_vote", "term": 1}

    assert transport.send("a", vote) is False
    assert exchanging.sent == []
    assert transport.send("b", vote) is True
    assert keyed.sent == [vote]
    assert transport.send("c", vote) is False  # no connection at all, as before


def test_without_an_encryptor_there_is_no_exchange_to_wait_for() -> None:
    plain = _Connection(None)
    transport = _transport({"a": plain}, encryptor=None)
    assert transport.send("a", {"type": "append_entries"}) is True
    assert plain.sent == [{"type": "append_entries"}]


def test_the_production_transport_is_the_keyed_one() -> None:
    assert issubclass(_DurableTransport, _KeyedTCPTransport)
    # The durable mixin's sends (immediate and held ones at the flush) reach the keyed
    # send: it comes before pysyncobj's in the method order.
    mro = _DurableTransport.__mro__
    assert mro.index(_KeyedTCPTransport) < next(
        i for i, c in enumerate(mro) if c.__name__ == "TCPTransport"
    )
