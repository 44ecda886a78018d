"""The node's Raft scheduler (logsvc/shard/scheduler.py) with stand-in replicas.

Proves: the worker threads are a fixed number however many replicas are added; a replica is
ticked at the deadline its last tick asked for and not in between; `wake` from another
thread ticks it at once; a socket event of a replica (a real socketpair subscribed through
its `ShardPoller`) ticks it and is delivered by its `poll`; events of sockets subscribed
before the replica is added wait for it; `remove` runs its callback on the worker and no
tick follows; and the liveness duties wake one connected carrier per silent peer node each
interval, every member of a node that lapses or comes back, and one member per reconnect
interval of a lapsed node. Real threads and sockets; every wait is bounded.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from logsvc.shard.liveness import NodeLiveness
from logsvc.shard.scheduler import POLL_READ, RaftScheduler, ShardPoller

WAIT_S_MAX = 5.0


class Fake:
    """A Tickable that records its ticks; `deadline` says when it wants the next."""

    def __init__(
        self,
        label: str,
        peers: frozenset[str] = frozenset(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.clock = clock
        self.peers = peers
        self.connected: set[str] = set(peers)
        self.ticks: list[tuple[float, str]] = []
        self.deadline: Callable[[float], float | None] = lambda now: None
        self.poller: ShardPoller | None = None
        self.events: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.leader: str | None = None  # the Raft address (here: the node) it follows
        self.is_leader = False

    def tick(self) -> float | None:
        now = self.clock()
        with self.lock:
            self.ticks.append((now, threading.current_thread().name))
        if self.poller is not None:
            self.poller.poll(0.0)
        return self.deadline(now)

    def peer_nodes(self) -> frozenset[str]:
        return self.peers

    def connected_to(self, node: str) -> bool:
        return node in self.connected

    def count(self) -> int:
        with self.lock:
            return len(self.ticks)


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S_MAX
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def scheduler(
    workers: int = 2, interval_s: float = 0.05, lapse_s: float = 0.3, reconnect_s: float = 0.2
) -> RaftScheduler:
    liveness = NodeLiveness("n1", interval_s, lapse_s, time.monotonic())
    return RaftScheduler(
        liveness, lambda address: address, workers=workers, reconnect_s=reconnect_s
    )


def add(sched: RaftScheduler, node: Fake) -> None:
    poller = sched.new_poller()
    node.poller = poller
    sched.add(node, poller)


def test_threads_are_the_workers_whatever_the_replica_count() -> None:
    before = threading.active_count()
    sched = scheduler(workers=3)
    sched.start()
    try:
        fakes = [Fake(f"r{i}") for i in range(500)]
        for fake in fakes:
            add(sched, fake)
        until(lambda: all(f.count() >= 1 for f in fakes), "every replica's first tick")
        assert threading.active_count() == before + 3
        names = {name for f in fakes for _, name in f.ticks}
        assert names == {"raft-worker-0", "raft-worker-1", "raft-worker-2"}
    finally:
        sched.close()
    until(lambda: threading.active_count() == before, "the workers to end")


class FrozenClock:
    """The scheduler's clock, moved only by the test: what "at the deadline" means is then
    exact, whatever the machine's load (a real clock's bound on the lateness of a tick
    failed on a loaded machine, and one loose enough to pass there proves nothing)."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def full_rounds(sched: RaftScheduler, probe: Fake, rounds: int = 2) -> None:
    """Wait until the worker has gone round its loop `rounds` times more, each reading the
    clock and expiring the timers due: `probe`, a replica on the same (only) worker, is
    woken and its tick awaited, twice, so the round of the first wake has ended entirely."""
    for _ in range(rounds):
        ticked = ticked_past(probe, probe.count())
        sched.wake(probe)
        until(ticked, "a round of the worker")


def ticked_past(fake: Fake, count: int) -> Callable[[], bool]:
    return lambda: fake.count() > count


