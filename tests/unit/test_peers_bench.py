"""The pure parts of `python -m logsvc.bench.peers`: argument parsing, the generated etcd
command lines and NATS server configs (3 members on loopback, durable settings), the
closed-loop driver against a fake operation, /proc/stat parsing and the markdown table
(percentiles: tests/unit/test_bench_measure.py). Nothing here installs or starts etcd or NATS."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logsvc.bench import measure, peer_install, peer_servers, peers

PORTS_6 = [20001, 20002, 20003, 20004, 20005, 20006]
PORTS_9 = [30001, 30002, 30003, 30004, 30005, 30006, 30007, 30008, 30009]


# ---------------------------------------------------------------- arguments


def test_defaults() -> None:
    opts = peers.parse_args([])
    assert opts == peers.Options(
        seconds=5.0,
        concurrency=(1, 64, 256),
        record_bytes=100,
        systems=("logsvc", "etcd", "jetstream"),
        workdir=None,
        json=False,
        etcd_client="grpc",
        peers_dir="",
    )


def test_all_options() -> None:
    opts = peers.parse_args(
        [
            "--seconds",
            "2.5",
            "--concurrency",
            "8, 1,8",
            "--record-bytes",
            "512",
            "--systems",
            "JetStream,etcd",
            "--workdir",
            "/tmp/x",
            "--json",
            "--etcd-client",
            "http",
            "--peers-dir",
            "/tmp/peers",
        ]
    )
    assert opts.seconds == 2.5
    assert opts.concurrency == (8, 1)  # order kept, duplicates dropped
    assert opts.record_bytes == 512
    assert opts.systems == ("jetstream", "etcd")
    assert opts.workdir == "/tmp/x"
    assert opts.json is True
    assert opts.etcd_client == "http"
    assert opts.peers_dir == "/tmp/peers"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--seconds", "0"], "--seconds"),
        (["--seconds", "abc"], "--seconds"),
        (["--concurrency", "1,0"], "--concurrency"),
        (["--concurrency", "1,x"], "--concurrency"),
        (["--concurrency", str(peers.CONCURRENCY_MAX + 1)], "--concurrency"),
        (["--record-bytes", "0"], "--record-bytes"),
        (["--systems", "logsvc,kafka"], "kafka"),
        (["--etcd-client", "rest"], "--etcd-client"),
        (["--bogus"], "--bogus"),
    ],
)
def test_bad_arguments_exit_2_naming_the_option(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        peers.parse_args(argv)
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


# ---------------------------------------------------------------- etcd


def test_etcd_members_get_distinct_loopback_ports() -> None:
    members = peer_servers.etcd_members(PORTS_6)
    assert [m.name for m in members] == ["e1", "e2", "e3"]
    ports = [p for m in members for p in (m.client_port, m.peer_port)]
    assert sorted(ports) == PORTS_6
    assert all(m.client_url.startswith("http://127.0.0.1:") for m in members)


def test_etcd_command_names_all_three_members_and_stays_durable() -> None:
    members = peer_servers.etcd_members(PORTS_6)
    cmd = peer_servers.etcd_command("/usr/bin/etcd", members[1], members, "/w/e2", "tok")
    assert cmd[0] == "/usr/bin/etcd"
    flags = dict(zip(cmd[1::2], cmd[2::2], strict=True))
    assert flags["--name"] == "e2"
    assert flags["--data-dir"] == "/w/e2"
    assert flags["--initial-cluster"] == (
        "e1=http://127.0.0.1:20002,e2=http://127.0.0.1:20004,e3=http://127.0.0.1:20006"
    )
    assert flags["--initial-cluster-state"] == "new"
    assert flags["--initial-cluster-token"] == "tok"
    assert flags["--listen-client-urls"] == "http://127.0.0.1:20003"
    assert flags["--advertise-client-urls"] == "http://127.0.0.1:20003"
    assert flags["--listen-peer-urls"] == "http://127.0.0.1:20004"
    assert flags["--initial-advertise-peer-urls"] == "http://127.0.0.1:20004"
    assert not any("unsafe" in part for part in cmd)  # fsync of the WAL stays on
    urls = [u for v in flags.values() for u in v.replace("=", ",").split(",") if "://" in u]
    assert len(urls) == 7 and all(u.startswith("http://127.0.0.1:") for u in urls)


def test_apt_candidate() -> None:
    policy = "etcd-server:\n  Installed: (none)\n  Candidate: 3.4.23-4+b4\n  Version table:\n"
    assert peer_install.parse_apt_candidate(policy) == "3.4.23-4+b4"
    assert peer_install.parse_apt_candidate("x:\n  Candidate: (none)\n") is None
    assert peer_install.parse_apt_candidate("") is None


# ---------------------------------------------------------------- nats


def test_nats_config_is_durable_clustered_and_loopback_only() -> None:
    nodes = peer_servers.nats_nodes(PORTS_9)
    assert [n.name for n in nodes] == ["n1", "n2", "n3"]
    text = peer_servers.nats_config(nodes[0], nodes, "/w/n1")
    lines = [line.strip() for line in text.splitlines()]
    assert "sync_interval: always" in lines
    assert 'store_dir: "/w/n1"' in lines
    assert 'server_name: "n1"' in lines
    assert 'listen: "127.0.0.1:30001"' in lines
    assert 'listen: "127.0.0.1:30002"' in lines  # the cluster (route) listener
    assert 'http: "127.0.0.1:30003"' in lines
    assert '"nats-route://127.0.0.1:30005"' in lines  # n2's cluster port
    assert '"nats-route://127.0.0.1:30008"' in lines  # n3's cluster port
    assert "30002" not in "".join(line for line in lines if "nats-route" in line)
    assert text.count("jetstream {") == 1 and text.count("cluster {") == 1
    for line in lines:
        if "127." in line or "://" in line:
            assert "127.0.0.1:" in line


def test_nats_stream_is_file_storage_r3() -> None:
    params = peer_servers.nats_stream_params()
    assert params["storage"] == "file"
    assert params["num_replicas"] == 3
    assert params["name"] == peer_servers.NATS_STREAM
    assert params["subjects"] == [peer_servers.NATS_SUBJECT]


def test_versions() -> None:
    assert peer_install.parse_version("nats-server: v2.15.1") == (2, 15, 1)
    debian = peer_install.parse_version("nats-server: v2.9.10")  # Debian's: no sync_interval
    assert debian == (2, 9, 10)
    assert debian < peer_install.NATS_SERVER_VERSION_MIN
    assert peer_install.parse_version("no version") is None


def test_pip_uses_this_interpreter_and_installs_into_the_peers_dir(tmp_path: Path) -> None:
    cmd = peer_install.pip_install_command(["nats-py==2.16.0"], str(tmp_path))
    assert cmd[:4] == [sys.executable, "-m", "pip", "install"]
    assert cmd[cmd.index("--target") + 1] == str(tmp_path)  # never the interpreter's env
    assert cmd[-1] == "nats-py==2.16.0"
    # The default directory is outside any virtualenv (the project's .venv stays exactly
    # its lock file), and one per Python version.
    assert not os.path.abspath(peer_install.PEERS_DIR_DEFAULT).startswith(sys.prefix + os.sep)
    assert f"py{sys.version_info.major}.{sys.version_info.minor}" in peer_install.PEERS_DIR_DEFAULT
    before = list(sys.path)
    try:
        where = peer_install.use_peers_dir(str(tmp_path / "peers"))
        assert sys.path[0] == where and os.path.isdir(where)
        peer_install.use_peers_dir(where)
        assert sys.path.count(where) == 1
    finally:
        sys.path[:] = before
    pins = (peer_install.NATS_SERVER_PIN, peer_install.NATS_PY_PIN, peer_install.AIOHTTP_PIN)
    assert all("==" in pin for pin in pins)
    assert all("==" in pin for pin in peer_install.AETCD_PINS)


# ---------------------------------------------------------------- measuring


def test_cpu_times_and_busy_fraction() -> None:
    before = measure.cpu_times("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n")
    after = measure.cpu_times("intr 5\ncpu  150 0 150 1500 100 0 0 0 0 0\n")
    assert before == (200, 1000)
    assert after == (300, 1900)
    assert measure.busy_fraction(before, after) == pytest.approx(100 / 900)
    assert measure.busy_fraction(after, after) == 0.0
    # irq and softirq (loopback traffic) count as neither busy nor idle; steal is busy
    assert measure.cpu_times("cpu  10 1 20 500 5 7 9 3 0 0\n") == (34, 555)
    with pytest.raises(ValueError):
        measure.cpu_times("cpu0 1 2 3 4\n")


def test_foreign_cpu_is_machine_busy_minus_our_own() -> None:
    before = measure.CpuSnapshot(wall_s=100.0, machine_busy_s=50.0, own_s=10.0)
    after = measure.CpuSnapshot(wall_s=110.0, machine_busy_s=62.0, own_s=20.0)
    assert measure.foreign_fraction(before, after, 2) == pytest.approx(2.0 / 20.0)
    quiet = measure.CpuSnapshot(wall_s=110.0, machine_busy_s=59.0, own_s=20.0)
    assert measure.foreign_fraction(before, quiet, 2) == 0.0  # never negative
    assert measure.foreign_fraction(before, before, 2) == 0.0


def test_closed_loop_counts_ops_latencies_and_errors() -> None:
    seen: list[int] = []

    async def op(n: int) -> None:
        seen.append(n)
        await asyncio.sleep(0.001)
        if n % 10 == 9:
            raise RuntimeError("boom")

    calls = iter([1.0, 3.5])
    began = time.monotonic()
    stats = asyncio.run(peers.closed_loop(op, 4, 0.2, 0.05, lambda: next(calls)))
    whole_s = time.monotonic() - began
    assert len(seen) == len(set(seen))  # every op gets a fresh number (fresh keys)
    assert stats.ops == len(stats.latencies_ms) > 0
    assert stats.errors > 0 and stats.first_error == "RuntimeError: boom"
    assert stats.ops + stats.errors + stats.warmup_errors < len(seen)  # warm-up not counted
    # The measured part lasts its 0.2 s (and its last ops) and leaves out the warm-up of at
    # least 0.05 s, however slow the machine (a bound of 1 s of wall time was not).
    assert 0.2 <= stats.elapsed_s <= whole_s - 0.05
    assert stats.server_cpu_s == 2.5
    result = peers.result_from_loop("etcd", 4, stats, {"client": "grpc"})
    assert result.ops_per_s and result.p50_ms and result.p99_ms
    assert "errors, first: RuntimeError: boom" in result.note
    assert result.as_json()["client"] == "grpc"


def test_no_acknowledged_op_is_a_failure_not_a_number() -> None:
    stats = peers.LoopStats(
        ops=0,
        elapsed_s=1.0,
        latencies_ms=[],
        errors=3,
        warmup_errors=0,
        first_error="ConnectionRefusedError: x",
        client_cpu_s=0.1,
    )
    result = peers.result_from_loop("jetstream", 64, stats, {})
    assert result.ops_per_s is None and result.p50_ms is None
    assert result.note.startswith("failed: no acknowledged op (ConnectionRefusedError")


# ---------------------------------------------------------------- table


def test_table() -> None:
    results = [
        peers.Result("logsvc", 1, 1234.56, 0.712, 1.5),
        peers.Result("etcd", 256, 14023.3, 17.589, 33.89, errors=2, note="2 errors | x"),
        peers.Result("jetstream", 64, note="skipped: `pip install x` exited 1"),
    ]
    lines = peers.format_table(results).splitlines()
    assert lines[0] == "| system | concurrency | ops/s | p50 ms | p99 ms | notes |"
    assert lines[1] == "| --- | ---: | ---: | ---: | ---: | --- |"
    assert lines[2] == "| logsvc | 1 | 1,235 | 0.71 | 1.50 |  |"
    assert lines[3] == "| etcd | 256 | 14,023 | 17.59 | 33.89 | 2 errors / x |"
    assert lines[4] == "| jetstream | 64 | — | — | — | skipped: `pip install x` exited 1 |"
    assert len(lines) == 5


def test_importing_installs_and_imports_no_client() -> None:
    code = (
        "import sys, logsvc.bench.peers\n"
        "assert not {'nats', 'aiohttp', 'aetcd', 'grpc'} & set(sys.modules), sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def test_a_system_that_cannot_be_had_is_a_skipped_row_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_etcd(system: str, opts: peers.Options) -> peers.Prepared:
        raise peer_install.Skip("`apt-get install -y etcd-server` exited 100: E: Unable to locate")

    def never(*args: object) -> peers.Result:
        raise AssertionError("nothing is measured for a skipped system")

    monkeypatch.setattr(peers, "prepare", no_etcd)
    monkeypatch.setattr(peers, "measure", never)
    code = peers.main(["--systems", "etcd", "--concurrency", "1,64", "--workdir", str(tmp_path)])
    assert code == 1
    out, err = capsys.readouterr()
    rows = [line for line in out.splitlines() if line.startswith("| etcd")]
    assert rows == [
        "| etcd | 1 | — | — | — | skipped: `apt-get install -y etcd-server` exited 100: "
        "E: Unable to locate |",
        "| etcd | 64 | — | — | — | skipped: `apt-get install -y etcd-server` exited 100: "
        "E: Unable to locate |",
    ]
    assert "skipping etcd" in err and "2 of 2 measurements skipped or failed" in err
