"""Every bound of the object layer, named with its unit and its reason.

Why one module (shared/STYLE.md, modelled on tae_driver/limits.py): the object store, the
codecs and the cache each bound what they accept and allocate, stated once here, with the
relations between limits asserted at import.
"""

from __future__ import annotations

from engine import limits as engine_limits

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# --- Object names (store.py check_name) ---------------------------------------------------------

OBJECT_NAME_BYTES_MAX = 512
"""Longest object name. With the store prefix and the "/" joining them it must stay within
S3's key limit (1024 bytes), so that every name valid here is valid on every store."""

S3_PREFIX_BYTES_MAX = 256
"""Longest key prefix of an S3 store (the "directory" it keeps its objects under)."""

S3_KEY_BYTES_MAX = 1024
"""S3's own limit on a key (AWS S3 "Object key naming guidelines")."""

OBJECT_NAME_SEGMENT_BYTES_MAX = 255
"""Longest segment between slashes: NAME_MAX of ext4 and XFS, since LocalDirStore makes each
segment a directory entry."""

OBJECT_NAME_SEGMENTS_MAX = 16
"""Deepest name. LocalDirStore walks one directory per segment; the engine uses 3 or 4."""

# --- Object sizes ------------------------------------------------------------------------------

OBJECT_BYTES_MAX = 1 * GiB
"""Largest object a put accepts. A put takes the whole object as one `bytes` in memory (the
writers build Parquet in memory), so this bounds the memory of one put; an L2 segment of
BLOCK_OBJECT_BLOCKS_MAX blocks of 8192 rows stays far below it."""

# --- S3 (s3.py) --------------------------------------------------------------------------------

S3_ATTEMPTS_MAX = 5
"""Tries of one S3 request before `ObjectStoreUnavailable` (the AWS SDK's default retry
strategy, `AwsDefaultS3RetryStrategy`: retryable errors only (network, 5xx, throttling), with
backoff 25 ms * 2^n: 25, 50, 100, 200 ms, so about 0.4 s of waiting in all). Longer outages are
the engine's business: a flush fails and is retried on its next round, commits never wait."""

S3_CONNECT_TIMEOUT_S = 2.0
"""Seconds to wait for a TCP connection to the S3 endpoint (per attempt)."""

S3_REQUEST_TIMEOUT_S = 30.0
"""Seconds of silence on a connection before a request is abandoned (per attempt; curl's
low-speed limit, not a bound on a whole large upload)."""

S3_PART_BYTES = 10 * MiB
"""Bytes a streamed write (`S3ObjectStore.put_stream`) holds before it sends them as one part
of a multipart upload: pyarrow's part size (`kPartUploadSize` in Arrow's s3fs.cc, fixed so
that 10,000 parts reach about 98 GB; Python cannot set it). With background writes off it is
also the most the stream holds at once. Named here so the bound is written down; the tests
check the memory a large streamed write peaks at against it."""

# --- Bloom filters (bloom.py) ------------------------------------------------------------------

BLOOM_BITS_PER_KEY_DEFAULT = 12
"""Filter bits per key. With one 64-bit word per key (register-blocked bloom) and
BLOOM_HASH_COUNT_DEFAULT bits set in it, 12 bits per key measure about 1.0 % false positives
(tests/unit/engine/objects/test_bloom.py checks <= 1.5 %); a classic bloom would need 10, but
builds 3-6x slower in numpy (scattered bit sets instead of one word per key)."""

BLOOM_HASH_COUNT_DEFAULT = 5
"""Bits set per key within its word (k). 5 is the measured optimum at 12 bits per key."""

BLOOM_HASH_COUNT_MAX = 5
"""Largest k of format version 1: the k bit positions are 6-bit fields of the low 30 bits of
the key's hash, below the 32 bits that choose the word (FORMAT.md)."""

