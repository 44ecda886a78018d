"""The command codec round-trips every valid command and reports every bad input as a typed
error, never a raw msgpack or struct exception.

How: round trips of hand-picked and hypothesis-generated commands (AppendGroup included); a
table of invalid and oversized commands (and groups) that `encode_command` refuses
(`CommandInvalid` / `CommandTooLarge`); corruption of a real frame (every truncation, a flip
of every byte, wrong magic and version, an oversized frame); bodies with a valid checksum
but a bad shape, type or range; and random bodies behind a valid header, which must decode
to a command that re-encodes or raise `CommandCorrupt`. Also the read path's
`decode_entry_records` and the group size limits against the shard store's record limit.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsvc.shard import commands as command_codec
from logsvc.shard.commands import (
    COMMAND_MAGIC,
    COMMAND_VERSION,
    FRAME_HEADER,
    AcquireLease,
    AppendBatch,
    AppendGroup,
    Barrier,
    Command,
    Truncate,
    UnfencedTruncate,
    decode_append_records,
    decode_command,
    decode_entry_records,
    encode_command,
    xxh3,
)
from logsvc.shard.errors import CommandCorrupt, CommandError, CommandInvalid, CommandTooLarge
from logsvc.shard.limits import DEFAULT_SHARD_LIMITS, ShardLimits

SMALL = ShardLimits(
    records_per_batch_max=4,
    record_bytes_max=8,
    batch_bytes_max=16,
    client_id_bytes_max=8,
    holder_bytes_max=8,
    group_batches_max=3,
    group_bytes_max=20,
).validate()

U64_MAX = 2**64 - 1


def frame(body: object, version: int = COMMAND_VERSION, magic: bytes = COMMAND_MAGIC) -> bytes:
    """A frame with a correct checksum around any msgpack body."""
    packed = msgpack.packb(body, use_bin_type=True)
    assert isinstance(packed, bytes)
    return FRAME_HEADER.pack(magic, version, xxh3(packed)) + packed


ROUND_TRIP = [
    AppendBatch("c1", 7, 2, (b"hello", b"")),
    AppendBatch("c", 0, 0, ()),
    AppendBatch("é" * 128, U64_MAX, U64_MAX, (b"\0" * 1000,) * 3),
    Truncate(0),
    Truncate(U64_MAX),
    Truncate(0, U64_MAX),
    Truncate(7, 2),
    UnfencedTruncate(0),
    UnfencedTruncate(U64_MAX),
    AcquireLease("tn-1", 1),
    AcquireLease("h" * 256, U64_MAX),
    Barrier(0),
    Barrier(U64_MAX),
    AppendGroup((AppendBatch("c1", 7, 2, (b"hello", b"")),)),
    AppendGroup(
        (
            AppendBatch("c1", 7, 2, (b"hello",)),
            AppendBatch("c2", 0, 0, ()),
            AppendBatch("c1", 7, 2, (b"retry", b"x")),  # the same (client, seq): allowed
        )
    ),
]


@pytest.mark.parametrize("command", ROUND_TRIP, ids=repr)
def test_round_trip(command: Command) -> None:
    data = encode_command(command)
    assert decode_command(data) == command
    assert decode_command(memoryview(data)) == command
    assert decode_command(bytearray(data)) == command


def test_decode_append_records_returns_the_batch_and_refuses_other_commands() -> None:
    assert decode_append_records(encode_command(AppendBatch("c", 1, 0, (b"a", b"bc")))) == (
        b"a",
        b"bc",
    )
    with pytest.raises(CommandCorrupt, match="expected an AppendBatch, found Barrier"):
        decode_append_records(encode_command(Barrier(1)))


def test_decode_entry_records_returns_the_flat_record_sequence() -> None:
    batch = AppendBatch("c", 1, 0, (b"a", b"bc"))
    assert decode_entry_records(encode_command(batch)) == (b"a", b"bc")
    group = AppendGroup((batch, AppendBatch("d", 1, 0, ()), AppendBatch("e", 9, 0, (b"z",))))
    # Every batch's records in batch order, whatever the state machine made of the batches.
    assert decode_entry_records(encode_command(group)) == (b"a", b"bc", b"z")
    for other in (Barrier(1), Truncate(3, 1), UnfencedTruncate(3), AcquireLease("h", 1)):
        with pytest.raises(CommandCorrupt, match="expected an AppendBatch or an AppendGroup"):
            decode_entry_records(encode_command(other))


def test_decode_append_records_refuses_a_group() -> None:
    """The pre-group read path (`records[offset:]` with no end) must fail loudly on a group
    entry instead of handing out a refused batch's records under wrong LSNs."""
    group = AppendGroup((AppendBatch("c", 1, 0, (b"a",)),))
    with pytest.raises(CommandCorrupt, match="expected an AppendBatch, found AppendGroup"):
        decode_append_records(encode_command(group))


