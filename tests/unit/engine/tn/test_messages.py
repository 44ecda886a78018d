"""The TN protocol's codec (engine/tn/messages.py) matches its golden vectors and FORMAT.md,
and refuses every kind of damage with a typed error.

How: encoding fixed messages (one of every request and reply, an op of every kind, keys of
every value type, an ErrorReply of every shape of args) must give exactly the frames in
`golden/`; decoding them through logsvc's FrameDecoder must give the messages back; the hex
dumps of FORMAT.md's worked examples are those vectors. Damage: every truncation of every
vector waits for more bytes and is a `TruncatedFrame` at end of stream; every flipped byte
is a `ProtocolError` (the two checksums cover every byte); bodies that are whole and
checksummed but break a rule are `BadRequest` (with its code) or `BadReply`, table-driven,
and random bodies (hypothesis) never raise anything else. `TN_GOLDEN_REWRITE=1` rewrites the
vectors after a deliberate format change (with `limits.PROTOCOL` bumped).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
from pathlib import Path

import msgpack
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import engine.tn
from engine import Column, Schema
from engine.cn.port import TNStatus
from engine.logtail import Logtail, TailEntry
from engine.tn import limits
from engine.tn.errors import BadReply, BadRequest, ErrorCode
from engine.tn.messages import (
    Authenticate,
    Authenticated,
    CheckpointList,
    Checkpoints,
    Commit,
    Committed,
    ErrorReply,
    LogtailPage,
    Promote,
    Promoted,
    PullLogtail,
    Pushed,
    Reply,
    Request,
    Status,
    StatusReply,
    Subscribe,
    Subscribed,
    decode_reply,
    decode_request,
    encode_reply,
    encode_request,
    reply_decoder,
    request_decoder,
)
from engine.wal.codec import encode_batch
from engine.wal.columns import encode_columns
from engine.writeset import Op, WriteSet
from logsvc.wire.errors import ProtocolError, TruncatedFrame, UnsupportedVersion
from logsvc.wire.frames import Frame, FrameKind, encode_frame

GOLDEN = Path(__file__).parent / "golden"
FORMAT_MD = Path(engine.tn.__file__).parent / "FORMAT.md"
REWRITE = os.environ.get("TN_GOLDEN_REWRITE") == "1"

SHOP = Schema(
    [
        Column("id", "int64"),
        Column("day", "date32"),
        Column("note", "string", nullable=True),
        Column("at", "timestamp[us]", nullable=True),
    ],
    primary_key=["id", "day"],
)
DAY = datetime.date(2024, 5, 1)
AT = datetime.datetime(2024, 5, 1, 12, 30, 0, 250)
ROWS = pa.table(
    {"id": [1, 2], "day": [DAY, DAY], "note": ["a", None], "at": [AT, None]},
    schema=SHOP.to_arrow(),
)


BIG_ROWS = pa.table(
    {
        "id": list(range(33)),
        "day": [DAY] * 33,
        "note": ["n"] * 32 + [None],
        "at": [AT] * 33,
    },
    schema=SHOP.to_arrow(),
)
"""One row over the compact encoding's 32: an Arrow IPC stream (kind `insert`)."""


def ws(*ops: Op, start_ts: int = 100, seq: int = 3) -> WriteSet:
    return WriteSet(start_ts, tuple(ops), "cn-1", seq)


