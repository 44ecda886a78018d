"""Commands a shard's Raft entries carry, the results of applying them, and their codec.

Pure functions over bytes, no I/O. `FORMAT.md` beside this file is the specification, with a
worked example; `tests/unit/shard/golden/` holds the golden vectors.

A command is the one `bytes` argument of a replicated call. Its frame (all integers
little-endian, checksum XXH3-64 seed 0):

    frame := magic "LSC" | version u8 (= 1) | checksum u64 = xxh3_64(body) | body
    body  := msgpack array [type_tag, field...]  (use_bin_type=True; no maps, no ext)

    type_tag 0: reserved, never valid (so zero-filled bytes never decode)
    type_tag 1: AppendBatch  [1, client_id str, seq uint, epoch uint, [record bin, ...]]
    type_tag 2: UnfencedTruncate [2, lsn uint]  (legacy: decoded and applied, never proposed)
    type_tag 3: AcquireLease [3, holder str, epoch uint]
    type_tag 4: Barrier      [4, token uint]
    type_tag 5: AppendGroup  [5, [[client_id str, seq uint, epoch uint, [record bin, ...]], ...]]
    type_tag 6: Truncate     [6, lsn uint, epoch uint]

AppendGroup (tag 5, added within version 1: every earlier frame keeps its bytes and meaning,
and a reader without tag 5 refuses it loudly as "unknown type tag 5") packs many writers'
AppendBatches into one Raft entry (issue 4's server-side group commit). The state machine
applies its batches in order, each exactly as if it were its own entry at the group's raft
index; the result is `GroupAppended`, one result per batch.

Truncate (tag 6, added within version 1 the same way) carries the writer's lease epoch and is
fenced exactly like an append. Tag 2, the Truncate without an epoch that earlier builds
proposed, keeps its bytes and its meaning (applied with no epoch check) so that journals and
replicas of earlier builds replay identically; it decodes to `UnfencedTruncate`, which this
build never proposes (`ShardReplica.submit` refuses it).

The frame has no length field: its length is the length of the Raft entry payload that
holds it (the shard store's record has a length and a checksum of its own).

`encode_command` refuses a command that breaks a rule (`CommandInvalid`) or a limit
(`CommandTooLarge`); `decode_command` refuses anything that `encode_command` could not
have produced (`CommandCorrupt`), so every decoded command re-encodes. The same framing
(other magic) carries the state machine snapshot: `encode_frame` / `decode_frame` are
shared with `state_machine.py`, and this is the only module that imports msgpack.

Results are not encoded: pysyncobj hands the result of an applied entry to the local
callback of the node that proposed it, in process. Every replica computes the same result.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import chain
from typing import TypeGuard

# msgpack 1.2.4 ships no type information (no py.typed, no stubs on typeshed); its calls
# are wrapped below in typed functions so nothing else sees an untyped value.
import msgpack
import xxhash

from logsvc.shard.errors import CommandCorrupt, CommandInvalid, CommandTooLarge
from logsvc.shard.limits import COMMAND_HEADER_BYTES, DEFAULT_SHARD_LIMITS, U64_MAX, ShardLimits

COMMAND_MAGIC = b"LSC"
COMMAND_VERSION = 1

# magic (3 bytes) | version u8 | checksum u64: shared by every frame of this package.
FRAME_HEADER = struct.Struct("<3sBQ")
FRAME_HEADER_BYTES = FRAME_HEADER.size
assert FRAME_HEADER_BYTES == COMMAND_HEADER_BYTES == 12

TAG_INVALID = 0  # reserved: a zeroed body never decodes to a command
TAG_APPEND_BATCH = 1
TAG_UNFENCED_TRUNCATE = 2  # legacy: decoded and applied, never proposed
TAG_ACQUIRE_LEASE = 3
TAG_BARRIER = 4
TAG_APPEND_GROUP = 5
TAG_TRUNCATE = 6  # carries the epoch (added within version 1, like tag 5)
_TAGS = (
    TAG_APPEND_BATCH,
    TAG_UNFENCED_TRUNCATE,
    TAG_ACQUIRE_LEASE,
    TAG_BARRIER,
    TAG_APPEND_GROUP,
    TAG_TRUNCATE,
)


# --- Commands ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendBatch:
    """Append `records` (a batch; they get consecutive LSNs) for writer `client_id`.

    `(client_id, seq)` names the batch for exactly-once retries; `epoch` is the writer's
    lease epoch (0 for writers that do not fence, accepted while no lease was ever granted).
    """

    client_id: str
    seq: int
    epoch: int
    records: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Truncate:
    """Discard every LSN below `lsn`: `lsn` becomes the first retained LSN (clamped to the
    next unassigned LSN; never moves backwards).

    `epoch` is the writer's lease epoch, checked exactly as an append's: below the current
    one `StaleEpoch`, above it `NotLeaseHolder` (0 is accepted while no lease was ever
    granted). A refused truncate changes nothing. Encoded with type tag 6."""

    lsn: int
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class UnfencedTruncate:
    """A Truncate without an epoch (type tag 2), as builds before fenced truncates proposed
    it: applied with no lease check, exactly as they applied it, so their journal entries
    replay to the same state. Decoded and applied, never proposed by this build
    (`ShardReplica.submit` refuses it): every new truncate is a `Truncate`."""

    lsn: int


@dataclass(frozen=True, slots=True)
class AcquireLease:
    """Take (or confirm) the shard's write lease at `epoch` (>= 1) for `holder`."""

    holder: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Barrier:
    """A no-op entry: once applied, everything committed before it is applied (used for
    linearizable reads). `token` is echoed back in the result."""

    token: int


