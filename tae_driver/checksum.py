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
