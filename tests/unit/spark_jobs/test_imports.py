"""What a process imports before it does any work (issue 23: Spark's per-core cost is partly
imports, paid by the driver and again by every Python worker). A fresh interpreter each:
the Spark driver's modules import no pandas (pyarrow.dataset pulled it in through the
engine's zone maps: engine/objects/zonemap.py now imports it when it prunes), and what an
lsn_audit task needs in a worker is the audit level's code, not the replay's, the
checkpoints' or the other jobs'."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["pandas", "pyarrow.dataset", "pysyncobj", "spark_jobs.local", "spark_jobs.checkpoints"]


def imported_after(statement: str) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    modules = set(json.loads(done.stdout))
    return [name for name in HEAVY if name in modules]


def test_the_spark_driver_imports_no_pandas() -> None:
    driver = "import spark_jobs.__main__, spark_jobs.run, spark_jobs.spark_engine"
    # The CLI's local engine and the checkpoints it reads are imported; not pandas.
    assert imported_after(driver) == ["spark_jobs.local", "spark_jobs.checkpoints"]


def test_an_audit_task_imports_only_the_audit() -> None:
    task = "from spark_jobs import audit, error_transport, output, records"
    assert imported_after(task) == []


def test_a_replay_task_imports_no_pandas() -> None:
    task = "from spark_jobs import error_transport, local_replay, output, records"
    assert imported_after(task) == ["spark_jobs.checkpoints"]  # it reads checkpoints