def test_a_full_batch_at_the_default_limits_fits_the_frame_limit() -> None:
    limits = DEFAULT_SHARD_LIMITS
    record = b"x" * (limits.batch_bytes_max // limits.records_per_batch_max)
    command = AppendBatch("c" * 256, U64_MAX, U64_MAX, (record,) * limits.records_per_batch_max)
    data = encode_command(command)
    assert len(data) <= limits.command_bytes_max
    assert decode_append_records(data) == command.records


def test_a_full_group_at_the_default_limits_fits_the_frame_limit() -> None:
    limits = DEFAULT_SHARD_LIMITS
    batches = limits.group_batches_max
    per_batch = limits.records_per_batch_max // batches
    record = b"x" * (limits.group_bytes_max // limits.records_per_batch_max)
    group = AppendGroup(
        tuple(
            AppendBatch(f"{index:0256d}", U64_MAX, U64_MAX, (record,) * per_batch)
            for index in range(batches)
        )
    )
    data = encode_command(group)
    assert len(data) <= limits.group_command_bytes_max <= limits.command_bytes_max
    # The bound is close (it assumes the widest msgpack headers: 5-byte bins and strs).
    assert len(data) > 0.98 * limits.group_command_bytes_max
    assert decode_command(data) == group


def test_limits_refuse_a_group_that_would_not_fit_a_store_record() -> None:
    with pytest.raises(ValueError, match="group_bytes_max, group_batches_max"):
        ShardLimits(group_bytes_max=15 * 1024 * 1024).validate()
    with pytest.raises(ValueError, match="group_bytes_max, group_batches_max"):
        ShardLimits(group_batches_max=8192).validate()
    with pytest.raises(ValueError, match="group_batches_max: must be positive"):
        ShardLimits(group_batches_max=0).validate()


def group(*batches: object) -> AppendGroup:
    return AppendGroup(batches)  # type: ignore[arg-type]


REFUSED: list[tuple[str, object, type[CommandError], str]] = [
    ("empty client_id", AppendBatch("", 1, 0, ()), CommandInvalid, "must not be empty"),
    ("long client_id", AppendBatch("x" * 9, 1, 0, ()), CommandInvalid, "over the limit"),
    ("multibyte id", AppendBatch("é" * 5, 1, 0, ()), CommandInvalid, "10 bytes"),
    ("surrogate id", AppendBatch("\ud800", 1, 0, ()), CommandInvalid, "UTF-8"),
    ("negative seq", AppendBatch("c", -1, 0, ()), CommandInvalid, "seq"),
    ("huge seq", AppendBatch("c", 2**64, 0, ()), CommandInvalid, "seq"),
    ("bool seq", AppendBatch("c", True, 0, ()), CommandInvalid, "seq"),
    ("negative epoch", AppendBatch("c", 1, -1, ()), CommandInvalid, "epoch"),
    ("list records", AppendBatch("c", 1, 0, [b"a"]), CommandInvalid, "tuple"),  # type: ignore[arg-type]
    ("str record", AppendBatch("c", 1, 0, ("a",)), CommandInvalid, "not bytes"),  # type: ignore[arg-type]
    ("bytearray", AppendBatch("c", 1, 0, (bytearray(b"a"),)), CommandInvalid, "not bytes"),  # type: ignore[arg-type]
    ("5 records", AppendBatch("c", 1, 0, (b"",) * 5), CommandTooLarge, "records_per_batch_max"),
    ("9-byte record", AppendBatch("c", 1, 0, (b"x" * 9,)), CommandTooLarge, "record_bytes_max"),
    ("17 bytes", AppendBatch("c", 1, 0, (b"x" * 8, b"x" * 8, b"x")), CommandTooLarge, "batch"),
    ("negative lsn", Truncate(-1), CommandInvalid, "lsn"),
    ("negative truncate epoch", Truncate(1, -1), CommandInvalid, "epoch"),
    ("huge truncate epoch", Truncate(1, 2**64), CommandInvalid, "epoch"),
    ("bool truncate epoch", Truncate(1, True), CommandInvalid, "epoch"),
    ("negative unfenced lsn", UnfencedTruncate(-1), CommandInvalid, "lsn"),
    ("lease epoch 0", AcquireLease("h", 0), CommandInvalid, r"\[1, 2\*\*64\)"),
    ("empty holder", AcquireLease("", 1), CommandInvalid, "holder must not be empty"),
    ("long holder", AcquireLease("h" * 9, 1), CommandInvalid, "holder is 9 bytes"),
    ("None holder", AcquireLease(None, 1), CommandInvalid, "holder must be a str"),  # type: ignore[arg-type]
    ("float token", Barrier(1.0), CommandInvalid, "token"),  # type: ignore[arg-type]
    ("not a command", "truncate", CommandInvalid, "not a command"),
    ("empty group", group(), CommandInvalid, "at least one batch"),
    ("list of batches", AppendGroup([AppendBatch("c", 1, 0, ())]), CommandInvalid, "tuple"),  # type: ignore[arg-type]
    ("4 batches", group(*[AppendBatch("c", 1, 0, ())] * 4), CommandTooLarge, "group_batches_max"),
    ("nested group", group(group(AppendBatch("c", 1, 0, ()))), CommandInvalid, "not an Append"),
    ("barrier in group", group(Barrier(1)), CommandInvalid, "batch 0 is a Barrier"),
    (
        "bad batch in group",
        group(AppendBatch("c", 1, 0, ()), AppendBatch("", 1, 0, ())),
        CommandInvalid,
        "batch 1: client_id must not be empty",
    ),
    (
        "big record in group",
        group(AppendBatch("c", 1, 0, (b"x" * 9,))),
        CommandTooLarge,
        "record_bytes_max",
    ),
    (
        "5 records in group",
        group(AppendBatch("c", 1, 0, (b"",) * 3), AppendBatch("d", 1, 0, (b"",) * 2)),
        CommandTooLarge,
        "records_per_batch_max",
    ),
    (
        "21 bytes in group",
        group(*[AppendBatch("c", 1, 0, (b"x" * 7,))] * 3),
        CommandTooLarge,
        "group_bytes_max",
    ),
]


@pytest.mark.parametrize(
    ("name", "command", "error", "match"), REFUSED, ids=[row[0] for row in REFUSED]
)
def test_encode_refuses(name: str, command: object, error: type[CommandError], match: str) -> None:
    with pytest.raises(error, match=match):
        encode_command(command, SMALL)  # type: ignore[arg-type]


def test_too_large_names_the_limit() -> None:
    with pytest.raises(CommandTooLarge) as caught:
        encode_command(AppendBatch("c", 1, 0, (b"x" * 9,)), SMALL)
    assert (caught.value.what, caught.value.size, caught.value.limit) == ("record_bytes_max", 9, 8)


GOOD = encode_command(AppendBatch("c1", 7, 2, (b"hello", b"")))


def test_every_truncation_is_corrupt() -> None:
    for length in range(len(GOOD)):
        with pytest.raises(CommandCorrupt):
            decode_command(GOOD[:length])


def test_a_flip_of_any_byte_is_corrupt() -> None:
    for position in range(len(GOOD)):
        for mask in (0x01, 0x80):
            damaged = bytearray(GOOD)
            damaged[position] ^= mask
            with pytest.raises(CommandCorrupt):
                decode_command(bytes(damaged))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "shorter than its 12-byte header"),
        (bytes(11), "shorter than its 12-byte header"),
        (bytes(40), "bad magic"),
        (b"LSS" + GOOD[3:], "bad magic"),
        (GOOD[:3] + b"\x02" + GOOD[4:], "unknown format version 2"),
        (GOOD[:3] + b"\x00" + GOOD[4:], "unknown format version 0"),
        (GOOD[:4] + bytes(8) + GOOD[12:], "checksum mismatch"),
        (GOOD + b"\0", "checksum mismatch"),
    ],
)
def test_damaged_frames_name_the_damage(data: bytes, reason: str) -> None:
    with pytest.raises(CommandCorrupt, match=reason):
        decode_command(data)


