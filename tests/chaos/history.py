"""The chaos suite's shared vocabulary: payloads, client operations, replica dumps and Raft
events, plus their JSON-lines encoding (shared/reference/chaos-plan.md §4.7).

Everything that produces evidence (the process workload, the deterministic simulator, the
offline dumper, the node event logs) produces these types; the checkers (`checker.py`)
consume only these types. Nothing here does I/O except the explicit `write_*` / `read_*`
helpers at the bottom.

Payload: `b"P1|" + payload_id + b"|" + shard + b"|" + filler + b"|" + crc32 hex(8)`, where the
CRC covers everything before the last `|`. The checker can thus tell which operation a byte
string came from, which shard it was meant for, and whether its bytes were damaged.

Outcomes (Jepsen): `ok` (the operation took effect and returned this result), `fail` (it
certainly did not take effect: only errors answered before anything was proposed), `info`
(unknown: timeouts, resets, unknown errors; an info append may or may not be in the log).
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

PAYLOAD_MAGIC = b"P1"
FILLER_BYTES_MIN = 16
FILLER_BYTES_MAX = 512

Outcome = Literal["ok", "fail", "info"]
OpKind = Literal["append", "read", "tail", "truncate", "status"]


class PayloadCorrupt(ValueError):
    """Bytes that are not an intact payload made by `make_payload`."""


@dataclass(frozen=True, slots=True)
class PayloadInfo:
    payload_id: str
    shard: int


def make_payload(payload_id: str, shard: int, rng: random.Random) -> bytes:
    assert "|" not in payload_id
    filler_len = rng.randint(FILLER_BYTES_MIN, FILLER_BYTES_MAX)
    filler = bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(filler_len))
    body = b"|".join([PAYLOAD_MAGIC, payload_id.encode(), str(shard).encode(), filler])
    return body + b"|" + f"{zlib.crc32(body):08x}".encode()


def parse_payload(data: bytes) -> PayloadInfo:
    """The payload's identity; `PayloadCorrupt` if the bytes are not an intact payload."""
    body, sep, crc = data.rpartition(b"|")
    if not sep or len(crc) != 8:
        raise PayloadCorrupt("no checksum field")
    try:
        expected = int(crc, 16)
    except ValueError:
        raise PayloadCorrupt("checksum field is not hex") from None
    if zlib.crc32(body) != expected:
        raise PayloadCorrupt("checksum mismatch")
    parts = body.split(b"|")
    if len(parts) != 4 or parts[0] != PAYLOAD_MAGIC:
        raise PayloadCorrupt("wrong field count or magic")
    try:
        return PayloadInfo(parts[1].decode(), int(parts[2]))
    except (UnicodeDecodeError, ValueError):
        raise PayloadCorrupt("bad id or shard field") from None


@dataclass(frozen=True, slots=True)
class Op:
    """One client operation, invoked and (unless the run ended first) completed.

    Times are `time.monotonic_ns()` of one host (all workers share one clock); in the
    simulator they are virtual nanoseconds. `complete_ns is None` means the operation never
    completed (treat as `info`).

    Per kind, the fields that are meaningful:
      append   payloads (invoked); ok -> lsns (one per payload, in order)
      read     from_lsn; ok -> records [(lsn, payload)], next_lsn; or fail with
               truncated_first_lsn set (the typed Truncated answer)
      tail     like read, but answered by the leader after a quorum check (fresh: S8)
      truncate lsn (the requested truncation point); ok -> first_lsn (the new first LSN)
      status   ok -> first_lsn, last_lsn (last_lsn = first_lsn - 1 when empty)
    """

    op_id: str
    process: str
    kind: OpKind
    shard: int
    invoke_ns: int
    complete_ns: int | None
    outcome: Outcome
    payloads: tuple[bytes, ...] = ()
    lsns: tuple[int, ...] = ()
    from_lsn: int | None = None
    records: tuple[tuple[int, bytes], ...] = ()
    next_lsn: int | None = None
    lsn: int | None = None
    first_lsn: int | None = None
    last_lsn: int | None = None
    truncated_first_lsn: int | None = None
    error: str | None = None  # the error's name or message, for reports


