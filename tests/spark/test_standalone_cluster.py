"""The jobs on a real Spark standalone cluster (issue 23, target 4): a master and two workers
started from the pyspark install (`spark-class ...deploy.master.Master` / `...worker.Worker`)
as separate processes on loopback, `replay_as_of` and `lsn_audit` submitted with
`spark-submit --master spark://127.0.0.1:PORT --py-files <the project as a zip>`, their
outputs compared table by table (and summary and stdout) with the local engine's.

Too slow for CI on a small machine (four JVMs: master, two workers and the driver, plus the
executors' Python workers; minutes on 2 shared cores), so it runs only when asked:

    LOGSVC_SPARK_STANDALONE=1 .venv/bin/python -m pytest -q tests/spark/test_standalone_cluster.py

Measured here (2 shared cores, other sessions' work running): the replay took 3.5 minutes
on the cluster when it ran as DataFrame operations (45 Spark stages for a 300-row history:
start-up and per-stage costs, not data); with one task per log (one stage), the whole file,
replay and audit, took 2.5 minutes at load average 11.

Bounds: each daemon must be up within `DAEMON_READY_S_MAX` (the master's JSON status page
lists both workers ALIVE), each spark-submit finishes within `SUBMIT_S_MAX`, and every
process started here is stopped by its own PID (SIGTERM, then SIGKILL after `STOP_S_MAX`),
its process group included (spark-class runs java as a child).

Why `--py-files` is the shipped form tested: it needs nothing installed on the workers but
the dependencies (pyarrow, pyroaring, msgpack, xxhash, pysyncobj, cryptography), which is the
case this machine can show; the zip's entries come first on the executors' `sys.path`
(PYTHONPATH), ahead of any installed copy. The wheel form (`pip wheel --no-deps .`, installed
into the executors' environment) is documented in the README.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_jobs import output
from spark_jobs.exits import EXIT_OK
from spark_jobs.inputs import file_input
from spark_jobs.jobs import JobParams
from spark_jobs.run import run_job
from tests.spark.test_spark_jobs import read_outputs
from tests.support.s3server import free_port
from tests.unit.spark_jobs.logs import anomalies_log, engine_history

if os.environ.get("LOGSVC_SPARK_STANDALONE") != "1":
    pytest.skip(
        "a standalone Spark cluster takes minutes here: LOGSVC_SPARK_STANDALONE=1 to run",
        allow_module_level=True,
    )

DAEMON_READY_S_MAX = 180.0
SUBMIT_S_MAX = 900.0
STOP_S_MAX = 10.0
POLL_S = 0.5
PACKAGES = ("spark_jobs", "engine", "tae_driver", "logsvc")
ROOT = Path(__file__).resolve().parents[2]


def _pyspark_bin() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = os.path.dirname(sys.executable)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PATH=bin_dir + os.pathsep + env.get("PATH", ""),
    )
    env.pop("PYTHONPATH", None)  # the executors get the code from --py-files only
    return env


class _Daemons:
    """The processes started here, stopped by PID in reverse order."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 (closed by the child's end)
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(),
            start_new_session=True,
        )
        log.close()
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(STOP_S_MAX)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(STOP_S_MAX)

    def tail(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}"
            for path in sorted(self.log_dir.glob("*.log"))
        )


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as answer:
            status: dict[str, Any] = json.load(answer)
    except (OSError, urllib.error.URLError, ValueError):
        return -1
    return sum(1 for worker in status.get("workers", []) if worker.get("state") == "ALIVE")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A master and two workers (one core, 1 GiB each); yields the master URL."""
    base = tmp_path_factory.mktemp("standalone")
    daemons = _Daemons(base)
    spark_class = os.path.join(_pyspark_bin(), "spark-class")
    port, ui_port = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    try:
        daemons.start(
            "master",
            [spark_class, "org.apache.spark.deploy.master.Master",
             "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port)],
        )  # fmt: skip
        for index in (1, 2):
            work_dir = base / f"worker-{index}"
            work_dir.mkdir()
            daemons.start(
                f"worker-{index}",
                [spark_class, "org.apache.spark.deploy.worker.Worker", master,
                 "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                 "--webui-port", str(free_port()), "--work-dir", str(work_dir)],
            )  # fmt: skip
        deadline = time.monotonic() + DAEMON_READY_S_MAX
        while _alive_workers(ui_port) < 2:
            exited = [p.args for p in daemons.processes if p.poll() is not None]
            assert not exited, f"a daemon exited: {exited}\n{daemons.tail()}"
            assert time.monotonic() < deadline, f"no 2 workers ALIVE\n{daemons.tail()}"
            time.sleep(POLL_S)
        yield master
    finally:
        daemons.stop()


@pytest.fixture(scope="module")
def project_zip(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The project's packages as one zip for --py-files (what the README's command makes)."""
    path = tmp_path_factory.mktemp("zip") / "logsvc-code.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in PACKAGES:
            for file in sorted((ROOT / package).rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts:
                    archive.write(file, file.relative_to(ROOT).as_posix())
    return str(path)


def _submit(master: str, project_zip: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
    assert os.path.exists(submit), "pyspark's spark-submit is installed with the spark extra"
    command = [
        submit, "--master", master, "--py-files", project_zip,
        "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m",
        "--conf", "spark.cores.max=2", "--conf", "spark.sql.shuffle.partitions=2",
        str(ROOT / "spark_jobs" / "__main__.py"), *argv,
    ]  # fmt: skip
    return subprocess.run(
        command,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=SUBMIT_S_MAX,
        check=False,
        cwd="/",  # nothing importable from the working directory
    )


def _compare(run_dir: str, params: JobParams, stdout: str, tmp_path: Path) -> dict[str, Any]:
    manifest = output.read_manifest(run_dir)
    assert manifest["engine"] == "spark" and manifest["spark_master"].startswith("spark://")
    local = run_job(params, engine="local", out=str(tmp_path / "local"))
    assert read_outputs(run_dir) == read_outputs(local.run_dir)
    assert manifest["summary"] == local.manifest["summary"]
    for line in local.lines:
        assert line in stdout
    return manifest


@pytest.mark.timeout(2 * SUBMIT_S_MAX + DAEMON_READY_S_MAX)
def test_replay_and_audit_on_a_standalone_cluster_equal_the_local_engine(
    cluster: str, project_zip: str, tmp_path: Path
) -> None:
    history = engine_history(str(tmp_path / "engine"), big_rows=300)
    wal = str(tmp_path / "anomalies" / "wal")
    anomalies_log(wal)
    out = str(tmp_path / "out")
    ts = history.timestamps[5]
    cases = [
        (
            ["replay_as_of", "--file-wal", history.path, "--as-of", str(ts)],
            JobParams("replay_as_of", file_input(history.path), as_of=ts),
            EXIT_OK,
        ),
        (
            ["lsn_audit", "--file-wal", wal, "--allow-problems"],
            JobParams("lsn_audit", file_input(wal)),
            EXIT_OK,
        ),
    ]
    for index, (argv, params, code) in enumerate(cases):
        run_id = f"cluster-{index}"
        done = _submit(cluster, project_zip, [*argv, "--out", out, "--run-id", run_id])
        assert done.returncode == code, done.stderr[-4000:]
        # spark-submit's PythonRunner sends the driver's stderr to its own stdout.
        assert "engine spark (auto: launched by spark-submit" in done.stdout + done.stderr
        run_dir = os.path.join(out, params.job, run_id)
        manifest = _compare(run_dir, params, done.stdout, tmp_path / run_id)
        if params.job == "replay_as_of":
            got = {
                name.split("/", 1)[1].replace("/", "."): rows
                for name, rows in read_outputs(run_dir).items()
            }
            assert got == history.scans[ts]
        else:
            assert manifest["summary"]["anomalies"] == 5