def test_a_frame_over_the_limit_is_refused_before_decoding() -> None:
    oversized = frame([1, "c", 1, 0, [b"x" * 8] * 4]) + b"\0" * SMALL.command_bytes_max
    with pytest.raises(CommandCorrupt, match="over the limit"):
        decode_command(oversized, SMALL)


BAD_BODIES: list[tuple[str, object, str]] = [
    ("empty array", [], "empty body"),
    ("not an array", 7, "not an array"),
    ("a map", {"tag": 1}, "bad msgpack body"),
    ("empty map", {}, "not an array"),
    ("tag 0", [0, 5], "unknown type tag 0"),
    ("tag 99", [99], "unknown type tag 99"),
    ("tag 7", [7, 5, 1], "unknown type tag 7"),
    ("str tag", ["1", "c", 1, 0, []], "type tag is a str"),
    ("bool tag", [True, 5], "type tag is a bool"),
    ("missing field", [1, "c", 1, 0], "type tag 1 with 3 fields"),
    ("extra field", [2, 5, 6], "type tag 2 with 2 fields"),
    ("bool seq", [1, "c", True, 0, []], "wrong type"),
    ("float epoch", [1, "c", 1, 1.0, []], "wrong type"),
    ("bin client_id", [1, b"c", 1, 0, []], "wrong type"),
    ("records not array", [1, "c", 1, 0, b"x"], "records are not an array"),
    ("str record", [1, "c", 1, 0, ["x"]], "record 0 is not bin"),
    ("nil record", [1, "c", 1, 0, [b"x", None]], "record 1 is not bin"),
    ("negative seq", [1, "c", -1, 0, []], "fields out of range.*seq"),
    ("empty client_id", [1, "", 1, 0, []], "fields out of range.*client_id"),
    ("lease epoch 0", [3, "h", 0], "fields out of range.*epoch"),
    ("negative lsn", [2, -5], "fields out of range.*lsn"),
    ("nil lsn", [2, None], "lsn is not an integer"),
    ("truncate without epoch", [6, 5], "type tag 6 with 1 fields"),
    ("truncate, extra field", [6, 5, 1, 0], "type tag 6 with 3 fields"),
    ("bool truncate epoch", [6, 5, True], "Truncate field of the wrong type"),
    ("nil truncate lsn", [6, None, 1], "Truncate field of the wrong type"),
    ("negative truncate epoch", [6, 5, -1], "fields out of range.*epoch"),
    ("str token", [4, "9"], "token is not an integer"),
    ("records over count", [1, "c", 1, 0, [b""] * 5], "out of range.*records_per_batch_max"),
    ("array over limit", [1, "c", 1, 0, [b""] * 6], "bad msgpack body.*max_array_len"),
    ("record over size", [1, "c", 1, 0, [b"x" * 9]], "bad msgpack body.*max_bin_len"),
    ("batch over size", [1, "c", 1, 0, [b"x" * 8] * 3], "fields out of range.*batch_bytes"),
    ("id over size", [1, "c" * 9, 1, 0, []], "bad msgpack body.*max_str_len"),
    ("ext type", [1, "c", msgpack.ExtType(5, b"x"), 0, []], "bad msgpack body"),
    ("timestamp", [4, msgpack.Timestamp(1)], "bad msgpack body"),
    ("group without batches", [5], "type tag 5 with 0 fields"),
    ("group, extra field", [5, [], 1], "type tag 5 with 2 fields"),
    ("group batches not array", [5, b"x"], "AppendGroup batches are not an array"),
    ("empty group", [5, []], "out of range.*at least one batch"),
    ("group batch short", [5, [["c", 1, 0]]], "batch 0 is not a 4-element array"),
    ("group batch tagged", [5, [[1, "c", 1, 0, []]]], "batch 0 is not a 4-element array"),
    ("group batch not array", [5, ["c"]], "batch 0 is not a 4-element array"),
    ("group bool seq", [5, [["c", 1, 0, []], ["c", True, 0, []]]], "batch 1 field of the wrong"),
    ("group str record", [5, [["c", 1, 0, ["x"]]]], "batch 0 record 0 is not bin"),
    ("group records not array", [5, [["c", 1, 0, b"x"]]], "batch 0 records are not an array"),
    ("group negative seq", [5, [["c", -1, 0, []]]], "out of range.*batch 0: seq"),
    ("4 batches", [5, [["c", 1, 0, []]] * 4], "out of range.*group_batches_max"),
    ("batches over array limit", [5, [["c", 1, 0, []]] * 6], "bad msgpack body.*max_array_len"),
    ("group over count", [5, [["c", 1, 0, [b""] * 3]] * 2], "out of range.*records_per_batch"),
    ("group over size", [5, [["c", 1, 0, [b"x" * 8] * 2]] * 2], "out of range.*group_bytes_max"),
]