REQUESTS: list[tuple[str, int, Request]] = [
    ("request_authenticate_v1.hex", 1, Authenticate("s3cret-token")),
    ("request_status_v1.hex", 2, Status()),
    ("request_pull_logtail_v1.hex", 3, PullLogtail(100, 200)),
    ("request_commit_v1.hex", 1, Commit(ws(Op("delete", "shop", "orders", keys=(7,))))),
    (
        "request_commit_ddl_v1.hex",
        4,
        Commit(
            ws(
                Op("create_database", "shop"),
                Op("create_table", "shop", "orders", schema=SHOP),
                Op("drop_table", "shop", "old"),
                Op("drop_database", "attic"),
            )
        ),
    ),
    (
        "request_commit_rows_ipc_v1.hex",
        5,
        Commit(ws(Op("insert", "shop", "orders", rows=BIG_ROWS))),
    ),
    (
        "request_commit_columns_v1.hex",
        10,
        Commit(ws(Op("insert", "shop", "orders", rows=ROWS))),
    ),
    (
        "request_commit_values_v1.hex",
        6,
        Commit(
            ws(
                Op("delete", "shop", "orders", keys=((1, DAY), (2, DAY))),
                Op("delete", "shop", "by_time", keys=(AT, b"\x00bin", "text", True, -5)),
                Op(
                    "update",
                    "shop",
                    "orders",
                    keys=((1, DAY),),
                    values={"note": None, "at": AT, "score": 1.5, "day2": DAY},
                ),
            )
        ),
    ),
    ("request_subscribe_v1.hex", 7, Subscribe()),
    ("request_checkpoints_v1.hex", 8, Checkpoints()),
    ("request_promote_v1.hex", 9, Promote()),
]

ENTRIES = (TailEntry(101, 7, b"entry-101"), TailEntry(105, 9, b"entry-105"))

REPLIES: list[tuple[str, int, Reply]] = [
    ("reply_authenticated_v1.hex", 1, Authenticated()),
    ("reply_status_v1.hex", 2, StatusReply(TNStatus(105, 90, "standby"))),
    ("reply_logtail_page_v1.hex", 3, LogtailPage(Logtail(None, 0, ENTRIES, 110), False)),
    (
        "reply_logtail_checkpoint_v1.hex",
        3,
        LogtailPage(Logtail("ckp/00090-ab/manifest.json", 90, ENTRIES, 105), True),
    ),
    ("reply_committed_v1.hex", 1, Committed(101)),
    ("reply_subscribed_v1.hex", 7, Subscribed(100)),
    ("reply_pushed_v1.hex", 7, Pushed(ENTRIES)),
    ("reply_checkpoint_list_v1.hex", 8, CheckpointList(((80, "ckp/a"), (90, "ckp/b")))),
    ("reply_promoted_v1.hex", 9, Promoted(120, True)),
    ("reply_error_not_active_v1.hex", 2, ErrorReply(ErrorCode.NOT_ACTIVE, "standby")),
    (
        "reply_error_duplicate_key_v1.hex",
        4,
        ErrorReply(ErrorCode.DUPLICATE_KEY, "dup", ("shop.orders", (1, DAY))),
    ),
    (
        "reply_error_txn_too_large_v1.hex",
        4,
        ErrorReply(ErrorCode.TXN_TOO_LARGE, "big", ("txn_deletes_max", 100_001, 100_000)),
    ),
    ("reply_error_overloaded_v1.hex", 5, ErrorReply(ErrorCode.OVERLOADED, "full", ("q", 64))),
    (
        "reply_error_subscriber_dropped_v1.hex",
        7,
        ErrorReply(ErrorCode.SUBSCRIBER_DROPPED, "behind", (16_384,)),
    ),
    ("reply_error_connection_v1.hex", 0, ErrorReply(ErrorCode.BAD_REQUEST, "bad frame magic")),
]

ARROW_VECTORS = {"request_commit_rows_ipc_v1.hex"}
"""Vectors holding an Arrow IPC stream: their bytes are pyarrow's serialization, which may
change with pyarrow while the format does not. They must decode; encoding is compared
through decoding (the other vectors are compared byte for byte)."""


def golden(name: str) -> bytes:
    return bytes.fromhex((GOLDEN / name).read_text())


def write_golden(name: str, data: bytes) -> None:
    GOLDEN.mkdir(exist_ok=True)
    lines = [data[i : i + 32].hex() for i in range(0, len(data), 32)]
    (GOLDEN / name).write_text("\n".join(lines) + "\n")


def only_frame(data: bytes, *, reply: bool) -> Frame:
    decoder = reply_decoder() if reply else request_decoder()
    decoder.feed(data)
    frame = decoder.next_frame()
    assert frame is not None
    assert decoder.next_frame() is None
    return frame


