"""The chaos workload: N logical clients against a real cluster, recording a history
(chaos-plan.md §4.7).

Runs as its own process (`WorkloadProcess` starts it), so that pausing, killing and the
harness's own work never steal its event loop, and so that its clients see the cluster the
way an application does:

    python -m tests.chaos.harness.workload --spec SPEC.json

Each logical client has its own `logsvc.client.Client` (own client id, own connections).
Appends go through the library's retries, which reuse `(client_id, seq)`, so a retried
append is deduplicated by the shard (exactly-once); a payload is never re-sent under a new
seq by this workload. Payloads are `make_payload(f"{process}-{seq:08d}", shard, rng)`.

Op mix (per invocation, per spec): append, read (any replica, committed data), tail (leader,
after a quorum barrier: the fresh read of S8), status, truncate (increasing targets below the
observed high-water mark, keeping `truncate_keep` records). Invocations are paced by one
token bucket per shard so that appends run at about `appends_per_s_per_shard`.

Outcomes are mapped conservatively (L7): `ok`; `fail` only when nothing can have taken
effect (a typed answer that the request was refused before or at apply, e.g. `Truncated`
for a read, `StaleEpoch`); `info` for everything else (timeouts, resets, `Unavailable`
after retries, unknown errors). An operation still running when the workload stops is
written with `complete_ns=None` (info).

History: JSON lines of `history.Op`, appended every ~100 ms. Times are
`time.monotonic_ns()` (one host clock shared with the nemesis log). SIGTERM stops invoking,
drains what is in flight (bounded), writes everything and exits 0 with a JSON summary on
stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from logsvc.client import (
    Client,
    ClientOptions,
    NotLeaseHolder,
    ServerError,
    StaleEpoch,
    TooManyInFlight,
    Truncated,
    connect,
)
from logsvc.wire import messages as wire
from tests.chaos.history import Op, OpKind, from_json_line, make_payload, write_jsonl

FLUSH_S = 0.1
READ_BYTES_MAX = 64 * 1024
TAIL_WAIT_MS = 100

# Answers that say the request certainly had no effect (refused before proposal, or
# rejected deterministically at apply): the only `fail` outcomes of a write.
_DEFINITE_REFUSALS = {
    wire.ErrorCode.BAD_REQUEST,
    wire.ErrorCode.TOO_LARGE,
    wire.ErrorCode.UNAUTHENTICATED,
    wire.ErrorCode.UNKNOWN_SHARD,
    wire.ErrorCode.UNKNOWN_OP,
    wire.ErrorCode.STALE_EPOCH,
    wire.ErrorCode.NOT_LEASE_HOLDER,
}


@dataclass(slots=True)
class WorkloadSpec:
    addresses: list[str]
    token: str
    shards: list[int]
    history_path: str
    seed: int
    process_prefix: str = "w"  # process names: f"{prefix}{i}"; unique per run
    clients: int = 6
    appends_per_s_per_shard: float = 100.0
    mix: dict[str, float] = field(
        default_factory=lambda: {
            "append": 0.70,
            "read": 0.19,
            "tail": 0.05,
            "status": 0.05,
            "truncate": 0.01,
        }
    )
    records_per_append_max: int = 3
    truncate_keep: int = 100  # a truncate leaves at least this many records below the hwm
    request_timeout_s: float = 2.0
    retry_s_max: float = 8.0
    drain_s_max: float = 15.0

    @property
    def op_timeout_s(self) -> float:
        return self.retry_s_max + self.request_timeout_s + 2.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> WorkloadSpec:
        return WorkloadSpec(**json.loads(text))


@dataclass(slots=True)
class _ShardView:
    """What the workload has observed of a shard (to aim reads and truncates)."""

    hwm: int = 0  # highest LSN seen acked or read
    first_lsn: int = 1  # highest first LSN seen
    truncate_target: int = 0  # highest truncate target invoked


class Workload:
    def __init__(self, spec: WorkloadSpec) -> None:
        assert spec.clients >= 1 and spec.shards
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.views = {shard: _ShardView() for shard in spec.shards}
        self.buffer: list[Op] = []
        self.in_flight: dict[str, Op] = {}
        self.counts: Counter[str] = Counter()
        self.stopping = asyncio.Event()
        ops_per_s = spec.appends_per_s_per_shard / max(spec.mix.get("append", 0.7), 0.05)
        self.interval_s = 1.0 / ops_per_s  # per shard
        self.next_slot = {shard: 0.0 for shard in spec.shards}

    async def run(self) -> None:
        options = ClientOptions(
            request_timeout_s=self.spec.request_timeout_s,
            retry_s_max=self.spec.retry_s_max,
            connect_timeout_s=min(2.0, self.spec.request_timeout_s),
        )
        clients = [
            await connect(
                self.spec.addresses,
                self.spec.token,
                options=options,
                client_id=f"{self.spec.process_prefix}{i}-{os.getpid()}-{self.spec.seed}",
            )
            for i in range(self.spec.clients)
        ]
        flusher = asyncio.create_task(self._flush_loop())
        tasks = [
            asyncio.create_task(self._client_loop(f"{self.spec.process_prefix}{i}", client, i))
            for i, client in enumerate(clients)
        ]
        await self.stopping.wait()
        _, pending = await asyncio.wait(tasks, timeout=self.spec.drain_s_max)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for op in list(self.in_flight.values()):
            self.buffer.append(op)  # never completed: complete_ns None, outcome info
            self.counts["append:incomplete" if op.kind == "append" else "incomplete"] += 1
        self.in_flight.clear()
        flusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
        self._flush()
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            self._flush()

    def _flush(self) -> None:
        if self.buffer:
            items, self.buffer = self.buffer, []
            write_jsonl(self.spec.history_path, items)

    async def _pace(self, shard: int) -> None:
        """One token of the shard's bucket (burst at most a second's worth)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        slot = max(self.next_slot[shard], now - 1.0)
        self.next_slot[shard] = slot + self.interval_s
        if slot > now:
            await asyncio.sleep(slot - now)

    async def _client_loop(self, process: str, client: Client, index: int) -> None:
        rng = random.Random(f"{self.spec.seed}-{index}")
        kinds = list(self.spec.mix)
        weights = [self.spec.mix[k] for k in kinds]
        seq = 0
        number = 0
        while not self.stopping.is_set():
            shard = rng.choice(self.spec.shards)
            await self._pace(shard)
            if self.stopping.is_set():
                break
            kind = rng.choices(kinds, weights)[0]
            number += 1
            op_id = f"{process}:{number}"
            if kind == "append":
                count = rng.randint(1, self.spec.records_per_append_max)
                payloads = []
                for _ in range(count):
                    seq += 1
                    payloads.append(make_payload(f"{process}-{seq:08d}", shard, rng))
                await self._append(op_id, process, client, shard, tuple(payloads))
            elif kind == "read":
                await self._read(op_id, process, client, shard, rng, tail=False)
            elif kind == "tail":
                await self._read(op_id, process, client, shard, rng, tail=True)
            elif kind == "status":
                await self._status(op_id, process, client, shard)
            elif kind == "truncate":
                await self._truncate(op_id, process, client, shard, rng)

    def _begin(self, op: Op) -> None:
        self.in_flight[op.op_id] = op

    def _end(self, op: Op, **fields: Any) -> None:
        self.in_flight.pop(op.op_id, None)
        done = _replace(op, complete_ns=time.monotonic_ns(), **fields)
        self.buffer.append(done)
        self.counts[f"{op.kind}:{done.outcome}"] += 1

    async def _append(
        self, op_id: str, process: str, client: Client, shard: int, payloads: tuple[bytes, ...]
    ) -> None:
        op = Op(op_id, process, "append", shard, time.monotonic_ns(), None, "info", payloads)
        self._begin(op)
        try:
            lsns = await asyncio.wait_for(client.append(shard, payloads), self.spec.op_timeout_s)
        except Exception as exc:  # an outcome (a cancellation is not one: it propagates)
            self._end(op, outcome=_write_outcome(exc), error=_describe(exc))
            return
        view = self.views[shard]
        view.hwm = max(view.hwm, lsns[-1])
        self._end(op, outcome="ok", lsns=tuple(lsns))

    async def _read(
        self, op_id: str, process: str, client: Client, shard: int, rng: random.Random, tail: bool
    ) -> None:
        view = self.views[shard]
        if tail:
            from_lsn = max(1, view.hwm + 1 - rng.randint(0, 3))
        elif rng.random() < 0.5:
            from_lsn = max(1, view.hwm - rng.randint(0, 30))
        else:  # historic, sometimes below the first LSN (a typed Truncated answer)
            low = max(1, view.first_lsn - 10)
            from_lsn = rng.randint(low, max(low, view.hwm))
        kind: OpKind = "tail" if tail else "read"
        op = Op(op_id, process, kind, shard, time.monotonic_ns(), None, "info", from_lsn=from_lsn)
        self._begin(op)
        try:
            if tail:
                call = client.tail(shard, from_lsn, READ_BYTES_MAX, TAIL_WAIT_MS)
            else:
                call = client.read(shard, from_lsn, READ_BYTES_MAX)
            answer = await asyncio.wait_for(call, self.spec.op_timeout_s)
        except Exception as exc:  # an outcome (a cancellation is not one: it propagates)
            if isinstance(exc, Truncated):
                first = exc.first_lsn
                if first is not None:
                    view.first_lsn = max(view.first_lsn, first)
                self._end(op, outcome="fail", truncated_first_lsn=first, error=_describe(exc))
            else:
                # A read changes nothing: fail and info mean the same to the checkers.
                self._end(op, outcome="info", error=_describe(exc))
            return
        records = tuple((answer.first_lsn + i, r) for i, r in enumerate(answer.records))
        if records:
            view.hwm = max(view.hwm, records[-1][0])
        self._end(op, outcome="ok", records=records, next_lsn=answer.next_lsn)

    async def _status(self, op_id: str, process: str, client: Client, shard: int) -> None:
        op = Op(op_id, process, "status", shard, time.monotonic_ns(), None, "info")
        self._begin(op)
        try:
            status = await asyncio.wait_for(client.status(shard), self.spec.op_timeout_s)
        except Exception as exc:  # an outcome (a cancellation is not one: it propagates)
            self._end(op, outcome="info", error=_describe(exc))
            return
        view = self.views[shard]
        view.first_lsn = max(view.first_lsn, status.first_lsn)
        view.hwm = max(view.hwm, status.next_lsn - 1)
        # Any replica may answer a status: its view, not a fresh read (only tail is).
        self._end(op, outcome="ok", first_lsn=status.first_lsn, last_lsn=status.next_lsn - 1)

    async def _truncate(
        self, op_id: str, process: str, client: Client, shard: int, rng: random.Random
    ) -> None:
        view = self.views[shard]
        top = view.hwm - self.spec.truncate_keep
        low = max(view.truncate_target, view.first_lsn)
        if top <= low:
            return  # nothing worth truncating yet: no op
        target = rng.randint(low + 1, top)
        view.truncate_target = target
        op = Op(op_id, process, "truncate", shard, time.monotonic_ns(), None, "info", lsn=target)
        self._begin(op)
        try:
            first = await asyncio.wait_for(client.truncate(shard, target), self.spec.op_timeout_s)
        except Exception as exc:  # an outcome (a cancellation is not one: it propagates)
            self._end(op, outcome=_write_outcome(exc), error=_describe(exc))
            return
        view.first_lsn = max(view.first_lsn, first)
        self._end(op, outcome="ok", first_lsn=first)


