"""The `logsvc` command: usage errors exit 2 with a message naming the option and no
traceback; `python -O` is refused; `bench store` prints one JSON object per mode with the
fields the issue names; the demo runs to the end and says what it measured (the logsvc
failover, the embedded engine's reopenings, the TN pair's checkpoint and takeover); output
whose reader has gone (`| head`) ends quietly, for `logsvc` and `python -m engine`, with no
BrokenPipeError traceback (issue 20: the read end of the pipe is closed before the command
writes); a demo killed midway (what a timeout does) leaves none of its processes running.
Real subprocesses, short bounded runs; each command's processes are ended with it
(tests/support/descendants.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import descendants

BENCH_FIELDS = {
    "mode",
    "writers",
    "record_bytes",
    "records_per_s",
    "syncs_per_s",
    "p50_ms",
    "p99_ms",
}


COMMAND_S_MAX = 120.0
# The whole demo: ~26 s on a quiet 2-core CI box; 143 s here with the load average at 20
# (other engineers' clusters beside it: every phase slower, none stuck), where a budget of
# 120 s failed it. Under pytest-timeout's 300 s, so that a demo that does hang is reported
# here, with what it printed, rather than by the plugin.
DEMO_S_MAX = 270.0


def logsvc(
    *args: str, optimize: bool = False, timeout_s: float = COMMAND_S_MAX
) -> subprocess.CompletedProcess[str]:
    """Run the command; on its end, a timeout or a failure, every process it started (the
    demo's nodes and TNs run in sessions of their own) is ended too. A timeout fails the
    test with what the command printed until then (which step it was in)."""
    flags = ["-O"] if optimize else []
    argv = [sys.executable, *flags, "-m", "logsvc.cli", *args]
    try:
        return descendants.run(argv, timeout_s=timeout_s)
    except subprocess.TimeoutExpired as expired:
        output = expired.output or b""  # what communicate() had read: bytes
        printed = output if isinstance(output, str) else output.decode(errors="replace")
        pytest.fail(f"{' '.join(args)}: not done after {timeout_s} s; it printed:\n{printed}")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["bench", "store", "--writers", "0"], "--writers"),
        (["bench", "store", "--seconds", "forever"], "--seconds"),
        (["bench", "store", "--modes", "fast"], "--modes"),
        (["launch"], "launch"),
        (["truncate", "--shard", "1", "--lsn", "5", "--epoch", "-1"], "--epoch"),
        (["status", "--admin", "127.0.0.1"], "--admin"),
        (["status", "--shard", "1", "--json"], "--json"),
    ],
)
def test_usage_errors_exit_2_naming_the_option(args: list[str], named: str) -> None:
    done = logsvc(*args)
    assert done.returncode == 2
    assert named in done.stderr
    assert "Traceback" not in done.stderr


def test_refuses_to_run_without_assertions() -> None:
    done = logsvc("bench", "store", optimize=True)
    assert done.returncode == 2
    assert "python -O" in done.stderr


def test_bench_store_prints_one_json_object_per_mode(tmp_path: object) -> None:
    done = logsvc("bench", "store", "--seconds", "0.2", "--writers", "4", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["mode"] for line in lines] == ["group", "sync_each", "sync_each_grow", "nosync"]
    for line in lines:
        assert set(line) >= BENCH_FIELDS
        assert line["writers"] == 4
        assert line["records_per_s"] > 0
    assert lines[1]["records_per_sync"] == 1.0  # sync_each really syncs every record
    assert lines[2]["records_per_sync"] == 1.0


def test_demo_runs_to_the_end() -> None:
    done = logsvc("demo", timeout_s=DEMO_S_MAX)
    # On a failure the demo prints the end of each TN's log (and keeps its directory).
    assert done.returncode == 0, f"{done.stdout[-20000:]}\n{done.stderr}"
    assert "lost: 0, duplicated: 0" in done.stdout
    assert "caught up" in done.stdout
    assert "refused" in done.stdout
    # The failover report is the truth: the killed leader, then another node leading in a
    # later term, confirmed by a barrier (not a follower's stale view of the old leader).
    killed = re.search(r"killed (n\d) \(the leader, (\S+), term (\d+)\)", done.stdout)
    new = re.search(
        r"the first append sent after the kill was acknowledged ([0-9.]+) s after the kill; "
        r"new leader (n\d) \((\S+)\), term (\d+) \(confirmed",
        done.stdout,
    )
    assert killed and new, done.stdout
    assert new.group(2) != killed.group(1) and new.group(3) != killed.group(2)
    assert int(new.group(4)) > int(killed.group(3))
    # An election, not an acknowledgement already in flight:
    assert float(new.group(1)) > 0.2, done.stdout
    engine = done.stdout.split("== the engine:", 1)[1]
    reports = [line for line in engine.splitlines() if line.startswith("reopened")]
    assert len(reports) == 3
    assert all(", 0 lost;" in line and "every transaction whole" in line for line in reports)
    assert "the next commit was acknowledged" in engine
    assert "A's next commit was refused and A exited with code 3" in engine
    _assert_the_tn_story(done.stdout.split("== the engine as a service", 1)[1])
    assert done.stdout.rstrip().endswith("demo finished")


def test_a_demo_killed_midway_leaves_no_process_behind(tmp_path: Path) -> None:
    """What a timeout or a failure of the test above does: the demo is SIGKILLed while its
    cluster runs (each node in a session of its own, which a kill of the demo or of its
    process group does not reach); every node it started is gone afterwards."""
    base = tmp_path / "demo"
    with descendants.TaggedProcess(
        [sys.executable, "-m", "logsvc.cli", "demo", "--dir", str(base)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    ) as demo:
        node_pids = _await_demo_nodes(base, demo.popen)
        tagged = set(descendants.tagged_pids(demo.tag))
        # (The demo kills and restarts a leader itself: only nodes still running count.)
        assert [pid for pid in node_pids if _running(pid) and pid not in tagged] == []
        assert tagged
    assert demo.popen.returncode == -signal.SIGKILL
    assert [pid for pid in node_pids if _running(pid)] == []
    assert descendants.tagged_pids(demo.tag) == []


def test_a_demo_stopped_by_sigterm_stops_its_cluster(tmp_path: Path) -> None:
    """`timeout logsvc demo`, a service manager, `kill`: SIGTERM ends the demo with 143 after
    it stopped every node it started (by PID), as Ctrl-C does, and says so; before, SIGTERM
    ended the demo at once and its nodes ran on. Checked before the tag sweep runs."""
    base = tmp_path / "demo"
    with descendants.TaggedProcess(
        [sys.executable, "-m", "logsvc.cli", "demo", "--dir", str(base)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as demo:
        node_pids = _await_demo_nodes(base, demo.popen)
        demo.popen.send_signal(signal.SIGTERM)
        out, _ = demo.popen.communicate(timeout=120)
        assert demo.popen.returncode == 128 + signal.SIGTERM, out
        assert [pid for pid in node_pids if _running(pid)] == [], out
        assert "stopped by SIGTERM" in out and "cluster stopped" in out, out
        assert descendants.tagged_pids(demo.tag) == [], out
        assert "Traceback" not in out, out


def test_a_benchmark_stopped_by_sigterm_stops_its_cluster(tmp_path: Path) -> None:
    """`timeout 600 python -m logsvc.bench shards ...`: SIGTERM in the middle of its load ends
    the benchmark with 143 after it stopped the nodes it started, by PID; before, the
    benchmark died at once and its nodes (each in a session of its own) ran on."""
    with descendants.TaggedProcess(
        [
            *(sys.executable, "-m", "logsvc.bench", "shards", "--nodes", "3", "--shards", "3"),
            *("--active-shards", "3", "--settle-seconds", "0", "--idle-seconds", "1"),
            *("--load-seconds", "600", "--dir", str(tmp_path / "bench")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as bench:
        deadline = time.monotonic() + 120.0
        while len(descendants.tagged_pids(bench.tag)) < 4:  # the benchmark and its 3 nodes
            assert bench.popen.poll() is None, (
                f"the benchmark ended early: {bench.popen.returncode}"
            )
            assert time.monotonic() < deadline, "the benchmark's nodes never all ran"
            time.sleep(0.05)
        bench.popen.send_signal(signal.SIGTERM)
        out, _ = bench.popen.communicate(timeout=120)
        assert bench.popen.returncode == 128 + signal.SIGTERM, out
        assert descendants.tagged_pids(bench.tag) == [], out
        assert "Traceback" not in out, out


def _await_demo_nodes(base: Path, demo: subprocess.Popen[str]) -> list[int]:
    """The PIDs of the demo's three nodes once all run (bounded wait: their start-up, as
    the other commands here are given)."""
    deadline = time.monotonic() + 120.0
    while True:
        assert demo.poll() is None, f"the demo ended early: {demo.returncode}"
        assert time.monotonic() < deadline, "the demo's nodes never all ran"
        with contextlib.suppress(OSError, ValueError):
            pids = [int(pid) for pid in json.loads((base / "pids.json").read_text()).values()]
            if len(pids) == 3 and all(_running(pid) for pid in pids):
                return pids
        time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _assert_the_tn_story(out: str) -> None:
    """The TN/CN part (engine/tn/demo.py): what each line measured is what it should be."""
    pair = re.search(r"TN (\S+) \(pid \d+\) says active, TN (\S+) \(pid \d+\) says standby", out)
    assert pair, out
    active, standby = pair.groups()
    # Both CNs answered a query at one timestamp, the same.
    queried = re.search(
        r"cn-1 reads (\d+) orders at ts (\d+), cn-2 reads (\d+) at the same ts", out
    )
    assert queried and queried.group(1) == queried.group(3) and int(queried.group(1)) > 0, out
    assert re.search(r"logsvc leader n\d of shard \d+ \(term \d+\) killed with SIGKILL", out)
    # The TN's own checkpoint listing, and logsvc no longer holding the log's start.
    checkpoint = re.search(r"its listing shows (\d+), the newest at ckp_ts (\d+)", out)
    retained = re.search(r"now retains LSNs \[(\d+), (\d+)\)", out)
    assert checkpoint and int(checkpoint.group(1)) >= 1, out
    assert retained and 1 < int(retained.group(1)) < int(retained.group(2)), out
    # The standby took over: it says active, and both CNs commit through it.
    takeover = re.search(
        rf"active TN {re.escape(active)} killed with SIGKILL after (\d+) acknowledged commits; "
        rf"the first commit begun after it was acknowledged ([0-9.]+) s later; "
        rf"TN {re.escape(standby)} says active; both CNs now commit through {re.escape(standby)}\n",
        out,
    )
    assert takeover and int(takeover.group(1)) > 0, out
    assert float(takeover.group(2)) > 0.2  # the standby's watch and promotion, not an old ack
    # The ledger: every acknowledged commit read back once, nothing else; both CNs agree.
    ledger = re.search(
        r"(\d+) of (\d+) acknowledged commits present, 0 lost, 0 duplicated, 0 present but "
        r"never acknowledged; cn-1 and cn-2 count (\d+) and (\d+) rows at that ts",
        out,
    )
    assert ledger, out
    assert len(set(ledger.groups())) == 1 and int(ledger.group(1)) > int(takeover.group(1))
    assert "it exited with code 3: TN fenced" in out


def into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `args` with stdout into a pipe nobody reads any more (`... | head` once head has
    exited)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)


def test_output_into_a_closed_pipe_ends_without_a_traceback(tmp_path: Path) -> None:
    from engine import Column, Engine, Schema

    async def fill() -> None:
        eng = await Engine.open(str(tmp_path / "engine"))
        async with eng.transaction() as txn:
            await txn.create_database("db")
            await txn.create_table("db", "t", Schema([Column("k", "int64")], ["k"]))
            await txn.table("db", "t").insert([{"k": k} for k in range(5000)])
        await eng.close()

    asyncio.run(fill())
    for args in (
        ["-m", "logsvc.cli", "dev-cluster", "status", "--dir", str(tmp_path)],
        ["-m", "engine", "tables", str(tmp_path / "engine")],
        ["-m", "engine", "scan", str(tmp_path / "engine"), "db.t", "--limit", "5000"],
    ):
        result = into_a_closed_pipe(*args)
        assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, (
            args,
            result.stderr,
        )
        assert result.returncode == 1, (args, result.returncode)
