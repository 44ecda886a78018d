"""`NetworkTN`: the `TNPort` a compute node uses to reach TN daemons over the network
(engine/tn/FORMAT.md), with failover between them (issue 15, decision 0007).

    tn = NetworkTN(["127.0.0.1:7301", "127.0.0.1:7302"], token)
    cn = ComputeNode(tn, LocalDirStore(objects_dir, read_only=True))
    ...
    await cn.close(); await tn.close()

Finding the TN: the addresses are tried in order, each with a bounded connect, token and
`Status`; the first that answers as *active* is used until it fails (its connection is lost,
a request times out, or it answers NotActive, Fenced, WalFailed or "closed"). Then the
search starts again, in rounds over every address with a doubling back-off, for at most
`failover_wait_s_max` (longer than a standby's detection plus promotion). Reads (status,
logtail, checkpoints) and subscriptions that find no active TN in a round over the addresses
accept a standby that answered: its state is the WAL's, only perhaps behind.

Commits: the same `WriteSet` (same client_id and seq) is sent again after any failure that
leaves its outcome open, to the same TN or the next active one; the TN remembers recent
origins, so a commit that landed answers with its first commit_ts and one that never
reached the log runs as new (decision 0007). A typed answer (WriteConflict, DuplicateKey,
...) is final. Only when no TN answers within the bounds is the caller told so:
`OutcomeUnknown` if some attempt was sent and never answered (it may have landed: ask again
with the same write set later), `TNUnavailable` if nothing was ever sent.

Subscriptions run on a connection of their own and survive the loss of their TN: a new
subscription is made (to the active TN, or a standby), and the entries between the last one
delivered and the new subscription's start are pulled from the logtail first, so the
callback sees every entry once, in commit order, with no gap. When the TN cannot fill the
gap with entries (the compute node is behind its logtail buffer and would need a
checkpoint), `on_gap` is called, if given (the consumer must pull), else the subscription
ends with an error in the log: it never delivers past a gap.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from engine.cn.port import TNStatus
from engine.errors import EngineClosed, OutcomeUnknown, Overloaded, WalFailed
from engine.logtail import Logtail, TailEntry
from engine.tn import limits, messages
from engine.tn.channel import Channel, ChannelClosed, probe
from engine.tn.errors import BadReply, NotActive, SubscriberDropped, TNUnavailable, Unauthorized
from engine.tn.limits import ClientOptions
from engine.tn.messages import Reply, Request
from engine.writeset import WriteSet

log = logging.getLogger("engine.cn.client")

_TN_GONE = (ConnectionError, TimeoutError, OSError, BadReply, NotActive, EngineClosed, WalFailed)
"""What makes a client leave a TN and look for another: it is unreachable or went away,
sent something undecodable, is (or became) a standby, is closing, or its WAL failed (Fenced:
a newer TN took over)."""


class NetworkTN:
    def __init__(
        self, addresses: Sequence[str], token: str, options: ClientOptions | None = None
    ) -> None:
        assert addresses, "at least one TN address"
        self.addresses = list(addresses)
        self._token = token
        self._options = options or ClientOptions()
        self._channel: Channel | None = None
        self._channel_role = ""
        self._search = asyncio.Lock()
        self._follows: set[_Follow] = set()
        self._closed = False
        self.failovers = 0
        """Times a call left its TN for another (or for the same one, reconnected)."""
        self.commits_resent = 0
        """Commits sent again after an attempt whose outcome was open (lost, timed out,
        fenced): each such retry is answered by the origin table (decision 0007)."""

    # --- TNPort -------------------------------------------------------------------------------

    async def status(self) -> TNStatus:
        reply = await self._read(messages.Status())
        assert isinstance(reply, messages.StatusReply)
        return reply.status

    async def logtail(self, t0: int, t1: int) -> Logtail:
        """(t0, t1] as one `Logtail`, read a page at a time."""
        return await _pull(self._read, t0, t1)

    async def commit(self, write_set: WriteSet) -> int:
        # Encoded and checked once, here (a request that breaks a rule: BadRequest now), and
        # only framed again for each attempt.
        request = messages.encode_body(messages.Commit(write_set))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.failover_wait_s_max
        delay = self._options.backoff_s_first
        maybe_landed = False
        last: BaseException | None = None
        for attempt in range(self._options.attempts_max):
            if attempt and loop.time() > deadline:
                break
            try:
                channel = await self._active(deadline, require_active=True)
            except TNUnavailable as exc:
                last = exc
                break
            try:
                reply = await channel.call(request)
            except ChannelClosed as exc:
                last = exc
                self._forget(channel)
                continue
            except Overloaded as exc:
                last = exc
                if loop.time() + delay > deadline:
                    break
                await asyncio.sleep(delay)
                delay = min(2 * delay, self._options.backoff_s_max)
                continue
            except _TN_GONE as exc:
                last = exc
                self._forget(channel)
                if not isinstance(exc, (NotActive, EngineClosed)):
                    maybe_landed = True  # written, and no answer says what became of it
                    self.commits_resent += 1
                log.info(
                    "commit %s/%d: the TN at %s went away (%s); retrying elsewhere",
                    write_set.client_id,
                    write_set.seq,
                    channel.address,
                    exc,
                )
                continue
            assert isinstance(reply, messages.Committed)
            return reply.commit_ts
        what = f"commit {write_set.client_id}/{write_set.seq}"
        if maybe_landed:
            raise OutcomeUnknown(
                f"{what} may or may not have landed: no TN answered within "
                f"{self._options.failover_wait_s_max} s ({last}); send the same write set "
                "again to learn its outcome"
            ) from last
        if isinstance(last, Overloaded):
            raise last
        raise TNUnavailable(f"{what} was not sent: no active TN answered ({last})") from last

    async def subscribe(
        self,
        on_entry: Callable[[TailEntry], None],
        *,
        on_gap: Callable[[], None] | None = None,
    ) -> Callable[[], None]:
        """Call `on_entry` with every entry visible after now, in order (across failovers).
        Returns the unsubscribe function."""
        follow = _Follow(self, on_entry, on_gap)
        await follow.start()
        self._follows.add(follow)
        return lambda: self._unfollow(follow)

    # --- more than a TNPort ------------------------------------------------------------------

    async def checkpoints(self) -> tuple[tuple[int, str], ...]:
        """The TN's retained checkpoints, oldest first: (ckp_ts, manifest name)."""
        reply = await self._read(messages.Checkpoints())
        assert isinstance(reply, messages.CheckpointList)
        return reply.checkpoints

    @property
    def address(self) -> str | None:
        """The TN in use, if any."""
        return self._channel.address if self._channel is not None else None

    async def close(self) -> None:
        self._closed = True
        for follow in list(self._follows):
            self._unfollow(follow)
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()

    def _unfollow(self, follow: _Follow) -> None:
        self._follows.discard(follow)
        follow.stop()

    # --- finding the TN ----------------------------------------------------------------------

    async def _read(self, request: Request) -> Reply:
        """An idempotent request, retried on any TN until the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._options.failover_wait_s_max
        last: BaseException | None = None
        for _ in range(self._options.attempts_max):
            channel = await self._active(deadline, require_active=False)
            try:
                return await channel.call(request)
            except (ChannelClosed, *_TN_GONE) as exc:
                last = exc
                self._forget(channel)
            if loop.time() > deadline:
                break
        raise TNUnavailable(f"no TN answered {type(request).__name__} ({last})") from last

    async def _active(self, deadline: float, *, require_active: bool) -> Channel:
        channel = self._channel
        if self._usable(channel, require_active):
            assert channel is not None
            return channel
        async with self._search:  # one search at a time; the others use what it found
            channel = self._channel
            if self._usable(channel, require_active):
                assert channel is not None
                return channel
            if channel is not None:
                self._forget(channel)
            found, role = await _find(
                self.addresses, self._token, self._options, deadline, require_active
            )
            if self._closed:
                found.abort()
                raise TNUnavailable("the client is closed")
            self._channel, self._channel_role = found, role
            log.info("using the %s TN at %s", role, found.address)
            return found

    def _usable(self, channel: Channel | None, require_active: bool) -> bool:
        if channel is None or channel.broken:
            return False
        return self._channel_role == "active" or not require_active

    def _forget(self, channel: Channel) -> None:
        if self._channel is channel:
            self._channel = None
            self.failovers += 1
        channel.abort()


async def _find(
    addresses: Sequence[str],
    token: str,
    options: ClientOptions,
    deadline: float,
    require_active: bool,
) -> tuple[Channel, str]:
    """A channel to the first TN that answers as active; when `require_active` is False and
    a whole round found none, one that answered as a standby. `TNUnavailable` else;
    `Unauthorized` at once for a wrong token (a configuration error, not a failover)."""
    loop = asyncio.get_running_loop()
    delay = options.backoff_s_first
    last: BaseException | None = None
    standby: Channel | None = None
    try:
        for _ in range(options.attempts_max):
            for address in addresses:
                try:
                    channel, reply = await probe(address, token, options)
                except Unauthorized:
                    raise
                except (OSError, TimeoutError, ConnectionError, BadReply) as exc:
                    last = exc
                    continue
                if reply.status.role == "active":
                    return channel, "active"
                last = NotActive(f"{address} is a {reply.status.role}")
                if standby is None:
                    standby = channel
                else:
                    channel.abort()
            if standby is not None and not require_active:
                break  # a read: a standby serves the WAL's state, only perhaps behind
            if loop.time() + delay > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(2 * delay, options.backoff_s_max)
        if standby is not None and not require_active:
            found, standby = standby, None
            return found, "standby"
    finally:
        if standby is not None:
            standby.abort()
    raise TNUnavailable(
        f"no {'active ' if require_active else ''}TN among {', '.join(addresses)} within "
        f"{options.failover_wait_s_max} s (last: {last})"
    ) from last


async def _pull(call: Callable[[Request], object], t0: int, t1: int) -> Logtail:
    """(t0, t1] from `call` (a coroutine function sending one request), a page at a time,
    checked: every page continues the one before it."""
    checkpoint: str | None = None
    checkpoint_ts = 0
    entries: list[TailEntry] = []
    at = t0
    for _ in range(limits.LOGTAIL_PAGES_MAX):
        reply = await call(messages.PullLogtail(at, t1))  # type: ignore[misc]
        assert isinstance(reply, messages.LogtailPage)
        tail = reply.logtail
        if tail.checkpoint is not None:
            # The TN no longer holds what follows `at`: the state is the checkpoint's.
            checkpoint, checkpoint_ts, entries = tail.checkpoint, tail.checkpoint_ts, []
        elif tail.entries and tail.entries[0].commit_ts <= at:
            raise BadReply(f"a logtail page from {at} holds {tail.entries[0].commit_ts}")
        entries.extend(tail.entries)
        if not reply.more:
            return Logtail(checkpoint, checkpoint_ts, tuple(entries), tail.upto_ts)
        if tail.upto_ts <= at:
            raise BadReply(f"a logtail page from {at} ends at {tail.upto_ts}: no progress")
        at = tail.upto_ts
    raise BadReply(f"the logtail from {t0} to {t1} took more than {limits.LOGTAIL_PAGES_MAX} pages")


class _Follow:
    """One subscription, kept alive across connections and TNs (see the module docstring)."""

    def __init__(
        self,
        tn: NetworkTN,
        on_entry: Callable[[TailEntry], None],
        on_gap: Callable[[], None] | None,
    ) -> None:
        self._tn = tn
        self._on_entry = on_entry
        self._on_gap = on_gap
        self.last_ts: int | None = None
        """The newest commit_ts delivered (or the first subscription's from_ts)."""
        self._channel: Channel | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.resubscriptions = 0

    async def start(self) -> None:
        """Make the first subscription (bounded by the client's failover wait), then keep
        it going in a task."""
        loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()
        self._task = loop.create_task(self._run(started))
        await started

    def stop(self) -> None:
        self._stopped = True
        if self._channel is not None:
            self._channel.abort()
        if self._task is not None:
            self._task.cancel()

    def _deliver(self, entries: Sequence[TailEntry]) -> None:
        for entry in entries:
            if self.last_ts is None or entry.commit_ts > self.last_ts:
                self._on_entry(entry)
                self.last_ts = entry.commit_ts

    async def _run(self, started: asyncio.Future[None]) -> None:
        options = self._tn._options
        delay = options.backoff_s_first
        try:
            while not self._stopped:
                try:
                    ended = await self._subscribe_once(started)
                    delay = options.backoff_s_first
                except _GapError:
                    raise
                except Exception as exc:  # no TN, a refusal, a lost connection...
                    if not started.done():
                        started.set_exception(exc)
                        return
                    ended = exc  # ...later: subscribe again (paced by the back-off)
                if self._stopped:
                    return
                self.resubscriptions += 1
                log.info("subscription ended (%s); subscribing again", ended)
                await asyncio.sleep(delay)
                delay = min(2 * delay, options.backoff_s_max)
        except _GapError as exc:
            log.error("subscription stopped: %s", exc)
        finally:
            if not started.done():
                started.set_exception(TNUnavailable("the subscription was stopped"))
            if self._channel is not None:
                self._channel.abort()

    async def _subscribe_once(self, started: asyncio.Future[None]) -> BaseException:
        """One subscription on one connection: until it ends, return why."""
        tn = self._tn
        options = tn._options
        loop = asyncio.get_running_loop()
        deadline = loop.time() + options.failover_wait_s_max
        channel, _role = await _find(tn.addresses, tn._token, options, deadline, False)
        self._channel = channel
        ended: asyncio.Future[BaseException] = loop.create_future()
        held: list[TailEntry] = []
        live = False

        def on_push(entries: tuple[TailEntry, ...]) -> None:
            if live:
                self._deliver(entries)
            elif len(held) + len(entries) > limits.PUSHES_HELD_MAX:
                if not ended.done():
                    ended.set_result(SubscriberDropped(limits.PUSHES_HELD_MAX))
                channel.abort()
            else:
                held.extend(entries)

        def on_end(exc: BaseException) -> None:
            if not ended.done():
                ended.set_result(exc)

        try:
            from_ts = await channel.subscribe(on_push, on_end)
            if self.last_ts is None:
                self.last_ts = from_ts
            elif from_ts > self.last_ts:
                await self._fill(channel, self.last_ts, from_ts)
            live = True
            self._deliver(held)
            held.clear()
            if not started.done():
                started.set_result(None)
            return await ended
        finally:
            channel.abort()
            self._channel = None

    async def _fill(self, channel: Channel, t0: int, t1: int) -> None:
        """Deliver (t0, t1] from the logtail, before the pushes that follow t1."""

        async def call(request: Request) -> Reply:
            return await channel.call(request)

        tail = await _pull(call, t0, t1)
        if tail.checkpoint is not None:
            if self._on_gap is None:
                raise _GapError(
                    f"entries after {t0} are no longer in the TN's logtail (it answers with "
                    f"checkpoint {tail.checkpoint}); pull instead of following"
                )
            log.warning("entries after %d must be pulled (checkpoint %s)", t0, tail.checkpoint)
            self._on_gap()
            self.last_ts = t1
            return
        self._deliver(tail.entries)


class _GapError(Exception):
    """A subscription cannot go on without skipping entries."""