@pytest.mark.parametrize(("name", "body", "reason"), BAD_BODIES, ids=[r[0] for r in BAD_BODIES])
def test_bodies_with_a_valid_checksum_are_checked_field_by_field(
    name: str, body: object, reason: str
) -> None:
    with pytest.raises(CommandCorrupt, match=reason):
        decode_command(frame(body), SMALL)


def test_garbage_msgpack_and_trailing_bytes_are_corrupt() -> None:
    for packed in (b"\xc1", b"\x95\x01", msgpack.packb([4, 1]) + b"\x00", b"\xdd\xff\xff\xff\xff"):
        data = FRAME_HEADER.pack(COMMAND_MAGIC, COMMAND_VERSION, xxh3(packed)) + packed
        with pytest.raises(CommandCorrupt, match="bad msgpack body"):
            decode_command(data)


def test_a_non_minimal_integer_encoding_decodes_to_the_same_value() -> None:
    """The command decoder accepts any msgpack encoding of valid values (FORMAT.md)."""
    packed = bytes([0x92, 0x04, 0xCF]) + (9).to_bytes(8, "big")  # Barrier(9), token as uint64
    data = FRAME_HEADER.pack(COMMAND_MAGIC, COMMAND_VERSION, xxh3(packed)) + packed
    assert decode_command(data) == Barrier(9)


