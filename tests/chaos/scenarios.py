"""The CI chaos scenarios C0-C10 (chaos-plan.md §4.9) as data: topology, seeded fault
schedule, and what the checkers must see. `test_scenarios.py` runs them; `soak.py` reuses
the fault packages of `harness/nemesis.py`, not these schedules.

C0 is not in the plan's table: it is the fault-free run that tests the tester (L8, §4.16).
Every schedule draws its choices from `ctx.rng` (seeded by CHAOS_SEED) and scales its
durations by CHAOS_TIME_SCALE (`ctx.sleep`).
"""

from __future__ import annotations

import time

from tests.chaos.harness.cluster import ClusterSpec
from tests.chaos.harness.scenario import RunContext, Scenario

SHARD = 1
# A slower sync leaves unsynced bytes at most moments of a SIGKILL, so that a power loss
# has something to lose (otherwise group commit syncs within a millisecond and most power
# losses are vacuous).
# The harness also times the SIGKILL to land inside that window (`in_failpoint`).
SLOW_SYNC_POINT = "store_after_write_before_sync"
SLOW_SYNC_ENV = {"LOGSVC_FAILPOINTS": f"{SLOW_SYNC_POINT}=sleep(30)"}


def _c0_fault_free(ctx: RunContext) -> None:
    ctx.sleep(6.0)


def _c1_kill_leader(ctx: RunContext) -> None:
    """Every 4 s, SIGKILL the current leader; restart it after 0-2 s; 6 cycles."""
    for _ in range(6):
        cycle_end = time.monotonic() + 4.0 * ctx.time_scale
        old = ctx.nemesis.kill_leader(SHARD)
        if old is None:
            ctx.sleep(1.0)
            continue
        ctx.sleep(ctx.rng.uniform(0.0, 2.0))
        ctx.nemesis.restart(old[0])
        ctx.nemesis.confirm_leader_change(SHARD, old)
        time.sleep(max(0.0, cycle_end - time.monotonic()))


def _c2_random_crashes(ctx: RunContext) -> None:
    """Every 3 s, kill 1 or 2 random nodes (a majority too); restart after 1-3 s."""
    for _ in range(6):
        victims = ctx.nemesis.kill_random(ctx.rng.choice([1, 1, 2]))
        ctx.sleep(ctx.rng.uniform(1.0, 3.0))
        for node_id in victims:
            ctx.nemesis.restart(node_id)
        ctx.sleep(1.5)


def _c3_paused_leader(ctx: RunContext) -> None:
    """SIGSTOP the leader for 6 s (more than an election plus the connection timeout);
    the clients that know it keep sending to it; SIGCONT; 3 cycles."""
    for _ in range(3):
        old = ctx.nemesis.pause_leader(SHARD)
        if old is None:
            ctx.sleep(1.0)
            continue
        resume_at = time.monotonic() + 6.0 * ctx.time_scale
        ctx.nemesis.confirm_leader_change(SHARD, old, wait_s=6.0)
        time.sleep(max(0.0, resume_at - time.monotonic()))
        ctx.nemesis.resume(old[0])
        ctx.sleep(3.0)


def _c4_partitions(ctx: RunContext) -> None:
    """Rotate partitions through the proxy mesh, 5 s on and 2 s off (the plan's 7/3,
    shortened for the CI budget; still above 2 x connection_timeout): isolate the leader,
    majority/minority, one-way leader->followers, bridge; then one cycle of 200+-100 ms
    delay; one follower runs with its clock at x1.5 throughout (when libfaketime is
    installed)."""
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
        nemesis.partition(spec, SHARD)
        ctx.sleep(5.0)  # at least 2 x connection_timeout (plan §4.16)
        if old is not None and spec in ("leader", "one-way-from-leader"):
            nemesis.confirm_leader_change(SHARD, old, wait_s=0.5)
        nemesis.heal_network()
        ctx.sleep(2.0)
    # Between the leader and a follower: two followers exchange nothing in Raft.
    found = ctx.cluster.leader(SHARD)
    a = found[0] if found is not None else ctx.rng.choice(ctx.cluster.replicas_of[SHARD])
    b = ctx.rng.choice([n for n in ctx.cluster.replicas_of[SHARD] if n != a])
    nemesis.delay(a, b, 200, 100)
    ctx.sleep(5.0)
    nemesis.heal_network()
    if skewed is not None:
        nemesis.end_clock(skewed)


