"""`python -m spark_jobs` as a new user meets it (issue 23, target 5), on logs written by the
real writers, with the local engine (no JVM; tests/spark/test_spark_user.py covers Spark's
quiet logging):

* `--help` describes every job, the engines, the `--as-of` forms and the exit codes;
* `--engine auto` (the default) picks local below the documented input size and Spark at or
  above it or when `--master` is given, says which on stderr and keeps it in the manifest;
* `--as-of` takes epoch milliseconds and ISO-8601 with a zone, mapped to the last commit_ts
  of that millisecond, and gives the same tables as the commit timestamp they map to;
* exit codes: 3 when lsn_audit finds problems (0 with `--allow-problems`), 4 for a path that
  holds no log (`--file-wal /etc`) and for a WAL whose frames all are damaged (0 rows read);
* the local progress line: pure rendering, and nothing drawn when stderr is not a terminal.

Each CLI case failed on the code before it (default engine spark, `--as-of` int only, exit
0 for problems and for non-logs, no job descriptions).
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from engine.clock import ts_at_wall_ms
from spark_jobs import __main__ as cli
from spark_jobs import output
from spark_jobs.engines import choose_engine, human_bytes
from spark_jobs.exits import problems_of
from spark_jobs.jobs import JOBS
from spark_jobs.limits import AUTO_SPARK_INPUT_BYTES_MIN
from spark_jobs.progress import LocalProgress, progress_line
from tests.unit.spark_jobs.logs import History, anomalies_log, engine_history


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return engine_history(str(tmp_path_factory.mktemp("engine")), big_rows=20)


def test_help_describes_every_job_the_engines_as_of_and_exit_codes(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    for job in JOBS:
        assert f"\n  {job:<14}{cli.JOB_DESCRIPTIONS[job].split()[0]}" in text, job
    assert "auto (default)  local below 1.0 GiB" in text
    assert "1795694400000ms" in text and "(epoch_ms << 16) | 0xFFFF" in text
    for code in (cli.EXIT_PROBLEMS, cli.EXIT_NOT_A_LOG):
        assert f"\n  {code}  " in text


def test_auto_chooses_by_input_size_master_and_spark_submit() -> None:
    small = choose_engine(
        "auto", AUTO_SPARK_INPUT_BYTES_MIN - 1, master=None, under_spark_submit=False
    )
    assert small.engine == "local" and "< 1.0 GiB" in small.reason
    big = choose_engine("auto", AUTO_SPARK_INPUT_BYTES_MIN, master=None, under_spark_submit=False)
    assert big.engine == "spark" and ">= 1.0 GiB" in big.reason
    named = choose_engine("auto", 10, master="spark://h:7077", under_spark_submit=False)
    assert named.engine == "spark" and "spark://h:7077" in named.reason
    assert choose_engine("auto", 10, master=None, under_spark_submit=True).engine == "spark"
    forced = choose_engine(
        "local", AUTO_SPARK_INPUT_BYTES_MIN * 9, master="x", under_spark_submit=True
    )
    assert forced.engine == "local"
    assert [human_bytes(n) for n in (0, 1023, 1536, 5 << 30)] == [
        "0 B",
        "1023 B",
        "1.5 KiB",
        "5.0 GiB",
    ]


def test_the_default_engine_is_auto_and_says_so(
    history: History, tmp_path: Path, capsys: Any
) -> None:
    out = str(tmp_path / "out")
    assert cli.main(["inventory", "--file-wal", history.path, "--out", out, "--run-id", "a"]) == 0
    assert "engine local (auto: input " in capsys.readouterr().err
    manifest = output.read_manifest(os.path.join(out, "inventory", "a"))
    assert manifest["engine"] == "local" and manifest["engine_reason"].startswith("auto: input ")


def test_as_of_takes_epoch_ms_and_iso_8601(history: History, tmp_path: Path, capsys: Any) -> None:
    ts = history.timestamps[4]
    epoch_ms = ts >> 16
    mapped = ts_at_wall_ms(epoch_ms)
    assert mapped >= ts
    base = ["replay_as_of", "--file-wal", history.path, "--out", str(tmp_path)]
    forms = {
        "ts": str(mapped),
        "ms": f"{epoch_ms}ms",
        "iso": _iso(epoch_ms),
        "iso_offset": _iso(epoch_ms, "+01:00"),
    }
    outputs = {}
    for name, text in forms.items():
        assert cli.main([*base, "--as-of", text, "--run-id", name]) == cli.EXIT_OK, name
        run = os.path.join(tmp_path, "replay_as_of", name)
        manifest = output.read_manifest(run)
        assert manifest["params"]["as_of"] == mapped, name
        outputs[name] = manifest["outputs"]
    assert all(found == outputs["ts"] for found in outputs.values())
    assert f"commit_ts {mapped} (the last of" in capsys.readouterr().err
    assert cli.main([*base, "--as-of", "2026-11-26T12:00:00"]) == cli.EXIT_USAGE  # no zone
    assert "time zone" in capsys.readouterr().err


def _iso(epoch_ms: int, zone: str = "Z") -> str:
    import datetime

    at = datetime.datetime.fromtimestamp(epoch_ms / 1000, datetime.UTC)
    if zone != "Z":
        at = at.astimezone(datetime.timezone(datetime.timedelta(hours=1)))
    text = at.isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def test_audit_problems_exit_3_unless_allowed(tmp_path: Path, capsys: Any) -> None:
    wal = str(tmp_path / "wal")
    anomalies_log(wal)
    argv = ["lsn_audit", "--file-wal", wal, "--out", str(tmp_path / "out")]
    assert cli.main(argv) == cli.EXIT_PROBLEMS == 3
    err = capsys.readouterr().err
    assert "PROBLEM: replica file shard 0: gaps 1, conflicts 1" in err
    assert "--allow-problems to exit 0" in err
    assert cli.main([*argv, "--allow-problems"]) == cli.EXIT_OK


def test_a_clean_audit_exits_0(history: History, tmp_path: Path) -> None:
    assert cli.main(["lsn_audit", "--file-wal", history.path, "--out", str(tmp_path)]) == 0


def test_a_path_without_a_log_exits_4(tmp_path: Path, capsys: Any) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    for job in ("lsn_audit", "txn_latency", "inventory"):
        argv = [job, "--file-wal", str(etc), "--out", str(tmp_path / "out")]
        assert cli.main(argv) == cli.EXIT_NOT_A_LOG == 4, job
        assert f"not a log: no WAL segment (wal-<lsn>.seg) in {etc}" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out")  # nothing written for a non-log


def test_replay_of_a_wal_whose_frames_are_all_damaged_exits_4(
    history: History, tmp_path: Path, capsys: Any
) -> None:
    damaged = str(tmp_path / "engine")
    shutil.copytree(history.path, damaged)
    wal = os.path.join(damaged, "wal")
    [segment] = [name for name in os.listdir(wal) if name.endswith(".seg")]
    path = os.path.join(wal, segment)
    data = bytearray(Path(path).read_bytes())
    for offset in range(40, len(data), 200):  # a byte in every frame
        data[offset] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    argv = ["replay_as_of", "--file-wal", damaged, "--as-of", str(history.timestamps[-1])]
    code = cli.main([*argv, "--out", str(tmp_path / "out"), "--verify", "report"])
    assert code == cli.EXIT_NOT_A_LOG
    assert "bytes of WAL frames gave no record" in capsys.readouterr().err


def test_problems_of_replica_diff_and_inventory() -> None:
    pair = {"shard": 1, "replica_a": "n1", "replica_b": "n3", "first_divergent_lsn": 7}
    assert problems_of("replica_diff", {"pairs": [pair]}) == [
        "shard 1: n1 and n3 differ from LSN 7"
    ]
    assert problems_of("replica_diff", {"pairs": [{**pair, "first_divergent_lsn": None}]}) == []
    damaged = {"shard": 0, "directory": "ckp/x/", "state": "damaged", "objects_missing": 0}
    missing = {**damaged, "state": "complete", "objects_missing": 2}
    incomplete = {**damaged, "state": "incomplete"}
    found = problems_of("inventory", {"checkpoints": [damaged, missing, incomplete]})
    assert found == [
        "shard 0: checkpoint ckp/x/ damaged",
        "shard 0: checkpoint ckp/x/ names 2 missing object(s)",
    ]
    assert problems_of("write_stats", {"rows_appended": 0}) == []


def test_progress_line() -> None:
    assert progress_line(None, 100, 3.2) == "local: 3 s"
    assert progress_line(50, 100, 1) == "local: [############------------]  50% of 100 B read, 1 s"
    assert progress_line(125, 100, 2).endswith(" 25% (pass 2) of 100 B read, 2 s")
    assert progress_line(0, 0, 0) == "local: 0 s"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_local_progress_draws_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    piped = io.StringIO()
    with LocalProgress(100, piped):
        pass
    assert piped.getvalue() == ""
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setattr("spark_jobs.progress.PROGRESS_INTERVAL_S", 0.001)
    terminal = _Terminal()
    with LocalProgress(1 << 20, terminal) as progress:
        _wait_for(lambda: "local: " in terminal.getvalue())
        assert progress is not None
    assert terminal.getvalue().endswith("\r\033[K")  # the line is cleared at the end


def _wait_for(condition: Any, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_bad_argument_is_one_line_naming_it_and_exit_2(capsys: Any) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["replay_as_of", "--file-wal", "x"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "usage:" not in err
