"""The CI chaos scenarios C0-C10 (chaos-plan.md §4.9) as data: topology, seeded fault
schedule, and what the checkers must see. `test_scenarios.py` runs them; `soak.py` reuses
the fault packages of `harness/nemesis.py`, not these schedules.

C0 is not in the plan's table: it is the fault-free run that tests the tester (L8, §4.16).
Every schedule draws its choices from `ctx.rng` (seeded by CHAOS_SEED) and scales its
durations by CHAOS_TIME_SCALE (`ctx.sleep`).

Timing rule (what keeps the suite short without making a scenario hollow): a fault lasts a
minimum derived from the chaos cluster's Raft timings (`CHAOS_RAFT_MS`, not production
defaults) and, where the scenario expects an effect, until that effect is confirmed in the
nemesis log: `leader_change` (a leader in a higher term, through the product's status),
`deposed` (an old leader back from a pause or partition reports the higher term),
`served` (appends acked again after the step). Between faults a schedule waits for
`served`, not for a fixed time. Each confirmation is an applied-or-not event and every
scenario runs with `faults_must_apply`, so an unconfirmed effect fails the run ("V"), and
each scenario's `faults_min` demands the effects it was written for.
"""

from __future__ import annotations

import time

from logsvc.shard.standing import standing_rank
from tests.chaos.harness import disk
from tests.chaos.harness.cluster import CHAOS_RAFT_MS, ClusterSpec
from tests.chaos.harness.scenario import RunContext, Scenario

SHARD = 1
# A slower sync leaves unsynced bytes at most moments of a SIGKILL, so that a power loss
# has something to lose (otherwise group commit syncs within a millisecond and most power
# losses are vacuous).
# The harness also times the SIGKILL to land inside that window (`in_failpoint`).
SLOW_SYNC_POINT = "store_after_write_before_sync"
SLOW_SYNC_ENV = {"LOGSVC_FAILPOINTS": f"{SLOW_SYNC_POINT}=sleep(30)"}

ELECTION_S_MAX = CHAOS_RAFT_MS["election_timeout_ms_max"] / 1000  # a follower's longest wait
CONNECTION_TIMEOUT_S = CHAOS_RAFT_MS["connection_timeout_ms"] / 1000  # a silent link dropped
LEADER_FALLBACK_S = CHAOS_RAFT_MS["leader_fallback_ms"] / 1000  # a cut-off leader steps down
# A paused leader stays paused for an election plus the connection timeout: its followers
# elect another leader and drop their connections to it, so that it wakes up as a stale
# leader with dead links (and longer still until the new leader is confirmed and served).
PAUSE_HOLD_S = ELECTION_S_MAX + CONNECTION_TIMEOUT_S
# A partition outlasts the cut-off leader's own step-down (leader_fallback) and at least two
# connection timeouts (every blocked link is dropped and redialled inside it), with a margin
# for a loaded box's timer lateness.
PARTITION_HOLD_S = max(LEADER_FALLBACK_S, 2 * CONNECTION_TIMEOUT_S) + 0.5
# One shard's leader partitioned while its node stays live through the other shard (C10):
# held as long as any partition. Its followers hold that leader to Raft's recency rule in
# their pre-vote grants (logsvc/shard/leader_contact.py), not to its node's liveness, so it
# is replaced within an election timeout, as a dead node's would be. (Session 10 held it
# for a connection timeout and an election more: the followers waited for their
# connection to it to drop.)
ONE_SHARD_LEADER_HOLD_S = PARTITION_HOLD_S
# Slow links and kernel packet loss: two connection timeouts of traffic through them.
DEGRADED_HOLD_S = 2 * CONNECTION_TIMEOUT_S
assert PAUSE_HOLD_S > ELECTION_S_MAX
assert max(ELECTION_S_MAX, LEADER_FALLBACK_S, 2 * CONNECTION_TIMEOUT_S) < PARTITION_HOLD_S
# Load for a sealed segment to damage (C7): 256 KiB segments fill in a few seconds.
SEALED_WAIT_S = 20.0
# Appends acked between two coordinated power losses (C5): each loss has new data to lose.
POWER_LOSS_ACKS = 50


def _c0_fault_free(ctx: RunContext) -> None:
    ctx.sleep(6.0)


