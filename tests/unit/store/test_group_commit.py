"""The group-commit policy starts a sync exactly when bytes, delay or urgency say so.

Pure core, driven through its inputs with explicit `now_ms`; no threads, no clock.
"""

from __future__ import annotations

from logsvc.store.group_commit import IDLE, SYNC_NOW, GroupCommitPolicy, WaitUntil


def test_idle_without_unsynced_bytes() -> None:
    policy = GroupCommitPolicy(bytes_max=1000, delay_ms_max=5)
    assert policy.next_action(0) == IDLE
    policy.request_urgent()
    assert policy.next_action(0) == IDLE


def test_delay_triggers_after_the_oldest_unsynced_append() -> None:
    policy = GroupCommitPolicy(bytes_max=1000, delay_ms_max=5)
    policy.on_append(10, now_ms=100)
    policy.on_append(10, now_ms=103)
    assert policy.next_action(101) == WaitUntil(105)
    assert policy.next_action(105) == SYNC_NOW


def test_bytes_trigger_at_once() -> None:
    policy = GroupCommitPolicy(bytes_max=100, delay_ms_max=1000)
    policy.on_append(60, now_ms=0)
    assert isinstance(policy.next_action(0), WaitUntil)
    policy.on_append(40, now_ms=0)
    assert policy.next_action(0) == SYNC_NOW


def test_urgent_request_syncs_now_and_is_cleared_by_the_sync() -> None:
    policy = GroupCommitPolicy(bytes_max=1000, delay_ms_max=1000)
    policy.on_append(10, now_ms=0)
    policy.request_urgent()
    assert policy.next_action(0) == SYNC_NOW
    assert policy.on_sync_started() == 10
    policy.on_sync_finished(now_ms=1)
    policy.on_append(10, now_ms=2)
    assert policy.next_action(2) == WaitUntil(1002)


def test_one_sync_in_flight_at_a_time_and_batching_behind_it() -> None:
    policy = GroupCommitPolicy(bytes_max=1000, delay_ms_max=0)
    policy.on_append(10, now_ms=0)
    assert policy.next_action(0) == SYNC_NOW
    policy.on_sync_started()
    for _ in range(50):
        policy.on_append(10, now_ms=1)
    assert policy.next_action(1) == IDLE  # the disk is busy: appends accumulate
    policy.on_sync_finished(now_ms=2)
    assert policy.next_action(2) == SYNC_NOW
    assert policy.on_sync_started() == 500  # one sync covers all fifty


def test_discarding_every_unsynced_byte_returns_to_idle() -> None:
    policy = GroupCommitPolicy(bytes_max=1000, delay_ms_max=10)
    policy.on_append(30, now_ms=0)
    policy.request_urgent()
    policy.on_discarded(30)
    assert policy.next_action(100) == IDLE
