"""The driver JVM's class-data archive (spark_jobs/jvm_archive.py): built by `python -m
spark_jobs.jvm_archive build` into the cache directory without printing the dump's
warnings, then mapped by the driver JVM of a per-log job's session (seen in the JVM's
/proc/<pid>/maps) while it runs lsn_audit.
Two JVMs (the build's, the run's): two minutes on a loaded 2-core box, so it runs only when
asked (tests/unit/spark_jobs/test_jvm_archive.py covers the rest without a JVM):

    LOGSVC_SPARK_JVM_ARCHIVE=1 .venv/bin/python -m pytest -q tests/spark/test_jvm_archive.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs import jvm_archive, output
from spark_jobs.session import LEAN_JVM_OPTIONS
from tests.unit.spark_jobs.logs import History, engine_history

if os.environ.get("LOGSVC_SPARK_JVM_ARCHIVE") != "1":
    pytest.skip(
        "building a JVM class-data archive takes minutes here: LOGSVC_SPARK_JVM_ARCHIVE=1 to run",
        allow_module_level=True,
    )

RUN_S_MAX = 400


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return engine_history(str(tmp_path_factory.mktemp("engine")))


@pytest.mark.timeout(2 * RUN_S_MAX + 60)
def test_the_archive_is_built_then_mapped_by_a_per_log_run(
    history: History, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    env = dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_JOBS_CACHE_DIR=str(cache),
        SPARK_JOBS_JVM_ARCHIVE="1",
    )
    built = subprocess.run(
        [sys.executable, "-m", "spark_jobs.jvm_archive", "build"],
        env=env, capture_output=True, text=True, timeout=RUN_S_MAX, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert "[cds]" not in built.stderr, built.stderr[-3000:]
    monkeypatch.setenv("SPARK_JOBS_CACHE_DIR", str(cache))
    monkeypatch.setenv("SPARK_JOBS_JVM_ARCHIVE", "1")
    path = jvm_archive.archive_path(LEAN_JVM_OPTIONS)
    assert path is not None and jvm_archive.is_archive(path)
    assert sorted(os.listdir(cache)) == [os.path.basename(path)]  # no temporary file left
    out = str(tmp_path / "out")
    # The run's driver JVM is asked, while it runs, whether it mapped the archive.
    probe = (
        "import sys\n"
        "from spark_jobs import jvm_archive\n"
        "from spark_jobs.session import LEAN_JVM_OPTIONS, get_spark, lean_jvm_conf\n"
        "option = jvm_archive.use_option(LEAN_JVM_OPTIONS)\n"
        "spark = get_spark('probe', 'local[1]', lean_jvm_conf(option), data_sources=False)\n"
        "pid = spark.sparkContext._gateway.proc.pid\n"
        "with open(f'/proc/{pid}/maps') as maps:\n"
        "    print('mapped' if option.split('=', 1)[1] in maps.read() else 'not mapped')\n"
        "from spark_jobs.inputs import file_input\n"
        "from spark_jobs.jobs import JobParams\n"
        "from spark_jobs.run import run_job\n"
        f"params = JobParams('lsn_audit', file_input({history.path!r}))\n"
        f"run_job(params, engine='spark', out={out!r}, run_id='a', spark=spark)\n"
        "spark.stop()\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        env=env, capture_output=True, text=True, timeout=RUN_S_MAX, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip() == "mapped", ran.stdout
    assert "[cds]" not in ran.stderr
    assert output.read_manifest(os.path.join(out, "lsn_audit", "a"))["summary"]["logs"]