@dataclass(frozen=True, slots=True)
class AppendGroup:
    """Many writers' AppendBatches in one Raft entry (server-side group commit).

    Applied in order, each batch exactly as if it were its own entry at this entry's raft
    index: the same lease, epoch and dedupe rules, consecutive LSNs across the accepted
    batches, none for refused or duplicate ones. The same `(client_id, seq)` may appear
    twice (a retry packed with its original): the second is a duplicate of the first.

    At least 1 and at most `group_batches_max` batches, each valid on its own; their
    records count against `records_per_batch_max` together, and their record bytes against
    `group_bytes_max`. The entry's *flat record sequence* is every batch's records
    concatenated in batch order, refused and duplicate batches included
    (`decode_entry_records`); the state machine's LSN index points into it."""

    batches: tuple[AppendBatch, ...]


Command = AppendBatch | Truncate | UnfencedTruncate | AcquireLease | Barrier | AppendGroup


# --- Results -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Appended:
    """The batch holds LSNs `[first_lsn, first_lsn + count)`. `duplicate` is True for a
    retry of a remembered `(client_id, seq)`: these are the original LSNs and nothing was
    appended. An empty batch gets `count == 0` and `first_lsn` = the next LSN at the time."""

    first_lsn: int
    count: int
    duplicate: bool

    @property
    def lsns(self) -> range:
        return range(self.first_lsn, self.first_lsn + self.count)


@dataclass(frozen=True, slots=True)
class StaleEpoch:
    """Refused append or truncate: the epoch is below the current one (or, for a lease,
    equal with another holder). The writer has been fenced; the current lease is named."""

    current_holder: str | None
    current_epoch: int


@dataclass(frozen=True, slots=True)
class NotLeaseHolder:
    """Refused append or truncate: its epoch is above the current one (acquire the lease
    first)."""

    current_holder: str | None
    current_epoch: int


@dataclass(frozen=True, slots=True)
class DuplicateUnknown:
    """Refused append: `seq` is older than anything the shard remembers of `client_id`, so
    whether it was applied is unknown. Nothing was appended."""

    client_id: str
    seq: int
    oldest_remembered_seq: int


@dataclass(frozen=True, slots=True)
class Truncated:
    """The first retained LSN after the truncate (also when it was a no-op)."""

    first_lsn: int


@dataclass(frozen=True, slots=True)
class LeaseGranted:
    holder: str
    epoch: int


@dataclass(frozen=True, slots=True)
class BarrierDone:
    """The barrier's token and the next LSN to be assigned when it was applied."""

    token: int
    next_lsn: int


# What applying one AppendBatch gives, alone or inside an AppendGroup.
AppendResult = Appended | StaleEpoch | NotLeaseHolder | DuplicateUnknown