@dataclass(frozen=True, slots=True)
class ReplicaDump:
    """One replica's log read offline after the run: records `[first_lsn, last_lsn]` in
    order (empty when `last_lsn == first_lsn - 1`). `corruptions` lists what the offline
    reader refused as damaged (it never returns damaged records)."""

    node_id: str
    shard: int
    first_lsn: int
    last_lsn: int
    records: tuple[tuple[int, bytes], ...]
    corruptions: tuple[str, ...] = ()


RaftEventKind = Literal["start", "term", "vote", "leader", "follower", "recovery", "corruption"]


@dataclass(frozen=True, slots=True)
class RaftEvent:
    """A white-box event from a node's event log (S12, S14).

    start       the replica (re)started; term = the term it recovered
    term        the replica's durable term changed to `term`
    vote        the replica durably voted for `voted_for` in `term`
    leader      the replica became leader in `term`
    follower    the replica stepped down / follows in `term`
    recovery    recovery repaired a torn tail or similar (`detail` says what)
    corruption  recovery or a read detected damaged data (`detail` says where)
    """

    node_id: str
    shard: int
    time_ns: int
    kind: RaftEventKind
    term: int = 0
    voted_for: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class NemesisEvent:
    """One fault: `phase` is start, end or info; `fault` names it (kill, pause, partition,
    power_loss, bitflip, ...); `targets` the nodes; `applied` whether it was confirmed."""

    time_ns: int
    phase: Literal["start", "end", "info"]
    fault: str
    targets: tuple[str, ...] = ()
    applied: bool = True
    detail: str = ""


@dataclass(slots=True)
class Evidence:
    """Everything one run leaves for the checkers."""

    ops: list[Op] = field(default_factory=list)
    dumps: list[ReplicaDump] = field(default_factory=list)
    events: list[RaftEvent] = field(default_factory=list)
    nemesis: list[NemesisEvent] = field(default_factory=list)


# ---------------------------------------------------------------------- JSON lines
# bytes are hex strings; tuples become lists. One object per line, `"t"` names the type.


def _encode_value(value: object) -> object:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, tuple | list):
        return [_encode_value(v) for v in value]
    return value


def _decode_value(value: object) -> object:
    if isinstance(value, dict) and set(value) == {"hex"}:
        return bytes.fromhex(str(value["hex"]))
    if isinstance(value, list):
        return tuple(_decode_value(v) for v in value)
    return value


_TYPES: dict[str, type] = {
    "op": Op,
    "dump": ReplicaDump,
    "event": RaftEvent,
    "nemesis": NemesisEvent,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def to_json_line(item: Op | ReplicaDump | RaftEvent | NemesisEvent) -> str:
    fields = {name: _encode_value(getattr(item, name)) for name in item.__slots__}
    return json.dumps({"t": _NAMES[type(item)], **fields}, separators=(",", ":"))


def from_json_line(line: str) -> Op | ReplicaDump | RaftEvent | NemesisEvent:
    raw = json.loads(line)
    cls = _TYPES[raw.pop("t")]
    return cls(**{k: _decode_value(v) for k, v in raw.items()})  # type: ignore[no-any-return]


def write_jsonl(path: str, items: Iterable[Op | ReplicaDump | RaftEvent | NemesisEvent]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for item in items:
            f.write(to_json_line(item) + "\n")


def read_jsonl(paths: Sequence[str]) -> Evidence:
    evidence = Evidence()
    for path in paths:
        for item in _iter_lines(path):
            if isinstance(item, Op):
                evidence.ops.append(item)
            elif isinstance(item, ReplicaDump):
                evidence.dumps.append(item)
            elif isinstance(item, RaftEvent):
                evidence.events.append(item)
            else:
                evidence.nemesis.append(item)
    return evidence


def _iter_lines(path: str) -> Iterator[Op | ReplicaDump | RaftEvent | NemesisEvent]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield from_json_line(line)
