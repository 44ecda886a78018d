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

Where the parts live: this module is the public API (`connect`, `SyncClient`, and every name
below, re-exported); the async `Client` with its lanes and retries is logsvc/async_client.py,
a connection and `ClientOptions` logsvc/client_connection.py, the errors
logsvc/client_errors.py, the `Producer` logsvc/producer.py.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from logsvc.async_client import Client as Client
from logsvc.client_config import load_client_config
from logsvc.client_connection import WRITE_BUFFER_BYTES_MAX as WRITE_BUFFER_BYTES_MAX
from logsvc.client_connection import ClientOptions as ClientOptions
from logsvc.client_errors import LogsvcError as LogsvcError
from logsvc.client_errors import NotLeader as NotLeader
from logsvc.client_errors import NotLeaseHolder as NotLeaseHolder
from logsvc.client_errors import Overloaded as Overloaded
from logsvc.client_errors import ServerError as ServerError
from logsvc.client_errors import StaleEpoch as StaleEpoch
from logsvc.client_errors import TooManyInFlight as TooManyInFlight
from logsvc.client_errors import Truncated as Truncated
from logsvc.client_errors import Unauthenticated as Unauthenticated
from logsvc.client_errors import Unavailable as Unavailable
from logsvc.client_errors import UnknownShard as UnknownShard
from logsvc.producer import Producer as Producer
from logsvc.producer import ProducerFull as ProducerFull
from logsvc.producer import ProducerOptions as ProducerOptions
from logsvc.wire import messages as wire

T = TypeVar("T")


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