def _c1_kill_leader(ctx: RunContext) -> None:
    """SIGKILL the current leader; restart it after 0-2 s; once another leader is confirmed
    and has served, the next cycle; 6 cycles. (It was a fixed 4 s cycle: the leader change
    and the new leader's acks are what each cycle is for, and now each is confirmed.)"""
    for _ in range(6):
        old = ctx.nemesis.kill_leader(SHARD)
        if old is None:
            ctx.sleep(1.0)
            continue
        ctx.sleep(ctx.rng.uniform(0.0, 2.0))
        ctx.nemesis.restart(old[0])
        if ctx.nemesis.confirm_leader_change(SHARD, old) is not None:
            ctx.wait_served("under the new leader", SHARD)


def _c2_random_crashes(ctx: RunContext) -> None:
    """Kill 1 or 2 random nodes (a majority too); restart them after 1-3 s; the next
    cycle once the shard served again (it was a fixed 1.5 s: a node killed while it
    still boots stays possible, the shard's recovery is now confirmed); 6 cycles."""
    for _ in range(6):
        victims = ctx.nemesis.kill_random(ctx.rng.choice([1, 1, 2]))
        ctx.sleep(ctx.rng.uniform(1.0, 3.0))
        for node_id in victims:
            ctx.nemesis.restart(node_id)
        ctx.wait_served(f"after restarting {victims}", SHARD)


def _c3_paused_leader(ctx: RunContext) -> None:
    """SIGSTOP the leader for PAUSE_HOLD_S (an election plus the connection timeout) and
    until another leader is confirmed and served; the clients that know it keep sending to
    it; SIGCONT, and the next cycle once it reports the new term (deposed); 3 cycles.
    (It was a fixed 6 s pause and 3 s after it.)"""
    for _ in range(3):
        old = ctx.nemesis.pause_leader(SHARD)
        if old is None:
            ctx.sleep(1.0)
            continue
        paused_at = time.monotonic()
        if ctx.nemesis.confirm_leader_change(SHARD, old) is not None:
            ctx.wait_served("while its old leader is paused", SHARD)
        ctx.hold(paused_at, PAUSE_HOLD_S)
        ctx.nemesis.resume(old[0])
        ctx.nemesis.confirm_term("deposed", old[0], SHARD, old[1] + 1)


def _c4_partitions(ctx: RunContext) -> None:
    """Rotate partitions through the proxy mesh, PARTITION_HOLD_S on (above the leader's
    fallback and 2 x connection_timeout), and off until the shard served again or, after a
    leader's isolation, the old leader reports the new term (the plan's 7/3, then 5/2,
    shortened for the CI budget): isolate the leader, majority/minority, one-way
    leader->followers, bridge; then 200+-100 ms delay on one link for DEGRADED_HOLD_S; one
    follower runs with its clock at x1.5 throughout (when libfaketime is installed)."""
    nemesis = ctx.nemesis
    skewed: str | None = None
    found = ctx.cluster.leader(SHARD)
    followers = [n for n in ctx.cluster.replicas_of[SHARD] if found is None or n != found[0]]
    if followers and nemesis.clock_env(0.0, 1.5) is not None:
        skewed = ctx.rng.choice(followers)
        nemesis.restart_with_clock(skewed, 0.0, 1.5)
        ctx.cluster.wait_ready(30.0 * ctx.time_scale)
    else:
        nemesis.log.info("clock", [], True, "skipped: libfaketime not installed")
    for spec in ("leader", "majority-minority", "one-way-from-leader", "bridge"):
        old = ctx.cluster.leader(SHARD)
        began = time.monotonic()
        nemesis.partition(spec, SHARD)
        deposes = old is not None and spec in ("leader", "one-way-from-leader")
        if deposes:
            assert old is not None
            nemesis.confirm_leader_change(SHARD, old, wait_s=PARTITION_HOLD_S)
        ctx.hold(began, PARTITION_HOLD_S)
        nemesis.heal_network()
        if deposes:
            assert old is not None
            nemesis.confirm_term("deposed", old[0], SHARD, old[1] + 1)
        ctx.wait_served(f"after the {spec} partition", SHARD)
    # Between the leader and a follower: two followers exchange nothing in Raft.
    found = ctx.cluster.leader(SHARD)
    a = found[0] if found is not None else ctx.rng.choice(ctx.cluster.replicas_of[SHARD])
    b = ctx.rng.choice([n for n in ctx.cluster.replicas_of[SHARD] if n != a])
    nemesis.delay(a, b, 200, 100)
    ctx.sleep(DEGRADED_HOLD_S)
    nemesis.heal_network()
    if skewed is not None:
        nemesis.end_clock(skewed)


