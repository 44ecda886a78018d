"""The deterministic simulation tier (chaos-plan §4.10): real replicas under seeded faults.

What it proves, and how (tests/chaos/dst/ holds the simulator):

* Fixed seeds, then a few random ones (printed): each runs three real `ShardReplica`s in one
  thread on a virtual clock, with an in-memory network and a FaultFS disk per node, through
  40 simulated seconds of partitions (one, leader, majority, bridge, one-way), slow links,
  kills, power losses (torn, truncated and zeroed tails; names reverted, kept or mixed),
  whole-cluster restarts and clock-rate faults, under appends, reads and truncates; then a
  heal, convergence, dumps through the read path, and the safety checkers (S1-S14; S12 and
  committed-prefix agreement also after every step). Any violation fails the test with the
  command that reproduces the seed.
* Quiescence: more fixed seeds with quiescence on (an idle leader and its followers stop
  heartbeats and election timers) and rarer client bursts, so that quiet leaders are
  killed, powered off and partitioned; the same checkers, and counts showing it happened.
* Determinism: two seeds re-run in another process give the same trace hashes.
* Vacuity: summed over the fixed seeds, the faults, elections and operations that were
  supposed to happen did happen, in numbers.
* Negative control: with a disk whose segment fdatasync makes nothing durable (stock
  pysyncobj acknowledges from an mmap nobody syncs), power losses lose acknowledged
  appends, and the checkers say so. This is the bug the tier exists to catch.
* The harness itself: the simulated network keeps per-link order, holds messages across a
  short cut and drops them (telling both ends) when the cut outlasts the connection
  timeout; a fault-free run acknowledges every append. And two scripted regressions of
  bugs the simulator found (in-process, short).

Each seed runs in a `PYTHONHASHSEED=0` subprocess (pysyncobj iterates sets of nodes), two
side by side. Budget: about 90 s on 2 cores for the whole module.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any, cast

import pytest

from logsvc.shard.errors import LsnTruncated
from logsvc.shard.replica import ShardReplica
from tests.chaos.dst.clock import NS_PER_MS, NS_PER_S, VirtualClock
from tests.chaos.dst.network import SimNetwork, SimTransport
from tests.chaos.dst.runner import git_commit, run_seeds
from tests.chaos.dst.simulation import SimOptions, Simulation

FIXED_SEEDS = range(1, 57)
RANDOM_SEEDS_COUNT = 8
STEPS = 4000  # 40 simulated seconds of faults per seed
FLAGS = ("--steps", str(STEPS))
PARALLEL = 2
DETERMINISM_SEEDS = (FIXED_SEEDS[0], FIXED_SEEDS[29])
# Quiescence (logsvc/shard/quiescence.py) on: an idle leader asks its followers to go quiet
# after 300 ms, and clients come in rarer bursts so that the shard is often quiet when the
# nemesis kills, cuts power to or partitions its leader.
QUIET_SEEDS = range(1, 33)
QUIET_FLAGS = ("--steps", "3000", "--quiesce-after-ms", "300", "--bursts-per-s", "1.5")
QUIET_MINIMUMS = {"quiet_steps": 10000, "quiet_leader_crashes": 20, "quiet_partitions": 12}
NEGATIVE_SEEDS = range(1, 9)
NEGATIVE_FLAGS = ("--steps", "2000", "--lying-disk", "--fault-mix", "power", "--no-truncates")

# Summed over the fixed seeds (about half of what they do today, so that a change in the
# nemesis or the product that quietly stops faults from happening fails here).
MINIMUMS = {
    "partitions": 220,
    "kills": 160,
    "power_losses": 170,
    "cluster_restarts": 40,
    "clock_changes": 90,
    "restarts": 330,
    "leader_elections": 200,
    "appends_ok": 11000,
    "appends_info": 2000,
    "reads_ok": 5000,
    "truncates_ok": 400,
    "disconnects": 450,
}

Summary = dict[str, object]


@pytest.fixture(scope="module")
def fixed_runs() -> list[Summary]:
    return run_seeds(list(FIXED_SEEDS), FLAGS, parallel=PARALLEL)


def _failures(runs: Sequence[Summary], flags: Sequence[str]) -> str:
    lines = []
    for run in runs:
        violations = run["violations"]
        assert isinstance(violations, list)
        if violations:
            seed = int(str(run["seed"]))
            lines.append(f"seed {seed}: {len(violations)} violation(s)")
            lines.extend("  " + str(v)[:2000] for v in violations[:5])
            lines.append(
                f"  reproduce: PYTHONHASHSEED=0 .venv/bin/python -m tests.chaos.dst "
                f"--seed {seed} {' '.join(flags)}   # at commit {git_commit()}"
            )
    return "\n".join(lines)


def _cpu_report(runs: Sequence[Summary]) -> str:
    cpu = [float(str(run["cpu_s"])) for run in runs]
    return (
        f"{len(cpu)} seeds, CPU per seed: mean {statistics.mean(cpu):.2f} s, "
        f"max {max(cpu):.2f} s, total {sum(cpu):.1f} s"
    )


@pytest.mark.timeout(240)
def test_fixed_seeds_keep_every_safety_property(fixed_runs: list[Summary]) -> None:
    print(_cpu_report(fixed_runs))
    assert [int(str(r["seed"])) for r in fixed_runs] == list(FIXED_SEEDS)
    failures = _failures(fixed_runs, FLAGS)
    assert not failures, failures
    assert all(r["converged"] for r in fixed_runs)


@pytest.mark.timeout(120)
def test_random_seeds_keep_every_safety_property() -> None:
    seeds = [random.SystemRandom().randrange(1_000_000, 2**31) for _ in range(RANDOM_SEEDS_COUNT)]
    print(f"random DST seeds: {seeds}")
    runs = run_seeds(seeds, FLAGS, parallel=PARALLEL)
    print(_cpu_report(runs))
    failures = _failures(runs, FLAGS)
    assert not failures, failures


@pytest.mark.timeout(120)
def test_a_seed_replays_to_the_same_trace(fixed_runs: list[Summary]) -> None:
    by_seed = {int(str(r["seed"])): r["trace_hash"] for r in fixed_runs}
    again = run_seeds(list(DETERMINISM_SEEDS), FLAGS, parallel=PARALLEL)
    for run in again:
        seed = int(str(run["seed"]))
        assert run["trace_hash"] == by_seed[seed], f"seed {seed} is not deterministic"
    assert len({by_seed[s] for s in DETERMINISM_SEEDS}) == len(DETERMINISM_SEEDS)


@pytest.mark.timeout(60)
def test_the_simulator_really_injected_faults(fixed_runs: list[Summary]) -> None:
    totals: dict[str, int] = dict.fromkeys(MINIMUMS, 0)
    for run in fixed_runs:
        faults = run["faults"]
        assert isinstance(faults, dict)
        for name in totals:
            value = faults[name] if name in faults else run[name]
            totals[name] += int(str(value))
    print(f"totals over {len(fixed_runs)} seeds: {totals}")
    short = {name: (totals[name], low) for name, low in MINIMUMS.items() if totals[name] < low}
    assert not short, f"fewer than the minimum (got, minimum): {short}"


@pytest.mark.timeout(120)
def test_without_durable_syncs_power_loss_loses_acknowledged_appends() -> None:
    """The negative control. If this fails, the simulator can no longer see the loss of
    acknowledged writes that stock pysyncobj's unsynced journal suffers, and a green run of
    the tests above proves nothing about durability."""
    assert SimOptions(seed=0).command_flags() == ""
    runs = run_seeds(list(NEGATIVE_SEEDS), NEGATIVE_FLAGS, parallel=PARALLEL)
    lost = [
        int(str(run["seed"]))
        for run in runs
        if any(str(v).startswith(("S13 ", "S1 ")) for v in _violations(run))
    ]
    print(f"negative control: acked appends lost in seeds {lost} of {list(NEGATIVE_SEEDS)}")
    assert lost, "no seed lost an acknowledged append on a disk that never syncs:\n" + "\n".join(
        f"seed {r['seed']}: {_violations(r)[:3]}" for r in runs
    )


def _violations(run: Summary) -> list[object]:
    violations = run["violations"]
    assert isinstance(violations, list)
    return violations


class _Endpoint:
    """Stands in for a node's SimTransport: records what the network tells it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.log: list[tuple[Any, ...]] = []

    def connected(self, address: str) -> None:
        self.log.append(("up", address))

    def disconnected(self, address: str) -> None:
        self.log.append(("down", address))

    def received(self, address: str, message: Any) -> None:
        self.log.append(("message", address, message))


