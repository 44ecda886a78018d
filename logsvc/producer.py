"""Producer-side batching over a `Client` (logsvc/async_client.py): records sent close
together share one append (one round trip, one dedupe key, one Raft entry); each `send`
still returns its own record's LSN.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from logsvc.async_client import Client
from logsvc.client_errors import LogsvcError


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
