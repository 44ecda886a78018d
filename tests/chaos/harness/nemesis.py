"""Fault injection against a `Cluster`, with a log of what was done and whether it took
effect (chaos-plan.md §4.3-§4.6, §4.8 vacuity).

Every fault is logged as `history.NemesisEvent` JSON lines on the workload's clock
(`time.monotonic_ns()`): a "start" when it begins, with `applied` saying whether it was
*confirmed* (the process exited with -9, /proc shows it stopped, a `FAILPOINT` line was
printed, the proxy mesh counted bytes it held back, the power-loss report shows lost
bytes...), and an "end" when it is healed (restart, SIGCONT, link back to pass). Offline
mutations and the harness's own notes are "info" events. A start whose confirmation is
only known later (a partition: the mesh counters after the window) is written when known,
with the time it began; the checkers sort by time.

Fault packages (Jepsen targets, L4): kill the leader, kill random nodes (majorities too),
pause the leader, partitions through the mesh, coordinated power loss of a shard, power
loss of one node, corruption of a minority follower, failpoint crash, clock skew at
restart. Each takes its randomness from the nemesis's seeded `random.Random`.

Optional pieces (the proxy mesh, the disk tools, libfaketime) are imported lazily: a
scenario that needs a missing piece skips with the reason.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.harness.cluster import Cluster, listening, process_state
from tests.chaos.history import NemesisEvent, to_json_line

CONVERGED_FAULT = "converged"  # the checkers' name for "the convergence poll succeeded"
FAILPOINT_WAIT_S = 20.0  # a failpoint on a hot path fires within this under load


class NemesisLog:
    """Append-only JSON lines of NemesisEvent; every line is flushed at once."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.events: list[NemesisEvent] = []
        self._lock = threading.Lock()

    def write(self, event: NemesisEvent) -> NemesisEvent:
        with self._lock:
            self.events.append(event)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(to_json_line(event) + "\n")
        return event

    def start(
        self,
        fault: str,
        targets: Sequence[str],
        applied: bool,
        detail: str = "",
        time_ns: int | None = None,
    ) -> NemesisEvent:
        return self.write(
            NemesisEvent(
                time_ns if time_ns is not None else time.monotonic_ns(),
                "start",
                fault,
                tuple(targets),
                applied,
                detail,
            )
        )

    def end(self, fault: str, targets: Sequence[str], detail: str = "") -> NemesisEvent:
        return self.write(
            NemesisEvent(time.monotonic_ns(), "end", fault, tuple(targets), True, detail)
        )

    def info(
        self, fault: str, targets: Sequence[str] = (), applied: bool = True, detail: str = ""
    ) -> NemesisEvent:
        return self.write(
            NemesisEvent(time.monotonic_ns(), "info", fault, tuple(targets), applied, detail)
        )

    def applied_count(self, fault: str) -> int:
        return sum(e.fault == fault and e.applied and e.phase != "end" for e in self.events)

    def unapplied(self) -> list[NemesisEvent]:
        return [e for e in self.events if e.phase != "end" and not e.applied]


@dataclass(slots=True)
class _Active:
    fault: str
    targets: tuple[str, ...]
    since_ns: int
    data: dict[str, Any] = field(default_factory=dict)