@pytest.mark.timeout(30)
def test_the_network_orders_holds_and_drops_like_tcp() -> None:
    clock = VirtualClock({"n1": 0, "n2": 0})
    network = SimNetwork(random.Random(1), clock, {"n1": "a:1", "n2": "b:1"}, 3500 * NS_PER_MS)
    one, two = _Endpoint("a:1"), _Endpoint("b:1")
    for endpoint in (one, two):
        network.attach(cast(SimTransport, endpoint))

    def run(seconds: float) -> None:
        for _ in range(round(seconds * NS_PER_S / (10 * NS_PER_MS))):
            clock.advance(10 * NS_PER_MS)
            network.step()
            for endpoint in (one, two):
                network.pump(cast(SimTransport, endpoint))

    def messages() -> list[object]:
        return [entry[2] for entry in two.log if entry[0] == "message"]

    assert not network.send("a:1", "b:1", 0)  # not connected yet: refused, as TCP's send
    run(2)
    assert one.log == [("up", "b:1")]
    assert two.log == [("up", "a:1")]
    for i in range(5):
        assert network.send("a:1", "b:1", i)
    run(0.1)
    assert messages() == [0, 1, 2, 3, 4]
    network.set_cuts({("n1", "n2")})  # one way, shorter than the timeout: held, then late
    for i in range(5, 8):
        network.send("a:1", "b:1", i)
    run(2)
    assert messages() == [0, 1, 2, 3, 4]
    network.heal()
    run(0.1)
    assert messages() == [0, 1, 2, 3, 4, 5, 6, 7]
    network.set_cuts({("n1", "n2")})  # longer than the timeout: the connection dies
    network.send("a:1", "b:1", 8)
    run(4)
    assert one.log[-1] == ("down", "b:1")
    assert two.log[-1] == ("down", "a:1")
    assert not network.send("a:1", "b:1", 9)
    network.heal()
    run(2)
    assert one.log[-1] == ("up", "b:1")
    assert 8 not in messages()  # dropped with its connection
    network.set_cuts({("n2", "n1")}, reset=True)  # a reset: down at once, both ends
    run(0.01)
    assert one.log[-1] == ("down", "b:1")
    assert two.log[-1] == ("down", "a:1")


