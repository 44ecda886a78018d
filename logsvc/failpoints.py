"""Failpoints: named places in the node where a chaos test can crash or stall it (etcd style;
shared/reference/chaos-plan.md §4.4). Disabled by default, and then free: `failpoint(name)`
returns after one check of an empty dict.

Configuration is read once, at import, from the environment:

    LOGSVC_FAILPOINTS="name=action[;name=action...]"

    action := "exit"          os._exit(137) at the first hit (what SIGKILL leaves behind:
                              no atexit, no flush, no final sync)
            | "exit@N"        os._exit(137) at the Nth hit (N >= 1); earlier hits do nothing
            | "sleep(MS)"     sleep MS milliseconds at every hit (a slow fsync or apply)

A failpoint name must be one of `KNOWN_FAILPOINTS`: an unknown name (a typo) raises
`FailpointConfigError` at startup, naming it, so a scenario can never silently test nothing.
Each time an action fires, the node first writes one line to stderr,

    FAILPOINT <name> <action>

with a single unbuffered write, so the harness can confirm from the node's log that the fault
was really applied (vacuity check). The hit counter of `exit@N` counts every call of
`failpoint(name)` in the process, from any thread.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass

ENV_VAR = "LOGSVC_FAILPOINTS"
EXIT_CODE = 137  # 128 + SIGKILL: the harness reads it as "crashed"

# Every failpoint the code calls; what each one interrupts (see the call sites).
KNOWN_FAILPOINTS = frozenset(
    {
        # store/segment_writer.py: segment data handed to the OS, its fdatasync not yet started
        "store_after_write_before_sync",
        # store/segment_writer.py: fdatasync (and directory fsync) returned, durable index not
        # yet advanced and no waiter woken: the entries are durable but nobody was told
        "store_after_sync_before_ack",
        # store/segment_writer.py: a new segment's name (or the first one) is about to be made
        # durable
        "store_before_roll_dir_sync",
        # journal.py: journal records handed to the OS, their fdatasync not yet started
        "journal_after_write_before_sync",
        # journal.py: the journal's fdatasync returned, no store told yet
        "journal_after_sync_before_ack",
        # store.py save_vote: before / after the term and vote are written durably
        "meta_before_save",
        "meta_after_save",
        # store/truncation.py truncate_prefix: around the durable write of the new log start
        "store_truncate_prefix_before_meta",
        "store_truncate_prefix_after_meta",
        # raft/transport.py: a vote is durable, the vote reply is held and not yet sent
        "raft_after_vote_persisted_before_reply",
        # raft/transport.py: the tick's group-commit sync of the journal is about to start
        "raft_before_flush_sync",
        # raft/snapshot_transfer.py: a snapshot's temporary file is durable, not yet renamed
        # into place (a snapshot written at compaction, or one received from the leader)
        "raft_snapshot_before_rename",
    }
)

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_EXIT_AT = re.compile(r"^exit@([0-9]+)$")
_SLEEP = re.compile(r"^sleep\(([0-9]+)\)$")
SLEEP_MS_MAX = 600_000  # ten minutes: longer is a typo, not a stall


class FailpointConfigError(ValueError):
    """`LOGSVC_FAILPOINTS` cannot be used as written; `name` is the failpoint concerned
    (None when the problem is not about one name)."""

    def __init__(self, name: str | None, reason: str) -> None:
        where = f"failpoint {name!r}" if name is not None else "failpoints"
        super().__init__(f"{ENV_VAR}: {where}: {reason}")
        self.name = name
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Exit:
    """Exit the process at the `hit`-th call (1 = the first)."""

    hit: int

    def __str__(self) -> str:
        return "exit" if self.hit == 1 else f"exit@{self.hit}"


@dataclass(frozen=True, slots=True)
class Sleep:
    ms: int

    def __str__(self) -> str:
        return f"sleep({self.ms})"


Action = Exit | Sleep


def parse(spec: str) -> dict[str, Action]:
    """The actions of a `LOGSVC_FAILPOINTS` value; `FailpointConfigError` if any part is
    malformed, names an unknown failpoint, or names one twice."""
    actions: dict[str, Action] = {}
    for part in spec.split(";"):
        part = part.strip()
        if not part:
            continue
        name, sep, action_text = part.partition("=")
        name, action_text = name.strip(), action_text.strip()
        if not sep or not _NAME.match(name):
            raise FailpointConfigError(name or None, f"expected name=action, got {part!r}")
        if name not in KNOWN_FAILPOINTS:
            raise FailpointConfigError(
                name, f"unknown failpoint (known: {', '.join(sorted(KNOWN_FAILPOINTS))})"
            )
        if name in actions:
            raise FailpointConfigError(name, "given twice")
        actions[name] = _parse_action(name, action_text)
    return actions


def _parse_action(name: str, text: str) -> Action:
    if text == "exit":
        return Exit(1)
    exit_at = _EXIT_AT.match(text)
    if exit_at:
        hit = int(exit_at.group(1))
        if hit < 1:
            raise FailpointConfigError(name, "exit@N needs N >= 1")
        return Exit(hit)
    sleep = _SLEEP.match(text)
    if sleep:
        ms = int(sleep.group(1))
        if ms > SLEEP_MS_MAX:
            raise FailpointConfigError(name, f"sleep of {ms} ms exceeds {SLEEP_MS_MAX} ms")
        return Sleep(ms)
    raise FailpointConfigError(name, f"unknown action {text!r} (exit, exit@N, sleep(MS))")


class _Armed:
    __slots__ = ("action", "hits", "lock", "name")

    def __init__(self, name: str, action: Action) -> None:
        self.name = name
        self.action = action
        self.hits = 0
        self.lock = threading.Lock()

    def hit(self) -> None:
        with self.lock:
            self.hits += 1
            hits = self.hits
        action = self.action
        if isinstance(action, Exit):
            if hits == action.hit:
                _announce(self.name, action)
                os._exit(EXIT_CODE)
            return
        _announce(self.name, action)
        time.sleep(action.ms / 1000.0)


def _announce(name: str, action: Action) -> None:
    # One write(2) of the whole line, unbuffered: it is in the log even if we _exit next.
    os.write(2, f"FAILPOINT {name} {action}\n".encode())


def _arm(spec: str | None) -> dict[str, _Armed]:
    if not spec:
        return {}
    return {name: _Armed(name, action) for name, action in parse(spec).items()}


_armed: dict[str, _Armed] = _arm(os.environ.get(ENV_VAR))


def failpoint(name: str) -> None:
    """Act as configured for `name` (see the module docstring); nothing when unset."""
    if not _armed:
        return
    armed = _armed.get(name)
    if armed is None:
        assert name in KNOWN_FAILPOINTS, f"failpoint {name!r} is not in KNOWN_FAILPOINTS"
        return
    armed.hit()


def enabled() -> bool:
    """Whether any failpoint is armed (call sites that must do work to decide whether they
    are at their failpoint check this first)."""
    return bool(_armed)


def configure(spec: str | None) -> None:
    """Replace the armed failpoints (hit counts restart). For in-process tests; a node reads
    the environment at import and never calls this."""
    global _armed
    _armed = _arm(spec)
