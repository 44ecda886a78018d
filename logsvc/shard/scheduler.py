"""One Raft scheduler per node: every hosted replica's ticks, timers and socket events on a
fixed number of worker threads, however many shards the node hosts.

pysyncobj gives each SyncObj its own poller and expects a thread to call `doTick` in a
loop (our RaftNode did, one thread per replica, plus a syncer thread per store: two threads
and ~3 ms of CPU a second per idle replica). Here instead (docs/decisions/0005-...):

* Each replica is assigned to one worker for its whole life. The worker owns an epoll
  instance; the replica's poller (`ShardPoller`, handed to pysyncobj as its poller)
  registers the replica's sockets there. Everything of a replica (its ticks, its socket
  callbacks, its store syncs) runs on its worker's thread, one tick at a time, so pysyncobj
  and the store see exactly the single-threaded use they had with a thread of their own.
* A worker sleeps in `epoll.poll` until the earliest of: a socket event of one of its
  replicas, the deadline a replica's last tick asked for (`Tickable.tick` returns it: its
  next heartbeat, election timeout, reconnect, quiescence check; None for a quiet replica,
  which needs no timer at all), or a wake-up from another thread (a proposal:
  `wake(node)`). Then it ticks each replica that has something to do, once.
* Node liveness (logsvc/shard/liveness.py), on the first worker: every heartbeat interval,
  each peer node that was sent nothing gets an `alive` message carried by one replica with
  a connection to it (`carrier` ticks, which sends it); a node that lapses wakes the
  replicas it concerns (following a leader there, or leading without a live majority), a
  node that comes back every replica with a member on it; and a lapsed node's replicas are
  woken one at a time per reconnect interval, so a quiet node still redials a peer that
  restarts.

* Syncs nobody's reply waits on (a leader's own appends: pysyncobj's AppendEntries to the
  followers already left) run on the worker's syncer thread (`sync_later`), so the worker
  goes on receiving the followers' acknowledgements meanwhile: a leader's entry commits as
  soon as a majority holds it durably, which need not include the leader
  (logsvc/shard/raft/adapter.py counts the leader only up to its durable index). A sync
  that a held reply waits on (a follower's acknowledgement, a vote) stays on the worker, in
  the tick: handing it over would add a thread hop before the reply. Except over the node
  journal (`[node] journal = "node"`), where one journal sync covers every replica's
  appends: a replica ticked while others of the same round are still to be ticked defers
  that sync and its held replies to the end of the round (`defer_to_round_end`), so one
  fdatasync, by the round's last replica, answers them all.

Threads per node: `workers` (`WORKERS_DEFAULT`, 4; the config's `[raft] threads`), and
one syncer per worker (asleep on a condition, no timer, while nothing is asked of it),
independent of the shard count. Every queue is bounded by the number of hosted replicas (a
replica is in a worker's runnable set at most once; timers are one per replica, stale
entries dropped as they surface).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from logsvc.shard.liveness import NodeLiveness

log = logging.getLogger("logsvc.scheduler")

# pysyncobj's poller event bits (pysyncobj.poller.POLL_EVENT_TYPE; raft/patches.py asserts they
# match at import).
POLL_READ = 1
POLL_WRITE = 2
POLL_ERROR = 4

WORKERS_DEFAULT = 4
WORKERS_MAX = 64
# The longest a worker sleeps with no timer due (it rechecks its stop flag).
IDLE_WAIT_S_MAX = 1.0
# How long `remove` waits for the worker to let go of a replica.
REMOVE_WAIT_S_MAX = 30.0
# Follow-up ticks of one replica in a row before the worker looks at its others again.
EVENTS_PER_POLL_MAX = 1024


class Tickable(Protocol):
    """What the scheduler drives: one shard replica's Raft (logsvc/shard/raft/node.py)."""

    label: str

    def tick(self) -> float | None:
        """One tick on the worker thread; the next deadline (monotonic seconds) at which
        it must tick again with no event, or None for none."""

    def peer_nodes(self) -> frozenset[str]:
        """The nodes (not addresses) of the replica's peers."""

    def connected_to(self, node: str) -> bool:
        """Whether its Raft connection to its peer on `node` is up."""

    @property
    def leader(self) -> str | None:
        """The Raft address of the leader it follows or is (None: none known)."""

    @property
    def is_leader(self) -> bool:
        """Whether it leads its shard."""


