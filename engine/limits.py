"""Every bound of the engine, named with its unit and its reason.

Why one module (shared/STYLE.md, modelled on tae_driver/limits.py): a limit on every queue
and every workspace, stated once; relations between limits asserted at import.
"""

from __future__ import annotations

from dataclasses import dataclass

from tae_driver import limits as driver_limits

KiB = 1024
MiB = 1024 * KiB

# --- Transactions -------------------------------------------------------------------------------

TXNS_OPEN_MAX = 4096
"""Transactions open at once (begun, not yet committed or rolled back). Each pins its snapshot
and holds a workspace; beyond this `transaction()` raises `Overloaded`."""

TXN_WORKSPACE_BYTES_MAX = 1 * MiB
"""Bytes of inserted data (Arrow buffer sizes) one transaction may hold before commit. Until
large transactions write their rows as objects (issue 14), a transaction's whole data rides in
one WAL entry, so it must stay below the driver's entry limit with room for the commands."""

TXN_SPILL_BYTES = 1 * MiB
"""With an object store, a transaction's inserted rows of one table are written to an object
once they pass this many bytes (a large transaction, engine/spill.py): its WAL entry then
carries their metadata, not the rows."""

TXN_SPILL_ROWS_MAX = 50_000_000
"""Rows one transaction may insert (the large transactions' named limit): it keeps the sorted
keys of the rows it spilled in memory (8 bytes each for an integer key) and its commit checks
them against every concurrent commit's."""

TXN_ENTRY_BYTES_MAX = driver_limits.ENTRY_BYTES_MAX
"""Largest encoded WAL entry: one driver entry (tae_driver/limits.py ENTRY_BYTES_MAX). A
transaction whose entry would be larger fails with `TxnTooLarge("txn_entry_bytes_max")`."""

TXN_DELETES_MAX = TXN_SPILL_ROWS_MAX
"""Rows one transaction may delete (an update deletes the rows it rewrites). A delete costs a
bit in a block's mask in the WAL entry; its key is kept in a sorted array (8 bytes for an
integer key; a Python object for other keys, engine/keyset.py) and, past
`TXN_BULK_KEYS_MIN`, checked against concurrent commits by binary search instead of one
conflict-index entry per key. So deletes go as far as inserts do (issue 20: it was 100,000,
a conflict-index entry each)."""

DELETE_KEYS_LOGGED_MAX = 65_536
"""Rows of one transaction whose primary keys its WAL entry carries (the DeleteKeys command,
issue 23: the change stream gives each delete its key). The workspace remembers each deleted
row's key by (block, offset) until then, about 40 bytes a row; past it the transaction forgets
them and logs its deletes without keys (engine/FORMAT.md "DeleteKeys"), as it does when the
keys would take its entry past `TXN_ENTRY_BYTES_MAX`: 65,536 integer keys are 512 KiB, a
quarter of an entry, so the memory stays bounded and a large delete never fails for its keys."""

TXN_BULK_KEYS_MIN = 4096
"""A transaction that deleted more rows of one table than this hands their keys to the
conflict index as one sorted array (`conflicts.BulkInsert`), as a large insert does."""

CN_OP_KEYS_MAX = 100_000
"""Keys of one delete or update of a compute node's write set (it travels in one request,
engine/tn/limits.py): a compute node's transaction deletes at most this many rows."""


