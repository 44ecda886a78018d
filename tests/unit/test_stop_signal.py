"""SIGTERM as `Stopped`, and a start that a SIGTERM cannot leave with an unrecorded node.

The benchmark SIGTERM test (test_cli.py) failed a fresh-clone rehearsal with all three nodes
left running: the signal arrived while `devcluster.start` was inside `subprocess.Popen` for
the third node (the child forked, its PID not yet returned), so `down` found no PID file.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from logsvc import devcluster, stop_signal


@pytest.fixture
def sigterm_stops() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    stop_signal.stop_on_sigterm()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_sigterm_inside_a_deferred_block_stops_at_its_end(sigterm_stops: None) -> None:
    reached = []
    with pytest.raises(stop_signal.Stopped) as stopped:
        with stop_signal.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("after the signal")  # not interrupted
        reached.append("after the block")  # never: Stopped at the block's end
    assert reached == ["after the signal"]
    assert stopped.value.code == 128 + signal.SIGTERM


def test_a_sigterm_held_by_a_block_that_raises_still_stops(sigterm_stops: None) -> None:
    """The block's own error must not swallow the stop that was asked for (exit 143)."""
    with pytest.raises(stop_signal.Stopped) as stopped, stop_signal.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        raise OSError("spawn failed")
    assert stopped.value.code == 128 + signal.SIGTERM
    assert isinstance(stopped.value.__context__, OSError)


def test_a_sigterm_outside_stops_at_once(sigterm_stops: None) -> None:
    reached = []
    with pytest.raises(stop_signal.Stopped):
        os.kill(os.getpid(), signal.SIGTERM)
        reached.append("after the signal")
    assert reached == []


def test_a_start_stopped_while_spawning_records_every_node_it_spawned(
    sigterm_stops: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM during the second node's spawn (as if inside Popen after the fork): the
    PID file names both spawned nodes, so `down` stops them."""
    spawned: list[int] = []

    def spawn(dir_path: str, node_id: str) -> int:
        pid = 100_000 + len(spawned)  # no process: the PID file is what is checked
        spawned.append(pid)
        if len(spawned) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return pid

    monkeypatch.setattr(devcluster, "_spawn", spawn)
    with pytest.raises(stop_signal.Stopped):
        devcluster.start(str(tmp_path), nodes=3, shards=1)
    assert sorted(devcluster.read_pids(str(tmp_path)).values()) == spawned == [100_000, 100_001]