@dataclass(slots=True)
class _Entry:
    """A replica as its worker knows it."""

    node: Tickable
    poller: ShardPoller
    deadline_s: float | None = None
    removed: bool = False


class ShardPoller:
    """pysyncobj's `Poller` interface (subscribe, unsubscribe, poll) for one replica, over
    its worker's epoll. Sockets subscribed before the replica is added (its listening
    socket, bound while pysyncobj constructs) are registered when it is; `poll` (called
    by pysyncobj at the end of every tick) delivers the events the worker collected."""

    def __init__(self, worker: _Worker) -> None:
        self._worker = worker
        self._callbacks: dict[int, tuple[Callable[[int, int], None], int]] = {}
        self._pending: dict[int, int] = {}
        self.attached = False
        self.owner: Tickable | None = None  # set while its replica is added

    # pysyncobj's Poller API (names are theirs) ------------------------------------------

    def subscribe(self, descr: int, callback: Callable[[int, int], None], eventMask: int) -> None:
        self._callbacks[descr] = (callback, eventMask)
        if self.attached:
            self._worker.register(descr, self, eventMask)

    def unsubscribe(self, descr: int) -> None:
        self._callbacks.pop(descr, None)
        self._pending.pop(descr, None)
        self._worker.unregister(descr, self)

    def poll(self, timeout: float) -> None:
        """Deliver the events collected for this replica; never waits (its worker does)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        for descr, events in pending.items():
            found = self._callbacks.get(descr)
            if found is not None:
                found[0](descr, events)

    # ours -----------------------------------------------------------------------------------

    def attach(self) -> None:
        self.attached = True
        for descr, (_, mask) in list(self._callbacks.items()):
            self._worker.register(descr, self, mask)

    def detach(self) -> None:
        self.attached = False
        for descr in list(self._callbacks):
            self._worker.unregister(descr, self)

    def add_event(self, descr: int, events: int) -> None:
        self._pending[descr] = self._pending.get(descr, 0) | events


def _epoll_mask(events: int) -> int:
    mask = 0
    if events & POLL_READ:
        mask |= select.EPOLLIN
    if events & POLL_WRITE:
        mask |= select.EPOLLOUT
    return mask  # EPOLLERR and EPOLLHUP are always reported


def _poll_events(mask: int) -> int:
    events = 0
    if mask & (select.EPOLLIN | select.EPOLLPRI):
        events |= POLL_READ
    if mask & select.EPOLLOUT:
        events |= POLL_WRITE
    if mask & (select.EPOLLERR | select.EPOLLHUP):
        events |= POLL_ERROR
    return events


@dataclass(slots=True)
class _Requests:
    """What other threads ask of a worker; taken as a whole under the lock."""

    wakes: dict[Tickable, None] = field(default_factory=dict)
    adds: list[_Entry] = field(default_factory=list)
    removes: list[tuple[Tickable, Callable[[], None] | None, threading.Event]] = field(
        default_factory=list
    )
    stop: bool = False


class _Syncer:
    """A worker's syncer thread: runs the syncs its replicas hand it (`request`), each
    replica's at most once at a time, then wakes the replica when the sync says its next
    tick has something to act on (what became durable may commit, or it failed). The
    pending set is bounded by the worker's replicas (one entry each); idle, the thread
    waits on its condition with no timer."""

    def __init__(self, worker: _Worker) -> None:
        self._worker = worker
        self._cv = threading.Condition(threading.Lock())
        self._pending: dict[Tickable, Callable[[], bool]] = {}
        self._stopping = False
        self.thread: threading.Thread | None = None

    def request(self, node: Tickable, sync: Callable[[], bool]) -> None:
        """Run `sync()` (which must not raise) on the syncer thread soon, then wake `node`
        if it returned True."""
        with self._cv:
            if self._stopping:
                return
            self._pending[node] = sync
            if self.thread is None:  # started on first use: a node that never leads needs none
                self.thread = threading.Thread(
                    target=self._run, name=f"raft-syncer-{self._worker.number}", daemon=True
                )
                self.thread.start()
            self._cv.notify()

    def forget(self, node: Tickable) -> None:
        with self._cv:
            self._pending.pop(node, None)

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._pending.clear()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                pending, self._pending = self._pending, {}
            for node, sync in pending.items():
                try:
                    wake = sync()
                except Exception:  # the replica's own errors are kept by `sync`: a bug
                    log.exception("background sync of %s failed", node.label)
                    wake = True
                if not wake:
                    continue
                with self._cv:  # not once stopped: the worker closes its wake-up descriptor
                    if self._stopping:
                        return
                    self._worker.wake(node)


class _Worker:
    def __init__(self, scheduler: RaftScheduler, number: int) -> None:
        self._scheduler = scheduler
        self.number = number
        self._epoll = select.epoll()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake_fd, select.EPOLLIN)
        self._fd_lock = threading.Lock()
        self._fd_owner: dict[int, ShardPoller] = {}
        self._lock = threading.Lock()
        self._requests = _Requests()
        self._signalled = False
        self._entries: dict[Tickable, _Entry] = {}
        self._timers: list[tuple[float, int, Tickable]] = []
        self._timer_seq = itertools.count()
        self._runnable: dict[Tickable, None] = {}
        self.replicas = 0  # assigned (for balancing)
        self.syncer = _Syncer(self)
        self._round_left = 0  # replicas of the current round not ticked yet
        self._round_end: dict[Tickable, Callable[[], None]] = {}
        self.thread = threading.Thread(target=self._run, name=f"raft-worker-{number}", daemon=True)

    # ------------------------------------------------------------------ sockets

    def register(self, descr: int, poller: ShardPoller, events: int) -> None:
        mask = _epoll_mask(events)
        with self._fd_lock:
            known = descr in self._fd_owner
            self._fd_owner[descr] = poller
            try:
                if known:
                    self._epoll.modify(descr, mask)
                else:
                    self._epoll.register(descr, mask)
            except FileNotFoundError:
                # The descriptor was closed and reused by a new socket before its old owner
                # unsubscribed (a closed socket leaves epoll by itself).
                self._epoll.register(descr, mask)
            except FileExistsError:
                self._epoll.modify(descr, mask)

    def unregister(self, descr: int, poller: ShardPoller) -> None:
        with self._fd_lock:
            if self._fd_owner.get(descr) is not poller:
                return  # already reused by another replica's socket
            del self._fd_owner[descr]
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(descr)

    # ------------------------------------------------------------------ from other threads

    def _signal(self) -> None:
        if not self._signalled:
            self._signalled = True
            os.eventfd_write(self._wake_fd, 1)

    def wake(self, node: Tickable) -> None:
        if threading.current_thread() is self.thread:
            if node in self._entries:
                self._runnable[node] = None
            return
        with self._lock:
            self._requests.wakes[node] = None
            self._signal()

    def add(self, entry: _Entry) -> None:
        with self._lock:
            self._requests.adds.append(entry)
            self._signal()

    def remove(self, node: Tickable, then: Callable[[], None] | None) -> None:
        done = threading.Event()
        if threading.current_thread() is self.thread:
            self._drop(node, then)
            return
        with self._lock:
            self._requests.removes.append((node, then, done))
            self._signal()
        if not done.wait(REMOVE_WAIT_S_MAX):
            log.error("worker %d did not let go of %s in time", self.number, node.label)

    def stop(self) -> None:
        with self._lock:
            self._requests.stop = True
            self._signal()

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        while True:
            timeout = 0.0 if self._runnable else self._wait_s()
            try:
                ready = self._epoll.poll(timeout, EVENTS_PER_POLL_MAX)
            except InterruptedError:
                ready = []
            for descr, mask in ready:
                if descr == self._wake_fd:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake_fd)
                    continue
                poller = self._fd_owner.get(descr)
                if poller is None:
                    continue
                poller.add_event(descr, _poll_events(mask))
                if poller.owner is not None:
                    self._runnable[poller.owner] = None
            if self._take_requests():
                break
            now_s = self._scheduler.clock()
            self._expire(now_s)
            if self.number == 0:
                self._scheduler.duties(now_s)
            runnable, self._runnable = self._runnable, {}
            self._round_left = len(runnable)
            for node in runnable:
                self._round_left -= 1
                self._tick(node)
            if self._round_end:
                self._finish_round()
        self._close()

    def defer_to_round_end(self, node: Tickable, finish: Callable[[], None]) -> bool:
        """From `node`'s tick: run `finish()` once this round's other replicas are ticked;
        False (nothing deferred) when `node` is the round's last."""
        assert threading.current_thread() is self.thread
        if self._round_left == 0:
            return False
        self._round_end[node] = finish
        return True

    def _finish_round(self) -> None:
        pending, self._round_end = self._round_end, {}
        for node, finish in pending.items():
            if node not in self._entries:
                continue  # removed during the round
            try:
                finish()
            except Exception:  # the replica's own errors are handled inside: a bug
                log.exception("end of round of %s failed", node.label)

    def _wait_s(self) -> float:
        due_s = float("inf")
        timers = self._timers
        while timers:
            deadline_s, _, node = timers[0]
            entry = self._entries.get(node)
            if entry is None or entry.deadline_s != deadline_s:
                heapq.heappop(timers)  # stale: the replica asked for another deadline
                continue
            due_s = deadline_s
            break
        if self.number == 0:
            due_s = min(due_s, self._scheduler.duties_due_s)
        return min(IDLE_WAIT_S_MAX, max(0.0, due_s - self._scheduler.clock()))

    def _expire(self, now_s: float) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now_s:
            deadline_s, _, node = heapq.heappop(timers)
            entry = self._entries.get(node)
            if entry is not None and entry.deadline_s == deadline_s:
                entry.deadline_s = None
                self._runnable[node] = None

    def _tick(self, node: Tickable) -> None:
        entry = self._entries.get(node)
        if entry is None:
            return
        try:
            deadline_s = node.tick()
        except Exception:  # the replica's own errors are handled inside tick(): a bug
            log.exception("tick of %s failed", node.label)
            deadline_s = None
        entry.deadline_s = deadline_s
        if deadline_s is not None:
            heapq.heappush(self._timers, (deadline_s, next(self._timer_seq), node))

    def _take_requests(self) -> bool:
        """Apply what other threads asked; True when the worker must stop."""
        if not self._signalled:
            # Nothing was asked since the last look (a request sets the flag under the lock
            # and wakes the epoll; one that lands just after this read is seen next turn).
            return False
        with self._lock:
            requests, self._requests = self._requests, _Requests()
            self._signalled = False
        for entry in requests.adds:
            self._entries[entry.node] = entry
            entry.poller.owner = entry.node
            entry.poller.attach()
            self._runnable[entry.node] = None
        for node in requests.wakes:
            if node in self._entries:
                self._runnable[node] = None
        for node, then, done in requests.removes:
            try:
                self._drop(node, then)
            finally:
                done.set()
        return requests.stop

    def _drop(self, node: Tickable, then: Callable[[], None] | None) -> None:
        entry = self._entries.pop(node, None)
        self._runnable.pop(node, None)
        self.syncer.forget(node)  # a sync already running finishes; its wake is ignored
        if entry is not None:
            entry.poller.owner = None
            entry.removed = True
        try:
            if then is not None:
                then()  # e.g. destroy the replica's transport: on this thread, safely
        except Exception:
            log.exception("while removing %s", node.label)
        finally:
            if entry is not None:
                entry.poller.detach()
                self._scheduler.forget(node)

    def _close(self) -> None:
        self.syncer.stop()
        for node in list(self._entries):
            self._drop(node, None)
        with contextlib.suppress(OSError):
            self._epoll.close()
        with contextlib.suppress(OSError):
            os.close(self._wake_fd)