def _c5_coordinated_power_loss(ctx: RunContext) -> None:
    """SIGKILL every node, power loss (random mode) on every one, restart; 3 cycles, each
    after POWER_LOSS_ACKS new appends were acked (it was 5 s of load: the acks are what a
    power loss must not lose, and now each restart is confirmed to serve again)."""
    nodes = ctx.cluster.node_ids
    for cycle in range(3):
        ctx.wait_served(
            "before a power loss" if cycle == 0 else "after a power loss",
            SHARD,
            POWER_LOSS_ACKS,
        )
        found = ctx.cluster.leader(SHARD)
        writer = found[0] if found is not None else ctx.rng.choice(nodes)
        ctx.nemesis.crash_all(nodes, in_failpoint=(writer, SLOW_SYNC_POINT))
        ctx.nemesis.power_loss(nodes)
        for node_id in nodes:
            ctx.nemesis.restart(node_id)
        ctx.cluster.wait_ready(30.0 * ctx.time_scale)


def _c6_pause_kill(ctx: RunContext) -> None:
    """NATS "pause-kill": pause minority P1 while writing (PAUSE_HOLD_S, and until P2 + C
    served, under a new leader if P1 led); SIGKILL C and cut it to its durable state;
    pause P2 and resume P1: the new majority P1 + C (once C restarts) must elect a leader
    in a higher term and serve, for at least PAUSE_HOLD_S; resume everything. (It was
    5 s, 5 s and 3 s of fixed sleeps.)"""
    nodes = list(ctx.cluster.replicas_of[SHARD])
    ctx.rng.shuffle(nodes)
    p1, p2, crasher = nodes
    nemesis = ctx.nemesis
    first = ctx.cluster.wait_leader(SHARD, 15.0 * ctx.time_scale)
    began = time.monotonic()
    nemesis.pause(p1)
    if first is not None and first[0] == p1:
        nemesis.confirm_leader_change(SHARD, first)
    ctx.wait_served(f"while {p1} is paused", SHARD)
    ctx.hold(began, PAUSE_HOLD_S)
    # The leader now is P2 or C (P1 is paused): both are about to go.
    before = ctx.cluster.wait_leader(SHARD, 15.0 * ctx.time_scale)
    nemesis.crash(crasher, in_failpoint=SLOW_SYNC_POINT)
    nemesis.power_loss([crasher])
    began = time.monotonic()
    nemesis.pause(p2)
    nemesis.resume(p1)
    nemesis.restart(crasher)
    if before is not None and nemesis.confirm_leader_change(SHARD, before) is not None:
        ctx.wait_served(f"by {p1} + {crasher} while {p2} is paused", SHARD)
    ctx.hold(began, PAUSE_HOLD_S)
    nemesis.resume(p2)


def _c7_minority_corruption(ctx: RunContext) -> None:
    """Damage one follower at a time (a minority), offline, then kill the leader
    repeatedly so that the damaged replica may be elected (L2: corruption on a minority
    must never become data loss for the majority).

    Victim 1: a torn tail of its newest segment (cut inside the last record, or garbage
    appended: recovery must cut it and rejoin), then two leader kills. Victim 2 (another
    follower, once victim 1 runs again): a bit flip in a sealed segment and a Zipf cut of
    a random live segment, which recovery must detect. A replica that detects corruption
    is quarantined by its node (never served, ARCHITECTURE.md §3 rule 5) and rebuilt the
    operator's way through the admin API (removed, added back empty, caught up from the
    leader: `restart_checked`); a node that refuses to start at all stays down, and then
    no other replica is damaged."""
    nemesis = ctx.nemesis
    damaged: list[str] = []
    for kinds in (("torn_tail",), ("bitflip", "truncate_file")):
        if ctx.cluster.quarantined:
            break  # never two damaged replicas at once
        found = ctx.cluster.leader(SHARD)
        followers = [
            n
            for n in ctx.cluster.replicas_of[SHARD]
            if (found is None or n != found[0]) and n not in damaged
        ]
        victim = ctx.rng.choice(followers)
        damaged.append(victim)
        _await_sealed_segment(ctx, victim)  # was a fixed 3 s "for more sealed segments"
        nemesis.crash(victim)
        nemesis.corrupt(victim, kinds)
        if not nemesis.restart_checked(victim):
            continue
        ctx.cluster.wait_ready(30.0 * ctx.time_scale)
        ctx.wait_served(f"with {victim} back", SHARD)
        for _ in range(2):
            old = nemesis.kill_leader(SHARD)
            if old is None:
                ctx.sleep(1.0)
                continue
            ctx.sleep(ctx.rng.uniform(0.5, 1.5))
            nemesis.restart(old[0])
            if nemesis.confirm_leader_change(SHARD, old) is not None:
                ctx.wait_served("under the new leader", SHARD)


