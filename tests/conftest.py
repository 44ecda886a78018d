"""The whole run: no process a test started outlives the session.

At the start this process's environment gets a fresh `LOGSVC_TEST_TAG`, which every
subprocess a test starts inherits, however detached (nodes and TNs run in sessions of their
own). At the end every process still carrying it was left behind by some test (a timeout
that killed only the command it ran, a fixture that failed half-way): each is SIGKILLed and
named in the summary, instead of running on for hours (tests/support/descendants.py). A
SIGTERM to the run interrupts it like Ctrl-C, so that end still comes.

The process's own long-lived heap (the modules, the collected items, fixtures that stay) is
moved out of the cyclic collector's sight after collection and every `FREEZE_EVERY_TESTS`
tests (`gc.freeze`, as the daemons do: logsvc/gc_tuning.py). Otherwise a full collection
of it, late in the one-process CI run, stalls every thread of the tests' in-process
clusters and proxies at once (0.3 s for the 322k objects alive after collection, on a
quiet box; more as the run goes on and under load), which the product never sees. Tests
must still survive such stalls: `-p tests.support.gcpause` makes them, and turns this off.
"""

from __future__ import annotations

import gc
import os
import signal

import pytest

from tests.support import descendants

_leaked: list[str] = []
FREEZE_EVERY_TESTS = 50
_freezing = {"on": True, "tests": 0}


def _stopped_by_signal(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    os.environ[descendants.TAG_VAR] = descendants.new_tag()
    # A run stopped with SIGTERM (a CI timeout, `kill`, a loop script stopped) ends as an
    # interrupted one: fixtures tear down and the sweep below still ends what tests started.
    # Python's default for SIGTERM exits at once, and left a test's three nodes running.
    signal.signal(signal.SIGTERM, _stopped_by_signal)
    _freezing["on"] = not config.pluginmanager.has_plugin("tests.support.gcpause")


def _freeze_heap() -> None:
    if _freezing["on"]:
        gc.collect()
        gc.freeze()


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze_heap()


def pytest_runtest_setup(item: pytest.Item) -> None:
    _freezing["tests"] += 1
    if _freezing["tests"] % FREEZE_EVERY_TESTS == 0:
        _freeze_heap()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    tag = os.environ.get(descendants.TAG_VAR)
    if tag is None:
        return
    left = {pid: descendants.command_line(pid) for pid in descendants.tagged_pids(tag)}
    ended = descendants.end_tagged(tag)
    _leaked.extend(f"pid {pid}: {left.get(pid) or '?'}" for pid in ended)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _leaked:
        terminalreporter.write_sep("=", f"processes left running by tests, ended: {len(_leaked)}")
        for line in _leaked:
            terminalreporter.write_line(line)