class RaftScheduler:
    """Create one per node, `add` each replica once its SyncObj exists (its poller from
    `new_poller`, made before), `wake` it when something is proposed, `remove` it to stop
    ticking it, `close` at the end."""

    def __init__(
        self,
        liveness: NodeLiveness,
        node_of: Callable[[str], str],
        *,
        workers: int = WORKERS_DEFAULT,
        reconnect_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`node_of` maps a replica's Raft address to its node's id (all shards of a node
        share one liveness entry). `clock`: the one the replicas' deadlines are on
        (raft.monotonic_s, which is not `time.monotonic`)."""
        assert 1 <= workers <= WORKERS_MAX
        self.liveness = liveness
        self.node_of = node_of
        self.clock = clock
        self._reconnect_s = reconnect_s
        self._workers = [_Worker(self, number) for number in range(workers)]
        self._lock = threading.Lock()
        self._worker_of: dict[Tickable, _Worker] = {}
        self._by_peer_node: dict[str, dict[Tickable, None]] = {}
        self._carriers: dict[str, Tickable] = {}
        self._redial_next_s: dict[str, float] = {}
        self._redial_cursor: dict[str, int] = {}
        self.duties_due_s = clock()
        self._started = False
        self._closed = False

    def start(self) -> None:
        assert not self._started
        self._started = True
        for worker in self._workers:
            worker.thread.start()

    @property
    def threads(self) -> int:
        return len(self._workers)

    # ------------------------------------------------------------------ replicas

    def new_poller(self) -> ShardPoller:
        """A poller for a replica about to be built, on the least loaded worker."""
        with self._lock:
            worker = min(self._workers, key=lambda w: (w.replicas, w.number))
            worker.replicas += 1
        return ShardPoller(worker)

    def add(self, node: Tickable, poller: ShardPoller) -> None:
        worker = poller._worker
        with self._lock:
            self._worker_of[node] = worker
        self.update_peers(node)
        worker.add(_Entry(node, poller))

    def remove(self, node: Tickable, then: Callable[[], None] | None = None) -> None:
        """Stop ticking `node`; `then` runs on its worker once it is let go. Blocks until
        done (bounded)."""
        with self._lock:
            worker = self._worker_of.get(node)
        if worker is None or self._closed:
            if then is not None:
                then()
            return
        worker.remove(node, then)

    def release_poller(self, poller: ShardPoller) -> None:
        """A poller whose replica was never added (it failed to build)."""
        with self._lock:
            poller._worker.replicas -= 1

    def forget(self, node: Tickable) -> None:
        with self._lock:
            worker = self._worker_of.pop(node, None)
            if worker is not None:
                worker.replicas -= 1
            for members in self._by_peer_node.values():
                members.pop(node, None)
            for peer, carrier in list(self._carriers.items()):
                if carrier is node:
                    del self._carriers[peer]

    def thread_of(self, node: Tickable) -> threading.Thread | None:
        worker = self._worker_of.get(node)
        return None if worker is None else worker.thread

    def wake(self, node: Tickable) -> None:
        """Tick `node` soon (any thread)."""
        worker = self._worker_of.get(node)
        if worker is not None:
            worker.wake(node)

    def sync_later(self, node: Tickable, sync: Callable[[], bool]) -> None:
        """Run `sync()` on `node`'s worker's syncer thread, then wake `node` if it returns
        True (from its tick). `sync` must not raise: it keeps its error for the replica's
        next tick (and returns True)."""
        worker = self._worker_of.get(node)
        if worker is not None:
            worker.syncer.request(node, sync)

    def defer_to_round_end(self, node: Tickable, finish: Callable[[], None]) -> bool:
        """From `node`'s tick (its worker's thread): run `finish()` on that worker after
        the current round's other replicas are ticked; False, nothing deferred, when none
        are left to tick (the caller does it now)."""
        worker = self._worker_of.get(node)
        if worker is None or threading.current_thread() is not worker.thread:
            return False
        return worker.defer_to_round_end(node, finish)

    def update_peers(self, node: Tickable) -> None:
        """`node`'s peer nodes changed (a membership change): re-index it."""
        peers = node.peer_nodes()
        with self._lock:
            for peer, members in self._by_peer_node.items():
                if peer not in peers:
                    members.pop(node, None)
            for peer in peers:
                self._by_peer_node.setdefault(peer, {})[node] = None

    def close(self) -> None:
        self._closed = True
        for worker in self._workers:
            worker.stop()
        for worker in self._workers:
            if worker.thread.is_alive():
                worker.thread.join(REMOVE_WAIT_S_MAX)
            syncer = worker.syncer.thread
            if syncer is not None and syncer.is_alive():
                # A sync in progress ends when the disk answers (the store bounds it).
                syncer.join(REMOVE_WAIT_S_MAX)

    # ------------------------------------------------------------------ node liveness

    def duties(self, now_s: float) -> None:
        """On worker 0, once per liveness interval: `alive` messages to peer nodes nothing
        was sent to, wake-ups on liveness changes, redials of lapsed nodes."""
        if now_s < self.duties_due_s:
            return
        liveness = self.liveness
        self.duties_due_s = now_s + liveness.interval_s
        with self._lock:
            by_peer = {peer: list(members) for peer, members in self._by_peer_node.items()}
        changes = liveness.check(by_peer, now_s)
        for peer in changes.lapsed:
            woken = [m for m in by_peer.get(peer, ()) if self._lapse_concerns(m, now_s)]
            log.info(
                "node %s lapsed: waking %d of its %d replicas' shards",
                peer,
                len(woken),
                len(by_peer.get(peer, ())),
            )
            self._wake_all(woken)
        for peer in changes.revived:
            members = by_peer.get(peer, [])
            log.info("node %s is back: waking its %d replicas' shards", peer, len(members))
            self._wake_all(members)
        for peer, members in by_peer.items():
            if not members:
                continue
            if liveness.lapsed(peer, now_s):
                self._redial(peer, members, now_s)
            elif liveness.send_due(peer, now_s):
                carrier = self._carrier(peer, members)
                if carrier is not None:
                    self.wake(carrier)  # its tick sends `alive` to every peer node due

    def _lapse_concerns(self, member: Tickable, now_s: float) -> bool:
        """Whether a node's lapse is news to `member`, a replica with a peer there: it
        follows a leader on a lapsed node (a quiet follower has no timer of its own to
        notice), or it leads without a live majority (a quiet leader must wake to step
        down). Any other replica has nothing to do about it: waking them all (a thousand
        per node when a node of a thousand shards dies) cost the survivors a tick each
        right when their elections were due (issue 22). Reads of another worker's
        replica: a quiet one, the one that matters, changes none of them."""
        liveness = self.liveness
        leader = member.leader
        if leader is not None and not member.is_leader:
            return liveness.lapsed(self.node_of(leader), now_s)
        if not member.is_leader:
            return False
        peers = member.peer_nodes()
        live = sum(1 for node in peers if not liveness.lapsed(node, now_s))
        return 2 * (live + 1) <= len(peers) + 1

    def _carrier(self, peer: str, members: list[Tickable]) -> Tickable | None:
        carrier = self._carriers.get(peer)
        if carrier is not None and carrier in members and carrier.connected_to(peer):
            return carrier
        for candidate in members:
            if candidate.connected_to(peer):
                self._carriers[peer] = candidate
                return candidate
        return None

    def _redial(self, peer: str, members: list[Tickable], now_s: float) -> None:
        """A lapsed node: wake one of its replicas' shards per reconnect interval, in turn,
        so that whichever side dials that peer tries again even if all are quiet."""
        if now_s < self._redial_next_s.get(peer, 0.0):
            return
        self._redial_next_s[peer] = now_s + self._reconnect_s
        cursor = self._redial_cursor.get(peer, 0)
        self._redial_cursor[peer] = cursor + 1
        self.wake(members[cursor % len(members)])

    def _wake_all(self, nodes: Iterable[Tickable]) -> None:
        for node in nodes:
            self.wake(node)