def _c5_coordinated_power_loss(ctx: RunContext) -> None:
    """SIGKILL every node, power loss (random mode) on every one, restart; 3 cycles with
    5 s of load between them."""
    nodes = ctx.cluster.node_ids
    for _ in range(3):
        ctx.sleep(5.0)
        found = ctx.cluster.leader(SHARD)
        writer = found[0] if found is not None else ctx.rng.choice(nodes)
        ctx.nemesis.crash_all(nodes, in_failpoint=(writer, SLOW_SYNC_POINT))
        ctx.nemesis.power_loss(nodes)
        for node_id in nodes:
            ctx.nemesis.restart(node_id)
        ctx.cluster.wait_ready(30.0 * ctx.time_scale)


def _c6_pause_kill(ctx: RunContext) -> None:
    """NATS "pause-kill": pause minority P1 while writing; SIGKILL C and cut it to its
    durable state; pause P2 and resume P1 (new majority P1 + C once C restarts); 5 s;
    resume everything."""
    nodes = list(ctx.cluster.replicas_of[SHARD])
    ctx.rng.shuffle(nodes)
    p1, p2, crasher = nodes
    nemesis = ctx.nemesis
    nemesis.pause(p1)
    ctx.sleep(5.0)
    nemesis.crash(crasher, in_failpoint=SLOW_SYNC_POINT)
    nemesis.power_loss([crasher])
    nemesis.pause(p2)
    nemesis.resume(p1)
    nemesis.restart(crasher)
    ctx.sleep(5.0)
    nemesis.resume(p2)
    ctx.sleep(3.0)


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
        ctx.sleep(3.0)  # more sealed segments
        nemesis.crash(victim)
        nemesis.corrupt(victim, kinds)
        if not nemesis.restart_checked(victim):
            continue
        ctx.cluster.wait_ready(30.0 * ctx.time_scale)
        ctx.sleep(2.0)
        for _ in range(2):
            old = nemesis.kill_leader(SHARD)
            if old is None:
                ctx.sleep(1.0)
                continue
            ctx.sleep(ctx.rng.uniform(0.5, 1.5))
            nemesis.restart(old[0])
            nemesis.confirm_leader_change(SHARD, old)
            ctx.sleep(2.0)


def _c8_truncate_under_faults(ctx: RunContext) -> None:
    """Frequent truncates (workload mix) while leaders are killed, partitions flip and
    one node loses power."""
    nemesis = ctx.nemesis
    for cycle in range(2):
        old = nemesis.kill_leader(SHARD)
        ctx.sleep(ctx.rng.uniform(0.5, 2.0))
        if old is not None:
            nemesis.restart(old[0])
            nemesis.confirm_leader_change(SHARD, old)
        ctx.sleep(2.0)
        nemesis.partition(ctx.rng.choice(["one", "leader", "majority-minority"]), SHARD)
        ctx.sleep(5.0)
        nemesis.heal_network()
        ctx.sleep(1.0)
        if cycle == 0:
            victim = ctx.rng.choice(ctx.cluster.replicas_of[SHARD])
            nemesis.crash(victim, in_failpoint=SLOW_SYNC_POINT)
            nemesis.power_loss([victim])
            nemesis.restart(victim)
            ctx.sleep(2.0)