def test_quiescent_seeds_keep_every_safety_property() -> None:
    """The same checkers with quiescence on: a quiet leader killed, powered off or cut off
    must be replaced within the election timeout as an active one would (liveness: L1/L2
    after the heal), and nothing acknowledged may be lost or diverge on the way (safety).
    Vacuity: the leader really was quiet for much of the time and when faults hit it."""
    runs = run_seeds(list(QUIET_SEEDS), QUIET_FLAGS, parallel=PARALLEL)
    assert [int(str(r["seed"])) for r in runs] == list(QUIET_SEEDS)
    failures = _failures(runs, QUIET_FLAGS)
    assert not failures, failures
    totals = {name: sum(int(str(r[name])) for r in runs) for name in QUIET_MINIMUMS}
    print(f"quiescent seeds: {totals}")
    short = {n: (totals[n], least) for n, least in QUIET_MINIMUMS.items() if totals[n] < least}
    assert not short, f"quiescence was not exercised enough: {short}"


@pytest.mark.timeout(60)
def test_a_fault_free_run_acknowledges_every_append() -> None:
    """The harness loses nothing on its own (chaos-plan §4.16: the appendix-A sketch first
    "found" lost writes that were a transport bug)."""
    [run] = run_seeds([5], ("--steps", "2000", "--faults-per-s", "0"), parallel=1)
    assert not _violations(run)
    assert run["appends_info"] == 0
    assert int(str(run["appends_ok"])) >= 300
    assert 1 <= int(str(run["leader_elections"])) <= 3  # no faults: no churn