def _await_sealed_segment(ctx: RunContext, node_id: str) -> None:
    """Load until the node's replica has a sealed segment for the bit flip (bounded: the
    flip itself then reports whether it found one, and an unapplied flip fails the run)."""
    data_dir = ctx.cluster.nodes[node_id].data_dir
    deadline = time.monotonic() + SEALED_WAIT_S * ctx.time_scale
    while disk.sealed_segment_count(data_dir, SHARD) < 1 and time.monotonic() < deadline:
        time.sleep(0.2)


def _c8_truncate_under_faults(ctx: RunContext) -> None:
    """Frequent truncates (workload mix) while leaders are killed, partitions flip and
    one node loses power. Between the steps the shard must serve again (it was 2 s and
    1 s of fixed sleeps); a partition lasts PARTITION_HOLD_S (was 5 s); a leader isolated
    by one is confirmed replaced."""
    nemesis = ctx.nemesis
    for cycle in range(2):
        old = nemesis.kill_leader(SHARD)
        ctx.sleep(ctx.rng.uniform(0.5, 2.0))
        if old is not None:
            nemesis.restart(old[0])
            nemesis.confirm_leader_change(SHARD, old)
        ctx.wait_served("after a leader kill", SHARD)
        spec = ctx.rng.choice(["one", "leader", "majority-minority"])
        old = ctx.cluster.leader(SHARD)
        began = time.monotonic()
        nemesis.partition(spec, SHARD)
        if spec == "leader" and old is not None:
            nemesis.confirm_leader_change(SHARD, old, wait_s=PARTITION_HOLD_S)
        ctx.hold(began, PARTITION_HOLD_S)
        nemesis.heal_network()
        ctx.wait_served(f"after the {spec} partition", SHARD)
        if cycle == 0:
            victim = ctx.rng.choice(ctx.cluster.replicas_of[SHARD])
            nemesis.crash(victim, in_failpoint=SLOW_SYNC_POINT)
            nemesis.power_loss([victim])
            nemesis.restart(victim)
            ctx.wait_served(f"with {victim} back from a power loss", SHARD)


def _c9_term_and_vote(ctx: RunContext) -> None:
    """(a) whole-cluster restart within ~100 ms, appends right away, x4; (b) a voter
    crashes right after persisting its vote (failpoint), restarts at once within the
    same election round, while the rival candidate needs its vote."""
    nemesis = ctx.nemesis
    for _ in range(4):
        nemesis.restart_all()
        ctx.cluster.wait_ready(30.0 * ctx.time_scale)
        ctx.wait_served("right after a whole-cluster restart", SHARD)  # was a fixed 1 s
    # (b): with the leader dead, the two survivors need each other's vote.
    for _attempt in range(4):
        found = ctx.cluster.leader(SHARD)
        if found is None:
            ctx.sleep(1.0)
            continue
        leader = found[0]
        voter = _second_to_stand(ctx, leader)
        nemesis.crash(voter, fault="kill")
        nemesis.restart(voter, {"LOGSVC_FAILPOINTS": "raft_after_vote_persisted_before_reply=exit"})
        ctx.sleep(2.0)
        old = nemesis.kill_leader(SHARD)
        hit = _wait_failpoint(ctx, voter, 10.0)
        if hit:
            # Back at once, inside the same election round, with no failpoint.
            nemesis.log.start("failpoint", [voter], True, f"{hit}")
            nemesis.log.end("failpoint", [voter])
            nemesis.cluster.kill(voter)
            nemesis.cluster.start(voter)
        else:
            # The voter became the candidate itself: disarm it and try again.
            nemesis.crash(voter, fault="kill")
            nemesis.restart(voter)
        if old is not None:
            ctx.sleep(1.0)
            nemesis.restart(old[0])
            nemesis.confirm_leader_change(SHARD, old)
        ctx.cluster.wait_ready(30.0 * ctx.time_scale)
        ctx.wait_served("after the vote failpoint round", SHARD)  # was a fixed 2 s
        if hit:
            break
    else:
        nemesis.log.info("failpoint", [], False, "the vote failpoint never fired")


