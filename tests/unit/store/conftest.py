"""Fixtures for store tests: small limits so segments roll and caches evict quickly."""

from __future__ import annotations

from pathlib import Path

import pytest

from logsvc.store import ShardStore, StoreLimits

SMALL = StoreLimits(
    segment_bytes_max=2048,
    record_payload_bytes_max=64 * 1024,
    group_commit_bytes_max=64 * 1024,
    group_commit_delay_ms_max=0,
    write_buffer_bytes_max=4096,
    cache_bytes_max=8192,
    sync_wait_ms_max=10_000,
)


@pytest.fixture
def store_dir(tmp_path: Path) -> str:
    return str(tmp_path / "shard")


def open_store(path: str, limits: StoreLimits = SMALL) -> ShardStore:
    return ShardStore.open(path, limits=limits)
