"""Every bound of the WAL driver and its local backends, named with its unit and its reason.

Why one module: TigerBeetle-style (shared/STYLE.md), a limit on every loop and queue, stated
once, with the relations between limits asserted at import so a change that breaks one is
caught before any code runs. Defaults follow MatrixOne's driver (reference/matrixone-wal.md
§1 "Driver defaults") where MO has one; the rest are ours and say why.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB

# --- Record codec (tae_driver/record.py, tae_driver/FORMAT.md) ---------------------------------

RECORD_HEADER_BYTES = 40
"""Fixed header of every driver record; see FORMAT.md."""

RECORD_BYTES_MAX = 2 * MiB
"""Largest encoded record (header + body). MO's `ClientBufSize` (§1): the group-commit cap."""

RECORD_ENTRIES_MAX = 50
"""Most entries packed into one record. MO's `ClientMaxEntryCount` (§1, scenario 12)."""

ENTRY_SIZE_PREFIX_BYTES = 4
ENTRY_BYTES_MAX = RECORD_BYTES_MAX - RECORD_HEADER_BYTES - ENTRY_SIZE_PREFIX_BYTES
"""Largest single engine entry: it must fit alone in one record."""

# --- The window (tae_driver/window.py) ---------------------------------------------------------

WINDOW_RECORDS_DEFAULT = 64
"""Records in flight by default. Throughput grows with it until the backend saturates."""

WINDOW_RECORDS_MAX = 256
"""Largest configurable window. It also bounds how far out of DSN order a crash can leave the
log (§2.3: at most window-1 records after the first hole), which bounds replay's pending set and
the size of a skip record. MO uses 100 (`ClientMaxCount`)."""

INTAKE_ENTRIES_MAX = 8192
"""Entries accepted but not yet packed into a record. When full, `append` waits (back-pressure)
and `submit` raises `Overloaded`; nothing buffers without bound."""

# --- Replay (tae_driver/replay.py) -------------------------------------------------------------

READ_BATCH_BYTES_DEFAULT = 4 * MiB
READ_BATCH_BYTES_MAX = 64 * MiB
"""Replay read batch. MO reads 64 MiB at a time (§1 `MaxReadBatchSize`); we default smaller
because results never depend on it (§4 replay tests run at several sizes)."""

REPLAY_WINDOWS_OUT_OF_ORDER_MAX = 4
"""How many full windows of records may be pending (read but not yet in DSN order) during
replay. Out-of-order-ness in a legal log is below two windows (records dispatched before and
while a record was in flight); a log that needs more is reported as corruption."""

REPLAY_PENDING_RECORDS_MAX = REPLAY_WINDOWS_OUT_OF_ORDER_MAX * WINDOW_RECORDS_MAX

RECORD_COPIES_MAX = 4
"""Identical copies of one record (a retried append, §2.7 Q7) that replay tracks. More copies
than this of one record is reported as corruption."""

SKIP_PAIRS_MAX = REPLAY_PENDING_RECORDS_MAX * RECORD_COPIES_MAX
"""Most (DSN, LSN) pairs in one skip record: every copy of every discarded trailing record."""

REPLAY_DIGESTS_KEPT = 2 * WINDOW_RECORDS_MAX
"""Checksums of recently applied records kept to verify that a late duplicate copy is
identical (Q7); older duplicates are accepted by DSN range alone."""

TAIL_POLL_DELAY_MS_MIN = 1
TAIL_POLL_DELAY_MS_MAX = 128
"""Back-off of a tailing reader over a backend that cannot wake it (MO polls 1..128 ms, §2.5)."""

# --- Local backends (tae_driver/backends/) -----------------------------------------------------

BACKEND_PAYLOAD_BYTES_MAX = RECORD_BYTES_MAX
"""Largest payload a local backend accepts: one driver record."""

FILE_FRAME_HEADER_BYTES = 32
"""Frame header of segment format version 2 (the one written): v1's 24 bytes plus the 8-byte
durable-LSN hint that tells a torn tail from corruption (backends/FORMAT.md)."""
FILE_FRAME_HEADER_BYTES_V1 = 24
"""Frame header of segment format version 1 (still read, never written)."""
FILE_SEGMENT_HEADER_BYTES = 32