def _isolate(sim: Simulation, name: str) -> None:
    names = sorted(sim.nodes)
    sim.network.set_cuts({(a, b) for a in names for b in names if a != b and name in (a, b)})


def _run_until_leader(sim: Simulation, *, other_than: str | None = None) -> str:
    for _ in range(200):
        leader = sim.leader()
        if leader is not None and leader != other_than:
            return leader
        sim.run_for(0.1)
    raise AssertionError("no leader elected in 20 simulated seconds")


@pytest.mark.timeout(60)
def test_a_deposed_leader_with_a_long_conflicting_suffix_catches_up() -> None:
    """Regression (message_fixes.py `_logsvc_on_message`, refusals never raise nextIndex). A leader
    cut off with entries of its own; the majority elects another and commits more than one
    AppendEntries batch past them; after the heal, stock pysyncobj's nextIndex bounced
    between "mismatch at X" and "my log ends at X" forever and the old leader never caught
    up (found by the simulator's seed 2 at 30 s of faults)."""
    sim = Simulation(SimOptions(seed=7, truncates=False))
    with sim.session():
        old = _run_until_leader(sim)
        _isolate(sim, old)
        for _ in range(40):
            sim.workload.append_via(old, "c1")  # appended there, never committed
            sim.run_for(0.02)
        new = _run_until_leader(sim, other_than=old)
        for _ in range(400):  # ~0.5 MB: several 64 KiB batches beyond the old suffix
            sim.workload.append_via(new, "c2")
            sim.run_for(0.01)
        sim.network.heal()
        sim.run_for(30)
        journals = {
            name: (node.replica.store.last_index, node.replica.node.commit_index)
            for name, node in sim.nodes.items()
            if node.replica is not None
        }
    assert len(journals) == 3
    assert len(set(journals.values())) == 1, journals
    assert not sim.observer.violations


@pytest.mark.timeout(60)
def test_a_restarted_replica_answers_truncated_below_its_compacted_journal() -> None:
    """Regression (replica.py `read`). After a truncate made a snapshot point compactable,
    every journal is compacted to it. A replica restarted from that snapshot holds the
    state as of the point, whose first LSN is older, until it re-applies the later
    truncate; a read of an LSN whose entry is gone raised the store's `Compacted` (an
    internal error to the client) instead of `LsnTruncated`."""
    sim = Simulation(SimOptions(seed=3))
    with sim.session():
        leader = _run_until_leader(sim)
        for _ in range(20):
            sim.workload.append_via(leader, "c1")
            sim.run_for(0.05)
        sim.run_for(1)
        sim.workload.truncate_via(leader, "c1", 5)  # the snapshot point
        sim.run_for(0.5)
        replica = sim.nodes[leader].replica
        assert replica is not None
        point_next_lsn = replica.status()["next_lsn"]
        for _ in range(10):
            sim.workload.append_via(leader, "c1")
            sim.run_for(0.05)
        sim.workload.truncate_via(leader, "c1", point_next_lsn + 3)  # makes it compactable
        sim.run_for(1)
        follower = next(n for n in sorted(sim.nodes) if n != leader)
        _isolate(sim, follower)  # it must not re-apply the second truncate yet
        sim.crash(follower, power=False)
        sim.restart(follower)
        sim.run_for(1)
        restarted = sim.nodes[follower].replica
        assert restarted is not None
        status = restarted.status()
        assert restarted.store.first_index > 1
        assert status["first_lsn"] < point_next_lsn  # the state as of the snapshot point
        with pytest.raises(LsnTruncated) as raised:
            restarted.read(status["first_lsn"], 1 << 20)
        assert raised.value.first_lsn > status["first_lsn"]
        after = restarted.read(raised.value.first_lsn, 1 << 20)
        assert after.records