@pytest.mark.parametrize(("name", "request_id", "msg"), REQUESTS)
def test_request_vectors(name: str, request_id: int, msg: Request) -> None:
    data = encode_request(request_id, msg)
    if REWRITE:
        write_golden(name, data)
    frame = only_frame(golden(name), reply=False)
    assert (frame.kind, frame.request_id) == (FrameKind.REQUEST, request_id)
    assert decode_request(frame) == msg
    if name in ARROW_VECTORS:
        assert decode_request(only_frame(data, reply=False)) == msg
    else:
        assert data == golden(name)


@pytest.mark.parametrize(("name", "request_id", "msg"), REPLIES)
def test_reply_vectors(name: str, request_id: int, msg: Reply) -> None:
    data = encode_reply(request_id, msg)
    if REWRITE:
        write_golden(name, data)
    assert data == golden(name)
    frame = only_frame(golden(name), reply=True)
    assert (frame.kind, frame.request_id) == (FrameKind.RESPONSE, request_id)
    assert decode_reply(frame) == msg


def test_every_message_has_a_vector_and_every_vector_a_message() -> None:
    kinds = {type(msg) for _, _, msg in REQUESTS + REPLIES}
    assert kinds == set(Request.__args__) | set(Reply.__args__)
    ops = {op.kind for _, _, m in REQUESTS if isinstance(m, Commit) for op in m.write_set.ops}
    assert ops == {
        "create_database",
        "drop_database",
        "create_table",
        "drop_table",
        "insert",
        "delete",
        "update",
    }
    listed = {name for name, _, _ in REQUESTS + REPLIES} | set(OLDER_CLIENT_VECTORS)
    assert listed == {path.name for path in GOLDEN.glob("*.hex")}


OLDER_CLIENT_VECTORS = {
    "request_commit_rows_v1.hex": (5, Commit(ws(Op("insert", "shop", "orders", rows=ROWS)))),
}
"""Frames a client older than the compact insert sends (two rows as Arrow IPC): they still
decode to the same operation."""


@pytest.mark.parametrize("name", sorted(OLDER_CLIENT_VECTORS))
def test_an_older_clients_frames_still_decode(name: str) -> None:
    request_id, msg = OLDER_CLIENT_VECTORS[name]
    frame = only_frame(golden(name), reply=False)
    assert frame.request_id == request_id
    assert decode_request(frame) == msg


def test_a_small_insert_travels_as_columns_and_a_large_one_as_arrow() -> None:
    small = only_frame(golden("request_commit_columns_v1.hex"), reply=False).body
    assert b"\xaeinsert_columns" in small and b"\xa6insert" not in small
    large = only_frame(golden("request_commit_rows_ipc_v1.hex"), reply=False).body
    assert b"\xa6insert" in large and b"insert_columns" not in large
    # The columns body is the WAL's AppendColumns body, byte for byte.
    batch = pa.RecordBatch.from_arrays(
        [c.combine_chunks() for c in ROWS.columns], schema=ROWS.schema
    )
    parts = encode_columns(batch)
    assert parts is not None
    assert b"".join(parts) in small


def test_a_one_row_insert_is_a_fraction_of_its_arrow_stream() -> None:
    one = ROWS.slice(0, 1)
    frame = encode_request(1, Commit(ws(Op("insert", "shop", "orders", rows=one))))
    assert (
        len(frame)
        < len(
            encode_batch(
                pa.RecordBatch.from_arrays(
                    [c.combine_chunks() for c in one.columns], schema=one.schema
                )
            )
        )
        // 2
    )


def test_a_null_in_a_non_nullable_column_still_travels_as_arrow() -> None:
    """The compact body cannot hold it: the TN refuses it as it always did (SchemaError)."""
    loose = pa.table({"id": [None]}, schema=pa.schema([pa.field("id", pa.int64(), False)]))
    body = encode_request(1, Commit(ws(Op("insert", "shop", "t", rows=loose))))[32:]
    assert b"insert_columns" not in body


def test_damaged_columns_are_a_bad_request() -> None:
    data = golden("request_commit_columns_v1.hex")
    body = bytearray(only_frame(data, reply=False).body)
    head = body.index(b"\xaeinsert_columns")
    at = body.index(b"\x02\x00\x00\x00", head)  # the columns body's row count, 2
    body[at] = 0  # no rows
    with pytest.raises(BadRequest, match="AppendColumns") as caught:
        decode_request(Frame(FrameKind.REQUEST, 1, bytes(body)))
    assert caught.value.code == ErrorCode.BAD_REQUEST