ids = st.text(min_size=1, max_size=8).filter(lambda s: len(s.encode("utf-8", "replace")) <= 8)
u64 = st.integers(min_value=0, max_value=U64_MAX)
commands = st.one_of(
    st.builds(
        AppendBatch,
        ids,
        u64,
        u64,
        st.lists(st.binary(max_size=4), max_size=4).map(tuple),
    ),
    st.builds(Truncate, u64, u64),
    st.builds(UnfencedTruncate, u64),
    st.builds(AcquireLease, ids, st.integers(min_value=1, max_value=U64_MAX)),
    st.builds(Barrier, u64),
    st.builds(
        AppendGroup,
        st.lists(
            st.builds(
                AppendBatch,
                ids,
                u64,
                u64,
                st.lists(st.binary(max_size=4), max_size=2).map(tuple),
            ),
            min_size=1,
            max_size=2,
        ).map(tuple),
    ),
)


@settings(max_examples=300, deadline=None)
@given(commands)
def test_every_valid_command_round_trips(command: Command) -> None:
    try:
        data = encode_command(command, SMALL)
    except CommandInvalid:  # a lone surrogate in the generated text
        return
    assert decode_command(data, SMALL) == command


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_random_bodies_decode_to_a_valid_command_or_are_corrupt(body: bytes) -> None:
    data = FRAME_HEADER.pack(COMMAND_MAGIC, COMMAND_VERSION, xxh3(body)) + body
    try:
        command = decode_command(data, SMALL)
    except CommandCorrupt:
        return
    assert decode_command(encode_command(command, SMALL), SMALL) == command


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ROUND_TRIP), st.data())
def test_random_damage_is_corrupt_or_absent(command: Command, data: st.DataObject) -> None:
    frame_bytes = bytearray(encode_command(command))
    position = data.draw(st.integers(0, len(frame_bytes) - 1))
    frame_bytes[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CommandCorrupt):
        decode_command(bytes(frame_bytes))


