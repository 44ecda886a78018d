"""One SparkSession for the whole Spark suite, on local[1] with the lean test settings of
shared/reference/spark.md §4.4 (spark_jobs.session.TEST_CONF), built by spark_jobs.session
and stopped at the end. The suite skips, naming the reason, only when pyspark or a `java`
are missing: `./dev test` installs both, so in CI it runs."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (the spark extra)")
if shutil.which("java") is None:
    pytest.skip("no java on PATH (Spark needs a Java 17 runtime)", allow_module_level=True)


# A run of the suite builds no JVM class-data archive into the user's cache (a per-log job
# run through the CLI would start one: spark_jobs/jvm_archive.py); test_jvm_archive.py
# builds one in a temporary cache directory.
os.environ.setdefault("SPARK_JOBS_JVM_ARCHIVE", "0")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from spark_jobs.session import TEST_CONF, get_spark

    session = get_spark("spark_jobs tests", master="local[1]", conf=TEST_CONF)
    try:
        yield session
    finally:
        session.stop()
        _end_the_gateway_jvm()


GATEWAY_EXIT_S_MAX = 30.0  # the JVM's exit once its stdin is closed (a loaded box: seconds)


def _end_the_gateway_jvm() -> None:
    """`stop()` leaves the py4j gateway's JVM running until this process exits (it exits at
    EOF on its stdin): ended here, so that the root conftest's sweep does not find it among
    the processes tests left running."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    process: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if process is None:
        return
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(GATEWAY_EXIT_S_MAX)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(GATEWAY_EXIT_S_MAX)
