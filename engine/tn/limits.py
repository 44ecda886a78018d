"""Every bound of the TN's protocol, server, client and standby watch, with its unit and
its reason (shared/STYLE.md "Limits are named, with units and reasons"; modelled on
engine/limits.py and logsvc/wire/limits.py). Relations are asserted at the bottom, at import.

Both ends use these values: a request the client encodes is never refused by the server for
its size, and a reply the server encodes always fits the client's decoder.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import limits as engine_limits

KiB = 1024
MiB = 1024 * KiB

U64_MAX = 2**64 - 1
"""Timestamps, DSNs, seqs and request ids are msgpack unsigned integers."""

PROTOCOL = 1
"""The TN protocol's own version, sent in `Authenticate` (FORMAT.md). The frames are logsvc's
(magic "LSW", frame version 1); this number versions the engine's messages inside them, so
they can change without touching logsvc's frame version."""

# --- Frames -------------------------------------------------------------------------------------

REQUEST_BODY_BYTES_MAX = 16 * MiB
"""The largest request body the server buffers (checked from the frame header, before the
body is read: an oversized frame costs 32 bytes). A compute node's write set is bounded by
its workspace (TXN_WORKSPACE_BYTES_MAX of rows) and CN_OP_KEYS_MAX keys, which fit with room
for long string keys."""

REPLY_BODY_BYTES_MAX = 32 * MiB
"""The largest reply body the client buffers: a logtail page or a push, plus their framing."""

FEED_BYTES_MAX = 1 * MiB
"""Bytes one decoder `feed()` may bring beyond a pending frame (asyncio reads 256 KiB)."""

READ_CHUNK_BYTES = 256 * KiB
"""What a connection reads from its socket at a time."""

# --- Messages -----------------------------------------------------------------------------------

TOKEN_BYTES_MAX = 1 * KiB
"""UTF-8 bytes of a token: a secret, not data."""

MESSAGE_BYTES_MAX = 4 * KiB
"""UTF-8 bytes of an error's message: one line for humans, not a traceback."""

ROLE_BYTES_MAX = 16
"""A role: "active" or "standby"."""

NAME_BYTES_MAX = engine_limits.NAME_BYTES_MAX
"""Database and table names, and column names in an update (the engine's own bound)."""

CLIENT_ID_BYTES_MAX = 256
"""A compute node's id in its write sets' origins."""

INCARNATION_HEX_CHARS = 12
"""A compute node's id is its name, "-", then this many random hex digits drawn when it
starts: two nodes given one name, or one node restarted, never share a `(client_id, seq)`
(the TN would answer the second as a retry of the first, decision 0007)."""

CN_NAME_BYTES_MAX = CLIENT_ID_BYTES_MAX - 1 - INCARNATION_HEX_CHARS
"""cn.toml's `client_id`: the name part of a compute node's id."""

SCHEMA_JSON_BYTES_MAX = 1 * MiB
"""A table schema as JSON (engine/checkpoint/layout.py `schema_json`): COLUMNS_MAX columns of
NAME_BYTES_MAX-byte names and their types fit in under 400 KiB."""

MANIFEST_NAME_BYTES_MAX = 1 * KiB
"""A checkpoint manifest's object name (`ckp/<ts>-<id>/manifest...`)."""

COMMIT_OPS_MAX = 4096
"""Operations in one write set: DDL and per-table inserts, deletes and updates."""

OP_KEYS_MAX = engine_limits.CN_OP_KEYS_MAX
"""Keys of one delete or update: a compute node's transaction deletes at most CN_OP_KEYS_MAX
rows."""

OP_VALUES_MAX = engine_limits.COLUMNS_MAX
"""Columns one update sets."""

OP_ROWS_BYTES_MAX = 8 * MiB
"""An insert's Arrow IPC stream. A compute node's transaction holds at most
TXN_WORKSPACE_BYTES_MAX of rows (it never spills), far below."""

KEY_PARTS_MAX = engine_limits.COLUMNS_MAX
"""Values in a compound key."""

EXT_BYTES_MAX = 8
"""The msgpack ext values used (dates: 4 bytes, timestamps: 8)."""

ENTRY_BYTES_MAX = engine_limits.TXN_ENTRY_BYTES_MAX
"""One logtail entry's payload: one encoded WAL entry."""