def _c9_term_and_vote(ctx: RunContext) -> None:
    """(a) whole-cluster restart within ~100 ms, appends right away, x4; (b) a voter
    crashes right after persisting its vote (failpoint), restarts at once within the
    same election round, while the rival candidate needs its vote."""
    nemesis = ctx.nemesis
    for _ in range(4):
        nemesis.restart_all()
        ctx.cluster.wait_ready(30.0 * ctx.time_scale)
        ctx.sleep(1.0)
    # (b): with the leader dead, the two survivors need each other's vote.
    for _attempt in range(4):
        found = ctx.cluster.leader(SHARD)
        if found is None:
            ctx.sleep(1.0)
            continue
        leader = found[0]
        voter = ctx.rng.choice([n for n in ctx.cluster.replicas_of[SHARD] if n != leader])
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
        ctx.sleep(2.0)
        if hit:
            break
    else:
        nemesis.log.info("failpoint", [], False, "the vote failpoint never fired")


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
    of both shards (what a deployment does, and half the CPU on a 2-core box)."""
    nemesis = ctx.nemesis
    nemesis.partition("leader", 1)
    ctx.sleep(5.0)
    nemesis.heal_network()
    ctx.sleep(2.0)
    old = nemesis.pause_leader(2)
    ctx.sleep(5.0)
    if old is not None:
        nemesis.resume(old[0])
    ctx.sleep(2.0)
    nemesis.partition("majority-minority", 2)
    ctx.sleep(5.0)
    nemesis.heal_network()
    ctx.sleep(2.0)
    victim = ctx.rng.choice(ctx.cluster.node_ids)
    nemesis.crash(victim)
    ctx.sleep(2.0)
    nemesis.restart(victim)
    ctx.sleep(2.0)
    # The kernel-level case (test_scenarios runs C10 inside `unshare --net` when it can):
    # 10% random loss (iptables statistic) on everything one shard leader sends.
    if nemesis.kernel is None:
        why = ctx.notes.get("kernel", "not in a network namespace")
        nemesis.log.info("note", [], True, f"kernel-level loss skipped: {why}")
        return
    found = ctx.cluster.leader(ctx.rng.choice(ctx.cluster.shards))
    target = found[0] if found is not None else ctx.rng.choice(ctx.cluster.node_ids)
    nemesis.kernel_loss(target, 0.1, 6.0)


# Leader changes are counted from the node event logs (RaftEvent "leader").
SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("C0", _c0_fault_free),
        Scenario(
            "C1",
            _c1_kill_leader,
            options={"leader_changes_min": 3, "faults_min": {"kill": 5, "leader_change": 3}},
        ),
        Scenario("C2", _c2_random_crashes, options={"faults_min": {"kill": 6}}),
        Scenario(
            "C3",
            _c3_paused_leader,
            options={"leader_changes_min": 2, "faults_min": {"pause": 3, "leader_change": 2}},
        ),
        Scenario(
            "C4",
            _c4_partitions,
            needs_mesh=True,
            options={"faults_min": {"partition": 4, "delay": 1}, "leader_changes_min": 1},
        ),
        Scenario(
            "C5",
            _c5_coordinated_power_loss,
            node_env=SLOW_SYNC_ENV,
            workload={"clients": 12},  # slower commits: more clients for the same rate
            options={"power_loss": True, "faults_min": {"kill": 9, "power_loss": 1}},
        ),
        Scenario(
            "C6",
            _c6_pause_kill,
            node_env=SLOW_SYNC_ENV,
            workload={"clients": 12},
            options={"faults_min": {"pause": 2, "kill": 1}},
        ),
        Scenario(
            "C7",
            _c7_minority_corruption,
            # No truncation: sealed segments must survive for the bit flip.
            workload={"mix": {"append": 0.72, "read": 0.2, "tail": 0.05, "status": 0.03}},
            options={
                "faults_min": {"bitflip": 1, "torn_tail": 1, "kill": 4},
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
            options={"faults_min": {"kill": 3, "partition": 2, "power_loss": 1}},
        ),
        Scenario(
            "C9",
            _c9_term_and_vote,
            options={"faults_min": {"restart_all": 4, "failpoint": 1}},
        ),
        Scenario(
            "C10",
            _c10_two_shards,
            cluster=ClusterSpec(nodes=3, shards=2),
            needs_mesh=True,
            options={"faults_min": {"partition": 2, "pause": 1, "kill": 1}},
        ),
    ]
}
