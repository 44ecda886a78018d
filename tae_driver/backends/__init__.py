"""Local `LogBackend` implementations: `memory` (tests, examples) and `file` (rotating files,
group fsync). The logsvc backend will live beside them once the client library exists."""
