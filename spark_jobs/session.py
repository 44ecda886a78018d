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
* Quiet by default (issue 23): the driver JVM starts with a log4j2 configuration that lets
  only ERROR through (`QUIET_LOG4J2`: without it Spark prints its default-profile banner
  and WARN lines such as NativeCodeLoader's on every run; one line remains, the JVM's own
  "WARNING: Using incubator modules", which Spark's launcher causes by always adding
  `--add-modules=jdk.incubator.vector` and no logging setting reaches), pyspark's pandas-version
  FutureWarning is filtered, and `setLogLevel("ERROR")` keeps it so. `quiet=False`
  (`--spark-log`) leaves Spark's own logging as it is. Under spark-submit the JVM is
  already running: its logging is spark-submit's to configure.
* Spark's console progress bar (`[Stage 3:====>   (12 + 2) / 40]` on stderr) is on when
  `progress` is true; the CLI asks for it only when stderr is a terminal.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from spark_jobs.objectstores import S3_ENVS

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

# replay_as_of and lsn_audit run one Python task per log (spark_engine.per_log): the JVMs
# only schedule the tasks and carry a few bytes per log back, so the optimizing JIT (C2)
# and G1's threads spend CPU nothing uses. Measured (a session built, one tiny job, stopped,
# local[2], 2-core box): 19.3 CPU-s with the JVM's defaults, 10.9 with these. Not for the
# other jobs, whose rows go through the JVM (there C2 pays for itself).
LEAN_JVM_OPTIONS = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"
PER_LOG_JOBS = ("replay_as_of", "lsn_audit")  # spark_engine.per_log: no Data Source read
LEAN_JVM_CONF: Mapping[str, str] = {
    "spark.driver.extraJavaOptions": LEAN_JVM_OPTIONS,
    "spark.executor.extraJavaOptions": LEAN_JVM_OPTIONS,
}


def lean_jvm_conf(archive_option: str | None) -> dict[str, str]:
    """LEAN_JVM_CONF, the driver JVM mapping its class-data archive when `archive_option`
    (spark_jobs/jvm_archive.py `use_option`) is given."""
    conf = dict(LEAN_JVM_CONF)
    if archive_option:
        conf["spark.driver.extraJavaOptions"] = f"{LEAN_JVM_OPTIONS} {archive_option}"
    return conf


# Everything at ERROR and above to stderr, nothing else (log4j2 properties syntax). The
# PythonGatewayServer logger at the root's level too: a driver launched by pyspark
# initializes Spark's logging from that class as a shell would, compares the level configured
# for its logger (WARN when none is) with the root's, and when they differ prints "Setting
# default log level to ..." (Logging.scala; measured: SparkContext, SparkSubmit or
# repl.Main in its place leave the message).
QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""
JAVA_OPTIONS_KEY = "spark.driver.extraJavaOptions"


def launched_by_spark_submit() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_spark(
    app: str,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    quiet: bool = True,
    progress: bool = False,
    data_sources: bool = True,
) -> Any:
    """A SparkSession (typed Any: pyspark is imported here only, and only when called).
    `data_sources=False`: our Data Sources are not registered (a registration makes Spark
    start a Python worker to look up data sources, ~0.8 CPU-s measured; the per-log jobs
    read through none)."""
    if not launched_by_spark_submit():
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    builder = builder.config("spark.sql.python.filterPushdown.enabled", "true")
    builder = builder.config("spark.ui.showConsoleProgress", "true" if progress else "false")
    settings = dict(conf or {})
    for name in S3_ENVS:  # executors open S3 locations from their environment (objectstores.py)
        if os.environ.get(name):
            settings.setdefault(f"spark.executorEnv.{name}", os.environ[name])
    with contextlib.ExitStack() as stack:
        if quiet and not launched_by_spark_submit():
            config = stack.enter_context(_quiet_log4j2_file())
            option = f"-Dlog4j2.configurationFile=file:{config}"
            settings[JAVA_OPTIONS_KEY] = f"{option} {settings.get(JAVA_OPTIONS_KEY, '')}".strip()
        for key, value in settings.items():
            builder = builder.config(key, value)
        if quiet:  # for the process: pyspark warns again when a job first needs pandas
            warnings.filterwarnings("ignore", "PySpark does not yet fully support pandas")
        spark = builder.getOrCreate()
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
    from spark_jobs.sources import register

    if data_sources:
        register(spark)
    export_s3_env(spark, force=data_sources, register=data_sources)
    return spark


def export_s3_env(spark: Any, *, force: bool = False, register: bool = True) -> None:
    """Give the `engine_objects` source's Python workers this process's S3 settings
    (objectstores.py). pyspark captures `sc.environment` when a source is registered, so the
    source is registered again when they changed (a session built before the S3 settings,
    as the tests' shared one is); not with `register=False`. Python functions given to
    Spark after this call (the per-log tasks) capture them too."""
    environment = spark.sparkContext.environment
    changed = force
    for name in S3_ENVS:
        value = os.environ.get(name)
        if value and environment.get(name) != value:
            environment[name] = value
            changed = True
    if changed and register:
        from spark_jobs.objectsource import EngineObjectsSource

        spark.dataSource.register(EngineObjectsSource)


@contextlib.contextmanager
def _quiet_log4j2_file() -> Iterator[str]:
    """QUIET_LOG4J2 in a temporary file for the JVM's start: log4j reads it once, when the
    driver JVM starts inside `getOrCreate()`, so it is removed right after."""
    handle, path = tempfile.mkstemp(prefix="spark_jobs-log4j2-", suffix=".properties")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(QUIET_LOG4J2)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
