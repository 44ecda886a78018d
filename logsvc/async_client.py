"""The async `Client`: its operations, the lanes that keep an append's retries within the
shard's dedupe window, and the routing of each call to the shard's leader with bounded
retries (`_Targets`: where the next attempt goes). Opened by `logsvc.client.connect`; its
connections are logsvc/client_connection.py, its errors logsvc/client_errors.py.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator, Sequence

from logsvc.client_connection import ClientOptions, _Connection, _Waiters
from logsvc.client_errors import _RETRYABLE, TooManyInFlight, Unavailable, UnknownShard, _error
from logsvc.wire import messages as wire


class _Lanes:
    """Hands out (client id, seq) so that the seqs of one id in flight always lie within
    `window` consecutive seqs: a seq is handed out only while it is less than `window` past
    the lowest seq of its id not yet released. (Bounding only the count in flight is not
    enough: while one append is stuck in retries after a leader change, the others of its id
    complete and new seqs follow them, and once `window` newer seqs are accepted the shard
    forgets below them and answers the stuck retry DUPLICATE_UNKNOWN.)

    Lanes with room are kept on a stack (`_spare`), so taking one is O(1) and never waits
    while one has room; past `lanes_max` lanes x `window`, `acquire` waits (bounded) for a
    release."""

    def __init__(self, client_id: str, window: int, lanes_max: int, wait_s_max: float) -> None:
        assert window >= 1
        assert lanes_max >= 1
        self._wait_s_max = wait_s_max
        self._client_id = client_id
        self._window = window
        self._lanes_max = lanes_max
        self._base: list[int] = []  # per lane: the lowest seq not yet released
        self._done: list[int] = []  # per lane: bit i = seq base + i released already
        self._next_seq: list[int] = []
        self._spare: list[int] = []  # lanes whose next seq is within the window
        self._is_spare: list[bool] = []
        self._waiters = _Waiters()

    async def acquire(self) -> tuple[int, str, int]:
        taken = self.take_nowait()
        if taken is not None:
            return taken
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s_max
        while True:
            try:
                await self._waiters.wait(loop, deadline)
            except TimeoutError:
                raise TooManyInFlight(
                    f"{self._lanes_max} lanes x {self._window} appends in flight"
                ) from None
            taken = self.take_nowait()
            if taken is not None:
                return taken

    def release(self, lane: int, seq: int) -> None:
        base = self._base[lane]
        offset = seq - base
        assert 0 <= offset < self._window
        done = self._done[lane] | (1 << offset)
        while done & 1:
            done >>= 1
            base += 1
        self._done[lane] = done
        self._base[lane] = base
        if not self._is_spare[lane] and self._next_seq[lane] - base < self._window:
            self._is_spare[lane] = True
            self._spare.append(lane)
        self._waiters.wake_one()

    def take_nowait(self) -> tuple[int, str, int] | None:
        """(lane, client id, seq) at once, or None when every lane is full."""
        if self._spare:
            lane = self._spare[-1]
        elif len(self._base) < self._lanes_max:
            lane = len(self._base)
            self._base.append(1)
            self._done.append(0)
            self._next_seq.append(1)
            self._is_spare.append(True)
            self._spare.append(lane)
        else:
            return None
        seq = self._next_seq[lane]
        self._next_seq[lane] = seq + 1
        if seq + 1 - self._base[lane] >= self._window:
            self._spare.pop()
            self._is_spare[lane] = False
        return lane, f"{self._client_id}.{lane}", seq


class Client:
    def __init__(
        self, addresses: Sequence[str], token: str, options: ClientOptions, client_id: str
    ) -> None:
        assert addresses, "at least one node address"
        self._addresses = list(addresses)
        self._token = token
        self._options = options
        self.client_id = client_id
        self._lanes = _Lanes(
            client_id, options.dedupe_window, options.lanes_max, options.request_timeout_s
        )
        self._connections: dict[str, _Connection] = {}
        self._leaders: dict[int, str] = {}
        self._closed = False

    # ------------------------------------------------------------------ operations

    async def append(self, shard: int, payloads: Sequence[bytes], *, epoch: int = 0) -> list[int]:
        """Append records atomically as one batch; return their LSNs (consecutive)."""
        lanes = self._lanes
        taken = lanes.take_nowait()  # the usual case: no coroutine for the acquisition
        lane, lane_id, seq = taken if taken is not None else await lanes.acquire()
        try:
            request = wire.Append(shard, tuple(payloads), lane_id, seq, epoch)
            answer = await self._leader_call(shard, request)
        finally:
            self._lanes.release(lane, seq)
        assert isinstance(answer, wire.Appended), answer
        return list(range(answer.first_lsn, answer.first_lsn + answer.count))

    async def read(self, shard: int, lsn: int, max_bytes: int) -> wire.Records:
        """Committed records from `lsn`. Any replica may answer: one that is catching up
        returns a shorter prefix (never other data). `tail` reads through the leader."""
        answer = await self._any_call(shard, wire.Read(shard, lsn, max_bytes))
        assert isinstance(answer, wire.Records), answer
        return answer

    async def tail(self, shard: int, lsn: int, max_bytes: int, wait_ms: int) -> wire.Records:
        answer = await self._leader_call(shard, wire.Tail(shard, lsn, max_bytes, wait_ms))
        assert isinstance(answer, wire.Records), answer
        return answer

    async def truncate(self, shard: int, lsn: int, *, epoch: int = 0) -> int:
        """Discard every LSN below `lsn`; return the first retained LSN. Fenced like an
        append: `StaleEpoch` when `epoch` is below the shard's lease epoch."""
        answer = await self._leader_call(shard, wire.Truncate(shard, lsn, epoch))
        assert isinstance(answer, wire.TruncatedTo), answer
        return answer.first_lsn

    async def acquire_lease(self, shard: int, holder: str, epoch: int) -> wire.LeaseGranted:
        answer = await self._leader_call(shard, wire.AcquireLease(shard, holder, epoch))
        assert isinstance(answer, wire.LeaseGranted), answer
        return answer

    async def status(self, shard: int) -> wire.ShardStatus:
        """One node's answer (the known leader's if it answers, else any node's):
        `is_leader` true only if it is the leader's, confirmed by a barrier; otherwise that
        node's own, possibly stale, view. `leader_status` insists on the leader's."""
        answer = await self._leader_call(shard, wire.Status(shard), require_leader=False)
        assert isinstance(answer, wire.ShardStatus), answer
        return answer

    async def leader_status(self, shard: int) -> wire.ShardStatus:
        """The shard's status as its leader answers it after a barrier through the log
        (`is_leader` true: the leader a majority follows, its term, every committed LSN
        applied). A follower's answer is followed to the leader it names; bounded retries
        (as every call); `Unavailable` if no leader confirmed itself."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.retry_s_max
        delay = self._options.backoff_s_first
        targets = _Targets(self._addresses)
        last: object = None
        unhosted: set[str] = set()
        address = ""
        for _ in range(self._options.attempts_max):
            address = targets.next(self._leaders.get(shard), address)
            try:
                outcome = await self._call(address, wire.Status(shard))
            except (OSError, ConnectionError, TimeoutError) as exc:
                outcome = exc
            if isinstance(outcome, wire.ShardStatus):
                if outcome.is_leader:
                    self._leaders[shard] = address
                    return outcome
                last = f"{address} is not the leader (it names {outcome.leader})"
                hint = outcome.leader
                if hint and hint != address and self._leaders.get(shard) != hint:
                    self._leaders[shard] = hint
                    continue  # follow a new hint at once (a stale one gets the back-off)
                self._leaders.pop(shard, None)
            elif isinstance(outcome, wire.ErrorResponse):
                if outcome.code not in _RETRYABLE:
                    raise _error(outcome)
                self._check_hosted(shard, address, outcome, unhosted)
                last = _error(outcome)
                self._leaders.pop(shard, None)
            else:
                last = outcome
                self._leaders.pop(shard, None)
            if loop.time() > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._options.backoff_s_max)
        raise Unavailable(f"shard {shard}: no leader confirmed itself after retries: {last}")

    async def close(self) -> None:
        """Close every connection; calls still running fail, and no retry reconnects."""
        self._closed = True
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            await connection.close()

    # ------------------------------------------------------------------ routing

    async def _leader_call(
        self, shard: int, request: object, *, require_leader: bool = True
    ) -> object:
        """Send to the shard's leader, following NOT_LEADER hints, retrying the same request
        (bounded) on retryable answers and lost connections."""
        address = self._leaders.get(shard)
        if address is not None:
            connection = self._connections.get(address)
            if connection is not None and connection.ready and not connection.broken:
                # The usual case: the leader is known and its connection open. Its outcome,
                # unless it is an answer, goes through the retry loop as its first attempt.
                try:
                    answer = await connection.call(request)
                except (OSError, ConnectionError, TimeoutError) as exc:
                    return await self._retrying(shard, request, require_leader, (address, exc))
                if type(answer) is not wire.ErrorResponse:
                    return answer
                return await self._retrying(shard, request, require_leader, (address, answer))
        return await self._retrying(shard, request, require_leader, None)

    async def _retrying(
        self,
        shard: int,
        request: object,
        require_leader: bool,
        first: tuple[str, object] | None,
    ) -> object:
        """`_leader_call`'s loop; `first`: the address and outcome (answer or exception) of
        an attempt already made, which counts as this loop's first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.retry_s_max
        delay = self._options.backoff_s_first
        last: BaseException | None = None
        targets = _Targets(self._addresses)
        unhosted: set[str] = set()
        address = ""
        for _ in range(self._options.attempts_max):
            if first is not None:
                (address, outcome), first = first, None
            else:
                if loop.time() > deadline:
                    break
                address = targets.next(self._leaders.get(shard), address)
                try:
                    outcome = await self._call(address, request)
                except (OSError, ConnectionError, TimeoutError) as exc:
                    outcome = exc
            if isinstance(outcome, (OSError, ConnectionError, TimeoutError)):
                last = outcome
                self._leaders.pop(shard, None)
            elif not isinstance(outcome, wire.ErrorResponse):
                if require_leader:
                    self._leaders[shard] = address
                return outcome
            else:
                if outcome.code not in _RETRYABLE:
                    raise _error(outcome)
                self._check_hosted(shard, address, outcome, unhosted)
                last = _error(outcome)
                hint = outcome.leader_hint
                if outcome.code == wire.ErrorCode.NOT_LEADER and hint and hint != address:
                    self._leaders[shard] = hint
                    continue  # follow a new hint at once (a stale one gets the back-off)
                self._leaders.pop(shard, None)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._options.backoff_s_max)
        raise Unavailable(f"shard {shard}: no usable answer after retries: {last}") from last

    def _check_hosted(
        self, shard: int, address: str, answer: wire.ErrorResponse, unhosted: set[str]
    ) -> None:
        """Note `address`'s UNKNOWN_SHARD in `unhosted` (this call's); `UnknownShard` once
        every address has said so."""
        if answer.code != wire.ErrorCode.UNKNOWN_SHARD:
            return
        unhosted.add(address)
        if unhosted.issuperset(self._addresses):
            raise UnknownShard(shard, self._addresses)

    async def _any_call(self, shard: int, request: object) -> object:
        """Committed reads: any replica may answer; prefer the leader we know."""
        return await self._leader_call(shard, request, require_leader=False)

    async def _call(self, address: str, request: object) -> object:
        if self._closed:
            raise Unavailable("the client is closed")
        connection = self._connections.get(address)
        if connection is not None and connection.ready and not connection.broken:
            return await connection.call(request)  # the usual case: open and authenticated
        if connection is None or connection.broken:
            if connection is not None:
                await connection.close()
            connection = _Connection(address, self._token, self._options)
            self._connections[address] = connection
        await connection.ensure_open()
        return await connection.call(request)


class _Targets:
    """Where a call's attempts go: the shard's leader while one is known, else the
    addresses in turn, the round starting after the address that just failed (timed out,
    lost its connection, or was no leader): a stale leader cut off from its shard holds a
    request until the request timeout, and a round starting at `addresses[0]` again asked
    it first once more (chaos C4: every retry paid a timeout there)."""

    __slots__ = ("_addresses", "_round")

    def __init__(self, addresses: Sequence[str]) -> None:
        self._addresses = addresses
        self._round: Iterator[str] | None = None

    def next(self, leader: str | None, failed: str) -> str:
        if leader is not None:
            return leader
        if self._round is None:
            addresses = self._addresses
            if failed in addresses:
                at = addresses.index(failed) + 1
                addresses = [*addresses[at:], *addresses[:at]]
            self._round = itertools.cycle(addresses)
        return next(self._round)
