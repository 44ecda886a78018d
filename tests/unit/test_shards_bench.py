"""The shards benchmark's idle phase measures a settled cluster (pure parts, no cluster)."""

from __future__ import annotations

import os

import pytest

from logsvc.bench import shards_bench


class _Answers:
    """Quiet counts a cluster gives over successive asks, the last one repeated."""

    def __init__(self, answers: list[tuple[int, int]]) -> None:
        self.answers = answers
        self.asked = 0

    def __call__(self) -> tuple[int, int]:
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return answer


def test_the_idle_window_starts_once_every_replica_is_quiet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shards_bench, "SETTLE_POLL_S", 0.0)
    answers = _Answers([(0, 0), (10, 30), (29, 30), (30, 30)])
    config = shards_bench.ShardsBenchConfig(settle_seconds=0.0, idle_seconds=0.01)
    result = shards_bench._idle({"n1": os.getpid()}, config, answers)
    assert result["idle_quiet_replicas"] == {"before": 30, "after": 30, "of": 30}
    assert answers.asked == 5  # four until quiet, one after the window


def test_a_cluster_that_never_goes_quiet_is_measured_after_the_bound_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shards_bench, "SETTLE_POLL_S", 0.0)
    monkeypatch.setattr(shards_bench, "SETTLE_WAIT_S_MAX", 0.05)
    answers = _Answers([(12, 30)])
    config = shards_bench.ShardsBenchConfig(settle_seconds=0.0, idle_seconds=0.01)
    result = shards_bench._idle({"n1": os.getpid()}, config, answers)
    assert result["idle_quiet_replicas"] == {"before": 12, "after": 12, "of": 30}