def test_the_worked_examples_of_format_md_are_the_vectors() -> None:
    dumps: list[bytes] = []
    current: bytearray | None = None
    for line in FORMAT_MD.read_text().splitlines():
        match = re.match(r"^([0-9a-f]{4}): ((?:[0-9a-f]{2} ?)+)", line)
        if match is None:
            if current is not None:
                dumps.append(bytes(current))
                current = None
            continue
        current = current if current is not None else bytearray()
        current += bytes.fromhex(match.group(2))
    assert dumps == [golden("request_commit_v1.hex"), golden("reply_committed_v1.hex")]


def test_the_commit_body_is_where_format_md_says() -> None:
    data = golden("request_commit_v1.hex")
    assert data[:8] == b"LSW\x01\x01\x00\x00\x00"
    body = data[32:]
    assert body[:9] == b"\x95\x13\x64\xa4cn-1\x03"  # array(5), op 19, 100, "cn-1", seq 3
    assert body[9:11] == b"\x91\x97"  # ops: array(1), the op: array(7)
    assert body[-3:] == b"\x91\x07\x90"  # keys [7], values []


def test_dates_and_timestamps_are_the_ext_types_of_format_md() -> None:
    body = golden("request_commit_values_v1.hex")[32:]
    days = (DAY - datetime.date(1970, 1, 1)).days
    assert b"\xd6\x01" + days.to_bytes(4, "little") in body  # fixext 4, type 1
    micros = (AT - datetime.datetime(1970, 1, 1)) // datetime.timedelta(microseconds=1)
    assert b"\xd7\x02" + micros.to_bytes(8, "little") in body  # fixext 8, type 2


# --- damage: frames --------------------------------------------------------------------------


ALL_VECTORS = [(name, False) for name, _, _ in REQUESTS] + [(name, True) for name, _, _ in REPLIES]


@pytest.mark.parametrize(("name", "reply"), ALL_VECTORS)
def test_every_truncation_waits_then_is_a_truncated_frame(name: str, reply: bool) -> None:
    data = golden(name)
    for cut in range(1, len(data)):
        decoder = reply_decoder() if reply else request_decoder()
        decoder.feed(data[:cut])
        assert decoder.next_frame() is None
        with pytest.raises(TruncatedFrame):
            decoder.end_of_stream()


@pytest.mark.parametrize(("name", "reply"), ALL_VECTORS)
def test_every_flipped_byte_is_a_protocol_error(name: str, reply: bool) -> None:
    data = golden(name)
    positions = range(len(data)) if len(data) <= 512 else range(0, len(data), 7)
    for position in positions:
        damaged = bytearray(data)
        damaged[position] ^= 0x5A
        decoder = reply_decoder() if reply else request_decoder()
        with pytest.raises(ProtocolError) as caught:
            decoder.feed(bytes(damaged))
            decoder.next_frame()
        if position == 3:
            assert isinstance(caught.value, UnsupportedVersion)


def test_an_oversize_request_is_refused_from_its_header() -> None:
    decoder = request_decoder(body_bytes_max=1024)
    header = encode_frame(FrameKind.REQUEST, 9, b"\x90" * 2048)[:32]
    decoder.feed(header)
    with pytest.raises(ProtocolError, match="over the limit"):
        decoder.next_frame()


# --- damage: bodies ---------------------------------------------------------------------------


def request_frame(body: bytes, request_id: int = 1) -> Frame:
    return Frame(FrameKind.REQUEST, request_id, body)


def reply_frame(body: bytes, request_id: int = 1) -> Frame:
    return Frame(FrameKind.RESPONSE, request_id, body)


def pack(value: object) -> bytes:
    packed = msgpack.packb(value, use_bin_type=True)
    assert isinstance(packed, bytes)
    return packed


def op(*fields: object) -> tuple[object, ...]:
    return fields


DELETE = op("delete", "shop", "orders", None, None, (7,), ())