@dataclass(frozen=True, slots=True)
class GroupAppended:
    """The result of an AppendGroup: `results[i]` is what `batches[i]` alone would have
    got, had it been applied in its place (an `AppendResult`)."""

    results: tuple[AppendResult, ...]


Result = (
    Appended
    | StaleEpoch
    | NotLeaseHolder
    | DuplicateUnknown
    | Truncated
    | LeaseGranted
    | BarrierDone
    | GroupAppended
)


# --- Frames (shared with the snapshot codec) -----------------------------------------------


def xxh3(data: bytes | bytearray | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(data)


def encode_frame(magic: bytes, version: int, body: tuple[object, ...]) -> bytes:
    """magic | version u8 | xxh3_64(body) u64 | body = msgpack(body)."""
    assert len(magic) == 3
    assert 0 < version < 256
    packed = msgpack.packb(body, use_bin_type=True)
    assert isinstance(packed, bytes)
    return FRAME_HEADER.pack(magic, version, xxh3(packed)) + packed


def decode_frame(
    data: bytes | bytearray | memoryview,
    magic: bytes,
    versions: tuple[int, ...],
    *,
    frame_bytes_max: int,
    str_bytes_max: int,
    bin_bytes_max: int,
    array_len_max: int,
) -> tuple[object, ...] | str:
    """The body (a msgpack array, decoded to a tuple) of a whole frame, or the reason the
    bytes are not one. `versions` are the format versions the caller reads (the frame's is
    its byte 3). Maps and ext types are refused; arrays decode to tuples."""
    size = len(data)
    if size < FRAME_HEADER_BYTES:
        return f"frame is {size} bytes, shorter than its {FRAME_HEADER_BYTES}-byte header"
    if size > frame_bytes_max:
        return f"frame is {size} bytes, over the limit of {frame_bytes_max}"
    got_magic, got_version, checksum = FRAME_HEADER.unpack_from(data, 0)
    if got_magic != magic:
        return f"bad magic {got_magic!r} (expected {magic!r})"
    if got_version not in versions:
        known = ", ".join(map(str, versions))
        return f"unknown format version {got_version} (this build reads {known})"
    body = memoryview(data)[FRAME_HEADER_BYTES:]
    if checksum != xxh3(body):
        return "checksum mismatch"
    try:
        decoded = msgpack.unpackb(
            body,
            raw=False,
            use_list=False,
            strict_map_key=True,
            max_str_len=str_bytes_max,
            max_bin_len=bin_bytes_max,
            max_array_len=array_len_max,
            max_map_len=0,
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        # ValueError covers truncated input, extra data, limits, bad UTF-8 and the
        # FormatError/StackError subclasses; nothing raw escapes.
        return f"bad msgpack body: {type(exc).__name__}: {exc}"
    if not isinstance(decoded, tuple):
        return f"body is a {type(decoded).__name__}, not an array"
    return decoded


def is_u64(value: object) -> TypeGuard[int]:
    """An int (bool excluded) in [0, 2**64)."""
    return type(value) is int and 0 <= value <= U64_MAX


# --- Command codec -------------------------------------------------------------------------


def encode_command(command: Command, limits: ShardLimits = DEFAULT_SHARD_LIMITS) -> bytes:
    """The frame of a valid command; `CommandInvalid` / `CommandTooLarge` otherwise."""
    problem = command_problem(command, limits)
    if problem is not None:
        raise problem
    match command:
        case AppendBatch(client_id, seq, epoch, records):
            body: tuple[object, ...] = (TAG_APPEND_BATCH, client_id, seq, epoch, records)
        case Truncate(lsn, epoch):
            body = (TAG_TRUNCATE, lsn, epoch)
        case UnfencedTruncate(lsn):
            body = (TAG_UNFENCED_TRUNCATE, lsn)
        case AcquireLease(holder, epoch):
            body = (TAG_ACQUIRE_LEASE, holder, epoch)
        case Barrier(token):
            body = (TAG_BARRIER, token)
        case AppendGroup(batches):
            body = (
                TAG_APPEND_GROUP,
                tuple((b.client_id, b.seq, b.epoch, b.records) for b in batches),
            )
    encoded = encode_frame(COMMAND_MAGIC, COMMAND_VERSION, body)
    assert len(encoded) <= limits.command_bytes_max
    return encoded


def decode_command(
    data: bytes | bytearray | memoryview, limits: ShardLimits = DEFAULT_SHARD_LIMITS
) -> Command:
    """The command in a frame; `CommandCorrupt(reason)` for anything else."""
    body = decode_frame(
        data,
        COMMAND_MAGIC,
        (COMMAND_VERSION,),
        frame_bytes_max=limits.command_bytes_max,
        str_bytes_max=max(limits.client_id_bytes_max, limits.holder_bytes_max),
        bin_bytes_max=limits.record_bytes_max,
        array_len_max=max(limits.records_per_batch_max, limits.group_batches_max, 5),
    )
    if isinstance(body, str):
        raise CommandCorrupt(body)
    command = _command_from_body(body)
    if isinstance(command, str):
        raise CommandCorrupt(command)
    problem = command_problem(command, limits)
    if problem is not None:
        raise CommandCorrupt(f"fields out of range: {problem}")
    return command


def decode_append_records(
    data: bytes | bytearray | memoryview, limits: ShardLimits = DEFAULT_SHARD_LIMITS
) -> tuple[bytes, ...]:
    """The records of an AppendBatch frame. Fully verified, like `decode_command`; any
    other command, an AppendGroup included, is reported as `CommandCorrupt`.

    Superseded for the read path by `decode_entry_records` (which also reads AppendGroup
    entries). Kept refusing groups on purpose: a read loop that slices `records[offset:]`
    without the end `ShardStateMachine.locate` gives would hand out the records of refused
    batches of a group under wrong LSNs; with this function it fails loudly instead."""
    command = decode_command(data, limits)
    if not isinstance(command, AppendBatch):
        raise CommandCorrupt(f"expected an AppendBatch, found {type(command).__name__}")
    return command.records


def decode_entry_records(
    data: bytes | bytearray | memoryview, limits: ShardLimits = DEFAULT_SHARD_LIMITS
) -> tuple[bytes, ...]:
    """The flat record sequence of an append entry (the read path): an AppendBatch's
    records, or the records of every batch of an AppendGroup concatenated in batch order,
    those of refused and duplicate batches included. `ShardStateMachine.locate(lsn)` gives
    `(raft_index, offset, count)`: records `[offset, offset + count)` of this sequence hold
    LSNs `[lsn, lsn + count)`. Fully verified, like `decode_command`; any other command is
    reported as `CommandCorrupt` (the state machine maps LSNs only to append entries)."""
    command = decode_command(data, limits)
    if isinstance(command, AppendBatch):
        return command.records
    if isinstance(command, AppendGroup):
        if len(command.batches) == 1:
            return command.batches[0].records
        return tuple(chain.from_iterable(batch.records for batch in command.batches))
    raise CommandCorrupt(
        f"expected an AppendBatch or an AppendGroup, found {type(command).__name__}"
    )


def _command_from_body(body: tuple[object, ...]) -> Command | str:
    """The command a body's shape describes (types only; ranges are checked after)."""
    if not body:
        return "empty body"
    tag, fields = body[0], body[1:]
    if type(tag) is not int:
        return f"type tag is a {type(tag).__name__}"
    if tag == TAG_APPEND_BATCH and len(fields) == 4:
        return _batch_from_fields(fields, "AppendBatch")
    if tag == TAG_APPEND_GROUP and len(fields) == 1:
        (rows,) = fields
        if not isinstance(rows, tuple):
            return "AppendGroup batches are not an array"
        batches: list[AppendBatch] = []
        for position, row in enumerate(rows):
            if not (isinstance(row, tuple) and len(row) == 4):
                return f"AppendGroup batch {position} is not a 4-element array"
            batch = _batch_from_fields(row, f"AppendGroup batch {position}")
            if isinstance(batch, str):
                return batch
            batches.append(batch)
        return AppendGroup(tuple(batches))
    if tag == TAG_TRUNCATE and len(fields) == 2:
        lsn, epoch = fields
        if type(lsn) is not int or type(epoch) is not int:
            return "Truncate field of the wrong type"
        return Truncate(lsn, epoch)
    if tag == TAG_UNFENCED_TRUNCATE and len(fields) == 1:
        (lsn,) = fields
        if type(lsn) is not int:
            return "UnfencedTruncate lsn is not an integer"
        return UnfencedTruncate(lsn)
    if tag == TAG_ACQUIRE_LEASE and len(fields) == 2:
        holder, epoch = fields
        if not isinstance(holder, str) or type(epoch) is not int:
            return "AcquireLease field of the wrong type"
        return AcquireLease(holder, epoch)
    if tag == TAG_BARRIER and len(fields) == 1:
        (token,) = fields
        return Barrier(token) if type(token) is int else "Barrier token is not an integer"
    if tag in _TAGS:
        return f"type tag {tag} with {len(fields)} fields"
    return f"unknown type tag {tag}"


def _batch_from_fields(fields: tuple[object, ...], what: str) -> AppendBatch | str:
    """An AppendBatch from `[client_id, seq, epoch, records]` (types only)."""
    client_id, seq, epoch, records = fields
    if not isinstance(client_id, str) or type(seq) is not int or type(epoch) is not int:
        return f"{what} field of the wrong type"
    if not isinstance(records, tuple):
        return f"{what} records are not an array"
    for position, record in enumerate(records):
        if not isinstance(record, bytes):
            return f"{what} record {position} is not bin"
    return AppendBatch(client_id, seq, epoch, records)


def command_problem(
    command: object, limits: ShardLimits = DEFAULT_SHARD_LIMITS
) -> CommandInvalid | CommandTooLarge | None:
    """Why `command` may not be encoded (or, found in a frame, applied), or None.

    Types are checked too (not only trusted to mypy): a bool is not an integer here, so
    `True` can never stand for an epoch of 1 on one replica and something else on another.
    """
    if _appends_ok(command, limits):
        return None  # the hot path: the same rules, checked in one pass (see _appends_ok)
    return _general_problem(command, limits)


def _general_problem(
    command: object, limits: ShardLimits
) -> CommandInvalid | CommandTooLarge | None:
    match command:
        case AppendBatch(client_id, seq, epoch, records):
            problem = _id_problem("client_id", client_id, limits.client_id_bytes_max)
            if problem is not None:
                return problem
            if not is_u64(seq):
                return CommandInvalid(f"seq must be an integer in [0, 2**64), got {seq!r}")
            if not is_u64(epoch):
                return CommandInvalid(f"epoch must be an integer in [0, 2**64), got {epoch!r}")
            return _records_problem(records, limits)
        case Truncate(lsn, epoch):
            if not is_u64(lsn):
                return CommandInvalid(f"lsn must be an integer in [0, 2**64), got {lsn!r}")
            if not is_u64(epoch):
                return CommandInvalid(f"epoch must be an integer in [0, 2**64), got {epoch!r}")
            return None
        case UnfencedTruncate(lsn):
            if not is_u64(lsn):
                return CommandInvalid(f"lsn must be an integer in [0, 2**64), got {lsn!r}")
            return None
        case AcquireLease(holder, epoch):
            problem = _id_problem("holder", holder, limits.holder_bytes_max)
            if problem is not None:
                return problem
            # Epoch 0 means "no lease was ever granted"; a lease is always at epoch >= 1.
            if not is_u64(epoch) or epoch == 0:
                return CommandInvalid(f"epoch must be an integer in [1, 2**64), got {epoch!r}")
            return None
        case Barrier(token):
            if not is_u64(token):
                return CommandInvalid(f"token must be an integer in [0, 2**64), got {token!r}")
            return None
        case AppendGroup(batches):
            return _group_problem(batches, limits)
    return CommandInvalid(f"not a command: {type(command).__name__}")


def _appends_ok(command: object, limits: ShardLimits) -> bool:
    """True only if `command_problem` finds nothing wrong with `command`: every rule of an
    AppendBatch or an AppendGroup in one pass of plain comparisons, for the entries every
    append goes through (encoded by the leader, decoded and checked by every replica). It
    only ever accepts: anything it does not accept (a subclass, an odd type, a broken
    limit) takes the general walk, which finds the precise reason. test_commands.py checks,
    with hypothesis, that it accepts exactly what the general rules accept."""
    batches: object
    if type(command) is AppendBatch:
        batches, group = (command,), False
    elif type(command) is AppendGroup:
        batches, group = command.batches, True
        if type(batches) is not tuple or not batches or len(batches) > limits.group_batches_max:
            return False
    else:
        return False
    id_bytes_max = limits.client_id_bytes_max
    records_max = limits.records_per_batch_max
    record_bytes_max = limits.record_bytes_max
    batch_bytes_max = limits.batch_bytes_max
    total_records = 0
    total_bytes = 0
    for batch in batches:
        if type(batch) is not AppendBatch:
            return False
        client_id, seq, epoch, records = batch.client_id, batch.seq, batch.epoch, batch.records
        if not (
            type(client_id) is str
            and client_id
            and type(seq) is int
            and 0 <= seq <= U64_MAX
            and type(epoch) is int
            and 0 <= epoch <= U64_MAX
            and type(records) is tuple
            and len(records) <= records_max
        ):
            return False
        if not client_id.isascii():
            try:
                if len(client_id.encode("utf-8")) > id_bytes_max:
                    return False
            except UnicodeEncodeError:
                return False
        elif len(client_id) > id_bytes_max:
            return False
        batch_bytes = 0
        for record in records:
            if type(record) is not bytes or len(record) > record_bytes_max:
                return False
            batch_bytes += len(record)
        if batch_bytes > batch_bytes_max:
            return False
        total_records += len(records)
        total_bytes += batch_bytes
    return not group or (total_records <= records_max and total_bytes <= limits.group_bytes_max)


def _group_problem(batches: object, limits: ShardLimits) -> CommandInvalid | CommandTooLarge | None:
    if not isinstance(batches, tuple):
        return CommandInvalid(f"batches must be a tuple, got {type(batches).__name__}")
    if not batches:
        return CommandInvalid("an AppendGroup holds at least one batch")
    if len(batches) > limits.group_batches_max:
        return CommandTooLarge("group_batches_max", len(batches), limits.group_batches_max)
    total_records = 0
    total_bytes = 0
    for position, batch in enumerate(batches):
        if not isinstance(batch, AppendBatch):
            return CommandInvalid(
                f"batch {position} is a {type(batch).__name__}, not an AppendBatch"
            )
        problem = command_problem(batch, limits)
        if isinstance(problem, CommandInvalid):
            return CommandInvalid(f"batch {position}: {problem.reason}")
        if problem is not None:
            return problem
        total_records += len(batch.records)
        total_bytes += sum(map(len, batch.records))
    if total_records > limits.records_per_batch_max:
        return CommandTooLarge("records_per_batch_max", total_records, limits.records_per_batch_max)
    if total_bytes > limits.group_bytes_max:
        return CommandTooLarge("group_bytes_max", total_bytes, limits.group_bytes_max)
    return None


def _id_problem(name: str, value: object, bytes_max: int) -> CommandInvalid | None:
    if not isinstance(value, str):
        return CommandInvalid(f"{name} must be a str, got {type(value).__name__}")
    if not value:
        return CommandInvalid(f"{name} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return CommandInvalid(f"{name} is not encodable as UTF-8 (lone surrogate)")
    if size > bytes_max:
        return CommandInvalid(f"{name} is {size} bytes of UTF-8, over the limit of {bytes_max}")
    return None


def _records_problem(
    records: object, limits: ShardLimits
) -> CommandInvalid | CommandTooLarge | None:
    if not isinstance(records, tuple):
        return CommandInvalid(f"records must be a tuple, got {type(records).__name__}")
    if len(records) > limits.records_per_batch_max:
        return CommandTooLarge("records_per_batch_max", len(records), limits.records_per_batch_max)
    total_bytes = 0
    for position, record in enumerate(records):
        if not isinstance(record, bytes):
            return CommandInvalid(f"record {position} is a {type(record).__name__}, not bytes")
        if len(record) > limits.record_bytes_max:
            return CommandTooLarge("record_bytes_max", len(record), limits.record_bytes_max)
        total_bytes += len(record)
    if total_bytes > limits.batch_bytes_max:
        return CommandTooLarge("batch_bytes_max", total_bytes, limits.batch_bytes_max)
    return None