def _compacted_past_a_cut_off_leader(
    sim: Simulation, cut_off_appends: int, new_appends: int
) -> tuple[str, ShardReplica, ShardReplica, list[str]]:
    """A leader cut off takes `cut_off_appends` appends it can never commit; the majority
    elects another, which takes `new_appends` and compacts its log past everything the old
    one holds. Returns the old leader's name, the new leader's replica, the old one's, and
    the cut-off appends' op ids (the network still cut: the caller heals it)."""
    old = _run_until_leader(sim)
    for _ in range(10):
        sim.workload.append_via(old, "c1")
        sim.run_for(0.05)
    sim.run_for(1)
    _isolate(sim, old)
    cut_off = []
    for _ in range(cut_off_appends):
        cut_off.append(sim.workload.append_via(old, "c1"))  # appended there, never committed
        sim.run_for(0.02)
    new = _run_until_leader(sim, other_than=old)
    for _ in range(new_appends):
        sim.workload.append_via(new, "c2")
        sim.run_for(0.02)
    sim.run_for(0.5)
    sim.workload.truncate_via(new, "c2", 3)  # the snapshot point
    sim.run_for(0.5)
    replica = sim.nodes[new].replica
    assert replica is not None
    point_next_lsn = replica.status()["next_lsn"]
    for _ in range(5):
        sim.workload.append_via(new, "c2")
        sim.run_for(0.02)
    sim.workload.truncate_via(new, "c2", point_next_lsn + 1)  # compact past old's log
    sim.run_for(1)
    stale = sim.nodes[old].replica
    assert stale is not None and replica.store.first_index > stale.store.last_index
    return old, replica, stale, cut_off


@pytest.mark.timeout(60)
def test_a_snapshot_chunk_never_commits_a_followers_diverging_suffix() -> None:
    """Regression (message_fixes.py `_logsvc_on_message`, snapshot chunks). A leader cut off with
    entries of its own; the majority moves on and compacts past them; after the heal the
    old leader gets the snapshot in chunks, and stock pysyncobj set its commit index to its
    own last index on the first chunk, so it would apply (and serve) its uncommitted,
    diverging entries (found by the simulator's seed 4039 at 120 s of faults). The observer
    checks committed-prefix agreement after every message."""
    sim = Simulation(SimOptions(seed=11))
    with sim.session():
        old, replica, _, _ = _compacted_past_a_cut_off_leader(sim, 30, 60)
        sim.network.heal()
        sim.run_for(10)
        caught_up = sim.nodes[old].replica
        assert caught_up is not None
        assert caught_up.store.first_index == replica.store.first_index  # it got the snapshot
    assert not sim.observer.violations, sim.observer.violations[:3]