def _write_outcome(exc: BaseException) -> str:
    """fail only for answers that prove the write took no effect; info otherwise (L7)."""
    if isinstance(exc, TooManyInFlight):
        return "fail"  # refused by the client library before anything was sent
    if isinstance(exc, StaleEpoch | NotLeaseHolder):
        return "fail"
    if isinstance(exc, ServerError) and exc.code in _DEFINITE_REFUSALS:
        return "fail"
    return "info"


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _replace(op: Op, **fields: Any) -> Op:
    values = {name: getattr(op, name) for name in op.__slots__}
    values.update(fields)
    return Op(**values)


# ---------------------------------------------------------------------- process entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    with open(args.spec) as f:
        spec = WorkloadSpec.from_json(f.read())
    workload = Workload(spec)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, workload.stopping.set)
        loop.add_signal_handler(signal.SIGINT, workload.stopping.set)
        await workload.run()

    asyncio.run(run())
    print(json.dumps({"counts": dict(workload.counts)}), flush=True)
    return 0


class WorkloadProcess:
    """Starts the workload as a child process and stops it (SIGTERM, bounded drain,
    SIGKILL as the last resort). `close()` belongs in a finally."""

    def __init__(self, spec: WorkloadSpec, spec_path: str, log_path: str) -> None:
        self.spec = spec
        self.spec_path = spec_path
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None
        self.summary: dict[str, Any] = {}

    def start(self) -> None:
        assert self.popen is None
        with open(self.spec_path, "w") as f:
            f.write(self.spec.to_json())
        from tests.chaos.harness.cluster import REPO_ROOT

        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.harness.workload", "--spec", self.spec_path],
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def stop(self) -> dict[str, Any]:
        """SIGTERM, wait for the drain (bounded), return the summary."""
        if self.popen is None:
            return self.summary
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            out, _ = self.popen.communicate(timeout=self.spec.drain_s_max + 20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            out, _ = self.popen.communicate(timeout=10)
        for line in out.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                self.summary = json.loads(line)
        self.summary["returncode"] = self.popen.returncode
        return self.summary

    def close(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(10)

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class HistoryTail:
    """Follows a history file while the workload writes it: complete lines only."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self.ok_append_times: dict[int, list[int]] = {}  # shard -> completion times

    def poll(self) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n")
        if end < 0:
            return
        self._offset += end + 1
        for line in data[: end + 1].decode().splitlines():
            if not line.strip():
                continue
            item = from_json_line(line)
            if (
                isinstance(item, Op)
                and item.kind == "append"
                and item.outcome == "ok"
                and item.complete_ns is not None
            ):
                self.ok_append_times.setdefault(item.shard, []).append(item.complete_ns)

    def ok_appends_since(self, since_ns: int, shard: int | None = None) -> int:
        self.poll()
        shards = [shard] if shard is not None else list(self.ok_append_times)
        return sum(1 for s in shards for t in self.ok_append_times.get(s, []) if t >= since_ns)


if __name__ == "__main__":
    sys.exit(main())
