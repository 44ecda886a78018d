"""`RaftNode`: one shard replica's Raft as the replica and the node's scheduler see it."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from logsvc import logs
from logsvc.events import ReplicaEvents
from logsvc.events import enabled as events_enabled
from logsvc.shard import membership as shard_membership
from logsvc.shard import scheduler, small_file, snapshot_file
from logsvc.shard.liveness import NodeLiveness
from logsvc.shard.progress import ProgressView, RaftProgress
from logsvc.shard.raft.adapter import ShardRaft
from logsvc.shard.raft.config import RaftConfig, RaftFatal, RaftHandler
from logsvc.shard.raft.journal import StoreJournal
from logsvc.shard.raft.patches import monotonic_s
from logsvc.shard.raft.snapshot_transfer import _make_durable
from logsvc.store import ShardStore, StoreError
from logsvc.store.fs import FileSystem, OsFileSystem

log = logging.getLogger("logsvc.raft")

# Calls run on the tick (transfers requested from other threads) waiting at once.
TICK_CALLS_MAX = 64


def _open_membership(
    config: RaftConfig,
    journal: StoreJournal,
    fs: FileSystem,
    installing: snapshot_file.SnapshotFile | None,
) -> shard_membership.ReplicaMembership:
    """The replica's members file next to its snapshot, validated against its log; made
    from the configured peers on the first start. A bad file is fatal: guessing the
    peers could start a replica in the wrong group. `installing`: a snapshot whose
    installation a crash cut short; its configuration replaces the file's, unvalidated
    (the log is about to be replaced by the snapshot's entries)."""
    path = os.path.join(os.path.dirname(config.snapshot_path), shard_membership.FILE_NAME)
    store = journal.store
    try:
        return shard_membership.ReplicaMembership.open(
            fs,
            path,
            config.self_address,
            (config.self_address, *config.peers),
            config.joining,
            store.first_index,
            journal.term_at,
            reset_to=None
            if installing is None
            else (installing.last.index, installing.last.term, installing.cluster),
        )
    except (small_file.SmallFileCorrupt, shard_membership.MembershipLost) as exc:
        raise RaftFatal(f"cannot tell the shard's members: {exc}") from exc


def _snapshot_to_finish(
    fs: FileSystem, path: str, journal: StoreJournal
) -> snapshot_file.SnapshotFile | None:
    """The snapshot file when the journal lacks its last entry: an installation cut short
    by a crash (after the snapshot was durable, before the journal held its entries; the
    members file may already name its configuration). Raft §7: the snapshot is committed
    state, so it wins. None when there is no snapshot, the journal holds it, or it does
    not load (pysyncobj's load at the first tick then stops the replica: hole 4)."""
    if not fs.exists(path):
        return None
    try:
        snapshot = snapshot_file.decode(fs.read_file(path))
    except (OSError, snapshot_file.SnapshotFileCorrupt):
        return None
    last = snapshot.last
    if journal.term_at(last.index) == last.term:
        return None
    if last.index - 1 < journal.store.first_index:
        return None  # a snapshot older than our log start: the load says what is wrong
    try:
        # Received snapshots are renamed into place unsynced (pysyncobj): durable before
        # the journal is cut to it.
        _make_durable(fs, path)
    except OSError as exc:
        raise RaftFatal(f"cannot make the snapshot {path} durable: {exc}") from exc
    return snapshot


class RaftNode:
    """One shard replica's Raft: builds the SyncObj; the node's `RaftScheduler` ticks it
    (a private one with a single worker when none is given)."""

    def __init__(
        self,
        config: RaftConfig,
        store: ShardStore,
        handler: RaftHandler,
        file_system: FileSystem | None = None,
        events: ReplicaEvents | None = None,
        transport_base: type | None = None,
        raft_scheduler: scheduler.RaftScheduler | None = None,
    ) -> None:
        """`file_system` holds the snapshot file (the store's own port; the real one by
        default). pysyncobj itself writes a received snapshot with plain file calls; we make
        it durable through `file_system` before relying on it. `events` receives term, vote
        and role changes (logsvc/events.py). `transport_base`: simulator only (see
        `TransportBase`); such a node is never `start()`ed: the simulator calls
        `tick_once`. `raft_scheduler`: the node's scheduler (its liveness table and address
        -> node map serve quiescence); None: a private one, started and closed with this
        node."""
        config.validate()
        fs = file_system if file_system is not None else OsFileSystem()
        if store.first_index > 1 and not fs.exists(config.snapshot_path):
            raise RaftFatal(
                f"the journal starts at raft index {store.first_index} but the snapshot "
                f"{config.snapshot_path} is missing: refusing to start with an empty state"
            )
        self._config = config
        self.label = config.self_address
        self._journal = StoreJournal(store, events)
        installing = _snapshot_to_finish(fs, config.snapshot_path, self._journal)
        self._membership = _open_membership(config, self._journal, fs, installing)
        self._journal.membership = self._membership
        if installing is not None:
            # Before pysyncobj sees the journal: it would start an empty one at raft
            # index 1. The snapshot itself is loaded at the first tick (snapshot_points).
            log.warning(
                "the snapshot at raft index %d is ahead of the journal [%d, %d]: "
                "finishing its installation (the journal is reset to it)",
                installing.last.index,
                store.first_index,
                store.last_index,
            )
            self._journal.install_snapshot_entries(installing.prev, installing.last)
        # The peers are the log's latest configuration, not the ones configured at first.
        started = replace(config, peers=self._membership.peers)
        self._owns_scheduler = raft_scheduler is None and transport_base is None
        if self._owns_scheduler:
            now_s = monotonic_s()
            raft_scheduler = scheduler.RaftScheduler(
                NodeLiveness(
                    config.self_address,
                    interval_s=config.heartbeat_ms / 1000.0,
                    lapse_s=config.election_timeout_ms_min / 1000.0,
                    now_s=now_s,
                ),
                str,
                workers=1,
                reconnect_s=config.connection_retry_ms / 1000.0,
                clock=monotonic_s,
            )
        self._scheduler = raft_scheduler
        self._poller = None if raft_scheduler is None else raft_scheduler.new_poller()
        try:
            self._raft = ShardRaft(
                started,
                self._journal,
                handler,
                fs,
                transport_base,
                poller=self._poller,
                liveness=None if raft_scheduler is None else raft_scheduler.liveness,
                node_of=None if raft_scheduler is None else raft_scheduler.node_of,
            )
        except BaseException:
            if raft_scheduler is not None and self._poller is not None:
                raft_scheduler.release_poller(self._poller)
            raise
        self._members_version = self._membership.version
        self._progress = RaftProgress()
        self._events = events
        self._leading = False  # as of the last tick (role changes go to the event log)
        self._started = False
        self._stopped = False
        self._fatal: BaseException | None = None
        self._fatal_listeners: list[Callable[[BaseException], None]] = []
        # Calls from other threads that must run on the tick (leader transfers), bounded.
        self._tick_calls: deque[Callable[[], None]] = deque()
        self._tick_calls_lock = threading.Lock()
        self.ticks = 0  # counted (tests and benchmarks see how often a replica ticks)
        # A sync handed to the worker's syncer thread (scheduler.sync_later): at most one at
        # a time; its error, kept for the next tick (the syncer never raises into us).
        self._sync_in_flight = False
        self._sync_error: StoreError | None = None

    def start(self) -> None:
        assert not self._started
        assert self._scheduler is not None and self._poller is not None, "simulated: tick it"
        self._started = True
        if self._owns_scheduler:
            self._scheduler.start()
        self._scheduler.add(self, self._poller)

    def stop(self) -> None:
        """Stop ticking, then close the Raft connections and the listening socket (on the
        replica's worker, so no tick runs meanwhile)."""
        if self._stopped:
            return
        self._stopped = True
        if self._scheduler is not None and self._started:
            self._scheduler.remove(self, then=self._destroy)
        else:
            self._destroy()
            if self._scheduler is not None and self._poller is not None:
                self._scheduler.release_poller(self._poller)
        if self._owns_scheduler and self._scheduler is not None and self._started:
            self._scheduler.close()

    def _destroy(self) -> None:
        with contextlib.suppress(Exception):
            self._raft.destroy()

    def on_fatal(self, listener: Callable[[BaseException], None]) -> None:
        self._fatal_listeners.append(listener)

    @property
    def fatal(self) -> BaseException | None:
        return self._fatal

    def propose(self, encoded: bytes, callback: Callable[[object, int], None]) -> None:
        """Queue one command; `callback(result, fail_reason)` runs on the tick thread once
        it is applied here (FailReason.SUCCESS) or failed."""
        self._raft.logsvc_propose(encoded, callback)
        self._wake()

    def _wake(self) -> None:
        if self._scheduler is not None:
            self._scheduler.wake(self)

    @property
    def is_leader(self) -> bool:
        return self._raft.logsvc_is_leader()

    @property
    def leader(self) -> str | None:
        return self._raft.logsvc_leader()

    @property
    def term(self) -> int:
        return int(self._raft.raftCurrentTerm)

    @property
    def commit_index(self) -> int:
        return int(self._raft.raftCommitIndex)

    @property
    def last_applied(self) -> int:
        return int(self._raft.raftLastApplied)

    @property
    def self_address(self) -> str:
        return self._config.self_address

    @property
    def quiet(self) -> bool:
        """Quiescent: no heartbeats, no election timer (quiescence.py)."""
        return bool(self._raft.logsvc_quiet)

    @property
    def learner(self) -> bool:
        """A non-voting learner (RaftConfig.learner)."""
        return self._config.learner

    def learners(self) -> dict[str, int]:
        """On the leader: each connected learner's address -> its match index (the last
        entry it holds, as it acknowledged); empty elsewhere. Any thread: a copy, retried
        if the tick changed the maps meanwhile."""
        raft = self._raft
        if not raft.logsvc_is_leader():
            return {}
        for _ in range(10):
            try:
                learners = dict(raft._logsvc_learners)
                match = raft.logsvc_match_index(learners)
            except RuntimeError:  # changed size during the copy
                continue
            return {address: match.get(address, 0) for address in learners.values()}
        return {}

    @property
    def last_index(self) -> int:
        return self._journal.store.last_index

    def status(self) -> dict[str, Any]:
        return dict(self._raft.getStatus())

    @property
    def members(self) -> tuple[str, ...]:
        """The Raft addresses of the shard's members: the latest configuration in this
        replica's log (this replica included while it is a member)."""
        return self._membership.members

    @property
    def joining(self) -> bool:
        """Started to join; its own `add` not in its log yet (it holds its elections)."""
        return self._membership.joining

    @property
    def config_index(self) -> int:
        """The raft index of the membership entry behind `members` (0: none yet)."""
        return self._membership.config_index

    def progress(self) -> ProgressView:
        """The last election seen and, on the leader, each follower's lag in seconds."""
        return self._progress.view(monotonic_s())

    def add_member(self, address: str, callback: Callable[[object, int], None]) -> None:
        self._raft.addNodeToCluster(address, callback=callback)
        self._wake()

    def remove_member(self, address: str, callback: Callable[[object, int], None]) -> None:
        self._raft.removeNodeFromCluster(address, callback=callback)
        self._wake()

    def transfer_leadership(
        self, address: str | None, callback: Callable[[object, int], None]
    ) -> None:
        """Run on the tick (pysyncobj sends TimeoutNow from the calling thread otherwise)."""
        self._on_tick(lambda: self._raft.transferLeadership(address, callback=callback))

    def _on_tick(self, call: Callable[[], None]) -> None:
        with self._tick_calls_lock:
            if len(self._tick_calls) >= TICK_CALLS_MAX:
                raise RaftFatal(f"more than {TICK_CALLS_MAX} calls waiting for the tick")
            self._tick_calls.append(call)
        self._wake()

    # ------------------------------------------------------------------ the scheduler's side

    def peer_nodes(self) -> frozenset[str]:
        """The nodes of this replica's peers (scheduler.Tickable); none for a learner (its
        read-only connections carry no node liveness)."""
        assert self._scheduler is not None
        if self._config.learner:
            return frozenset()
        node_of = self._scheduler.node_of
        return frozenset(node_of(address) for address in self._raft.logsvc_peers())

    def connected_to(self, node: str) -> bool:
        """Whether this replica's connection to its peer on `node` is up."""
        assert self._scheduler is not None
        if self._config.learner:
            return False
        node_of = self._scheduler.node_of
        return any(node_of(address) == node for address in self._raft.logsvc_connected_peers())

    def tick(self) -> float | None:
        """One tick, on the replica's worker; the next deadline to tick again without an
        event (monotonic seconds), or None (quiet, or stopped on a fatal error)."""
        if not self.tick_once(0.0):
            return None
        raft = self._raft
        now_s = float(monotonic_s())
        if raft._logsvc_messages != self._messages_before:
            return now_s  # act on what arrived (commit, apply, answer) before anything else
        due_s: float | None = raft._logsvc_next_wakeup_s(now_s)
        return due_s

    @property
    def tick_thread(self) -> threading.Thread | None:
        """The thread that ticks this replica (its scheduler worker's), once started."""
        return None if self._scheduler is None else self._scheduler.thread_of(self)

    _messages_before = 0

    def tick_once(self, wait_s: float = 0.0) -> bool:
        """One tick: pysyncobj's (waiting up to `wait_s` for messages), then the tick's one
        sync and the held replies. False once the replica has stopped on a fatal error. The
        scheduler calls it through `tick`; the simulator (tests/chaos/dst/) calls it itself."""
        if self._fatal is not None:
            return False
        raft = self._raft
        self.ticks += 1
        shard = self._events.shard if self._events is not None else 0
        if shard:
            # Every line logged during the tick (ours, pysyncobj's, the store's) names the
            # shard: the worker thread ticks many replicas, one after the other.
            logs.bind_shard(shard)
        try:
            # Before anything is sent (a tick call's TimeoutNow too): a quiet replica's
            # connections count as just read from, or pysyncobj closes one that was quiet
            # longer than connection_timeout under the first message sent on it (a leader
            # transfer of a quiet shard closed its connection to the target instead).
            raft.logsvc_before_events(monotonic_s())
            self._run_tick_calls()
            if self._poller is not None:
                # Receive what the worker collected, sync and send the held replies, then
                # run pysyncobj's tick (timers, commit check, applies) on it: the order of
                # pysyncobj's own loop (its poll ends one tick, our flush follows, the next
                # tick acts), in one tick of ours instead of two per event. Every reply
                # that promises durability still leaves only after the sync.
                self._poller.poll(0.0)
                self._flush()
            now_s = monotonic_s()
            self._messages_before = raft._logsvc_messages
            raft._logsvc_quiesce_before(now_s)
            raft.logsvc_prevote_gate(monotonic_s())
            raft.doTick(wait_s)
            self._flush()  # one sync for the tick, then the held replies
            now_s = monotonic_s()
            raft._logsvc_quiesce_after(now_s)
            raft._logsvc_send_alive(now_s)
            self._note_role()
            self._after_tick()
        except (RaftFatal, StoreError) as exc:
            self._die(exc)
        except Exception as exc:  # a bug: stop rather than tick on in an unknown state
            log.exception(
                "raft tick failed on %s", self._config.self_address, extra={"term": self.term}
            )
            self._die(exc)
        finally:
            if shard:
                logs.bind_shard(None)  # the worker's own lines name no shard
        return self._fatal is None

    def _flush(self) -> None:
        """The tick's sync. A reply held for it (an acknowledgement, a vote) waits: sync here
        and send it (over the node journal, at the end of the worker's round when other
        replicas are still to tick: one journal sync then covers them all). Otherwise (a
        leader's own appends: its AppendEntries already left) the sync goes to the worker's
        syncer thread and this worker goes on receiving the followers' acknowledgements
        meanwhile; the adapter counts this replica in a commit only up to its durable
        index, and the syncer wakes it when the sync is done. The simulator (no scheduler)
        always syncs here."""
        raft = self._raft
        if self._sync_error is not None:
            error, self._sync_error = self._sync_error, None
            raise error
        if self._poller is None or self._scheduler is None:
            raft.logsvc_flush()
            return
        # A term or vote set this tick is durable before anything of it is synced or sent:
        # a lone replica sends nothing, and its own appends go to the syncer below.
        self._journal.flush_vote()
        if raft.logsvc_holds_replies():
            store = self._journal.store
            if not store.shares_journal or not self._scheduler.defer_to_round_end(
                self, self._flush_at_round_end
            ):
                raft.logsvc_flush()
            return
        if self._sync_in_flight or not self._journal.store.sync_needed:
            return  # the syncer wakes us when the one running is done; we look again then
        self._sync_in_flight = True
        self._scheduler.sync_later(self, self._sync_in_background)

    def _flush_at_round_end(self) -> None:
        """The deferred sync and held replies (node journal), on the worker after its round:
        the round's last sync covered this store's appends too, so this sends at once."""
        if self._fatal is not None or self._stopped:
            return
        shard = self._events.shard if self._events is not None else 0
        if shard:
            logs.bind_shard(shard)
        try:
            self._raft.logsvc_flush()
        except (RaftFatal, StoreError) as exc:
            self._die(exc)
        except Exception as exc:  # a bug: stop rather than go on in an unknown state
            log.exception("raft flush failed on %s", self._config.self_address)
            self._die(exc)
        finally:
            if shard:
                logs.bind_shard(None)

    def _sync_in_background(self) -> bool:
        """On the worker's syncer thread; never raises (the error waits for the tick).
        True (wake the replica) if the sync failed, entries were appended meanwhile (the
        next tick asks for their sync), or it made durable an entry not yet committed that
        a follower already acknowledged (the next commit count may take it); else no tick
        is needed (a wake-up per lone append was a third of the leader's ticks)."""
        try:
            durable = self._journal.store.sync()
        except StoreError as exc:
            self._sync_error = exc
            return True
        finally:
            self._sync_in_flight = False
        if self._journal.store.sync_needed:
            return True  # appended meanwhile: the next tick asks for their sync
        if int(self._raft.raftCommitIndex) >= durable:
            return False  # the followers' acks committed everything it covered already
        # Durable here before any follower acked it (a lone append's usual order): a tick
        # now would commit nothing; the tick that receives the ack counts this durable
        # index. Only an ack already ahead of the commit index makes the tick worth it.
        return self._raft.logsvc_commit_may_wait_on_own_sync()

    def _run_tick_calls(self) -> None:
        if not self._tick_calls:
            return
        with self._tick_calls_lock:
            calls, self._tick_calls = self._tick_calls, deque()
        for call in calls:
            call()

    def _after_tick(self) -> None:
        """Membership and progress bookkeeping: a few comparisons per tick."""
        raft = self._raft
        version = self._membership.version
        if version != self._members_version:  # e.g. a truncated suffix undid a change
            self._members_version = version
            raft._logsvc_follow_membership()
            if self._scheduler is not None and self._started:
                self._scheduler.update_peers(self)
        now_s = monotonic_s()
        if self._membership.joining:
            # Not a member until our `add` arrives: an election now would only raise our
            # term and, once the leader adds us, make it step down.
            raft.logsvc_hold_election(now_s + self._config.election_timeout_ms_max / 1000.0)
        leading = raft.logsvc_is_leader()
        match_index = raft.logsvc_match_index() if leading else {}
        self._progress.observe(
            now_s,
            time.time(),
            self.leader,
            self.term,
            leading,
            self._journal.store.last_index,
            match_index,
        )

    def _note_role(self) -> None:
        """Emit `leader` / `follower` when leadership changed during the last tick."""
        if self._events is None or not events_enabled():
            return
        leading = self._raft.logsvc_is_leader()
        if leading != self._leading:
            self._leading = leading
            self._events.emit("leader" if leading else "follower", term=self.term)

    def _die(self, exc: BaseException) -> None:
        log.critical(
            "raft replica %s stopped: %s",
            self._config.self_address,
            exc,
            extra={"term": self.term},
        )
        self._fatal = exc
        # Close its connections: its peers then see it gone at once (a quiet follower of a
        # replica that stopped would otherwise wait on a node that is still alive).
        self._destroy()
        for listener in self._fatal_listeners:
            listener(exc)