# --- The hot path accepts exactly what the general rules accept -----------------------------


# Values around every edge of an AppendBatch's and an AppendGroup's rules under SMALL: types
# a decoded body or a buggy caller could hold (bool, float, bytes for str, list for tuple,
# a str subclass), ranges at and past their limits, UTF-8 that cannot be encoded.
class _Id(str):
    pass


_any_u64 = st.one_of(
    st.integers(-2, 3), st.integers(U64_MAX - 1, U64_MAX + 1), st.booleans(), st.floats(0, 2)
)
_any_id = st.one_of(
    st.text(max_size=9),
    st.sampled_from(["\ud800", "é" * 4, "é" * 5, "x" * 8, "x" * 9]),
    st.builds(_Id, st.text(min_size=1, max_size=2)),
    st.binary(max_size=2),
    st.none(),
)
_any_records = st.one_of(
    st.lists(st.one_of(st.binary(max_size=9), st.text(max_size=1)), max_size=5).map(tuple),
    st.lists(st.binary(max_size=2), max_size=2),
    st.none(),
)
_any_batch = st.builds(AppendBatch, _any_id, _any_u64, _any_u64, _any_records)
# Valid batches, so that groups reach their own limits (records and bytes summed).
_fair_batch = st.builds(
    AppendBatch,
    st.sampled_from(["c", "d"]),
    st.integers(0, 3),
    st.integers(0, 3),
    st.lists(st.binary(max_size=8), max_size=4).map(tuple),
)
_any_group = st.builds(
    AppendGroup,
    st.one_of(
        st.lists(st.one_of(_any_batch, st.just(Barrier(1))), max_size=4).map(tuple),
        st.lists(_fair_batch, max_size=4).map(tuple),
        st.lists(_any_batch, max_size=1),
    ),
)


@settings(max_examples=3000, deadline=None)
@given(st.one_of(_any_batch, _any_group))
def test_the_append_fast_path_accepts_exactly_the_valid_commands(command: Command) -> None:
    fast = command_codec._appends_ok(command, SMALL)
    general = command_codec._general_problem(command, SMALL)
    if fast:
        assert general is None
    elif general is None:  # refused by the fast path, valid for the general rules:
        assert _has_subclassed_field(command)  # only a subclass may take the long way


def _has_subclassed_field(command: Command) -> bool:
    batches = command.batches if isinstance(command, AppendGroup) else (command,)
    return any(type(batch.client_id) is _Id for batch in batches)  # type: ignore[union-attr]