def _second_to_stand(ctx: RunContext, leader: str) -> str:
    """The survivor that stands last when `leader` is lost (the survivors' order,
    logsvc/shard/standing.py): it votes for the first, so its vote is the one an armed
    failpoint needs. A survivor picked at random stood first itself in half the rounds, and
    all four rounds of a run did so now and then ("the vote failpoint never fired")."""
    address = {n: ctx.cluster.raft_address(n, SHARD) for n in ctx.cluster.replicas_of[SHARD]}
    survivors = [n for n in address if n != leader]
    return max(
        survivors,
        key=lambda n: standing_rank(address[leader], address[n], address.values()),
    )


def _wait_failpoint(ctx: RunContext, node_id: str, wait_s: float) -> str | None:
    deadline = time.monotonic() + wait_s * ctx.time_scale
    while time.monotonic() < deadline:
        hits = ctx.cluster.failpoint_hits(node_id)
        if hits and not ctx.cluster.nodes[node_id].running():
            return hits[0]
        time.sleep(0.05)
    return None


def _c10_two_shards(ctx: RunContext) -> None:
    """Two shards on three nodes: per-shard partitions, a pause and a kill, then (inside a
    network namespace) 10% kernel-level packet loss on a leader; checked per shard, and no
    payload may show up in another shard than its own (S4 parses the shard tag).

    The plan's 2 x 3 is six processes; here each of the three processes hosts a replica
    of both shards (what a deployment does, and half the CPU on a 2-core box).

    Holds: shard 1's leader partition ONE_SHARD_LEADER_HOLD_S, the other partition
    PARTITION_HOLD_S (was 5 s), the pause PAUSE_HOLD_S and until shard 2
    has another leader that served (was 5 s), the crash an election's length; between
    steps, until the old leader reports the new term or both shards served (was 2 s)."""
    nemesis = ctx.nemesis
    old = ctx.cluster.wait_leader(1, 15.0 * ctx.time_scale)
    began = time.monotonic()
    nemesis.partition("leader", 1)
    if old is not None:
        nemesis.confirm_leader_change(1, old, wait_s=ONE_SHARD_LEADER_HOLD_S)
    ctx.hold(began, ONE_SHARD_LEADER_HOLD_S)
    nemesis.heal_network()
    if old is not None:
        nemesis.confirm_term("deposed", old[0], 1, old[1] + 1)
    _served_everywhere(ctx, "after shard 1's leader partition")
    old = nemesis.pause_leader(2)
    began = time.monotonic()
    if old is not None and nemesis.confirm_leader_change(2, old) is not None:
        ctx.wait_served("while its old leader is paused", 2)
    ctx.hold(began, PAUSE_HOLD_S)
    if old is not None:
        nemesis.resume(old[0])
        nemesis.confirm_term("deposed", old[0], 2, old[1] + 1)
    began = time.monotonic()
    nemesis.partition("majority-minority", 2)
    ctx.hold(began, PARTITION_HOLD_S)
    nemesis.heal_network()
    _served_everywhere(ctx, "after shard 2's majority-minority partition")
    victim = ctx.rng.choice(ctx.cluster.node_ids)
    nemesis.crash(victim)
    ctx.sleep(ELECTION_S_MAX)
    nemesis.restart(victim)
    _served_everywhere(ctx, f"with {victim} back")
    # The kernel-level case (test_scenarios runs C10 inside `unshare --net` when it can):
    # 10% random loss (iptables statistic) on everything one shard leader sends.
    if nemesis.kernel is None:
        why = ctx.notes.get("kernel", "not in a network namespace")
        nemesis.log.info("note", [], True, f"kernel-level loss skipped: {why}")
        return
    found = ctx.cluster.leader(ctx.rng.choice(ctx.cluster.shards))
    target = found[0] if found is not None else ctx.rng.choice(ctx.cluster.node_ids)
    nemesis.kernel_loss(target, 0.1, DEGRADED_HOLD_S)  # was 6 s


