"""Failpoints (logsvc/failpoints.py): the spec parser refuses what would make a chaos scenario
vacuous (unknown names, bad actions), the actions do what they say (exit in a subprocess,
with the stderr line the harness looks for; sleep in process), every call site in the code
names a registered failpoint and every registered one is called, and a store killed at a
failpoint keeps what it had synced.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from logsvc import failpoints
from logsvc.failpoints import Exit, FailpointConfigError, Sleep, parse

REPO = Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT_S = 60


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    failpoints.configure(None)
    yield
    failpoints.configure(None)


def test_parse_actions_and_whitespace() -> None:
    spec = (
        " store_after_sync_before_ack=exit ; meta_before_save = exit@3;;"
        "raft_before_flush_sync=sleep(25) "
    )
    assert parse(spec) == {
        "store_after_sync_before_ack": Exit(1),
        "meta_before_save": Exit(3),
        "raft_before_flush_sync": Sleep(25),
    }
    assert parse("") == {}
    assert str(Exit(1)) == "exit"
    assert str(Exit(4)) == "exit@4"
    assert str(Sleep(7)) == "sleep(7)"


@pytest.mark.parametrize(
    ("spec", "name", "reason"),
    [
        ("store_after_sync_before_akc=exit", "store_after_sync_before_akc", "unknown failpoint"),
        ("meta_before_save=panic", "meta_before_save", "unknown action"),
        ("meta_before_save=exit@0", "meta_before_save", "N >= 1"),
        ("meta_before_save=sleep(-1)", "meta_before_save", "unknown action"),
        ("meta_before_save=sleep(9999999)", "meta_before_save", "exceeds"),
        ("meta_before_save=exit;meta_before_save=exit@2", "meta_before_save", "twice"),
        ("meta_before_save", "meta_before_save", "name=action"),
        ("=exit", None, "name=action"),
    ],
)
def test_parse_refuses(spec: str, name: str | None, reason: str) -> None:
    with pytest.raises(FailpointConfigError) as caught:
        parse(spec)
    assert caught.value.name == name
    assert reason in str(caught.value)
    if name is not None:
        assert repr(name) in str(caught.value)  # the message names the failpoint


def test_unset_is_a_no_op_and_armed_unknown_call_is_a_bug() -> None:
    assert not failpoints.enabled()
    failpoints.failpoint("no_such_failpoint")  # disabled: not even checked (free)
    failpoints.configure("meta_after_save=sleep(0)")
    assert failpoints.enabled()
    failpoints.failpoint("meta_before_save")  # known, not armed: nothing
    with pytest.raises(AssertionError, match="not in KNOWN_FAILPOINTS"):
        failpoints.failpoint("no_such_failpoint")


def test_sleep_sleeps_and_announces(capfd: pytest.CaptureFixture[str]) -> None:
    failpoints.configure("raft_before_flush_sync=sleep(40)")
    started = time.monotonic()
    failpoints.failpoint("raft_before_flush_sync")
    failpoints.failpoint("raft_before_flush_sync")
    assert time.monotonic() - started >= 0.08
    err = capfd.readouterr().err
    assert err.count("FAILPOINT raft_before_flush_sync sleep(40)\n") == 2


def _run(code: str, spec: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, failpoints.ENV_VAR: spec, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )


HITS = """
import sys
from logsvc.failpoints import failpoint
for hit in range(1, 6):
    print(f"before hit {hit}", flush=True)
    failpoint("store_after_write_before_sync")
print("survived", flush=True)
"""


def test_exit_at_first_hit_in_a_subprocess() -> None:
    done = _run(HITS, "store_after_write_before_sync=exit")
    assert done.returncode == failpoints.EXIT_CODE
    assert done.stdout.splitlines() == ["before hit 1"]
    assert done.stderr == "FAILPOINT store_after_write_before_sync exit\n"


def test_exit_at_nth_hit_in_a_subprocess() -> None:
    done = _run(HITS, "store_after_write_before_sync=exit@3")
    assert done.returncode == failpoints.EXIT_CODE
    assert done.stdout.splitlines() == ["before hit 1", "before hit 2", "before hit 3"]
    assert done.stderr == "FAILPOINT store_after_write_before_sync exit@3\n"


def test_unknown_name_in_the_environment_fails_at_startup() -> None:
    done = _run("import logsvc.store", "store_after_sync_before_akc=exit")
    assert done.returncode == 1
    assert "FailpointConfigError" in done.stderr
    assert "'store_after_sync_before_akc'" in done.stderr


STORE_CRASH = """
import sys
from logsvc.store import Entry, ShardStore
store = ShardStore.open(sys.argv[1])
store.append([Entry(1, 1, b"synced")])
store.sync()  # exits in here, after the fdatasync, before the waiter is woken
print("acked", flush=True)
"""


def test_store_killed_after_sync_before_ack_keeps_the_entry(tmp_path: Path) -> None:
    env = {
        **os.environ,
        failpoints.ENV_VAR: "store_after_sync_before_ack=exit",
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, "-c", STORE_CRASH, str(tmp_path / "s")],
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == failpoints.EXIT_CODE, done.stderr
    assert "acked" not in done.stdout
    assert "FAILPOINT store_after_sync_before_ack exit" in done.stderr
    from logsvc.store import ShardStore

    with ShardStore.open(str(tmp_path / "s")) as store:
        assert [e.payload for e in store.read(1, 2, 1 << 20)] == [b"synced"]


def test_every_call_site_is_registered_and_every_name_is_called() -> None:
    called: set[str] = set()
    for path in (REPO / "logsvc").rglob("*.py"):
        if path.name == "failpoints.py":
            continue
        called |= set(re.findall(r'failpoint\("([a-z0-9_]+)"\)', path.read_text()))
    assert called == failpoints.KNOWN_FAILPOINTS