def test_a_replica_ticks_at_its_deadline_and_on_wake() -> None:
    """On a clock only the test moves: no tick while the clock is short of the deadline
    the last tick asked for (however many rounds the worker makes), a tick once it reaches
    it, none when no deadline was asked for, however far the clock moves, and a tick on
    `wake` with the clock standing still (nothing but the wake can have caused it)."""
    clock = FrozenClock()
    liveness = NodeLiveness("n1", 0.05, 0.3, clock())
    sched = RaftScheduler(liveness, lambda address: address, workers=1, clock=clock)
    sched.start()
    fake = Fake("r", clock=clock)
    probe = Fake("probe", clock=clock)
    try:
        add(sched, probe)
        first_tick_s = clock()
        deadline_s = first_tick_s + 0.3
        fake.deadline = lambda now: deadline_s if len(fake.ticks) == 1 else None
        add(sched, fake)
        until(lambda: fake.count() == 1, "the first tick")
        clock.now_s = deadline_s - 0.001
        full_rounds(sched, probe)
        assert fake.count() == 1  # short of its deadline: not ticked
        clock.now_s = deadline_s
        until(lambda: fake.count() == 2, "the tick at the deadline")
        assert fake.ticks[1][0] == deadline_s
        clock.now_s = deadline_s + 3600.0
        full_rounds(sched, probe)
        assert fake.count() == 2  # no deadline asked: no tick
        sched.wake(fake)
        until(lambda: fake.count() == 3, "the tick after a wake")
        assert fake.ticks[2][0] == clock.now_s
    finally:
        sched.close()


def test_a_socket_event_ticks_its_replica_and_poll_delivers_it() -> None:
    sched = scheduler(workers=2)
    sched.start()
    fake = Fake("r")
    ours, theirs = socket.socketpair()
    try:
        poller = sched.new_poller()
        fake.poller = poller

        def on_event(descr: int, events: int) -> None:
            fake.events.append((descr, events))
            ours.recv(100)

        poller.subscribe(ours.fileno(), on_event, POLL_READ)  # before it is added
        theirs.send(b"x")
        time.sleep(0.05)
        assert fake.count() == 0  # not added: nothing runs for it
        sched.add(fake, poller)
        until(lambda: bool(fake.events), "the event delivered")
        assert fake.events[0] == (ours.fileno(), POLL_READ)
        ticks = fake.count()
        theirs.send(b"y")
        until(lambda: len(fake.events) == 2, "the second event")
        assert fake.count() > ticks
    finally:
        sched.close()
        ours.close()
        theirs.close()


def test_remove_runs_then_on_the_worker_and_no_tick_follows() -> None:
    sched = scheduler(workers=1)
    sched.start()
    fake = Fake("r")
    fake.deadline = lambda now: now + 0.01  # would tick on and on
    ran_on: list[str] = []
    try:
        add(sched, fake)
        until(lambda: fake.count() >= 3, "a few ticks")
        sched.remove(fake, then=lambda: ran_on.append(threading.current_thread().name))
        assert ran_on == ["raft-worker-0"]
        count = fake.count()
        time.sleep(0.1)
        assert fake.count() == count
        sched.wake(fake)  # a wake after removal does nothing
        time.sleep(0.05)
        assert fake.count() == count
    finally:
        sched.close()


def test_liveness_duties_carry_alive_messages_and_wake_on_changes() -> None:
    sched = scheduler(workers=2, interval_s=0.05, lapse_s=0.3)
    carrier = Fake("a", frozenset({"n2"}))
    other = Fake("b", frozenset({"n2"}))
    other.connected.clear()  # only `carrier` can reach n2
    sched.start()
    try:
        add(sched, carrier)
        add(sched, other)
        # Heard from n2 "an hour from now": it cannot lapse during the first part, however
        # late a loaded machine runs the workers (with the real silence of lapse_s = 0.3 s
        # this part raced the lapse and failed under load).
        sched.liveness.heard("n2", time.monotonic() + 3600.0)
        until(lambda: carrier.count() >= 1 and other.count() >= 1, "the first ticks")
        # Nothing was sent to n2, so `carrier` is woken each interval (its tick would send
        # the `alive` message); `other` is not.
        base_c, base_o = carrier.count(), other.count()
        until(lambda: carrier.count() - base_c >= 2, "two wakes of the carrier")
        assert other.count() == base_o
        # Nothing heard from n2 for more than lapse_s: it lapses at the next duties, which
        # wakes both; then its members are woken one at a time per reconnect interval.
        sched.liveness.heard("n2", time.monotonic() - 1.0)
        until(lambda: other.count() > base_o, "the wake of a lapsed node's members")
        sched.liveness.heard("n2", time.monotonic() + 3600.0)
        woke_o = other.count()
        until(lambda: other.count() > woke_o, "the wake when it is back")
    finally:
        sched.close()