BAD_REQUESTS: list[tuple[str, bytes, ErrorCode, str]] = [
    ("not msgpack", b"\xc1", ErrorCode.BAD_REQUEST, "bad msgpack"),
    ("truncated msgpack", pack((17, 1))[:-1], ErrorCode.BAD_REQUEST, "bad msgpack"),
    ("trailing bytes", pack((17,)) + b"\x00", ErrorCode.BAD_REQUEST, "bad msgpack"),
    ("a map", pack({"op": 17}), ErrorCode.BAD_REQUEST, "bad msgpack"),
    ("not an array", pack(17), ErrorCode.BAD_REQUEST, "not an array"),
    ("empty array", pack(()), ErrorCode.BAD_REQUEST, "empty"),
    ("bool op", pack((True,)), ErrorCode.BAD_REQUEST, "op is bool"),
    ("op 0", pack((0,)), ErrorCode.UNKNOWN_OP, "unknown op 0"),
    ("a logsvc op", pack((1, "token")), ErrorCode.UNKNOWN_OP, "unknown op 1"),
    ("a reply tag", pack((83, 1)), ErrorCode.UNKNOWN_OP, "unknown op 83"),
    ("extra field", pack((17, 1)), ErrorCode.BAD_REQUEST, "Status has 0 fields"),
    ("negative ts", pack((18, -1, 5)), ErrorCode.BAD_REQUEST, "t0 must be an unsigned"),
    ("bool ts", pack((18, True, 5)), ErrorCode.BAD_REQUEST, "t0 must be an unsigned"),
    ("empty token", pack((16, "", 1)), ErrorCode.BAD_REQUEST, "token"),
    ("long token", pack((16, "t" * 1025, 1)), ErrorCode.BAD_REQUEST, "token"),
    ("ops not array", pack((19, 1, "c", 1, "x")), ErrorCode.BAD_REQUEST, "ops must be"),
    ("empty client", pack((19, 1, "", 1, ())), ErrorCode.BAD_REQUEST, "client_id"),
    ("op not array", pack((19, 1, "c", 1, (5,))), ErrorCode.BAD_REQUEST, "ops[0] must be"),
    ("op short", pack((19, 1, "c", 1, (DELETE[:6],))), ErrorCode.BAD_REQUEST, "7 fields"),
    (
        "unknown kind",
        pack((19, 1, "c", 1, (op("truncate", *DELETE[1:]),))),
        ErrorCode.BAD_REQUEST,
        "unknown operation",
    ),
    (
        "schema on a delete",
        pack((19, 1, "c", 1, (op("delete", "d", "t", "{}", None, (7,), ()),))),
        ErrorCode.BAD_REQUEST,
        "schema goes with create_table",
    ),
    (
        "rows on a delete",
        pack((19, 1, "c", 1, (op("delete", "d", "t", None, b"x", (7,), ()),))),
        ErrorCode.BAD_REQUEST,
        "rows go with insert",
    ),
    (
        "insert of garbage",
        pack((19, 1, "c", 1, (op("insert", "d", "t", None, b"garbage", (), ()),))),
        ErrorCode.BAD_REQUEST,
        "not an engine Arrow IPC stream",
    ),
    (
        "a bad schema",
        pack((19, 1, "c", 1, (op("create_table", "d", "t", '{"columns": 5}', None, (), ()),))),
        ErrorCode.BAD_REQUEST,
        "schema",
    ),
    (
        "a deep schema",
        pack((19, 1, "c", 1, (op("create_table", "d", "t", "[" * 100_000, None, (), ()),))),
        ErrorCode.BAD_REQUEST,
        "schema",
    ),
    (
        "a table for a database op",
        pack((19, 1, "c", 1, (op("create_database", "d", "t", None, None, (), ()),))),
        ErrorCode.BAD_REQUEST,
        "takes no table",
    ),
    (
        "values on a delete",
        pack((19, 1, "c", 1, (op("delete", "d", "t", None, None, (7,), (("v", 1),)),))),
        ErrorCode.BAD_REQUEST,
        "values go with update",
    ),
    (
        "a column set twice",
        pack((19, 1, "c", 1, (op("update", "d", "t", None, None, (7,), (("v", 1), ("v", 2))),))),
        ErrorCode.BAD_REQUEST,
        "set twice",
    ),
    (
        "a nested key",
        pack((19, 1, "c", 1, (op("delete", "d", "t", None, None, ((1, (2, 3)),), ()),))),
        ErrorCode.BAD_REQUEST,
        "scalar",
    ),
    (
        "a one-part compound key",
        pack((19, 1, "c", 1, (op("delete", "d", "t", None, None, ((1,),), ()),))),
        ErrorCode.BAD_REQUEST,
        "2 to",
    ),
    (
        "an unknown ext type",
        pack(
            (19, 1, "c", 1, (op("delete", "d", "t", None, None, (msgpack.ExtType(9, b"x"),), ()),))
        ),
        ErrorCode.BAD_REQUEST,
        "unknown ext type 9",
    ),
    (
        "msgpack's timestamp",
        msgpack.packb(
            (
                19,
                1,
                "c",
                1,
                (op("delete", "d", "t", None, None, (datetime.datetime.now(datetime.UTC),), ()),),
            ),
            datetime=True,
        ),
        ErrorCode.BAD_REQUEST,
        "scalar",
    ),
    (
        "a date of the wrong size",
        pack(
            (
                19,
                1,
                "c",
                1,
                (op("delete", "d", "t", None, None, (msgpack.ExtType(1, b"abc"),), ()),),
            )
        ),
        ErrorCode.BAD_REQUEST,
        "unknown ext type 1 of 3 bytes",
    ),
    (
        "a date out of range",
        pack(
            (
                19,
                1,
                "c",
                1,
                (
                    op(
                        "delete",
                        "d",
                        "t",
                        None,
                        None,
                        (msgpack.ExtType(1, b"\xff\xff\xff\x7f"),),
                        (),
                    ),
                ),
            )
        ),
        ErrorCode.BAD_REQUEST,
        "out of the range",
    ),
    (
        "an array over the decoder's bound",
        pack((19, 1, "c", 1, (op("delete", "d", "t", None, None, (1,) * 100_001, ()),))),
        ErrorCode.BAD_REQUEST,
        "bad msgpack",
    ),
    (
        "rows over their limit",
        pack((19, 1, "c", 1, (op("insert", "d", "t", None, b"\0" * (8 * 2**20 + 1), (), ()),))),
        ErrorCode.TOO_LARGE,
        "over",
    ),
]