class Nemesis:
    def __init__(
        self,
        cluster: Cluster,
        log: NemesisLog,
        rng: random.Random,
        *,
        mesh: Any = None,
        kernel: Any = None,
        time_scale: float = 1.0,
    ) -> None:
        self.kernel = kernel  # netns.KernelNet, inside a private network namespace
        self.cluster = cluster
        self.log = log
        self.rng = rng
        self.mesh = mesh
        self.time_scale = time_scale
        self.down: dict[str, str] = {}  # node -> the fault that took it down
        self.paused: set[str] = set()
        self.partitions: list[_Active] = []
        self.next_env: dict[str, dict[str, str]] = {}  # env for a node's next start only
        self.power_loss_reports: list[dict[str, Any]] = []

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds * self.time_scale)

    # ------------------------------------------------------------------ processes

    def wait_in_failpoint(self, node_id: str, name: str, wait_s: float = 5.0) -> bool:
        """Wait (bounded) until the node prints a new `FAILPOINT <name>` line: with a
        `sleep(MS)` action it is then inside that window (e.g. between a write and its
        fsync), so a SIGKILL right now leaves unsynced bytes for a power loss (L5)."""
        node = self.cluster.nodes[node_id]
        marker = f"FAILPOINT {name} ".encode()
        try:
            offset = os.path.getsize(node.log_path)
        except OSError:
            return False
        deadline = time.monotonic() + wait_s
        pending = b""
        with open(node.log_path, "rb") as f:
            f.seek(offset)
            while time.monotonic() < deadline:
                chunk = f.read()
                if chunk:
                    pending = (pending + chunk)[-4096:]
                    if marker in pending:
                        return True
                else:
                    time.sleep(0.002)
        return False

    def crash(self, node_id: str, fault: str = "kill", *, in_failpoint: str | None = None) -> bool:
        """SIGKILL; confirmed when the exit status is -9 (we killed it, it had not died).
        `in_failpoint`: first wait (bounded) until the node is inside that failpoint."""
        if in_failpoint is not None:
            self.wait_in_failpoint(node_id, in_failpoint)
        was_running = self.cluster.nodes[node_id].running()
        status = self.cluster.kill(node_id)
        self.paused.discard(node_id)
        applied = was_running and status == -signal.SIGKILL
        self.log.start(fault, [node_id], applied, f"exit status {status}")
        self.down[node_id] = fault
        return applied

    def restart(self, node_id: str, extra_env: Mapping[str, str] | None = None) -> None:
        """Start a node that a fault took down, and end that fault."""
        env = dict(self.next_env.pop(node_id, {}))
        env.update(extra_env or {})
        self.cluster.start(node_id, env)
        fault = self.down.pop(node_id, "kill")
        self.log.end(fault, [node_id], f"restarted pid {self.cluster.nodes[node_id].popen.pid}")  # type: ignore[union-attr]

    def restart_checked(self, node_id: str, wait_s: float = 10.0) -> bool:
        """Restart a node whose data was damaged. A replica that detected corruption is
        quarantined by its node (which keeps serving its other shards): the operator's
        repair is then applied through the admin API (remove the node from the shard on
        the leader, add it back: it restarts empty and catches up), and confirmed by the
        leader reporting it caught up ("quarantine" and "repair" in the nemesis log). If
        the node process itself refuses to start, it stays down, out of the convergence
        poll and the dumps. Returns whether it is running."""
        self.restart(node_id)
        node = self.cluster.nodes[node_id]
        deadline = time.monotonic() + wait_s * self.time_scale
        while time.monotonic() < deadline:
            if not node.running():
                break
            if listening(node.ports.data) and listening(node.ports.admin):
                for shard in sorted(self.cluster.replicas_of):
                    if node_id in self.cluster.replicas_of[shard]:
                        self._repair_if_quarantined(node_id, shard)
                return True
            time.sleep(0.1)
        if node.running():
            return True
        text = self.cluster.log_since_start(node_id)
        refused = "Corruption" in text or "corruption" in text
        self.cluster.kill(node_id)  # reap
        self.cluster.quarantined.add(node_id)
        self.log.info(
            "quarantine",
            [node_id],
            refused,
            f"refused to start (exit {node.last_returncode}): "
            + (text.strip().splitlines() or ["no output"])[-1][:300],
        )
        return False

    def _admin(
        self, node_id: str, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """One admin API call to `node_id` (bounded): (HTTP status, JSON body)."""
        url = f"http://127.0.0.1:{self.cluster.nodes[node_id].ports.admin}{path}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.cluster.token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")
        except (OSError, ValueError) as exc:
            return 0, {"message": str(exc)}

    def _repair_if_quarantined(self, node_id: str, shard: int) -> None:
        """If `node_id` quarantined its replica of `shard`, repair it as an operator
        would, and wait (bounded) until the leader counts it caught up."""
        deadline = time.monotonic() + 15.0 * self.time_scale
        while True:  # the admin API answers once the node has opened its replicas
            status, answer = self._admin(node_id, "GET", f"/v1/shards/{shard}")
            if status != 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if not (status == 503 and "quarantined" in str(answer.get("message", ""))):
            return
        self.log.info("quarantine", [node_id], True, str(answer.get("message", ""))[:300])
        repaired, detail = False, ""
        deadline = time.monotonic() + 60.0 * self.time_scale
        while time.monotonic() < deadline and not repaired:
            found = self.cluster.wait_leader(shard, 10.0 * self.time_scale, not_node=node_id)
            if found is None:
                detail = "no leader"
                continue
            leader = found[0]
            members = self._admin(leader, "GET", f"/v1/shards/{shard}")[1].get("replicas", [])
            if any(r.get("node_id") == node_id for r in members):
                status, answer = self._admin(
                    leader, "DELETE", f"/v1/shards/{shard}/replicas/{node_id}"
                )
                detail = f"remove: {status} {answer.get('code', '')}"
                if status != 200:
                    time.sleep(1.0)
                    continue
            status, answer = self._admin(
                leader, "POST", f"/v1/shards/{shard}/replicas", {"node_id": node_id}
            )
            detail = f"add: {status} {answer.get('code', '')}"
            if status not in (200, 201):
                time.sleep(1.0)
                continue
            while time.monotonic() < deadline:
                replicas = self._admin(leader, "GET", f"/v1/shards/{shard}")[1].get("replicas", [])
                if any(r.get("node_id") == node_id and r.get("caught_up") for r in replicas):
                    repaired = True
                    break
                time.sleep(0.5)
        self.log.info("repair", [node_id], repaired, detail)

    def kill_leader(self, shard: int) -> tuple[str, int] | None:
        """SIGKILL the shard's current leader (found through the product's status);
        returns (node, term) for `confirm_leader_change`."""
        # Bounded wait: right after an earlier fault the shard may still be electing.
        found = self.cluster.wait_leader(shard, 15.0 * self.time_scale)
        if found is None:
            self.log.info("kill", [], False, f"shard {shard}: no leader to kill")
            return None
        self.crash(found[0])
        return found

    def confirm_leader_change(
        self, shard: int, old: tuple[str, int], wait_s: float = 20.0
    ) -> tuple[str, int] | None:
        """Confirm (bounded wait) that the shard elected a leader in a term above the old
        leader's: an info 'leader_change' event, applied when seen."""
        new = self.cluster.wait_leader(shard, wait_s * self.time_scale, term_above=old[1])
        self.log.info(
            "leader_change",
            [old[0]],
            new is not None,
            f"shard {shard}: {old[0]}@{old[1]} -> "
            + (f"{new[0]}@{new[1]}" if new else "no new leader"),
        )
        return new

    def confirm_term(
        self, fault: str, node_id: str, shard: int, term_min: int, wait_s: float = 20.0
    ) -> bool:
        """Confirm (bounded wait) that `node_id` reports a term of `shard` of at least
        `term_min` through its own status: an old leader back from a pause or a partition
        learnt that it was deposed ("deposed", term_min = its old term + 1), or a node
        follows the current leader ("rejoined"). An info event, applied when seen."""
        deadline = time.monotonic() + wait_s * self.time_scale
        status = self.cluster.status(node_id, shard)
        while (status is None or status.term < term_min) and time.monotonic() < deadline:
            time.sleep(0.1)
            status = self.cluster.status(node_id, shard)
        seen = status is not None and status.term >= term_min
        self.log.info(
            fault,
            [node_id],
            seen,
            f"shard {shard}: term "
            + (f"{status.term} (leader {status.is_leader})" if status else "unknown")
            + f", wanted >= {term_min}",
        )
        return seen

    def crash_all(
        self,
        node_ids: Sequence[str],
        fault: str = "kill",
        *,
        in_failpoint: tuple[str, str] | None = None,
    ) -> bool:
        """SIGKILL several nodes at once (a coordinated crash); all must be confirmed.
        `in_failpoint` = (node, failpoint): first wait until that node is inside it."""
        if in_failpoint is not None:
            self.wait_in_failpoint(*in_failpoint)
        running = {n for n in node_ids if self.cluster.nodes[n].running()}
        for node_id in node_ids:
            node = self.cluster.nodes[node_id]
            if node.popen is not None and node.running():
                os.killpg(node.popen.pid, signal.SIGKILL)
        applied = True
        for node_id in node_ids:
            status = self.cluster.kill(node_id)
            ok = node_id in running and status == -signal.SIGKILL
            applied = applied and ok
            self.log.start(fault, [node_id], ok, f"exit status {status}")
            self.down[node_id] = fault
            self.paused.discard(node_id)
        return applied

    def kill_random(self, count: int) -> list[str]:
        candidates = [n for n in self.cluster.node_ids if self.cluster.nodes[n].running()]
        chosen = self.rng.sample(candidates, min(count, len(candidates)))
        for node_id in chosen:
            self.crash(node_id)
        return chosen

    def pause(self, node_id: str) -> bool:
        applied = self.cluster.pause(node_id)
        state = process_state(self.cluster.nodes[node_id].popen.pid)  # type: ignore[union-attr]
        self.log.start("pause", [node_id], applied, f"process state {state}")
        self.paused.add(node_id)
        return applied

    def resume(self, node_id: str) -> None:
        self.cluster.resume(node_id)
        self.paused.discard(node_id)
        self.log.end("pause", [node_id])

    def pause_leader(self, shard: int) -> tuple[str, int] | None:
        found = self.cluster.leader(shard)
        if found is None:
            self.log.info("pause", [], False, f"shard {shard}: no leader to pause")
            return None
        self.pause(found[0])
        return found

    def restart_all(self) -> float:
        """Whole-cluster crash and restart within ~100 ms (PySyncObj #201/#202)."""
        targets = self.cluster.node_ids
        envs = {n: self.next_env.pop(n, {}) for n in targets}
        began_ns = time.monotonic_ns()
        statuses, spread_s = self.cluster.kill_all_and_restart(envs)
        applied = all(s == -signal.SIGKILL for s in statuses.values()) and spread_s < 0.5
        self.log.start(
            "restart_all",
            targets,
            applied,
            f"exit statuses {statuses}; starts spread {spread_s * 1000:.0f} ms",
            time_ns=began_ns,
        )
        self.log.end("restart_all", targets)
        self.paused.clear()
        return spread_s

    # ------------------------------------------------------------------ failpoints, clock

    def failpoint_crash(self, node_id: str, spec: str, wait_s: float = FAILPOINT_WAIT_S) -> bool:
        """Restart `node_id` (which must be down) with LOGSVC_FAILPOINTS=`spec`; confirmed
        when its output shows a `FAILPOINT` line and it exited. The node stays down."""
        assert not self.cluster.nodes[node_id].running()
        prior = self.down.pop(node_id, None)
        if prior is not None:  # the crash that took it down ends with this start
            self.log.end(prior, [node_id], "restarted with a failpoint armed")
        self.cluster.start(node_id, {"LOGSVC_FAILPOINTS": spec})
        since = time.monotonic_ns()
        deadline = time.monotonic() + wait_s * self.time_scale
        hits: list[str] = []
        while time.monotonic() < deadline:
            hits = self.cluster.failpoint_hits(node_id)
            if hits and not self.cluster.nodes[node_id].running():
                break
            time.sleep(0.05)
        status = self.cluster.nodes[node_id].popen.poll()  # type: ignore[union-attr]
        applied = bool(hits) and status is not None
        if not applied:  # it never hit: do not leave it running with the failpoint armed
            self.cluster.kill(node_id)
        self.log.start(
            "failpoint",
            [node_id],
            applied,
            f"{spec}: hits {hits[:3]}, exit status {status}",
            time_ns=since,
        )
        self.down[node_id] = "failpoint"
        return applied

    def arm_failpoint_running(self, node_id: str, spec: str) -> None:
        """Restart a running node with a failpoint armed (kill, then start with the env);
        the caller waits for the hit with `wait_failpoint`."""
        self.cluster.kill(node_id)
        self.cluster.start(node_id, {"LOGSVC_FAILPOINTS": spec})

    def clock_env(self, offset_s: float, rate: float) -> dict[str, str] | None:
        """libfaketime environment for the next start, None when unavailable."""
        try:
            clock = importlib.import_module("tests.chaos.harness.clock")
        except ImportError:
            return None
        ok, _why = clock.available()
        if not ok:
            return None
        env: dict[str, str] = clock.faketime_env(offset_s, rate)
        return env

    def restart_with_clock(self, node_id: str, offset_s: float, rate: float) -> bool:
        """Crash a node and restart it with a skewed clock (offset and/or rate)."""
        env = self.clock_env(offset_s, rate)
        if env is None:
            self.log.info("clock", [node_id], False, "libfaketime not available")
            return False
        self.crash(node_id)
        self.restart(node_id, env)
        pid = self.cluster.nodes[node_id].popen.pid  # type: ignore[union-attr]
        applied = _library_loaded(pid, "libfaketime", 5.0)
        self.log.start("clock", [node_id], applied, f"offset {offset_s} s, rate x{rate}")
        return applied

    def end_clock(self, node_id: str) -> None:
        """Restart the node with the real clock."""
        self.crash(node_id, fault="kill")
        self.restart(node_id)
        self.log.end("clock", [node_id])

    # ------------------------------------------------------------------ disk (offline)

    def _disk(self) -> Any:
        return importlib.import_module("tests.chaos.harness.disk")

    def power_loss(self, node_ids: Sequence[str], mode: str | None = None) -> bool:
        """The nodes must be down (SIGKILLed). Cut each data directory back to what its
        durability ledger says was synced (disk.power_loss); confirmed when some node had
        unsynced bytes or names to lose (a non-vacuous report). One info event."""
        disk = self._disk()
        if not self.cluster.uses_node_main():
            self.log.info("power_loss", node_ids, False, "no durability ledger")
            return False
        lost_any = False
        details = []
        for node_id in node_ids:
            node = self.cluster.nodes[node_id]
            assert not node.running(), f"{node_id} must be down for a power loss"
            chosen = mode or self.rng.choice(list(disk.POWER_LOSS_MODES))
            report = disk.power_loss(node.data_dir, node.ledger_path, chosen, self.rng)
            self.power_loss_reports.append({"node": node_id, "describe": report.describe()})
            lost_any = lost_any or not report.vacuous
            details.append(f"{node_id}: {report.describe()[:1500]}")
        self.log.info("power_loss", node_ids, lost_any, " | ".join(details))
        return lost_any

    def corrupt(self, node_id: str, kinds: Sequence[str] = ("bitflip", "truncate_file")) -> bool:
        """Offline damage on a dead replica, in every shard it hosts: by default a bit
        flip in a sealed segment and a Zipf cut of a live segment (Jepsen's file faults).
        One info event per mutation, applied when it found something to damage."""
        disk = self._disk()
        node = self.cluster.nodes[node_id]
        assert not node.running()
        functions = {
            "bitflip": disk.bitflip_sealed_segment,
            "truncate_file": disk.truncate_file,
            "torn_tail": disk.torn_tail,
        }
        applied = False
        for shard in self.cluster.shards:
            if node_id not in self.cluster.replicas_of[shard]:
                continue
            for kind in kinds:
                mutation = functions[kind](node.data_dir, shard, self.rng)
                applied = applied or mutation.applied
                self.log.info(
                    kind, [node_id], mutation.applied, f"shard {shard}: {mutation.describe()}"
                )
        if self.cluster.uses_node_main():
            # The damage is "durable" as it is now: a later power loss must not undo it.
            disk.reset_ledger(node.data_dir, node.ledger_path)
        return applied

    # ------------------------------------------------------------------ network

    def partition(
        self,
        spec: str,
        shard: int | None = None,
        *,
        nodes: Sequence[str] | None = None,
        mode: str = "blackhole",
    ) -> Any:
        """Block what the mesh's partition `spec` names (one, leader, majority-minority,
        bridge, one-way-from-leader, one-way-to-leader) among `nodes` (default: the
        shard's replicas, shuffled by the seed; the leader first for leader specs), on
        `shard` (None: every shard). Replaces any partition in force. The start is logged
        at the heal, with its start time, confirmed by the mesh counters of the blocked
        directions (bytes held or dropped, connections reset or refused)."""
        assert self.mesh is not None, "partitions need the proxy mesh"
        self.heal_network()
        probe_shard = shard if shard is not None else self.cluster.shards[0]
        chosen_nodes = list(nodes or self.cluster.replicas_of[probe_shard])
        self.rng.shuffle(chosen_nodes)
        # The mesh puts the leader first, and never makes it the bridge: a bridge spec
        # around a leader in the middle would only cut two idle followers apart.
        # Bounded wait, as `kill_leader`'s: one round of probes can find no leader that
        # confirms itself (an election under way, a barrier slower than the probe on a
        # loaded box), and a leader spec was then not applied at all (chaos C4, seed 6,
        # 3 of 19 loaded runs: "leader: no leader of 1" right after a restart).
        found = (
            self.cluster.wait_leader(probe_shard, 15.0 * self.time_scale)
            if "leader" in spec
            else self.cluster.leader(probe_shard)
        )
        leader = found[0] if found is not None and found[0] in chosen_nodes else None
        if spec == "one":
            leader = None  # a random node alone ("leader" is the spec for the leader)
        if "leader" in spec and leader is None:
            self.log.info("partition", [], False, f"{spec}: no leader of {probe_shard}")
            return None
        since = time.monotonic_ns()
        before = self.mesh.all_stats()
        chosen = self.mesh.partition(spec, chosen_nodes, leader, shard=shard, mode=mode)
        targets = tuple(sorted({n for pair in chosen.blocked for n in pair}))
        self.partitions.append(
            _Active(
                "partition",
                targets,
                since,
                {"before": before, "chosen": chosen, "shard": shard, "spec": spec, "mode": mode},
            )
        )
        return chosen

    def delay(self, a: str, b: str, ms: int, jitter_ms: int) -> None:
        """Delay both directions of the a-b links; confirmed at the heal by bytes that
        went through the delayed links."""
        assert self.mesh is not None, "delays need the proxy mesh"
        since = time.monotonic_ns()
        before = self.mesh.all_stats()
        self.mesh.set_link(a, b, f"delay:{ms}:{jitter_ms}")
        self.partitions.append(
            _Active(
                "delay",
                (a, b),
                since,
                {"before": before, "spec": f"{ms}+-{jitter_ms} ms", "pair": (a, b)},
            )
        )

    def heal_network(self) -> None:
        if self.mesh is None or not self.partitions:
            return
        ended, self.partitions = self.partitions, []
        after = self.mesh.all_stats()
        self.mesh.heal()
        for active in ended:
            before = active.data["before"]
            if active.fault == "delay":
                a, b = active.data["pair"]
                moved = 0
                for key, stats in after.items():
                    if set(key[:2]) == {a, b}:
                        delta = stats.since(before[key])
                        moved += delta.a_to_b.bytes_forwarded + delta.b_to_a.bytes_forwarded
                applied = moved > 0
                detail = f"delay {active.data['spec']} on {a}-{b}: {moved} bytes delayed"
            else:
                held = 0
                resets = 0
                for sender, receiver in active.data["chosen"].blocked:
                    x, y = sorted((sender, receiver))
                    for key, stats in after.items():
                        if key[:2] != (x, y) or active.data["shard"] not in (None, key[2]):
                            continue
                        delta = stats.since(before[key])
                        direction = delta.a_to_b if sender == x else delta.b_to_a
                        held += direction.bytes_queued + direction.bytes_dropped
                        resets += delta.connections_reset + delta.connections_refused
                applied = held > 0 or resets > 0
                detail = (
                    f"{active.data['spec']} ({active.data['mode']}) shard "
                    f"{active.data['shard']}: groups {active.data['chosen'].groups}, "
                    f"{held} bytes held/dropped, {resets} connections reset/refused"
                )
            self.log.start(active.fault, active.targets, applied, detail, time_ns=active.since_ns)
            self.log.end(active.fault, active.targets)

    def kernel_loss(self, node_id: str, probability: float, hold_s: float) -> bool:
        """Real packet loss (iptables statistic) on everything `node_id` sends, for
        `hold_s`; confirmed by the rule's drop counter."""
        assert self.kernel is not None, "kernel faults need netns.KernelNet"
        since = time.monotonic_ns()
        before = self.kernel.counters().get(f"loss:{node_id}", (0, 0))[0]
        self.kernel.loss(node_id, probability)
        self.sleep(hold_s)
        after = self.kernel.counters().get(f"loss:{node_id}", (0, 0))[0]
        self.kernel.heal()
        dropped = int(after) - int(before)
        self.log.start(
            "loss",
            [node_id],
            dropped > 0,
            f"iptables statistic p={probability}: {dropped} packets dropped",
            time_ns=since,
        )
        self.log.end("loss", [node_id])
        return dropped > 0

    # ------------------------------------------------------------------ heal

    def heal(self) -> None:
        """Resume the paused, heal the network, restart every node that is down."""
        for node_id in sorted(self.paused):
            self.resume(node_id)
        self.heal_network()
        for node_id in self.cluster.node_ids:
            if node_id in self.cluster.quarantined:
                continue
            if not self.cluster.nodes[node_id].running():
                if node_id not in self.down:
                    self.down[node_id] = "kill"
                self.restart(node_id)


def _library_loaded(pid: int, name: str, wait_s: float) -> bool:
    """Whether the process mapped a library whose path contains `name` (polled, bounded:
    right after exec the dynamic loader may not have run yet)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/maps") as f:
                if name in f.read():
                    return True
        except OSError:
            return False
        time.sleep(0.05)
    return False


Schedule = Callable[[Nemesis], None]
