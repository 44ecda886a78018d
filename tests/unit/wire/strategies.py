"""Hypothesis strategies and small limits shared by the wire tests (not a test module)."""

from __future__ import annotations

from hypothesis import strategies as st

from logsvc.wire import (
    AcquireLease,
    Append,
    Appended,
    Authenticate,
    Authenticated,
    ErrorCode,
    ErrorResponse,
    LeaseGranted,
    Read,
    Records,
    Request,
    Response,
    ShardStatus,
    Status,
    Tail,
    Truncate,
    TruncatedTo,
    WireLimits,
)

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1

# Small limits (validated: every relation holds) so tests reach every edge with tiny inputs.
SMALL = WireLimits(
    frame_body_bytes_max=256,
    feed_bytes_max=64,
    token_bytes_max=16,
    node_id_bytes_max=16,
    error_message_bytes_max=32,
    client_id_bytes_max=8,
    holder_bytes_max=8,
    append_records_max=4,
    record_bytes_max=8,
    append_bytes_max=16,
    read_bytes_max=16,
    read_records_max=4,
    tail_wait_ms_max=1000,
).validate()

u32 = st.integers(0, U32_MAX)
u64 = st.integers(0, U64_MAX)
lsn = st.integers(1, U64_MAX)


# Text that encodes to 1..`size_max` UTF-8 bytes (at most 4 bytes per character).
def ident(size_max: int = 256) -> st.SearchStrategy[str]:
    return st.text(min_size=1, max_size=size_max // 4)


records = st.lists(st.binary(max_size=64), max_size=8).map(tuple)

requests: st.SearchStrategy[Request] = st.one_of(
    st.builds(Authenticate, ident(1024)),
    st.builds(Append, u32, records, ident(), u64, u64),
    st.builds(Read, u32, lsn, st.integers(1, 16 * 1024 * 1024)),
    st.builds(Tail, u32, lsn, st.integers(1, 16 * 1024 * 1024), st.integers(0, 60_000)),
    st.builds(Truncate, u32, u64, u64),
    st.builds(AcquireLease, u32, ident(), lsn),
    st.builds(Status, u32),
)


@st.composite
def records_replies(draw: st.DrawFn) -> Records:
    got = draw(records)
    first = draw(st.integers(1, U64_MAX - len(got)))
    return Records(got, first, first + len(got))


@st.composite
def shard_statuses(draw: st.DrawFn) -> ShardStatus:
    first = draw(lsn)
    return ShardStatus(
        draw(u32),
        draw(st.none() | ident()),
        draw(u64),
        first,
        draw(st.integers(first, U64_MAX)),
        draw(u64),
        draw(st.booleans()),
    )


@st.composite
def error_responses(draw: st.DrawFn) -> ErrorResponse:
    code = draw(st.sampled_from(ErrorCode))
    message = draw(st.text(max_size=64))
    if code == ErrorCode.NOT_LEADER:
        return ErrorResponse(code, message, leader_hint=draw(st.none() | ident()))
    if code == ErrorCode.TRUNCATED:
        return ErrorResponse(code, message, first_lsn=draw(lsn))
    if code in (ErrorCode.STALE_EPOCH, ErrorCode.NOT_LEASE_HOLDER):
        holder = draw(st.none() | ident())
        return ErrorResponse(code, message, current_holder=holder, current_epoch=draw(u64))
    return ErrorResponse(code, message)


responses: st.SearchStrategy[Response] = st.one_of(
    st.just(Authenticated()),
    st.builds(Appended, lsn, st.integers(0, 65_536), st.booleans()),
    records_replies(),
    st.builds(TruncatedTo, lsn),
    st.builds(LeaseGranted, ident(), lsn),
    shard_statuses(),
    error_responses(),
)

request_ids = st.integers(1, U64_MAX)