LOGTAIL_PAGE_BYTES_MAX = 16 * MiB
"""Entry payload bytes in one logtail reply. Past it the TN answers a page (`more`) and the
client asks again from where the page ends; the first entry is always sent, so at least
ENTRY_BYTES_MAX must fit."""

LOGTAIL_PAGE_ENTRIES_MAX = 65_536
"""Entries in one logtail reply (tiny entries cost little payload: the count needs its own
bound)."""

LOGTAIL_PAGES_MAX = 4096
"""Pages one `NetworkTN.logtail` call reads before it gives up: the engine's logtail buffer
holds at most 2 x LOGTAIL_BYTES_MAX, 8 pages of LOGTAIL_PAGE_BYTES_MAX, so this bound only
trips on a TN whose pages do not advance."""

PUSH_BYTES_MAX = 4 * MiB
"""Entry payload bytes in one push frame (a subscriber's queue is sent in such batches)."""

PUSH_ENTRIES_MAX = 4096
"""Entries in one push frame."""

CHECKPOINTS_MAX = 64
"""Checkpoints in a listing (the engine retains CKP_RETAINED)."""

ARRAY_LEN_MAX = max(
    COMMIT_OPS_MAX, OP_KEYS_MAX, LOGTAIL_PAGE_ENTRIES_MAX, PUSH_ENTRIES_MAX, KEY_PARTS_MAX
)
"""The msgpack decoder's `max_array_len`: the longest array any message holds. An array
over it is refused before it is built."""

# --- Server -------------------------------------------------------------------------------------

CONNECTIONS_MAX = 256
"""Open connections to one TN (compute nodes, probes, operators); past it new ones are
closed at once."""

REQUESTS_INFLIGHT_MAX = 64
"""Requests of one connection being served at once; more are answered OVERLOADED."""

REQUESTS_INFLIGHT_TOTAL_MAX = 4096
"""Requests being served by one TN over all connections, counting those whose connection
is gone (a commit is never cancelled by its connection's loss: see server.py); more are
answered OVERLOADED. Equal to the engine's COMMIT_QUEUE_MAX: no more can be committing."""

WRITE_BUFFER_BYTES_MAX = 8 * MiB
"""Replies queued for a peer that does not read them, before the connection stops reading
requests (back-pressure)."""

SUBSCRIBERS_MAX = 64
"""Subscriptions to one TN at once (one per connection); more are answered OVERLOADED."""

SUBSCRIBER_QUEUE_ENTRIES_MAX = 16_384
"""Entries waiting to be pushed to one subscriber. A subscriber this far behind is dropped
(SUBSCRIBER_DROPPED) and pulls the logtail instead: the TN never buffers without bound for a
slow reader."""

SUBSCRIBER_QUEUE_BYTES_MAX = 64 * MiB
"""Payload bytes waiting for one subscriber (the same reason)."""

CLOSE_GRACE_S = 5.0
"""At SIGTERM, how long requests in flight may finish before connections are dropped."""

# --- Client (engine/cn/client.py) and channels --------------------------------------------------

CONNECT_TIMEOUT_S = 2.0
"""One TCP connect plus authentication."""

REQUEST_TIMEOUT_S = 10.0
"""One request's answer (a commit waits for the WAL: a logsvc leader election takes ~2 s)."""

FAILOVER_WAIT_S_MAX = 20.0
"""How long a call keeps looking for an active TN (all addresses, with back-off) before it
gives up: longer than the standby's detection (WATCH_* below, ~3 s) plus its promotion."""

RETRY_BACKOFF_S_FIRST = 0.05
RETRY_BACKOFF_S_MAX = 1.0
"""Waits between rounds of addresses, doubling."""

ATTEMPTS_MAX = 200
"""Attempts of one call, whatever the time: a bound on the loop itself."""

PUSHES_HELD_MAX = 65_536
"""Pushed entries a client holds while it fills a gap from the logtail (after a reconnect or
a drop); past it it starts again."""

# --- The standby's watch of the active TN (engine/tn/watch.py) ---------------------------------

WATCH_PROBE_INTERVAL_MS = 250
"""Between status probes of the peers."""