@dataclass(frozen=True, slots=True)
class TxnLimits:
    """The per-transaction limits an engine enforces, raisable at `Engine.open(...,
    txn_limits=TxnLimits(...))` (issue 20). Every field defaults to the constant above:

    * `workspace_bytes_max` (`TXN_WORKSPACE_BYTES_MAX`): bytes of rows held before commit by
      an engine without an object store (they all ride in the commit's one WAL entry, so at
      most `TXN_ENTRY_BYTES_MAX`);
    * `spill_bytes` (`TXN_SPILL_BYTES`): with an object store, a table's inserted rows are
      written to an object past this many bytes (below `TXN_ENTRY_BYTES_MAX`);
    * `rows_max` (`TXN_SPILL_ROWS_MAX`): rows inserted, an update's new versions included;
    * `deletes_max` (`TXN_DELETES_MAX`): rows deleted, an update's old versions included.

    A transaction past one of them fails with `TxnTooLarge` naming it, before the work: the
    size is checked from the rows or keys it is given."""

    workspace_bytes_max: int = TXN_WORKSPACE_BYTES_MAX
    spill_bytes: int = TXN_SPILL_BYTES
    rows_max: int = TXN_SPILL_ROWS_MAX
    deletes_max: int = TXN_DELETES_MAX

    def problem(self) -> str | None:
        """What is wrong with these limits (for `Engine.open` to refuse), or None."""
        for name in ("workspace_bytes_max", "spill_bytes", "rows_max", "deletes_max"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                return f"TxnLimits.{name} must be a positive int, not {value!r}"
        if self.workspace_bytes_max >= TXN_ENTRY_BYTES_MAX:
            return (
                f"TxnLimits.workspace_bytes_max must be below the WAL entry's "
                f"{TXN_ENTRY_BYTES_MAX} bytes (the rows ride in one entry)"
            )
        if self.spill_bytes >= TXN_ENTRY_BYTES_MAX:
            return (
                f"TxnLimits.spill_bytes must be below the WAL entry's {TXN_ENTRY_BYTES_MAX} bytes"
            )
        return None


# --- The commit pipeline ------------------------------------------------------------------------

COMMIT_QUEUE_MAX = 4096
"""Transactions between their conflict check and their visibility (being logged). Beyond it
`commit()` raises `Overloaded` before anything is logged. The driver's own intake
(INTAKE_ENTRIES_MAX) is larger, so the driver never refuses an entry the pipeline accepted."""

CONFLICT_KEYS_MAX = 1_000_000
"""Row keys remembered by the conflict index (changes committed since the oldest open
snapshot). Past it the oldest row changes are forgotten: memory stays bounded however long a
transaction stays open. A transaction whose snapshot predates what is remembered is checked
exactly against the table data at commit instead (engine/old_snapshots.py, issue 21), never
refused for it."""

# --- Storage (in memory until issue 14) --------------------------------------------------------

BLOCK_ROWS_MAX = 8192
"""Rows per block. Row ids are (block_id, offset); a block is the unit of delete masks in the
WAL's Delete command and, with issue 14, of sorted L1 objects."""

# --- Storage: flush, merge, compaction (decision 0006) ------------------------------------------

FLUSH_AGE_MS = 60_000
"""An open L0 block older than this (since its first row) is sealed and flushed to an L1
object, so a slowly written table does not keep its rows in memory and in the WAL forever."""

L0_VALUES_ROWS_MAX = 1024
"""Rows of small inserts an L0 block keeps as Python values before it builds their Arrow batch
(engine/storage/blocks.py): one `pa.array` per column per this many one-row commits at
least, and about 200 KiB of values at most per open block (~200 B a row as Python objects)."""

L0_BYTES_MAX = 64 * MiB
"""Bytes of Arrow data in L0 blocks, over every table. Past it the largest tables' open blocks
are sealed and flushed: memory stays bounded whatever the write pattern."""

L0_BYTES_HARD_MAX = 2 * L0_BYTES_MAX
"""Past this many bytes in L0 blocks, commits that append wait for flushes to give memory
back (at most `L0_WAIT_S_MAX`, then `Overloaded`): a load faster than flushes can keep up
with is slowed down instead of growing memory."""

L0_WAIT_S_MAX = 30.0
"""Longest wait of one commit for L0 memory."""

MERGE_L1_BLOCKS = 16
"""L1 blocks of a table merged into one L2 segment (the seed's K): point reads and scans
then open one sorted segment instead of many overlapping blocks."""

KEY_INDEX_RUN_RATIO = 4
"""A table's key index (engine/storage/keyindex.py) merges its newest run into the one before
while that one is less than this many times larger: at most log4(keys / block rows) + 1 runs
to search per lookup (4 at 10M keys in 8,192-row blocks, measured), each key rewritten
O(log) times in all (building 10M keys one block at a time: 1.4 s of merging in total, the
largest single merge 0.17 s)."""

KEY_INDEX_MERGE_ON_LOOP_ENTRIES_MAX = 1 << 17
"""A key index merge of at most this many entries (16 blocks of 8,192 rows, about 1 MiB, ~2 ms
of sorting) runs where it is wanted, on the event loop; a larger one is left to maintenance,
which runs it in a worker thread and swaps the result in on the loop (the 0.17 s pause at
10M keys stalled every commit)."""

KEY_INDEX_RUNS_MAX = 32
"""Runs a key index may hold while its large merges wait for a thread (a lookup costs one
binary search per run, ~2 us each): past it the merge runs on the loop anyway, so an index
nobody merges for (a compute node, maintenance stopped) stays a bounded number of runs."""

KEY_INDEX_DEAD_FRACTION = 0.25
"""The key index rewrites its runs without collected blocks' entries once those pass this
fraction of the live entries: at most 1.25 entries (10 bytes) per live key."""

KEY_INDEX_BLOCKS_PER_TASK = 64
"""Persisted blocks whose keys one background task reads to index them (after open or
replay, the blocks were created from their objects' footers, which hold no keys): about
half a million keys, a fraction of a second of reading per task."""

COMPACT_DELETED_FRACTION = 0.5
"""A persisted block is rewritten alone once this fraction of its rows is dead to every
reader (compaction of blocks with many deletes)."""

MAINTENANCE_INTERVAL_MS = 500
"""How often the engine plans flushes, merges and compactions."""

REWRITES_IN_FLIGHT_MAX = 2
"""Flushes, merges and compactions running at once (each holds its inputs' rows and writes
objects in a worker thread)."""

CACHE_BYTES = 256 * MiB
"""The buffer cache of persisted blocks' columns, keys and metadata (issue 14 "Buffer
manager"): RSS stays about this plus the L0 blocks, however large the tables grow."""

SCAN_GROUP_ROWS = 1 << 20
"""Rows of persisted blocks a scan loads and pins at once (whole objects; then filters them
and unpins): a few tens of MiB of columns, well inside CACHE_BYTES, so a table larger than
the cache is scanned through it. A group the cache cannot take is halved."""

# --- Checkpoints (decision 0006) ----------------------------------------------------------------

CKP_INTERVAL_MS = 60_000
"""A checkpoint at least this often while commits arrive, so restart replays at most this much
WAL (plus the reserve)."""

CKP_WAL_ENTRIES = 200_000
"""...or as soon as this many WAL entries were written since the last one: the retained WAL
stays a bounded window however fast commits come (issue 14 "Long-run")."""

CKP_WAL_RESERVE_ENTRIES = 1024
"""WAL entries kept below a checkpoint when truncating (MatrixOne's ReservedWALEntryCount):
a reader tailing the log, or an audit, finds the entries just before the checkpoint."""

CKP_RETAINED = 2
"""Checkpoints kept (the newest and the one before it); older ones and the objects only they
referred to are deleted."""

CKP_GLOBAL_EVERY = 8
"""Every this many checkpoints one is global (rewrites every dump and delta object), so the
objects of older ones can go; the others are incremental."""

# --- History retention (issue 24, decision 0010) ------------------------------------------------

HISTORY_RETENTION_MS = 3_600_000
"""Default `history_retention`: an hour during which `snapshot(ts)` works across restarts,
checkpoints, merges and compactions (Delta Lake keeps 30 days of log; our WAL holds every
row appended, so the default is short: an analyst's "what did this look like this morning"
is an `Engine.open(..., history_retention=...)` or a TN's `[maintenance]` away). 0 keeps
nothing below the newest checkpoint (the engine before issue 24)."""

CN_SNAPSHOT_GRACE_MS = 10_000
"""A TN keeps the blocks a flush, merge or compaction dropped this long before it collects
them (`Policy.snapshot_grace_ms`), so a compute node's transaction that began within it still
finds its snapshot when its write set arrives (issue 21: one flush refused every in-flight CN
transaction at once). Ten seconds covers a transaction's round trips under load many times;
the memory it holds is what the table's rewrites dropped in that time (at 10 MB/s of rows,
100 MB). A longer transaction gets `SnapshotUnavailable` and starts again."""

HISTORY_RETENTION_MS_MAX = 30 * 24 * 3600 * 1000
"""A longer window is surely a unit mistake (seconds typed as milliseconds...): Delta Lake's
default log retention."""

CKP_HISTORY_RETAINED_MAX = 256
"""Checkpoints kept for history at most, whatever the window: past it the one whose
neighbours are closest is retired (the window's start stays readable, a snapshot in the
middle replays a longer stretch of WAL). With the default checkpoint interval (a minute)
this thins a window longer than ~4 hours."""

SNAPSHOT_IN_FLIGHT_WAIT_S_MAX = 10.0
"""`snapshot(at=wall time)` waits at most this long for commits in flight with a timestamp at
or below that time to become visible (so the answer is repeatable); each takes one WAL append."""

HISTORY_VIEWS_MAX = 2
"""Historical states (a checkpoint replayed to a timestamp below the in-memory history) held
at once: each costs about a checkpoint's L0 dumps and a checkpoint interval of appends."""

# --- Compute nodes and the TN (issue 15) -------------------------------------------------------

WAL_WINDOW_RECORDS = 64
"""Driver records in flight to the WAL at once (tae_driver's window; `Engine.open`'s
`window_records`)."""

STANDBY_TAIL_ATTEMPTS_MAX = 6
"""A standby's tail that fails this many times in a row without progress gives up
(`StandbyFailed`; the TN daemon exits non-zero so a supervisor restarts it). Falling behind
the WAL's truncation is no failure: it catches up from a checkpoint (issue 25)."""

STANDBY_TAIL_RETRY_MS_MIN = 200
STANDBY_TAIL_RETRY_MS_MAX = 5_000
"""The back-off between a standby's tail attempts doubles from the first to the second:
about 11 s from the first failure to giving up, several times the log client's own bound
on finding a new leader (a shard's failover is seconds)."""

ORIGIN_CLIENTS_MAX = 10_000
"""Compute nodes whose recent commits the engine remembers by `(client_id, seq)`, so that a
commit retried after a TN failover finds its outcome instead of running twice."""

ORIGIN_SEQS_PER_CLIENT = 64
"""Commits remembered per compute node (more than it has in flight at once)."""

LOGTAIL_BYTES_MAX = 64 * MiB
"""Encoded entries the engine keeps for compute nodes to catch up with (engine/logtail.py);
a CN further behind starts from a checkpoint. Up to twice this while the entries after the
newest checkpoint need it; a full buffer asks for a checkpoint."""

# --- Names and schemas --------------------------------------------------------------------------

NAME_BYTES_MAX = 255
"""Longest database, table or column name in UTF-8 bytes."""

COLUMNS_MAX = 1024
"""Columns per table."""

# --- Reads --------------------------------------------------------------------------------------

SCAN_ROWS_DEFAULT_LIMIT = 20
"""Rows the `engine scan` CLI prints unless told otherwise."""

READ_ONLY_LOOK_ATTEMPTS_MAX = 4
"""`engine tables|scan|stats` beside a running engine: an object it needs was deleted by the
writer meanwhile (two newer checkpoints made it garbage while the look was reading an older
state), so it opens again and reads the newer state, at most this many times. A writer
checkpoints once a minute by default: one retry almost always suffices."""

HISTORY_LIMIT_ROWS_MAX = 100_000
"""`engine history --limit N` keeps the newest N rows it has read until the WAL ends (a few
hundred bytes each): at most this many, so the command stays within tens of MiB. Without
`--limit` rows are printed as they are read and nothing is kept."""

HISTORY_CACHE_BYTES = 8 * MiB
"""The block cache `engine history` opens its object store with: it reads only the newest
checkpoint's catalog and block list, never a block."""
SQL_QUERIES_MAX = 4
"""SQL queries (`Engine.sql`, `ComputeNode.sql`) running at once in this process. Each has
its own DuckDB database (a query's views live in its catalog, so two queries at different
snapshots never see each other's) and its own thread; one more is refused `Overloaded`."""

SQL_THREADS_MAX = 1
"""DuckDB worker threads per streamed query. One: more added only scheduling and GIL
hand-offs (a point query over a Python dataset: 1.2 ms median with one thread, 1.9 ms with
four; `engine.bench scan` at 1M rows: no query faster with two). At 10M rows (2026-11-27,
box loaded 15-30, best of 9 alternating in one process) the group-by took 137 ms with one
thread, 141 with two over one stream, 172 with two over two streams of half the blocks
each under a UNION ALL view, DuckDB's native table 85 ms. What it spends is DuckDB's: the
engine's scan of those 10M rows took 12-19 ms, DuckDB's group-by over the same rows as an
in-memory Arrow table 150-300 ms at one or two threads. The engine's loop still scans the
next group while DuckDB consumes this one (engine/sql.py), so a query keeps two cores
busy."""

SQL_MEMORY_BYTES_MAX = 1024 * MiB
"""DuckDB's memory limit per query (hash tables, sorts, the result while it is built); a
query that needs more fails with a `SqlError` naming the limit (DuckDB cannot spill: it
has no file system access here, see engine/sql_databases.py)."""

SQL_RESULT_BYTES_MAX = 512 * MiB
"""Largest result `sql()` returns as one Arrow table; past it the query is stopped with a
`SqlError` (add a LIMIT, aggregate, or page with a WHERE on the key)."""

SQL_VIEWS_KEPT_MAX = 1024
"""Tables a pooled DuckDB database keeps views of between queries (engine/sql_databases.py: making
them costs milliseconds per query); past it the database is closed and a new one made."""

SQL_QUERY_CHARS_MAX = 1 << 20
"""Longest SQL text accepted (a query, not a data load)."""

SQL_DIRECT_ROWS_MAX = 1 << 18
"""Most persisted rows (whole blocks meeting the key bounds) SQL's direct path reads into
memory before DuckDB runs (engine/sql_direct.py `answer`): a few MiB for a narrow table. A query
whose key bounds meet more is streamed a group at a time instead."""

SQL_INLINE_ROWS_MAX = 1 << 14
"""Most rows a direct query hands DuckDB on the engine's event loop itself (only a query of
sums, counts and comparisons: tens of microseconds per thousand rows, under ~2 ms in all);
more, or anything costlier, runs on the query's thread (two hand-overs, which on a loaded
machine each wait for a core)."""

SQL_TEMPLATES_KEPT_MAX = 1024
"""Query templates (engine/sql_keys.py) whose plans are kept, least recently used dropped:
a plan is a few hundred bytes, and reading one costs DuckDB's parse (~0.3 ms)."""

SQL_DIRECT_QUERY_CHARS_MAX = 4096
"""Longest query the direct path considers (its template is kept: at most
`SQL_TEMPLATES_KEPT_MAX` of these, 4 MiB); a longer one is streamed. A point or range
query is a line."""

SQL_TEMPLATE_SCHEMAS_MAX = 8
"""Table schemas per template whose answer schema is kept (a table's schema rarely
changes); past it the answer schema is found again per query."""

SQL_GROUPS_MAX = 1 << 20
"""Groups a GROUP BY the engine answers itself may have (engine/sql_groups.py): its state
is ~8-24 bytes per group per aggregate plus a row count, so tens of MiB at most. A query
that finds more is handed to DuckDB (which hashes them with its own memory limit)."""

SQL_GROUP_TEXT_BYTES_MAX = 64 * MiB
"""Bytes of distinct VARCHAR group keys such a GROUP BY keeps (UTF-8; each also costs a
Python str and a dict entry, ~100 bytes): past it, DuckDB answers instead."""

SQL_GROUP_DENSE_SLOTS_MAX = 1 << 16
"""Span of group keys (largest - smallest + 1) whose groups are kept in one slot per key
value (slot = key - smallest: no lookup per row), 512 KiB per state array; a wider span
switches to a sorted array of the keys seen, searched per row (a few times slower)."""

SQL_PULL_WAIT_S_MAX = 600.0
"""Longest a DuckDB thread waits for the engine's loop to produce one part of a scan (a
group of whole objects loaded through the cache: seconds from S3 at worst); past it the
query fails rather than hang on a loop that stopped."""

# --- Relations ----------------------------------------------------------------------------------

assert TXN_WORKSPACE_BYTES_MAX < TXN_ENTRY_BYTES_MAX
assert TXN_SPILL_BYTES < TXN_ENTRY_BYTES_MAX
assert COMMIT_QUEUE_MAX <= driver_limits.INTAKE_ENTRIES_MAX
assert CN_OP_KEYS_MAX <= CONFLICT_KEYS_MAX
assert TXN_BULK_KEYS_MIN < CN_OP_KEYS_MAX <= TXN_DELETES_MAX
assert BLOCK_ROWS_MAX < 2**32
assert BLOCK_ROWS_MAX <= 2**16  # a deleted row's offset is remembered as a u16 (workspace.py)
assert DELETE_KEYS_LOGGED_MAX * 8 < TXN_ENTRY_BYTES_MAX  # integer keys fit an entry
assert 1 <= L0_VALUES_ROWS_MAX <= BLOCK_ROWS_MAX
assert KEY_INDEX_RUNS_MAX > 10  # the geometric shape's runs at a billion keys: ~10
assert KEY_INDEX_MERGE_ON_LOOP_ENTRIES_MAX >= 2 * BLOCK_ROWS_MAX
assert L0_BYTES_HARD_MAX > L0_BYTES_MAX

assert 1 <= STANDBY_TAIL_RETRY_MS_MIN <= STANDBY_TAIL_RETRY_MS_MAX
assert STANDBY_TAIL_ATTEMPTS_MAX >= 1
assert SQL_QUERIES_MAX >= 1 and SQL_THREADS_MAX >= 1
assert SQL_RESULT_BYTES_MAX <= SQL_MEMORY_BYTES_MAX
assert SQL_INLINE_ROWS_MAX <= SQL_DIRECT_ROWS_MAX
assert SQL_GROUP_DENSE_SLOTS_MAX <= SQL_GROUPS_MAX
assert 0 <= HISTORY_RETENTION_MS <= HISTORY_RETENTION_MS_MAX
assert CKP_HISTORY_RETAINED_MAX > CKP_RETAINED