def test_a_lapse_wakes_only_the_replicas_it_concerns() -> None:
    """A node's lapse wakes its members that follow a leader there, and those that lead
    without a live majority, not the rest (a thousand wake-ups per survivor when a node of
    a thousand shards died, right when their elections were due). Redials (one member per
    reconnect interval) are pushed past the test: the first, at the lapse, goes to the
    first member, which is woken anyway."""
    sched = scheduler(workers=1, interval_s=0.05, lapse_s=0.3, reconnect_s=60.0)
    follows_n2 = Fake("follows n2", frozenset({"n2", "n3"}))
    follows_n2.leader = "n2"
    follows_n3 = Fake("follows n3", frozenset({"n2", "n3"}))
    follows_n3.leader = "n3"
    leads = Fake("leads, n3 live", frozenset({"n2", "n3"}))
    leads.leader, leads.is_leader = "n1", True
    leads_alone = Fake("leads, its only peer on n2", frozenset({"n2"}))
    leads_alone.leader, leads_alone.is_leader = "n1", True
    fakes = (follows_n2, follows_n3, leads, leads_alone)
    # Neither can carry `alive` messages (a carrier ticks for that each interval).
    follows_n3.connected.clear()
    leads.connected.clear()
    # n3 stays live: heard from "an hour from now", so it cannot lapse however late a loaded
    # machine runs this thread (a thread saying n3 spoke every 20 ms could be held past
    # lapse_s by load or a collection, and n3's lapse woke the two replicas that must
    # stay asleep). n2 says nothing and lapses.
    sched.liveness.heard("n3", time.monotonic() + 3600.0)
    sched.start()
    try:
        for fake in fakes:
            add(sched, fake)
        until(lambda: all(f.count() >= 1 for f in fakes), "the first ticks")
        before = {f.label: f.count() for f in fakes}
        until(lambda: sched.liveness.lapsed("n2", time.monotonic()), "n2 lapsed")
        until(
            lambda: (
                follows_n2.count() > before[follows_n2.label]
                and leads_alone.count() > before[leads_alone.label]
            ),
            "the wake of the replicas n2's lapse concerns",
        )
    finally:
        sched.close()
    assert follows_n3.count() == before[follows_n3.label]
    assert leads.count() == before[leads.label]


def test_a_deferred_step_runs_after_the_rounds_other_replicas() -> None:
    """`defer_to_round_end` (the node journal's shared sync): a replica ticked while others
    of its round are still to tick runs its step after them; the round's last replica, or
    a replica alone, is told to do it now. The round is made by holding the worker in a
    blocker's tick while both are woken (an event, no sleep)."""
    sched = scheduler(workers=1)
    sched.start()
    order: list[str] = []
    answers: dict[str, bool] = {}
    armed = threading.Event()
    release = threading.Event()
    blocking = threading.Event()

    class Deferring(Fake):
        def tick(self) -> float | None:
            super().tick()
            if self.label == "blocker":
                if armed.is_set():
                    blocking.set()
                    assert release.wait(WAIT_S_MAX)
                return None
            order.append(f"tick {self.label}")
            answers[self.label] = sched.defer_to_round_end(
                self, lambda: order.append(f"end {self.label}")
            )
            return None

    blocker, first, second = Deferring("blocker"), Deferring("a"), Deferring("b")
    try:
        for fake in (blocker, first, second):
            add(sched, fake)
        until(lambda: min(f.count() for f in (blocker, first, second)) == 1, "first ticks")
        until(lambda: len(order) == 2 + sum(answers.values()), "their deferred steps")
        order.clear()
        armed.set()
        sched.wake(blocker)
        assert blocking.wait(WAIT_S_MAX)
        sched.wake(first)
        sched.wake(second)
        release.set()
        until(lambda: "end a" in order, "the deferred step")
        assert order == ["tick a", "tick b", "end a"]
        assert answers == {"a": True, "b": False}
        sched.wake(first)  # alone in its round: nothing deferred
        until(lambda: order[-1] == "tick a", "a lone tick")
        assert answers["a"] is False
        assert sched.defer_to_round_end(first, lambda: None) is False  # not on its worker
    finally:
        release.set()
        sched.close()
