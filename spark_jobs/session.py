"""The only place a SparkSession is built (shared/reference/spark.md §4.3).

* No master is hard-coded: `python -m spark_jobs` gets pyspark's default (`local[*]`), and
  `spark-submit --master X` (or `MASTER`, or `PYSPARK_SUBMIT_ARGS`) decides unchanged; a
  `.master()` in code would silently override spark-submit's (measured, spark.md §4.3).
  `--master` on our CLI is passed through only when given.
* Workers run this interpreter (`PYSPARK_PYTHON = sys.executable`) unless spark-submit
  launched us: from an unactivated venv, Spark would start the first `python3` on PATH,
  which lacks pyarrow (spark.md §5.1). Spark binds to loopback (`SPARK_LOCAL_IP`).
* Python Data Source filter pushdown is switched on (`spark.sql.python.filterPushdown.
  enabled`): without it, a source that defines `pushFilters` fails at plan time.
* The Data Sources are registered here, once per session.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

# Lean settings for tests on a small machine (spark.md §4.4): one core, no UI, one shuffle
# partition, a small serial-GC driver with the C1 JIT only (faster start; slower big jobs).
TEST_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "1",
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
}


def launched_by_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_spark(app: str, master: str | None = None, conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession (typed Any: pyspark is imported here only, and only when called)."""
    if not launched_by_spark_submit():
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    builder = builder.config("spark.sql.python.filterPushdown.enabled", "true")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from spark_jobs.sources import register

    register(spark)
    return spark
