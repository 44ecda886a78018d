"""How a reader treats damage (`--verify`) and the kinds it names damage by: constants of
their own module so that every reader imports them without the logsvc journal reader
(spark_jobs/journal.py imports logsvc's shard and store, ~0.1 CPU-s: a file WAL's replay
never needs them, issue 23)."""

from __future__ import annotations

VERIFY_TRUE = "true"
VERIFY_FALSE = "false"
VERIFY_REPORT = "report"
VERIFY_MODES = (VERIFY_TRUE, VERIFY_FALSE, VERIFY_REPORT)

KIND_TORN = "torn_tail"
KIND_CORRUPT = "corrupt"
