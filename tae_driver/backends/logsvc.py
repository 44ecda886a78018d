"""The logsvc `LogBackend`: one shard of a Raft-replicated log service, through its client.

    backend = await LogsvcBackend.open(config.addresses, config.token, shard=1)
    driver = open_driver(backend, window=64)

Why each choice (issue 7, backend.py's contract, reference/matrixone-wal.md §3):

* **Numbers.** logsvc LSNs are dense per shard from 1 and every record is a user record
  (leases, barriers and no-ops take no LSN), so a record's LSN is `page.first_lsn + i`; the
  page is checked to say exactly that (`first_lsn` as asked, `next_lsn == first_lsn + n`)
  before any LSN is derived from a position (§2.7 Q1), and a page that does not is a
  `BackendError`.
* **Truncation, off by one.** logsvc's `truncate(shard, lsn)` keeps `lsn` ("discard every LSN
  below"; it answers the first retained LSN) and clamps past the end instead of refusing.
  The protocol's `truncate(lsn)` drops `lsn` itself. So `truncate(lsn)` sends `lsn + 1`,
  `truncated()` is logsvc's `first_lsn - 1`, `latest()` is `next_lsn - 1`, and the protocol's
  refusals are checked first: `AlreadyTruncated` when `lsn <= truncated()`, `OutOfRange` when
  `lsn > latest()` (checked before sending, because logsvc would silently truncate to the end).
* **Lease and fencing.** A writer takes the shard's lease `(holder, epoch)` at open; with no
  epoch given it takes the next one above the current (learned from the `STALE_EPOCH`
  answer), so a new engine instance fences every older one. Appends carry the epoch; a
  refusal (`STALE_EPOCH`) raises `BackendFenced` and every later append fails the same way at
  once. Truncates carry the epoch too and are fenced the same way by the shard itself: a
  fenced instance never truncates once the new writer's lease is applied, and its truncate
  raises `BackendFenced` (as do its appends from then on). `lease=False` opens a reader
  (FOR_READ/FOREVER replay) that fences nobody, and whose truncates, at epoch 0, are refused
  once any lease was granted; `acquire_lease()` later promotes it.
* **Reads.** `read` goes to any replica (the client prefers the known leader). A lagging
  replica answers a shorter prefix, never other data, so a non-empty page is always right;
  the one answer it can get wrong is "nothing more" (it has not applied the end yet), which
  is exactly the answer that ends a replay, and a replay that ends early lets FOR_WRITE reuse
  DSNs of acknowledged entries. So an empty page is confirmed through the leader with
  `tail(wait_ms=0)`, which runs a barrier through the log first. That costs one barrier per
  replay (or per idle poll) instead of one per page, and `read` stays cheap for followers.
  Reads at or below the highest truncated LSN this backend has seen raise `OutOfRange`
  locally, so a replica that has not applied a truncation yet cannot serve them.
* **`truncated()` / `latest()` are linearizable** (backend.py: a stale truncated LSN makes
  replay start below the compaction point). `Status` is answered from whichever replica gets
  it, so it only gives lower bounds (replicas apply a prefix of the committed log, and both
  bounds only grow). Each is then pinned with one `tail(wait_ms=0)` through the leader:
  a tail just below the lower bound of `first_lsn` must be refused with `TRUNCATED`, which
  carries the leader's `first_lsn` after its barrier; a tail at the lower bound of `next_lsn`
  that finds nothing proves that bound is the leader's `next_lsn` after its barrier. (On a
  log never truncated the first probe is a tail at LSN 1, which carries record 1's bytes.)
* **Bounds.** At most `appends_inflight_max` appends in flight (the pool; a driver's window
  never needs more than `WINDOW_RECORDS_MAX`). Every call is bounded as a whole by the client
  options (`retry_s_max + request_timeout_s + connect_timeout_s + backoff_s_max`) on top of
  the client's own per-attempt timeout and attempt count, and ends in `BackendUnavailable`.
  Long polls (`wait_past`) wait at most `LOGSVC_TAIL_WAIT_MS_MAX`, and well under one
  request timeout. `close()` cancels every call still running, so none outlives the backend.

Retries are the client's: an append is retried with the same `(client_id, seq)` and the shard
deduplicates it, so a retry after a lost reply or a leader change gets the original LSN back
and the log never holds two copies (the driver would tolerate identical copies anyway, §2.7 Q7).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from logsvc import client as logsvc_client
from logsvc.client import Client, ClientOptions, connect
from logsvc.wire import messages as wire
from logsvc.wire.errors import MessageError
from logsvc.wire.limits import DEFAULT_WIRE_LIMITS
from tae_driver import limits
from tae_driver.backend import Record
from tae_driver.errors import (
    AlreadyTruncated,
    BackendClosed,
    BackendError,
    BackendFenced,
    BackendUnavailable,
    OutOfRange,
)

T = TypeVar("T")

LOGSVC_APPENDS_INFLIGHT_MAX = limits.WINDOW_RECORDS_MAX
"""Appends in flight at once per backend (the pool). One driver has at most its window of
records in flight, so it never waits here; more would only queue inside the client, whose
per-connection request slots are not bounded in time."""

LOGSVC_READ_BYTES_MAX = DEFAULT_WIRE_LIMITS.read_bytes_max
"""The largest `max_bytes` a Read or Tail may carry (the wire's limit, 16 MiB): the driver's
read batch (up to `READ_BATCH_BYTES_MAX`) is cut to it."""

LOGSVC_TAIL_WAIT_MS_MAX = 1000
"""How long one `wait_past` long poll may wait at the leader. Short, so a tailing reader
re-checks the truncated LSN and its stop flag about once a second at worst."""

LOGSVC_PROBES_MAX = 8
"""Tails through the leader one `latest()` may make while the log keeps growing under it
(another writer appending); past this it answers the last confirmed lower bound."""

LEASE_ACQUIRE_ATTEMPTS_MAX = 8
"""Tries to take the next epoch when several instances race for the lease; losing this many
races in a row means another writer keeps winning: `BackendFenced`."""

HOLDER_PREFIX = "tae_driver:"

assert LOGSVC_APPENDS_INFLIGHT_MAX >= limits.WINDOW_RECORDS_MAX
assert LOGSVC_READ_BYTES_MAX >= limits.BACKEND_PAYLOAD_BYTES_MAX  # one whole record fits
assert DEFAULT_WIRE_LIMITS.record_bytes_max >= limits.BACKEND_PAYLOAD_BYTES_MAX
assert DEFAULT_WIRE_LIMITS.tail_wait_ms_max >= LOGSVC_TAIL_WAIT_MS_MAX


class LogsvcBackend:
    """Open with `await LogsvcBackend.open(addresses, token, shard)`; or wrap a `Client` you
    own (then `close()` leaves it open) and call `acquire_lease()` yourself."""

    def __init__(
        self,
        client: Client,
        shard: int,
        *,
        options: ClientOptions | None = None,
        owns_client: bool = False,
        holder: str | None = None,
        appends_inflight_max: int = LOGSVC_APPENDS_INFLIGHT_MAX,
    ) -> None:
        assert shard >= 1
        assert 1 <= appends_inflight_max <= LOGSVC_APPENDS_INFLIGHT_MAX
        options = options or ClientOptions()
        self._client = client
        self._shard = shard
        self._owns_client = owns_client
        self._holder = holder or f"{HOLDER_PREFIX}{uuid.uuid4().hex}"
        self._epoch = 0  # 0: no lease taken (appends are accepted only while none was granted)
        self._fenced: BackendFenced | None = None
        self._appends = asyncio.Semaphore(appends_inflight_max)
        self._truncate_lock = asyncio.Lock()
        self._calls: set[asyncio.Task[Any]] = set()
        self._closed = False
        # The whole of one client call: its last attempt may start just before the client's
        # retry deadline, after a back-off, and then connect and wait one request timeout.
        self._call_s_max = (
            options.retry_s_max
            + options.request_timeout_s
            + options.connect_timeout_s
            + options.backoff_s_max
        )
        # A long poll must answer well within one attempt, or the client would retry it.
        self._tail_wait_ms = max(
            0, min(LOGSVC_TAIL_WAIT_MS_MAX, int(options.request_timeout_s * 1000) // 2)
        )
        # Monotonic knowledge, from our own calls: the log's truncated LSN is at least
        # `_truncated_seen`, its latest LSN at least `_latest_seen`.
        self._truncated_seen = 0
        self._latest_seen = 0

    @classmethod
    async def open(
        cls,
        addresses: Sequence[str],
        token: str,
        shard: int,
        *,
        lease: bool = True,
        holder: str | None = None,
        epoch: int | None = None,
        options: ClientOptions | None = None,
        client_id: str | None = None,
        appends_inflight_max: int = LOGSVC_APPENDS_INFLIGHT_MAX,
    ) -> LogsvcBackend:
        """Connect to the cluster at `addresses` and, for a writer (`lease=True`), take the
        shard's lease: at `epoch` if given (`BackendFenced` if a higher one exists), else at
        the next epoch above the current one."""
        options = options or ClientOptions()
        client = await connect(addresses, token, options=options, client_id=client_id)
        backend = cls(
            client,
            shard,
            options=options,
            owns_client=True,
            holder=holder,
            appends_inflight_max=appends_inflight_max,
        )
        try:
            if lease:
                await backend.acquire_lease(epoch)
        except BaseException:
            await backend.close()
            raise
        return backend

    # --- observations ---------------------------------------------------------------------

    @property
    def shard(self) -> int:
        return self._shard

    @property
    def holder(self) -> str:
        return self._holder

    @property
    def epoch(self) -> int:
        """The lease epoch appends carry (0: no lease taken)."""
        return self._epoch

    @property
    def fenced(self) -> BackendFenced | None:
        """Why this backend is fenced, once an append was refused for a newer lease."""
        return self._fenced

    # --- the lease ------------------------------------------------------------------------

    async def acquire_lease(self, epoch: int | None = None) -> int:
        """Take the shard's lease for `holder` and return its epoch. With `epoch=None`, the
        next epoch above the current one (fencing every older writer); with an epoch, exactly
        that one. Raises `BackendFenced` when a higher epoch exists (or another writer won
        `LEASE_ACQUIRE_ATTEMPTS_MAX` races in a row). For a reader about to be promoted, or
        before writing: appends of this backend still in flight at the old epoch are fenced
        like anyone else's."""
        self._check_open()
        assert epoch is None or epoch >= 1
        wanted = epoch if epoch is not None else max(1, self._epoch + 1)
        for _ in range(LEASE_ACQUIRE_ATTEMPTS_MAX):
            try:
                granted = await self._call(
                    "acquire_lease",
                    self._client.acquire_lease(self._shard, self._holder, wanted),
                )
            except BackendFenced as exc:
                if epoch is not None or exc.current_epoch is None:
                    raise
                wanted = exc.current_epoch + 1
                continue
            if granted.holder != self._holder or granted.epoch != wanted:
                raise BackendError(f"acquire_lease({wanted}) was answered with {granted}")
            self._epoch = wanted
            self._fenced = None
            return wanted
        raise BackendFenced(
            f"shard {self._shard}: lost {LEASE_ACQUIRE_ATTEMPTS_MAX} lease races",
            holder=self._holder,
            epoch=self._epoch,
            current_holder=None,
            current_epoch=wanted - 1,
        )

    async def confirm_lease(self) -> None:
        """Ask the shard whether this writer still holds its lease (an idempotent
        AcquireLease at its own epoch): `BackendFenced` when a newer writer took it. A writer
        that appends nothing learns of a fencing only this way."""
        if self._epoch == 0:
            return
        try:
            await self.acquire_lease(self._epoch)
        except BackendFenced as exc:
            self._fenced = exc
            raise

    # --- LogBackend -----------------------------------------------------------------------

    async def append(self, payload: bytes) -> int:
        self._check_open()
        assert len(payload) <= limits.BACKEND_PAYLOAD_BYTES_MAX
        if self._fenced is not None:
            raise self._fenced_again("append")
        try:
            lsns = await self._call("append", self._append_one(bytes(payload)))
        except BackendFenced as exc:
            self._fenced = exc
            raise
        if len(lsns) != 1:
            raise BackendError(f"append of one record was given LSNs {lsns}")
        self._note_latest(lsns[0])
        return lsns[0]

    async def read(self, first_lsn: int, max_bytes: int) -> tuple[list[Record], int]:
        self._check_open()
        assert first_lsn >= 1
        assert max_bytes >= 1
        if first_lsn <= self._truncated_seen:
            raise OutOfRange(first_lsn, self._truncated_seen, self._latest_seen)
        max_bytes = min(max_bytes, LOGSVC_READ_BYTES_MAX)
        shard = self._shard
        page = await self._call("read", self._client.read(shard, first_lsn, max_bytes), first_lsn)
        if not page.records:
            # Maybe a lagging replica's end of the log: only the leader may say "nothing more".
            page = await self._call(
                "read", self._client.tail(shard, first_lsn, max_bytes, 0), first_lsn
            )
        self._check_page(page, first_lsn)
        records = [Record(first_lsn + i, payload) for i, payload in enumerate(page.records)]
        if records:
            self._note_latest(records[-1].lsn)
        return records, page.next_lsn

    async def truncate(self, lsn: int) -> None:
        self._check_open()
        assert lsn >= 0
        if self._fenced is not None:
            raise self._fenced_again("truncate")
        async with self._truncate_lock:
            truncated = await self.truncated()
            if lsn <= truncated:
                raise AlreadyTruncated(lsn, truncated)
            if lsn > self._latest_seen:
                latest = await self.latest()
                if lsn > latest:
                    raise OutOfRange(lsn, truncated, latest)
            # The shard refuses it (StaleEpoch: BackendFenced) once a newer writer took over.
            try:
                first_lsn = await self._call(
                    "truncate",
                    self._client.truncate(self._shard, lsn + 1, epoch=self._epoch),
                    lsn + 1,
                )
            except BackendFenced as exc:
                self._fenced = exc
                raise
            # lsn + 1 <= next_lsn, so logsvc did not clamp: it keeps exactly lsn + 1 on.
            if first_lsn < lsn + 1:
                raise BackendError(f"truncate to {lsn + 1} kept LSNs from {first_lsn}")
            self._note_truncated(first_lsn - 1)

    async def truncated(self) -> int:
        self._check_open()
        floor = self._truncated_seen
        if floor == 0:
            status = await self._call("truncated", self._client.status(self._shard))
            floor = status.first_lsn - 1
        # A tail at or below the truncated LSN must be refused with the leader's first LSN;
        # only a never-truncated log (first_lsn 1) can answer a tail at LSN 1.
        probe = max(1, floor)
        try:
            page = await self._call("truncated", self._client.tail(self._shard, probe, 1, 0), probe)
        except OutOfRange as exc:
            self._note_truncated(exc.truncated_lsn)
            return exc.truncated_lsn
        if floor >= 1:
            raise BackendError(f"the leader served LSN {probe}, which it had truncated")
        self._check_page(page, probe)
        return 0

    async def latest(self) -> int:
        self._check_open()
        status = await self._call("latest", self._client.status(self._shard))
        next_lsn = max(
            status.next_lsn, status.first_lsn, self._latest_seen + 1, self._truncated_seen + 1
        )
        for _ in range(LOGSVC_PROBES_MAX):
            try:
                page = await self._call(
                    "latest", self._client.tail(self._shard, next_lsn, 1, 0), next_lsn
                )
            except OutOfRange as exc:  # truncated past our lower bound: next_lsn is above it
                self._note_truncated(exc.truncated_lsn)
                next_lsn = max(next_lsn, exc.truncated_lsn + 1)
                continue
            self._check_page(page, next_lsn)
            if not page.records:
                break  # the leader, after a barrier, has nothing at next_lsn: it is next_lsn
            # The log grew (or the status came from a lagging replica). The leader that just
            # answered is the client's first choice for the status too.
            status = await self._call("latest", self._client.status(self._shard))
            next_lsn = max(page.next_lsn, status.next_lsn)
        self._note_latest(next_lsn - 1)
        return next_lsn - 1

    async def wait_past(self, lsn: int) -> None:
        """Long-poll the leader for a record above `lsn`, at most `LOGSVC_TAIL_WAIT_MS_MAX`.
        Errors end the wait early; the caller re-checks and its next read reports them."""
        if self._closed or lsn < self._latest_seen:
            return
        try:
            page = await self._call(
                "wait_past",
                self._client.tail(self._shard, lsn + 1, 1, self._tail_wait_ms),
                lsn + 1,
            )
        except BackendError:
            return
        if page.records and page.first_lsn == lsn + 1:
            self._note_latest(lsn + 1)

    async def close(self) -> None:
        """Cancel every call still running, then close the client if this backend owns it."""
        if self._closed:
            return
        self._closed = True
        calls = list(self._calls)
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        if self._owns_client:
            await self._client.close()

    # --- internals ------------------------------------------------------------------------

    async def _append_one(self, payload: bytes) -> list[int]:
        async with self._appends:
            return await self._client.append(self._shard, [payload], epoch=self._epoch)

    async def _call(self, what: str, call: Coroutine[Any, Any, T], lsn: int = 0) -> T:
        """Run one client call as a task this backend can cancel on close, bounded in time,
        with logsvc's errors turned into the driver's. `lsn` is the LSN asked for, for a
        `TRUNCATED` answer (-> `OutOfRange`)."""
        if self._closed:
            call.close()
            raise BackendClosed(f"{what}: the logsvc backend is closed")
        task = asyncio.ensure_future(call)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        try:
            async with asyncio.timeout(self._call_s_max):
                return await task
        except TimeoutError as exc:
            raise BackendUnavailable(
                f"{what}: no answer from shard {self._shard} within {self._call_s_max:.1f} s"
            ) from exc
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self._closed and (current is None or current.cancelling() == 0):
                raise BackendClosed(f"{what}: the logsvc backend was closed") from None
            raise
        except logsvc_client.StaleEpoch as exc:
            response = exc.response
            raise BackendFenced(
                f"{what} on shard {self._shard}",
                holder=self._holder,
                epoch=self._epoch,
                current_holder=response.current_holder,
                current_epoch=response.current_epoch,
            ) from exc
        except logsvc_client.Truncated as exc:
            if exc.first_lsn is None:
                raise BackendError(f"{what}: TRUNCATED without a first LSN") from exc
            self._note_truncated(exc.first_lsn - 1)
            raise OutOfRange(lsn, exc.first_lsn - 1, self._latest_seen) from exc
        except logsvc_client.Unavailable as exc:
            raise BackendUnavailable(f"{what} on shard {self._shard}: {exc}") from exc
        except (logsvc_client.LogsvcError, MessageError) as exc:
            raise BackendError(f"{what} on shard {self._shard}: {exc}") from exc
        except OSError as exc:  # the client retries these; one escaping is still an outage
            raise BackendUnavailable(f"{what} on shard {self._shard}: {exc!r}") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosed(f"logsvc backend for shard {self._shard} is closed")

    def _check_page(self, page: wire.Records, first_lsn: int) -> None:
        if page.first_lsn != first_lsn or page.next_lsn != first_lsn + len(page.records):
            raise BackendError(
                f"read from {first_lsn} answered {len(page.records)} records "
                f"[{page.first_lsn}, {page.next_lsn})"
            )

    def _fenced_again(self, what: str) -> BackendFenced:
        first = self._fenced
        assert first is not None
        error = BackendFenced(
            f"{what} on shard {self._shard}",
            holder=first.holder,
            epoch=first.epoch,
            current_holder=first.current_holder,
            current_epoch=first.current_epoch,
        )
        error.__cause__ = first
        return error

    def _note_truncated(self, lsn: int) -> None:
        self._truncated_seen = max(self._truncated_seen, lsn)
        self._latest_seen = max(self._latest_seen, lsn)

    def _note_latest(self, lsn: int) -> None:
        self._latest_seen = max(self._latest_seen, lsn)