@pytest.mark.timeout(60)
def test_a_cut_off_leaders_proposals_are_answered_when_a_snapshot_replaces_them() -> None:
    """Regression (snapshot_points.py `_logsvc_answer_skipped_waiters`). A leader cut off
    takes proposals it cannot commit; the majority moves on and compacts past them; at the
    heal the old leader installs the snapshot. pysyncobj answers a proposal only when its
    entry is applied, and the install skips those entries, so they were never answered:
    on a real node each held a proposal slot of the shard for 10 s, and when that replica
    won the next election (chaos C4: the one-way partition right after such a heal) it
    proposed nothing, not even a status's barrier, for seconds. Now they are answered
    OutcomeUnknown at the install (the client retries; deduplication returns the first
    outcome if there was one), well before the client's own timeout."""
    sim = Simulation(SimOptions(seed=11))
    with sim.session():
        _, replica, stale, cut_off = _compacted_past_a_cut_off_leader(sim, 5, 40)
        assert all(sim.workload.outcome_of(op_id) is None for op_id in cut_off)  # pending
        sim.network.heal()
        for _ in range(100):  # until the old leader installed the snapshot (bounded)
            if stale.store.first_index == replica.store.first_index:
                break
            sim.run_for(0.05)
        assert stale.store.first_index == replica.store.first_index  # it got the snapshot
        sim.run_for(0.1)  # the answers reach the client on the next steps
        answered = {
            op.op_id: (op.outcome, op.error) for op in sim.workload.ops if op.op_id in cut_off
        }
    assert set(answered) == set(cut_off), f"never answered: {set(cut_off) - set(answered)}"
    for outcome, error in answered.values():
        assert outcome == "info" and (error or "").startswith("OutcomeUnknown"), answered
    assert not sim.observer.violations, sim.observer.violations[:3]


class _CreepingClock:
    """A loaded machine's clock: every read inside one node's tick is a little later than
    the one before (2 ms a read, at most 9 ms, less than a 10 ms step, so each node's time
    still only moves forward), as when the worker thread is descheduled between two lines."""

    def __init__(self, sim: Simulation) -> None:
        self._clock = sim.clock
        self._base: float | None = None
        self._reads = 0

    def __call__(self) -> float:
        base = self._clock.monotonic_s()
        if base != self._base:
            self._base, self._reads = base, 0
        self._reads += 1
        return base + min(self._reads * 0.002, 0.009)


@pytest.mark.timeout(120)
def test_a_replica_stands_only_for_a_term_its_pre_vote_won(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression (the leaderless start-ups of issue 22: "a follower stood without pre-vote
    while behind"). The pre-vote gate read the clock, found the election timer not yet due
    and let pysyncobj tick; pysyncobj read the clock again a moment later, found it due, and
    stood without asking: on a loaded machine (the reads further apart) a follower whose
    log is behind raised the term with no pre-vote, deposing its live leader. Now pysyncobj
    may stand only for the term a pre-vote won (or a leader's transfer). Every standing over
    a dozen leader kills with a creeping clock is checked."""
    from pysyncobj import SyncObj

    from logsvc.shard.raft import patches as raft_patches
    from logsvc.shard.raft.adapter import ShardRaft

    stood: list[tuple[int, int, bool]] = []  # (term stood for, term its pre-vote won, transfer)
    set_term = SyncObj._SyncObj__setCurrentTerm

    def recording(self: ShardRaft, term: int, voted_for: Any) -> None:
        if self._SyncObj__selfNode is not None and voted_for == self._SyncObj__selfNode.id:
            stood.append(
                (term, self._logsvc_prevote_won[0], bool(self._SyncObj__transferInProgress))
            )
        set_term(self, term, voted_for)

    monkeypatch.setattr(ShardRaft, "_SyncObj__setCurrentTerm", recording, raising=False)
    sim = Simulation(SimOptions(seed=5, truncates=False))
    with sim.session():
        raft_patches.set_monotonic_clock(_CreepingClock(sim))
        for _ in range(30):
            leader = _run_until_leader(sim)
            sim.crash(leader, power=False)
            _run_until_leader(sim, other_than=leader)
            sim.restart(leader)
            sim.run_for(1)
    assert len(stood) >= 12
    unasked = [s for s in stood if s[0] != s[1] and not s[2]]
    assert not unasked, f"stood without a won pre-vote (term, won, transfer): {unasked}"
    assert not sim.observer.violations
