"""The whole run: no process a test started outlives the session.

At the start this process's environment gets a fresh `LOGSVC_TEST_TAG`, which every
subprocess a test starts inherits, however detached (nodes and TNs run in sessions of their
own). At the end every process still carrying it was left behind by some test (a timeout
that killed only the command it ran, a fixture that failed half-way): each is SIGKILLed and
named in the summary, instead of running on for hours (tests/support/descendants.py).
"""

from __future__ import annotations

import os

import pytest

from tests.support import descendants

_leaked: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    os.environ[descendants.TAG_VAR] = descendants.new_tag()


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
