"""Garbage-collector settings for latency-sensitive processes (the node daemon, the
cluster benchmark's client).

CPython's cyclic collector runs a generation-0 pass every 700 net allocations by default.
A node answering ~20k appends/s allocates that many objects many times a millisecond, and
the older-generation passes it triggers walk every live object (caches, dedupe tables,
pysyncobj's state), pausing every thread under the GIL. Measured with
`logsvc bench cluster --concurrency 256 --seconds 5` on the 2-core box: p99 37-45 ms with
the defaults, 13-26 ms with the thresholds below and the same throughput. Nearly all our
garbage is freed by reference counting; the collector only has to find the rare cycles,
so running it ~70x less often costs bounded memory (cycles wait longer) and no
correctness.
"""

from __future__ import annotations

import gc

# Allocations (net) between generation-0 collections; default 700.
GEN0_ALLOCATIONS_MAX = 50_000
# Generation-0 collections per generation-1 collection; default 10.
GEN1_PER_GEN0_MAX = 50
# Generation-1 collections per generation-2 (full) collection; default 10.
GEN2_PER_GEN1_MAX = 100


def tune_for_latency() -> None:
    """Fewer collector passes, and objects alive now (modules, config, startup state)
    moved out of the collector's sight for good (`gc.freeze`)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_ALLOCATIONS_MAX, GEN1_PER_GEN0_MAX, GEN2_PER_GEN1_MAX)


def freeze_now() -> None:
    """Move every object alive now out of the collector's sight too: a node that just
    opened its replicas (a thousand shards: millions of objects, for the process's life)
    would otherwise have each full collection walk them all."""
    gc.collect()
    gc.freeze()