def _served_everywhere(ctx: RunContext, why: str) -> None:
    for shard in ctx.cluster.shards:
        ctx.wait_served(why, shard)


# Leader changes are counted from the node event logs (RaftEvent "leader").
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("C0", _c0_fault_free),
        Scenario(
            "C1",
            _c1_kill_leader,
            options={
                "leader_changes_min": 3,
                "faults_min": {"kill": 5, "leader_change": 3, "served": 3},
            },
        ),
        Scenario("C2", _c2_random_crashes, options={"faults_min": {"kill": 6, "served": 6}}),
        Scenario(
            "C3",
            _c3_paused_leader,
            options={
                "leader_changes_min": 2,
                "faults_min": {"pause": 3, "leader_change": 2, "deposed": 2, "served": 2},
            },
        ),
        Scenario(
            "C4",
            _c4_partitions,
            needs_mesh=True,
            options={
                "faults_min": {
                    "partition": 4,
                    "delay": 1,
                    "leader_change": 1,
                    "deposed": 1,
                    "served": 4,
                },
                "leader_changes_min": 1,
            },
        ),
        Scenario(
            "C5",
            _c5_coordinated_power_loss,
            node_env=SLOW_SYNC_ENV,
            workload={"clients": 12},  # slower commits: more clients for the same rate
            # Each whole-cluster crash ends its leader's term: 3 new leaders at least.
            options={
                "power_loss": True,
                "leader_changes_min": 3,
                "faults_min": {"kill": 9, "power_loss": 1, "served": 3},
            },
        ),
        Scenario(
            "C6",
            _c6_pause_kill,
            node_env=SLOW_SYNC_ENV,
            workload={"clients": 12},
            options={
                "leader_changes_min": 1,
                "faults_min": {"pause": 2, "kill": 1, "leader_change": 1, "served": 2},
            },
        ),
        Scenario(
            "C7",
            _c7_minority_corruption,
            # No truncation: sealed segments must survive for the bit flip.
            workload={"mix": {"append": 0.72, "read": 0.2, "tail": 0.05, "status": 0.03}},
            options={
                "faults_min": {"bitflip": 1, "torn_tail": 1, "kill": 4, "served": 2},
                "recoveries_min": 1,
                "corruption_detection_required": True,
                "leader_changes_min": 2,
            },
        ),
        Scenario(
            "C8",
            _c8_truncate_under_faults,
            needs_mesh=True,
            node_env=SLOW_SYNC_ENV,
            workload={
                "clients": 12,
                "mix": {
                    "append": 0.68,
                    "read": 0.2,
                    "tail": 0.04,
                    "status": 0.03,
                    "truncate": 0.05,
                },
                "truncate_keep": 20,
            },
            options={
                "leader_changes_min": 2,
                "faults_min": {
                    "kill": 3,
                    "partition": 2,
                    "power_loss": 1,
                    "leader_change": 2,
                    "served": 5,
                },
            },
        ),
        Scenario(
            "C9",
            _c9_term_and_vote,
            # Each whole-cluster restart ends its leader's term: 4 new leaders at least.
            options={
                "leader_changes_min": 4,
                "faults_min": {"restart_all": 4, "failpoint": 1, "served": 5},
            },
        ),
        Scenario(
            "C10",
            _c10_two_shards,
            cluster=ClusterSpec(nodes=3, shards=2),
            needs_mesh=True,
            options={
                "leader_changes_min": 2,
                "faults_min": {
                    "partition": 2,
                    "pause": 1,
                    "kill": 1,
                    "leader_change": 2,
                    "deposed": 2,
                    "served": 6,
                },
            },
        ),
    ]
}