FILE_SEGMENT_BYTES_DEFAULT = 64 * MiB
FILE_SEGMENT_BYTES_MIN = 1 * KiB
"""Segment rotation size. Truncation frees whole files, so smaller segments free space sooner
at the cost of more files; tests use 3 KiB (scenario 30)."""

FILE_SYNC_BATCH_BYTES_MAX = 4 * MiB
FILE_SYNC_BATCH_FRAMES_MAX = 4096
"""One write + one fsync covers at most this much (group commit, ARCHITECTURE.md §3 rule 6)."""

FILE_TORN_TAIL_BYTES_MAX = FILE_SYNC_BATCH_BYTES_MAX + FILE_FRAME_HEADER_BYTES + RECORD_BYTES_MAX
"""A power loss can only tear the last unsynced batch, so a bad frame further than this from the
end of the newest segment cannot be a torn write: it is reported as corruption, never cut."""

FILE_READ_ONLY_OPEN_ATTEMPTS_MAX = 8
"""A read-only open lists the segments again when one vanished before it was opened (a
running writer truncated it away); a writer truncates at most once per checkpoint, so a
few attempts always meet a quiet moment. Bounded so a broken directory cannot spin."""

FILE_READ_ONLY_SCAN_ATTEMPTS_MAX = 3
"""Reads of a segment a read-only look makes before it reports damage in it: a writer's
group write being copied into the file while the look copies it out can show as a torn
frame followed by whole ones (file_read_only.py `_scan_live`); damage on disk shows in every
read."""

FILE_READ_ONLY_RESCAN_PAUSE_S = 0.05
"""The pause before such a read again: a group write is copied into the page cache in
microseconds, so one pause outlasts it even on a loaded machine; at most 0.1 s in all."""

FILE_PENDING_APPENDS_MAX = 16384
"""Appends waiting for the file backend's next group write (the syncer thread's queue);
beyond it `append` raises `Overloaded`. The driver's window keeps one driver far below it."""

FILE_PREALLOCATE_BYTES_DEFAULT = 1 * MiB
"""How far ahead of the write position the active segment is allocated (zeros, `fallocate`):
an fdatasync of bytes written into allocated space need not commit a new file size or new
blocks (~45 us instead of ~65 us on this ext4, issue 21). A step, not the whole segment: an
engine's idle WAL costs at most this much disk, and open reads no more than this of zeros."""
FILE_PREALLOCATE_BYTES_MIN = 4 * KiB

FILE_SYNCER_JOIN_S_MAX = 30.0
"""How long `close` waits for the syncer thread to exit (it has nothing queued by then; only a
disk that never answers an fdatasync keeps it longer, and then `close` returns anyway)."""

FILE_SYNCER_IDLE_EXIT_S = 1.0
"""The file backend's syncer thread exits after this long with nothing to write (a new one
starts with the next append): a backend dropped without `close` leaves no thread behind."""

# --- Relations --------------------------------------------------------------------------------

assert RECORD_ENTRIES_MAX >= 1
assert ENTRY_BYTES_MAX > 0
assert 1 <= WINDOW_RECORDS_DEFAULT <= WINDOW_RECORDS_MAX
# A skip record listing every possible pair must fit in one record.
assert RECORD_HEADER_BYTES + 16 * SKIP_PAIRS_MAX <= RECORD_BYTES_MAX
# One full intake must not be smaller than one full record, or a record could never fill.
assert INTAKE_ENTRIES_MAX >= RECORD_ENTRIES_MAX
assert READ_BATCH_BYTES_DEFAULT <= READ_BATCH_BYTES_MAX
assert TAIL_POLL_DELAY_MS_MIN <= TAIL_POLL_DELAY_MS_MAX
# The largest frame fits in one sync batch, so the torn-tail bound covers it.
assert FILE_FRAME_HEADER_BYTES + BACKEND_PAYLOAD_BYTES_MAX <= FILE_SYNC_BATCH_BYTES_MAX
assert FILE_SEGMENT_BYTES_MIN > FILE_SEGMENT_HEADER_BYTES
# The torn-tail bound is computed with the larger (v2) header, so it covers v1 frames too.
assert FILE_FRAME_HEADER_BYTES_V1 <= FILE_FRAME_HEADER_BYTES
assert FILE_PENDING_APPENDS_MAX >= WINDOW_RECORDS_MAX
assert FILE_PREALLOCATE_BYTES_MIN <= FILE_PREALLOCATE_BYTES_DEFAULT
