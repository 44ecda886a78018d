"""logsvc: a Raft-replicated, fsync-batched log service.

See shared/ARCHITECTURE.md for the decisions; `logsvc.store` is the per-shard segment store
that is the Raft journal of every shard replica.
"""

__version__ = "0.1.0"