BLOOM_BYTES_MAX = 64 * MiB
"""Largest serialized filter a reader accepts: 40M keys at 12 bits per key. A length field
claiming more is corruption, refused before anything is allocated."""

# --- Zonemaps (zonemap.py) ---------------------------------------------------------------------

ZONEMAP_STRING_PREFIX_BYTES = 64
"""A string or binary min/max longer than this is cut: the min to its prefix (still a lower
bound), the max to its prefix rounded up (still an upper bound). Keeps a zonemap of a column
of long texts small, at the price of pruning only on the first 64 bytes."""

ZONEMAP_BYTES_MAX = 4 * MiB
"""Largest serialized zonemap a reader accepts (1024 columns of two 64-byte bounds fit
many times over)."""

# --- Block objects (blockfile.py) --------------------------------------------------------------

BLOCK_ROWS_DEFAULT = engine_limits.BLOCK_ROWS_MAX
"""Rows per block (one Parquet row group): the engine's block size, so an L1 object is one
engine block."""

BLOCK_OBJECT_BLOCKS_MAX = 256
"""Blocks in one object (an L2 segment). Bounds the footer: each block carries a zonemap
and a bloom filter in the object's metadata."""

BLOCK_META_BYTES_MAX = 64 * MiB
"""Largest metadata blob (our key in the Parquet footer) a reader accepts."""

PARQUET_ZSTD_LEVEL = 3
"""zstd's own default level: most of the ratio of higher levels at a fraction of the time."""

# --- Delta objects (deltafile.py) --------------------------------------------------------------

DELTA_ROWS_MAX = 16 * 1024 * 1024
"""Deleted rows in one delta object (16 bytes of Arrow each when read: 256 MiB). A checkpoint
with more deletes writes several objects."""

DELTA_BLOCKS_MAX = 65536
"""Blocks in one delta object."""

DELTA_META_BYTES_MAX = 4 * MiB
"""Largest delta metadata blob a reader accepts (DELTA_BLOCKS_MAX summaries of 32 bytes)."""

# --- Buffer cache (cache.py) -------------------------------------------------------------------

CACHE_BYTES_DEFAULT = engine_limits.CACHE_BYTES
"""The buffer cache's capacity unless configured (issue 14's benchmark runs with 256 MiB)."""

CACHE_LOAD_WAIT_S_MAX = 60.0
"""Longest a reader waits for another thread's load of the same entry before giving up
with `ObjectStoreUnavailable` (a load is one object read: S3_ATTEMPTS_MAX attempts of at
most S3_REQUEST_TIMEOUT_S of silence each would be 150 s, but a waiter may retry itself)."""

# --- Relations ---------------------------------------------------------------------------------

assert S3_PREFIX_BYTES_MAX + 1 + OBJECT_NAME_BYTES_MAX <= S3_KEY_BYTES_MAX
assert OBJECT_NAME_SEGMENT_BYTES_MAX <= OBJECT_NAME_BYTES_MAX
assert 1 <= BLOOM_HASH_COUNT_DEFAULT <= BLOOM_HASH_COUNT_MAX
assert 6 * BLOOM_HASH_COUNT_MAX <= 32  # the k fields stay below the word-choosing bits
assert BLOOM_BITS_PER_KEY_DEFAULT >= 1
# The largest L2 segment's metadata (a bloom per block) fits the metadata bound.
assert (
    BLOCK_OBJECT_BLOCKS_MAX * (BLOCK_ROWS_DEFAULT * BLOOM_BITS_PER_KEY_DEFAULT // 8 + 64 * KiB)
    <= BLOCK_META_BYTES_MAX
)
assert BLOCK_ROWS_DEFAULT < 2**32
assert DELTA_BLOCKS_MAX * 32 <= DELTA_META_BYTES_MAX
assert S3_ATTEMPTS_MAX >= 1
assert S3_CONNECT_TIMEOUT_S > 0
assert S3_REQUEST_TIMEOUT_S > 0