@pytest.mark.parametrize(
    ("body", "code", "match"),
    [case[1:] for case in BAD_REQUESTS],
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_bad_request_bodies_are_typed(body: bytes, code: ErrorCode, match: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(match)) as caught:
        decode_request(request_frame(body))
    assert caught.value.code == code


def test_request_id_zero_and_a_reply_frame_are_refused() -> None:
    with pytest.raises(BadRequest, match="request id 0"):
        decode_request(request_frame(pack((17,)), request_id=0))
    with pytest.raises(ProtocolError):
        decode_request(reply_frame(pack((17,))))


BAD_REPLIES: list[tuple[str, bytes, str]] = [
    ("unknown tag", pack((99,)), "unknown reply tag 99"),
    ("a request op", pack((17,)), "unknown reply tag 17"),
    ("unknown code", pack((95, 77, "x", ())), "unknown error code 77"),
    ("code 0", pack((95, 0, "x", ())), "unknown error code 0"),
    ("args on a plain code", pack((95, 5, "x", ("a",))), "carries 0 args"),
    ("no args for a duplicate", pack((95, 9, "x", ())), "carries 2 args"),
    ("an int for a str arg", pack((95, 6, "x", (1, 2))), "must be a str"),
    ("a bad role", pack((81, 1, 0, "leader")), "role"),
    ("entries out of order", pack((85, ((5, 1, b"a"), (5, 2, b"b")))), "does not follow"),
    ("an empty push", pack((85, ())), "empty"),
    ("an empty payload", pack((85, ((5, 1, b""),))), "payload of 0 bytes"),
    ("dsn 0", pack((85, ((5, 0, b"a"),))), "dsn 0"),
    ("checkpoint_ts alone", pack((82, None, 5, (), 5, False)), "without a checkpoint"),
    ("entries before the checkpoint", pack((82, "c", 9, ((5, 1, b"a"),), 9, False)), "follow"),
    ("upto below its entries", pack((82, None, 0, ((5, 1, b"a"),), 4, False)), "below"),
    ("checkpoints out of order", pack((86, ((9, "b"), (5, "a")))), "out of order"),
    ("a non-error with id 0", b"", "reserved"),
]


@pytest.mark.parametrize(
    ("body", "match"), [case[1:] for case in BAD_REPLIES], ids=[case[0] for case in BAD_REPLIES]
)
def test_bad_reply_bodies_are_typed(body: bytes, match: str) -> None:
    if not body:  # the id-0 case: a valid Committed, on id 0
        with pytest.raises(BadReply, match=match):
            decode_reply(reply_frame(pack((83, 1)), request_id=0))
        return
    with pytest.raises(BadReply, match=re.escape(match)):
        decode_reply(reply_frame(body))


# --- encoding refuses what would not decode --------------------------------------------------


@pytest.mark.parametrize(
    ("msg", "match"),
    [
        (Authenticate(""), "token"),
        (Commit(WriteSet(1, (), "", 1)), "client_id"),
        (Commit(ws(Op("insert", "d", "t", rows=pa.table({"l": [[1]]})))), "not an engine type"),
        (Commit(ws(Op("delete", "d", "t", keys=(2**64,)))), "does not encode"),
        (Commit(ws(Op("delete", "d", "t", keys=(object(),)))), "does not encode"),
        (Commit(ws(Op("delete", "d", "t", keys=("\udc80",)))), "does not encode"),
        (Commit(ws(Op("create_table", "d", "t"))), "schema goes with create_table"),
        (Commit(ws(Op("update", "d", "t", keys=(1,)))), "values go with update"),
        (PullLogtail(-1, 5), "t0 must be an unsigned integer, got -1"),
    ],
)
def test_encoding_refuses_a_request_that_would_not_decode(msg: Request, match: str) -> None:
    with pytest.raises(BadRequest, match=re.escape(match)):
        encode_request(1, msg)


def test_a_request_over_the_body_limit_is_refused_before_sending() -> None:
    keys = tuple("k" * 200 for _ in range(limits.OP_KEYS_MAX))
    with pytest.raises(BadRequest) as caught:
        encode_request(1, Commit(ws(Op("delete", "d", "t", keys=keys))))
    assert caught.value.code == ErrorCode.TOO_LARGE


def test_an_aware_timestamp_travels_as_utc() -> None:
    aware = datetime.datetime(
        2024, 5, 1, 14, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=2))
    )
    frame = only_frame(
        encode_request(1, Commit(ws(Op("delete", "d", "t", keys=(aware,))))), reply=False
    )
    got = decode_request(frame)
    assert isinstance(got, Commit)
    assert got.write_set.ops[0].keys == (datetime.datetime(2024, 5, 1, 12, 0),)


