"""One seeded run of the deterministic simulator (chaos-plan §4.10, appendix A).

Real `ShardReplica`s (store, Raft with logsvc's fixes, state machine) run in this one
thread on a virtual clock, over `SimNetwork` and a FaultFS disk per node. Every source of
time and randomness is an input: the virtual clock, `random.Random`s derived from the
seed, and pysyncobj's global `random` (election timeouts), seeded here. With
`PYTHONHASHSEED=0` (pysyncobj iterates sets of nodes) a seed always gives the same run,
and the same trace hash.

A run:

1. Fault phase, `steps` steps of `dt_ms`: in each step the network advances, the nemesis
   may inject one fault (partition by spec, heal, slow link, kill or power loss of any node,
   whole-cluster restart, clock-rate change of one node), crashed nodes restart when due,
   clients may invoke a burst of operations, then every live node ticks once (messages and
   connection news are delivered inside its tick) and the observer checks S12 and
   committed-prefix agreement.
2. Heal: every fault is undone, every node restarted, and each client appends until one
   append is acknowledged (L1). The run steps on until the replicas have converged (one
   leader whose commit index is its last entry; every replica holds and has applied that
   same journal; no operation in flight) or `heal_s_max` simulated seconds pass (chaos-plan
   §2 item 3: catching up can take minutes; poll, bounded). Not converging is a violation.
3. Evidence: each replica's log is read through the product's read path
   (`ShardReplica.read`) into a `ReplicaDump` (also when not converged, if every node is
   up); with the history and the Raft events it goes to the safety checkers
   (tests/chaos/checker.py), which say whether every acknowledged append is there (S1,
   S13 after power losses), the replicas agree (S11), and the rest.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Literal

from logsvc.shard.errors import CommandCorrupt
from logsvc.shard.raft import patches as raft_patches
from tests.chaos.dst.checks import safety_violations
from tests.chaos.dst.clock import NS_PER_MS, NS_PER_S, VirtualClock
from tests.chaos.dst.network import (
    PARTITION_SPECS,
    SLOW_LINK_DELAY_NS_MAX,
    SLOW_LINK_DELAY_NS_MIN,
    SimNetwork,
    partition_cuts,
)
from tests.chaos.dst.node import SHARD, SimNode, Timing
from tests.chaos.dst.observer import Observer
from tests.chaos.dst.workload import Workload
from tests.chaos.history import Evidence, NemesisEvent, ReplicaDump
from tests.support.faultfs import POWER_LOSS_MODES, NamesMode

NAMES_MODES: tuple[NamesMode, ...] = ("revert", "keep", "random")
CLOCK_RATES = (0.5, 0.7, 1.5, 2.0)
RESTART_DELAY_NS_MIN = 200 * NS_PER_MS
RESTART_DELAY_NS_MAX = 4 * NS_PER_S
CLUSTER_RESTART_SPREAD_NS = 100 * NS_PER_MS  # plan C9: restarts within 100 ms of each other
PROBE_RETRY_NS = 1 * NS_PER_S
OPS_PER_BURST_MAX = 4
DUMP_READ_BYTES = 1 << 20

FaultKind = Literal[
    "partition", "heal", "slow_link", "kill", "power_loss", "cluster_restart", "clock_rate"
]
FaultMix = Literal["mixed", "power"]
# Relative weights of the fault drawn when the nemesis acts, per mix. `power` is for the
# negative control: mostly power losses, and whole-cluster restarts always lose power.
FAULT_WEIGHTS: dict[FaultMix, dict[FaultKind, int]] = {
    "mixed": {
        "partition": 28,
        "heal": 18,
        "slow_link": 8,
        "kill": 14,
        "power_loss": 14,
        "cluster_restart": 6,
        "clock_rate": 12,
    },
    "power": {
        "partition": 10,
        "heal": 10,
        "slow_link": 0,
        "kill": 5,
        "power_loss": 30,
        "cluster_restart": 15,
        "clock_rate": 0,
    },
}


@dataclass(frozen=True, slots=True)
class SimOptions:
    seed: int
    steps: int = 2000  # fault phase length, in steps of dt_ms
    nodes: int = 3
    clients: int = 3
    dt_ms: int = 10
    faults_per_s: float = 0.7  # the nemesis acts this often on average
    bursts_per_s: float = 10.0  # client bursts of 1-4 operations
    heal_s_max: int = 300
    truncates: bool = True
    power_loss: bool = True  # power loss among the faults (else kills only)
    fault_mix: FaultMix = "mixed"
    # The negative control: segment fdatasyncs return without making anything durable.
    lying_disk: bool = False
    # 0: the replicas never quiesce (the fixed seeds, as before quiescence existed); else
    # an idle leader asks its followers to go quiet after this long (quiescence.py).
    quiesce_after_ms: int = 0

    def command_flags(self) -> str:
        """The CLI flags that reproduce these options (besides the seed)."""
        defaults = SimOptions(seed=self.seed)
        flags = []
        for name, flag in (
            ("steps", "--steps"),
            ("nodes", "--nodes"),
            ("clients", "--clients"),
            ("faults_per_s", "--faults-per-s"),
            ("bursts_per_s", "--bursts-per-s"),
            ("heal_s_max", "--heal-s-max"),
            ("quiesce_after_ms", "--quiesce-after-ms"),
        ):
            if getattr(self, name) != getattr(defaults, name):
                flags.append(f"{flag} {getattr(self, name)}")
        if not self.truncates:
            flags.append("--no-truncates")
        if not self.power_loss:
            flags.append("--no-power-loss")
        if self.fault_mix != defaults.fault_mix:
            flags.append(f"--fault-mix {self.fault_mix}")
        if self.lying_disk:
            flags.append("--lying-disk")
        return " ".join(flags)


@dataclass(slots=True)
class FaultCounts:
    partitions: int = 0
    heals: int = 0
    slow_links: int = 0
    kills: int = 0
    power_losses: int = 0
    cluster_restarts: int = 0
    clock_changes: int = 0
    restarts: int = 0


@dataclass(slots=True)
class SeedResult:
    seed: int
    trace_hash: str
    converged: bool
    violations: list[str]
    faults: FaultCounts
    leader_elections: int
    quiet_steps: int  # steps at whose end the leader was quiet (agreed with its followers)
    quiet_leader_crashes: int  # kills and power losses of a leader that was quiet
    quiet_partitions: int  # partitions that began while the leader was quiet
    appends_ok: int
    appends_fail: int
    appends_info: int
    reads_ok: int
    truncates_ok: int
    disconnects: int
    messages: int
    final_lsn: int
    first_lsn: int
    sim_s: float
    converge_s: float
    cpu_s: float
    evidence: Evidence = field(repr=False)

    def summary(self) -> dict[str, object]:
        out = asdict(self)
        del out["evidence"]
        return out


class Simulation:
    def __init__(self, options: SimOptions) -> None:
        self.options = options
        seed = options.seed
        names = [f"n{i}" for i in range(1, options.nodes + 1)]
        self._names = names
        addresses = {name: f"10.0.0.{i}:7000" for i, name in enumerate(names, 1)}
        offsets = random.Random(f"{seed}:clock")
        self.clock = VirtualClock({n: offsets.randrange(1000 * NS_PER_S) for n in names})
        timing = Timing(quiesce_after_ms=options.quiesce_after_ms)
        self.network = SimNetwork(
            random.Random(f"{seed}:network"),
            self.clock,
            addresses,
            timing.connection_timeout_ms * NS_PER_MS,
        )
        self.nodes = {
            n: SimNode(n, addresses, self.clock, timing, lying_disk=options.lying_disk)
            for n in names
        }
        self._nemesis_rng = random.Random(f"{seed}:nemesis")
        self._client_rng = random.Random(f"{seed}:clients")
        self.workload = Workload(
            random.Random(f"{seed}:workload"),
            self.clock,
            self.nodes,
            options.clients,
            truncates=options.truncates and not options.lying_disk,
            lying_disk=options.lying_disk,
        )
        self.observer = Observer(self.clock, {a: n for n, a in addresses.items()})
        self.network.after_delivery = lambda name: self.observer.after_tick(self.nodes[name])
        self.nemesis: list[NemesisEvent] = []
        self.faults = FaultCounts()
        self.violations: list[str] = []
        self._restart_at: dict[str, int] = {}
        self._failed_restart: set[str] = set()
        self._dt_ns = options.dt_ms * NS_PER_MS
        self._hash = hashlib.blake2b(digest_size=16)
        self._steps = 0
        self._quiet_steps = 0
        self._quiet_leader_crashes = 0
        self._quiet_partitions = 0

    # -- the run ---------------------------------------------------------------------------

    @contextmanager
    def session(self) -> Iterator[None]:
        """The simulated world is installed (pysyncobj's clock and randomness, the network)
        and every node started; on exit every node is killed and the host's clock restored.
        `run` uses it; scripted scenarios (tests/chaos/test_dst.py) use it with `run_for`."""
        # pysyncobj draws election timeouts from the global `random`.
        random.seed(f"{self.options.seed}:pysyncobj")
        logging.disable(logging.CRITICAL)  # failures surface as violations, not log lines
        raft_patches.set_monotonic_clock(self.clock.monotonic_s)
        self.network.activate()
        try:
            for name in self._names:
                self._start(name)
            yield
        finally:
            for node in self.nodes.values():
                if node.up:
                    node.kill()
            self.network.deactivate()
            raft_patches.set_monotonic_clock(None)
            logging.disable(logging.NOTSET)

    def run_for(self, seconds: float) -> None:
        """Scripted scenarios: step without nemesis or random clients."""
        for _ in range(round(seconds * NS_PER_S / self._dt_ns)):
            self._step(faults=False, clients=False)

    def leader(self) -> str | None:
        """The node that leads in the highest term, as the nodes themselves believe."""
        return self._leader()

    def crash(self, name: str, *, power: bool) -> None:
        """Scripted scenarios: kill `name` (or cut its power); it stays down until
        `restart`."""
        self._restart_at.pop(name, None)
        self._crash(name, power=power)

    def restart(self, name: str) -> None:
        self._start(name)

    def run(self) -> SeedResult:
        started_cpu = time.process_time()
        options = self.options
        with self.session():
            for _ in range(options.steps):
                self._step(faults=True)
            heal_started_ns = self.clock.now_ns
            converged = self._heal_and_converge()
            converge_s = (self.clock.now_ns - heal_started_ns) / NS_PER_S
            self.workload.finish()
            all_up = all(node.up and node.fatal is None for node in self.nodes.values())
            dumps = self._dumps() if all_up else []
        evidence = Evidence(
            ops=self.workload.ops,
            dumps=dumps,
            events=self.observer.events,
            nemesis=self.nemesis,
        )
        violations = [
            *self.observer.violations,
            *self.violations,
            *safety_violations(evidence, power_loss=self.faults.power_losses > 0),
        ]
        if self.observer.violations_dropped:
            violations.append(f"... and {self.observer.violations_dropped} more of the observer's")
        if not converged:
            violations.append(
                f"L2 not converged within {options.heal_s_max} simulated s after the heal: "
                + self._progress()
            )
        for item in (*evidence.ops, *evidence.events, *evidence.nemesis, *dumps):
            self._hash.update(repr(item).encode())
        stats = self.workload.stats
        final = dumps[0] if dumps else None
        return SeedResult(
            seed=options.seed,
            trace_hash=self._hash.hexdigest(),
            converged=converged,
            violations=violations,
            faults=self.faults,
            leader_elections=self.observer.leader_elections,
            quiet_steps=self._quiet_steps,
            quiet_leader_crashes=self._quiet_leader_crashes,
            quiet_partitions=self._quiet_partitions,
            appends_ok=stats.appends_ok,
            appends_fail=stats.appends_fail,
            appends_info=stats.appends_info,
            reads_ok=stats.reads_ok,
            truncates_ok=stats.truncates_ok,
            disconnects=self.network.stats.disconnects,
            messages=self.network.stats.delivered,
            final_lsn=final.last_lsn if final else 0,
            first_lsn=final.first_lsn if final else 0,
            sim_s=self.clock.now_ns / NS_PER_S,
            converge_s=converge_s,
            cpu_s=round(time.process_time() - started_cpu, 3),
            evidence=evidence,
        )

    def _step(self, *, faults: bool, clients: bool = True) -> None:
        self._steps += 1
        self.clock.advance(self._dt_ns)
        self.network.step()
        if faults and self._nemesis_rng.random() < self.options.faults_per_s * self._dt_s:
            self._inject_fault()
        for name in self._names:
            due = self._restart_at.get(name)
            if due is not None and due <= self.clock.now_ns:
                del self._restart_at[name]
                self._start(name)
        if clients and self._client_rng.random() < self.options.bursts_per_s * self._dt_s:
            self.workload.burst(self._client_rng.randint(1, OPS_PER_BURST_MAX))
        for name in self._names:
            node = self.nodes[name]
            if not node.up or node.fatal is not None:
                continue
            alive = node.tick()
            self.observer.after_tick(node)
            if not alive:
                self._on_fatal(node)
        self.workload.expire()
        if self._leader_is_quiet():
            self._quiet_steps += 1
        if self._steps % 50 == 0:
            self._hash.update(self._state_line().encode())

    @property
    def _dt_s(self) -> float:
        return self._dt_ns / NS_PER_S

    # -- nodes -----------------------------------------------------------------------------

    def _start(self, name: str) -> None:
        node = self.nodes[name]
        try:
            node.start()
        except Exception as exc:
            self._failed_restart.add(name)
            self.violations.append(
                f"t={self.clock.now_ns / NS_PER_S:.2f}s {name} failed to restart: "
                f"{type(exc).__name__}: {exc}"
            )
            node.kill()
            return
        self._failed_restart.discard(name)
        self.faults.restarts += node.incarnation > 1
        self.observer.on_start(node)

    def _on_fatal(self, node: SimNode) -> None:
        self.violations.append(
            f"t={self.clock.now_ns / NS_PER_S:.2f}s {node.name} stopped on a fatal error:\n"
            f"{node.fatal}"
        )
        self._down(node.name)
        node.kill()
        # A supervisor restarts a replica that stopped; if the cause persists, so do the
        # violations.
        self._restart_at[node.name] = self.clock.now_ns + RESTART_DELAY_NS_MAX

    def _down(self, name: str) -> None:
        self.workload.on_node_down(name)

    def _leader(self) -> str | None:
        """The node that leads in the highest term, as the nodes themselves believe."""
        best: tuple[int, str] | None = None
        for name, node in sorted(self.nodes.items()):
            if node.replica is not None and node.fatal is None and node.replica.is_leader:
                candidate = (node.replica.node.term, name)
                best = candidate if best is None or candidate > best else best
        return None if best is None else best[1]

    # -- the nemesis -----------------------------------------------------------------------

    def _inject_fault(self) -> None:
        rng = self._nemesis_rng
        weights = dict(FAULT_WEIGHTS[self.options.fault_mix])
        if not self.options.power_loss:
            weights["power_loss"] = 0
        kinds = list(weights)
        kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
        up = [n for n in self._names if self.nodes[n].up]
        if kind == "partition":
            self._quiet_partitions += self._leader_is_quiet()
            spec = rng.choice(PARTITION_SPECS)
            cuts, detail = partition_cuts(spec, self._names, self._leader(), rng)
            reset = rng.random() < 0.5
            self.network.set_cuts(cuts, reset=reset)
            self.faults.partitions += 1
            self._nemesis("start", "partition", (), detail + (", reset" if reset else ""))
        elif kind == "heal":
            self.network.heal()
            self.faults.heals += 1
            self._nemesis("end", "partition", (), "heal: all links pass, no extra delay")
        elif kind == "slow_link":
            src, dst = rng.sample(self._names, 2)
            delay = rng.randint(SLOW_LINK_DELAY_NS_MIN, SLOW_LINK_DELAY_NS_MAX)
            self.network.slow_link(src, dst, delay)
            self.faults.slow_links += 1
            self._nemesis("start", "delay", (src, dst), f"{src}->{dst} +{delay // NS_PER_MS} ms")
        elif kind in ("kill", "power_loss"):
            if not up:
                return
            leader = self._leader()
            target = leader if leader is not None and rng.random() < 0.35 else rng.choice(up)
            self._crash(target, power=kind == "power_loss")
            self._restart_at[target] = self.clock.now_ns + rng.randint(
                RESTART_DELAY_NS_MIN, RESTART_DELAY_NS_MAX
            )
        elif kind == "cluster_restart":
            power = self.options.power_loss and (
                self.options.fault_mix == "power" or rng.random() < 0.5
            )
            for name in up:
                self._crash(name, power=power)
            for name in self._names:
                if name not in self._failed_restart:
                    self._restart_at[name] = (
                        self.clock.now_ns + self._dt_ns + rng.randrange(CLUSTER_RESTART_SPREAD_NS)
                    )
            self.faults.cluster_restarts += 1
            self._nemesis("info", "cluster_restart", tuple(up), "power loss" if power else "kill")
        else:
            assert kind == "clock_rate"
            name = rng.choice(self._names)
            rate = (
                rng.choice((1.0, *CLOCK_RATES))
                if self.clock.rate(name) != 1.0
                else (rng.choice(CLOCK_RATES))
            )
            self.clock.set_rate(name, rate)
            self.faults.clock_changes += 1
            self._nemesis("info", "clock_rate", (name,), f"x{rate}")

    def _leader_is_quiet(self, name: str | None = None) -> bool:
        name = self._leader() if name is None else name
        replica = None if name is None else self.nodes[name].replica
        return replica is not None and replica.is_leader and replica.node.quiet

    def _crash(self, name: str, *, power: bool) -> None:
        node = self.nodes[name]
        if self._leader_is_quiet(name):
            self._quiet_leader_crashes += 1
        self._down(name)
        if power:
            rng = self._nemesis_rng
            mode = rng.choice(POWER_LOSS_MODES)
            names = rng.choice(NAMES_MODES)
            node.power_loss(mode, names, rng)
            self.faults.power_losses += 1
            self._nemesis("info", "power_loss", (name,), f"mode={mode} names={names}")
        else:
            node.kill()
            self.faults.kills += 1
            self._nemesis("info", "kill", (name,))

    def _nemesis(
        self,
        phase: Literal["start", "end", "info"],
        fault: str,
        targets: tuple[str, ...],
        detail: str = "",
    ) -> None:
        self.nemesis.append(NemesisEvent(self.clock.now_ns, phase, fault, targets, True, detail))

    # -- the heal --------------------------------------------------------------------------

    def _heal_and_converge(self) -> bool:
        self.network.heal()
        for name in self._names:
            self.clock.set_rate(name, 1.0)
        self._nemesis("end", "all", (), "final heal: links pass, clocks x1, every node up")
        for name in self._names:
            if not self.nodes[name].up and name not in self._failed_restart:
                self._restart_at.pop(name, None)
                self._start(name)
        deadline = self.clock.now_ns + self.options.heal_s_max * NS_PER_S
        probes: dict[str, str] = {}  # client -> op id of its current liveness probe
        next_probe_ns = self.clock.now_ns
        while self.clock.now_ns < deadline:
            if self.clock.now_ns >= next_probe_ns:
                next_probe_ns = self.clock.now_ns + PROBE_RETRY_NS
                self._probe(probes)
            self._step(faults=False, clients=False)
            if self._converged(probes):
                return True
        return False

    def _probe(self, probes: dict[str, str]) -> None:
        """Each client whose last probe is not acknowledged (and not in flight) appends."""
        outcomes = {client: self.workload.outcome_of(op) for client, op in probes.items()}
        if probes and all(outcome == "ok" for outcome in outcomes.values()):
            return
        if any(outcome is None for outcome in outcomes.values()):
            return  # some probe is still in flight
        for op_id in self.workload.append_from_every_client():
            probes[op_id.split(":")[0]] = op_id

    def _converged(self, probes: dict[str, str]) -> bool:
        if not probes or any(self.workload.outcome_of(op) != "ok" for op in probes.values()):
            return False
        if self.workload.pending_count:
            return False
        replicas = []
        for node in self.nodes.values():
            if node.replica is None or node.fatal is not None:
                return False
            replicas.append(node.replica)
        leaders = [r for r in replicas if r.is_leader]
        if len(leaders) != 1:
            return False
        leader = leaders[0]
        last = leader.store.last_index
        if leader.node.commit_index != last:
            return False
        for replica in replicas:
            if replica.store.last_index != last or replica.node.last_applied != last:
                return False
            if replica.store.first_index != leader.store.first_index:
                return False
        # Settled: nothing can change any more. Whether every acknowledged LSN made it is
        # for the checkers to say (S1/S13), from the dumps.
        return True

    def _progress(self) -> str:
        parts = []
        for name, node in sorted(self.nodes.items()):
            replica = node.replica
            if replica is None:
                parts.append(f"{name}: down")
                continue
            parts.append(
                f"{name}: term={replica.node.term} leader={replica.is_leader} "
                f"journal=[{replica.store.first_index},{replica.store.last_index}] "
                f"commit={replica.node.commit_index} applied={replica.node.last_applied}"
                + (" FATAL" if node.fatal else "")
            )
        return "; ".join(parts) + f"; pending ops={self.workload.pending_count}"

    # -- evidence --------------------------------------------------------------------------

    def _dumps(self) -> list[ReplicaDump]:
        dumps = []
        digests = {}
        for name, node in sorted(self.nodes.items()):
            replica = node.replica
            assert replica is not None
            status = replica.status()
            digests[name] = status["state_digest"]
            first_lsn, next_lsn = status["first_lsn"], status["next_lsn"]
            records: list[tuple[int, bytes]] = []
            lsn = first_lsn
            while lsn < next_lsn:
                try:
                    result = replica.read(lsn, DUMP_READ_BYTES)
                except CommandCorrupt as exc:  # the negative control's lying disk
                    self.violations.append(f"S11 {name}: a read from LSN {lsn} failed: {exc}")
                    break
                if not result.records:
                    break
                records.extend((lsn + i, r) for i, r in enumerate(result.records))
                if result.next_lsn <= lsn:
                    # Only a broken replica (the negative control's lying disk) answers so;
                    # reading on would never end.
                    self.violations.append(
                        f"S11 {name}: a read from LSN {lsn} answered next_lsn {result.next_lsn}"
                    )
                    break
                lsn = result.next_lsn
            dumps.append(ReplicaDump(name, SHARD, first_lsn, next_lsn - 1, tuple(records)))
        if len(set(digests.values())) != 1:
            self.violations.append(f"S11 state machines differ after convergence: {digests}")
        return dumps

    def _state_line(self) -> str:
        parts = [str(self.clock.now_ns)]
        for name in self._names:
            replica = self.nodes[name].replica
            if replica is None:
                parts.append("-")
            else:
                parts.append(
                    f"{replica.node.term}/{replica.node.commit_index}/"
                    f"{replica.node.last_applied}/{int(replica.is_leader)}"
                )
        return " ".join(parts)


def run_seed(options: SimOptions) -> SeedResult:
    return Simulation(options).run()
