"""Simulated clients: appends, reads and truncates against the real replicas, recorded as
history `Op`s (chaos-plan §4.7) on the simulator's global clock.

Outcomes, conservatively (Jepsen; plan L7):

* `fail` only when nothing can have been proposed: `submit` raised before queueing
  (NotLeader, Overloaded, ReplicaFailed), or Raft answered NOT_LEADER / MISSING_LEADER
  (pysyncobj never proposed it), or the state machine refused it (a refusal consumes no
  LSN and changes nothing).
* `info` for everything else: OutcomeUnknown (discarded, leader changed), a timeout, or the
  node crashing under the operation (the client's connection reset). A pending operation
  left at the end of the run is `info` with `complete_ns=None`.
* Reads are served by any replica from its applied (committed) state, so they may be stale
  but never uncommitted; they are ordinary `read` ops (not `tail`: no freshness promise).

Every append carries unique payloads (`make_payload`), one `(client, seq)` per batch, and
is never retried, so any duplicate in the log is the service's.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Literal

from logsvc.shard.commands import AppendBatch, Appended, Command, Result, Truncate, Truncated
from logsvc.shard.errors import LsnTruncated, ShardError
from logsvc.shard.replica import NotLeader, Overloaded, ReplicaFailed
from tests.chaos.dst.clock import NS_PER_S, VirtualClock
from tests.chaos.dst.node import SHARD, SimNode
from tests.chaos.history import Op, make_payload

OP_TIMEOUT_NS = 10 * NS_PER_S  # the replica's own PROPOSAL_TIMEOUT_S_DEFAULT
RECORDS_PER_APPEND_MAX = 3
READ_BYTES_MAX = 16 * 1024
READ_RECORDS_MAX = 64
# Per client operation, the mix (appends, reads, truncates); truncates only if enabled.
APPEND_SHARE = 0.72
TRUNCATE_SHARE = 0.03


@dataclass(slots=True)
class _Pending:
    op_id: str
    process: str
    kind: Literal["append", "truncate"]
    node: str
    invoke_ns: int
    payloads: tuple[bytes, ...] = ()
    lsn: int | None = None


@dataclass(slots=True)
class WorkloadStats:
    invoked: int = 0
    appends_ok: int = 0
    appends_fail: int = 0
    appends_info: int = 0
    reads_ok: int = 0
    reads_fail: int = 0
    truncates_ok: int = 0
    ops_by_error: dict[str, int] = field(default_factory=dict)


class Workload:
    def __init__(
        self,
        rng: random.Random,
        clock: VirtualClock,
        nodes: dict[str, SimNode],
        clients: int,
        *,
        truncates: bool,
        lying_disk: bool = False,
    ) -> None:
        self._rng = rng
        self._clock = clock
        self._nodes = nodes
        self._clients = [f"c{i}" for i in range(1, clients + 1)]
        self._name_of = {node.address: name for name, node in nodes.items()}
        self._truncates = truncates
        # The negative control's disk never syncs: committed entries can be lost and then
        # overwritten, which the replicas' invariant asserts may notice before the checkers
        # do (which run is a matter of timing). There, such an assert is a failed read.
        self._lying_disk = lying_disk
        self._seq = dict.fromkeys(self._clients, 0)
        self._hint: dict[str, str | None] = dict.fromkeys(self._clients, None)
        self._pending: dict[str, _Pending] = {}
        self._acked_lsn_max = 0  # the high-water mark clients have observed (acked appends)
        self._truncate_floor = 1
        self.ops: list[Op] = []
        self.stats = WorkloadStats()

    # -- invoking -------------------------------------------------------------------------

    def burst(self, count: int, *, appends_only: bool = False) -> None:
        """`count` operations from one random client, invoked now."""
        client = self._rng.choice(self._clients)
        for _ in range(count):
            roll = self._rng.random()
            if appends_only or roll < APPEND_SHARE:
                self._append(client)
            elif self._truncates and roll < APPEND_SHARE + TRUNCATE_SHARE:
                self._truncate(client)
            else:
                self._read(client)

    def append_from_every_client(self) -> list[str]:
        """One append per client (the liveness probe after the final heal); their op ids."""
        return [self._append(client) for client in self._clients]

    def append_via(self, node: str, client: str) -> str:
        """Scripted scenarios: one append through `node` (no redirect); its op id."""
        return self._append(client, via=node, redirected=True)

    def truncate_via(self, node: str, client: str, lsn: int) -> str:
        """Scripted scenarios: truncate to `lsn` through `node` (no redirect); its op id."""
        self._truncate_floor = max(self._truncate_floor, lsn)
        pending = self._new(client, "truncate", lsn=lsn, via=node)
        self._submit(pending, Truncate(lsn, 0), redirected=True)
        return pending.op_id

    def _append(self, client: str, *, via: str | None = None, redirected: bool = False) -> str:
        self._seq[client] += 1
        seq = self._seq[client]
        count = self._rng.randint(1, RECORDS_PER_APPEND_MAX)
        payloads = tuple(
            make_payload(f"{client}-{seq:08d}-{k}", SHARD, self._rng) for k in range(count)
        )
        pending = self._new(client, "append", payloads=payloads, via=via)
        self._submit(pending, AppendBatch(client, seq, 0, payloads), redirected)
        return pending.op_id

    def _truncate(self, client: str, *, redirected: bool = False) -> None:
        hwm = self._acked_lsn_max + 1
        target = self._truncate_floor + self._rng.randint(0, max(0, hwm - self._truncate_floor))
        self._truncate_floor = target
        pending = self._new(client, "truncate", lsn=target)
        self._submit(pending, Truncate(target, 0), redirected)

    def _read(self, client: str) -> None:
        """A read from a random live replica, answered at once from its applied state."""
        up = [name for name, node in sorted(self._nodes.items()) if node.replica is not None]
        self.stats.invoked += 1
        now = self._clock.now_ns
        hwm = self._acked_lsn_max + 1
        if self._rng.random() < 0.6:
            from_lsn = max(1, hwm - self._rng.randint(0, 12))
        else:
            from_lsn = self._rng.randint(1, hwm)
        op = Op(self._next_op_id(client), client, "read", SHARD, now, now, "ok", from_lsn=from_lsn)
        if not up:
            self._record(dataclasses.replace(op, outcome="fail", error="no replica is up"))
            return
        node = self._nodes[self._rng.choice(up)]
        assert node.replica is not None
        try:
            result = node.replica.read(from_lsn, READ_BYTES_MAX, READ_RECORDS_MAX)
        except LsnTruncated as exc:
            self.stats.reads_fail += 1
            truncated = exc.first_lsn
            self._record(
                dataclasses.replace(
                    op, outcome="fail", truncated_first_lsn=truncated, error="LsnTruncated"
                )
            )
            return
        except ReplicaFailed as exc:
            self.stats.reads_fail += 1
            self._record(dataclasses.replace(op, outcome="fail", error=f"ReplicaFailed: {exc}"))
            return
        except AssertionError as exc:
            if not self._lying_disk:
                raise
            self.stats.reads_fail += 1
            error = f"invariant broken on the lying disk: {exc}"
            self._record(dataclasses.replace(op, outcome="fail", error=error))
            return
        records = tuple((result.first_lsn + i, r) for i, r in enumerate(result.records))
        self.stats.reads_ok += 1
        self._record(dataclasses.replace(op, records=records, next_lsn=result.next_lsn))

    def _new(
        self,
        client: str,
        kind: Literal["append", "truncate"],
        *,
        payloads: tuple[bytes, ...] = (),
        lsn: int | None = None,
        via: str | None = None,
    ) -> _Pending:
        self.stats.invoked += 1
        hint = self._hint[client]
        up = [name for name, node in sorted(self._nodes.items()) if node.replica is not None]
        fallback = self._rng.choice(up) if up else ""
        target = hint if hint is not None and hint in up else fallback
        if via is not None:
            target = via
        return _Pending(
            self._next_op_id(client), client, kind, target, self._clock.now_ns, payloads, lsn
        )

    def _submit(self, pending: _Pending, command: Command, redirected: bool) -> None:
        """Propose through `pending.node`. Refused with NotLeader naming a leader that is
        up, the client follows the redirect once, as a new operation (the refused one
        certainly did nothing)."""
        node = self._nodes.get(pending.node)
        if node is None or node.replica is None:
            self._complete(pending, "fail", error="no replica is up")
            return
        replica = node.replica

        def done(outcome: Result | ShardError) -> None:
            self._on_done(pending.op_id, outcome)

        try:
            with self._clock.running(node.name):
                replica.submit(command, done)
        except NotLeader as exc:
            self._learn_leader(pending.process, exc.leader_hint)
            self._complete(pending, "fail", error="NotLeader")
            hint = self._hint[pending.process]
            if not redirected and hint is not None and hint != pending.node:
                if pending.kind == "append":
                    self._append(pending.process, redirected=True)
                else:
                    self._truncate(pending.process, redirected=True)
            return
        except (Overloaded, ReplicaFailed) as exc:
            self._complete(pending, "fail", error=type(exc).__name__)
            return
        self._pending[pending.op_id] = pending

    # -- completing -----------------------------------------------------------------------

    def _on_done(self, op_id: str, outcome: Result | ShardError) -> None:
        pending = self._pending.pop(op_id, None)
        if pending is None:
            return  # the client gave up on it already (timeout, crash)
        if isinstance(outcome, NotLeader):
            self._learn_leader(pending.process, outcome.leader_hint)
            self._complete(pending, "fail", error="NotLeader")
        elif isinstance(outcome, ShardError):
            self._complete(pending, "info", error=f"{type(outcome).__name__}: {outcome}")
        elif isinstance(outcome, Appended) and pending.kind == "append":
            assert not outcome.duplicate, "no append is ever retried"
            lsns = tuple(range(outcome.first_lsn, outcome.first_lsn + outcome.count))
            self._acked_lsn_max = max(self._acked_lsn_max, *lsns)
            self._complete(pending, "ok", lsns=lsns)
        elif isinstance(outcome, Truncated) and pending.kind == "truncate":
            self._complete(pending, "ok", first_lsn=outcome.first_lsn)
        else:  # a refusal by the state machine (fencing): nothing was appended
            self._complete(pending, "fail", error=type(outcome).__name__)

    def on_node_down(self, name: str) -> None:
        """The node crashed: its clients' connections reset; outcomes unknown."""
        for op_id, pending in list(self._pending.items()):
            if pending.node == name:
                del self._pending[op_id]
                self._complete(pending, "info", error=f"{name} crashed")

    def expire(self) -> None:
        now = self._clock.now_ns
        for op_id, pending in list(self._pending.items()):
            if now - pending.invoke_ns >= OP_TIMEOUT_NS:
                del self._pending[op_id]
                self._complete(pending, "info", error="timeout")

    def finish(self) -> None:
        """The run is over: whatever is still pending never completed."""
        for pending in self._pending.values():
            self._record(self._op(pending, None, "info", error="still pending at the end"))
        self._pending.clear()

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def acked_lsn_max(self) -> int:
        return self._acked_lsn_max

    def outcome_of(self, op_id: str) -> str | None:
        for op in reversed(self.ops):
            if op.op_id == op_id:
                return op.outcome
        return None

    # -- internals ------------------------------------------------------------------------

    def _complete(
        self,
        pending: _Pending,
        outcome: Literal["ok", "fail", "info"],
        *,
        lsns: tuple[int, ...] = (),
        first_lsn: int | None = None,
        error: str | None = None,
    ) -> None:
        if pending.kind == "append":
            if outcome == "ok":
                self.stats.appends_ok += 1
            elif outcome == "fail":
                self.stats.appends_fail += 1
            else:
                self.stats.appends_info += 1
        elif outcome == "ok":
            self.stats.truncates_ok += 1
        if error is not None:
            key = error.split(":")[0]
            self.stats.ops_by_error[key] = self.stats.ops_by_error.get(key, 0) + 1
        op = self._op(pending, self._clock.now_ns, outcome, error=error)
        if lsns or first_lsn is not None:
            op = dataclasses.replace(op, lsns=lsns, first_lsn=first_lsn)
        self._record(op)

    def _op(
        self,
        pending: _Pending,
        complete_ns: int | None,
        outcome: Literal["ok", "fail", "info"],
        *,
        error: str | None,
    ) -> Op:
        return Op(
            op_id=pending.op_id,
            process=pending.process,
            kind=pending.kind,
            shard=SHARD,
            invoke_ns=pending.invoke_ns,
            complete_ns=complete_ns,
            outcome=outcome,
            payloads=pending.payloads,
            lsn=pending.lsn,
            error=error,
        )

    def _record(self, op: Op) -> None:
        self.ops.append(op)

    def _learn_leader(self, client: str, address: str | None) -> None:
        self._hint[client] = None if address is None else self._name_of.get(address)

    def _next_op_id(self, client: str) -> str:
        return f"{client}:{self.stats.invoked}"