def test_an_error_message_is_cut_to_its_bound() -> None:
    reply = ErrorReply.of(ErrorCode.INTERNAL, "é" * 10_000)
    assert len(reply.message.encode()) <= limits.MESSAGE_BYTES_MAX
    assert decode_reply(only_frame(encode_reply(1, reply), reply=True)) == reply


# --- random bodies ----------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.binary(max_size=8),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5).map(tuple), max_leaves=20)
bodies = st.one_of(
    st.binary(max_size=64),
    st.tuples(st.integers(0, 100), st.lists(values, max_size=6)).map(lambda t: pack((t[0], *t[1]))),
    st.tuples(st.sampled_from([16, 17, 18, 19, 20, 21, 22]), st.lists(values, max_size=6)).map(
        lambda t: pack((t[0], *t[1]))
    ),
)


@settings(max_examples=300, deadline=None)
@given(bodies)
def test_random_request_bodies_decode_or_are_bad_requests(body: bytes) -> None:
    with contextlib.suppress(BadRequest):  # and nothing else
        decode_request(request_frame(body))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        bodies,
        st.tuples(st.sampled_from(range(80, 96)), st.lists(values, max_size=6)).map(
            lambda t: pack((t[0], *t[1]))
        ),
    )
)
def test_random_reply_bodies_decode_or_are_bad_replies(body: bytes) -> None:
    with contextlib.suppress(BadReply):  # and nothing else
        decode_reply(reply_frame(body))
