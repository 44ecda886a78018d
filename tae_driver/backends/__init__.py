"""`LogBackend` implementations: `memory` (tests, examples), `file` (rotating files, group
fsync) and `logsvc` (a shard of a logsvc cluster, fenced by a lease)."""