WATCH_PROBE_TIMEOUT_MS = 500
"""One probe: connect, authenticate and status."""

WATCH_FAILURES_TO_PROMOTE = 4
"""Consecutive rounds in which no peer answered as the active TN before the standby promotes
itself: a dead process refuses connections at once (about 1 s to decide); a hung or
unreachable one times out (about 3 s)."""

WATCH_FAILURE_WINDOW_MS_MAX = 10_000
"""Those rounds must fall within this window; older failures do not count (a probe loop
that stalled, say under a paused process, does not promote on stale evidence)."""

STARTUP_PROBE_S_MAX = 3.0
"""At start, how long an active TN asks its peers whether one of them is active already."""

# --- The same, as values a test may shrink -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The server's bounds (defaults above); tests pass smaller ones to reach the edges."""

    connections_max: int = CONNECTIONS_MAX
    requests_inflight_max: int = REQUESTS_INFLIGHT_MAX
    requests_inflight_total_max: int = REQUESTS_INFLIGHT_TOTAL_MAX
    write_buffer_bytes_max: int = WRITE_BUFFER_BYTES_MAX
    subscribers_max: int = SUBSCRIBERS_MAX
    subscriber_queue_entries_max: int = SUBSCRIBER_QUEUE_ENTRIES_MAX
    subscriber_queue_bytes_max: int = SUBSCRIBER_QUEUE_BYTES_MAX
    request_body_bytes_max: int = REQUEST_BODY_BYTES_MAX

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            assert isinstance(value, int) and value >= 1, (name, value)
        assert self.request_body_bytes_max <= REQUEST_BODY_BYTES_MAX


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """A client's waits (defaults above): `NetworkTN`, the standby's probes, `engine
    promote`."""

    connect_timeout_s: float = CONNECT_TIMEOUT_S
    request_timeout_s: float = REQUEST_TIMEOUT_S
    failover_wait_s_max: float = FAILOVER_WAIT_S_MAX
    backoff_s_first: float = RETRY_BACKOFF_S_FIRST
    backoff_s_max: float = RETRY_BACKOFF_S_MAX
    attempts_max: int = ATTEMPTS_MAX

    def __post_init__(self) -> None:
        assert self.connect_timeout_s > 0
        assert self.request_timeout_s > 0
        assert self.failover_wait_s_max >= 0
        assert 0 < self.backoff_s_first <= self.backoff_s_max
        assert self.attempts_max >= 1


# --- Relations ----------------------------------------------------------------------------------

assert LOGTAIL_PAGE_BYTES_MAX >= ENTRY_BYTES_MAX  # the first entry always fits a page
assert PUSH_BYTES_MAX >= ENTRY_BYTES_MAX  # one entry always fits a push
# A page's framing: per entry an array header (1), commit_ts and dsn (9 each), a bin header (5).
assert LOGTAIL_PAGE_BYTES_MAX + LOGTAIL_PAGE_ENTRIES_MAX * 24 + 2 * KiB <= REPLY_BODY_BYTES_MAX
assert PUSH_BYTES_MAX + PUSH_ENTRIES_MAX * 24 + 1 * KiB <= REPLY_BODY_BYTES_MAX
assert OP_ROWS_BYTES_MAX < REQUEST_BODY_BYTES_MAX
assert REQUESTS_INFLIGHT_MAX <= REQUESTS_INFLIGHT_TOTAL_MAX <= engine_limits.COMMIT_QUEUE_MAX
assert engine_limits.TXN_WORKSPACE_BYTES_MAX <= OP_ROWS_BYTES_MAX
assert SUBSCRIBER_QUEUE_BYTES_MAX >= PUSH_BYTES_MAX
assert WATCH_PROBE_TIMEOUT_MS < WATCH_FAILURE_WINDOW_MS_MAX
assert (
    WATCH_FAILURES_TO_PROMOTE * (WATCH_PROBE_INTERVAL_MS + WATCH_PROBE_TIMEOUT_MS)
    <= WATCH_FAILURE_WINDOW_MS_MAX
)
assert FAILOVER_WAIT_S_MAX * 1000 > 2 * WATCH_FAILURES_TO_PROMOTE * (
    WATCH_PROBE_INTERVAL_MS + WATCH_PROBE_TIMEOUT_MS
)
