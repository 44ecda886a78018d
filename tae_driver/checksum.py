"""The one checksum of tae_driver's formats: XXH3-64, seed 0.

Why a module of its own: STYLE.md asks that each third-party library be imported in one
module only, and both the record codec (record.py) and the file backend's segment format
(backends/segment.py) checksum with it.
"""

from __future__ import annotations

import xxhash


def xxh3_64(data: bytes | bytearray | memoryview) -> int:
    """XXH3-64 of `data` with seed 0, as an unsigned 64-bit integer."""
    return int(xxhash.xxh3_64_intdigest(data))


def xxh3_64_ranges(data: bytes | memoryview, starts: list[int], ends: list[int]) -> list[int]:
    """`xxh3_64(data[starts[i]:ends[i]])` for every i, with no bytes object made per range
    (slices of one memoryview, the loop in C: `map`): what a reader checking many records
    of one buffer calls once (spark_jobs/walread_segments.py, issue 23)."""
    assert len(starts) == len(ends)
    view = memoryview(data)
    return list(map(xxhash.xxh3_64_intdigest, map(view.__getitem__, map(slice, starts, ends))))
