"""A shard: one replicated log, run as one Raft group (docs/decisions/0001-shard-replication.md).

The pure core is `commands` (command frames and results) and `state_machine` (LSNs, leases,
dedupe, truncation, snapshots); byte formats in FORMAT.md beside this file. Nothing here
imports pysyncobj except the Raft adapter module.
"""
