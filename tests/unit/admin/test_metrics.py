"""The metrics: every family the issue names is defined and exposed as valid Prometheus
text, on a registry of its own; update methods move the series they should.

How: a `Metrics` is fed events, statuses, server counters and store stats; its
`exposition()` is parsed back with prometheus-client's own text parser and the samples
are compared. Totals absorbed twice count only what grew (and a total that went down
counts as a reset); successive statuses count leader changes and elections; free-form
labels are bounded; a shard that is forgotten leaves no series.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from logsvc.admin.limits import AdminLimits
from logsvc.admin.metrics import Metrics
from logsvc.admin.port import example_view
from logsvc.admin.status import ReplicaStatus, ShardStatus
from logsvc.store import StoreStats
from logsvc.store.recovery import RecoveryReport

# The families the issue lists, by exposed name (counters as the parser names them:
# without `_total`).
EXPECTED_FAMILIES = {
    "logsvc_node_info": "gauge",
    "logsvc_appends": "counter",
    "logsvc_append_records": "counter",
    "logsvc_append_bytes": "counter",
    "logsvc_append_latency_seconds": "histogram",
    "logsvc_group_commit_batches": "histogram",
    "logsvc_group_commit_bytes": "histogram",
    "logsvc_sync_latency_seconds": "histogram",
    "logsvc_store_syncs": "counter",
    "logsvc_store_fdatasyncs": "counter",
    "logsvc_store_synced_bytes": "counter",
    "logsvc_store_sync_seconds": "counter",
    "logsvc_store_durable_index": "gauge",
    "logsvc_queue_depth": "gauge",
    "logsvc_overloaded_rejections": "counter",
    "logsvc_leader_changes": "counter",
    "logsvc_elections": "counter",
    "logsvc_shard_term": "gauge",
    "logsvc_shard_is_leader": "gauge",
    "logsvc_shard_leader_known": "gauge",
    "logsvc_shard_replica_failed": "gauge",
    "logsvc_shard_commit_index": "gauge",
    "logsvc_shard_applied_index": "gauge",
    "logsvc_shard_apply_lag_entries": "gauge",
    "logsvc_shard_last_election_timestamp_seconds": "gauge",
    "logsvc_replica_match_index": "gauge",
    "logsvc_replica_lag_entries": "gauge",
    "logsvc_replica_lag_records": "gauge",
    "logsvc_replica_lag_seconds": "gauge",
    "logsvc_shard_first_lsn": "gauge",
    "logsvc_shard_next_lsn": "gauge",
    "logsvc_shard_physical_truncation_lag_entries": "gauge",
    "logsvc_corruption_events": "counter",
    "logsvc_bad_frames": "counter",
    "logsvc_bad_requests": "counter",
    "logsvc_request_errors": "counter",
    "logsvc_auth_failures": "counter",
    "logsvc_server_events": "counter",
}


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, parsed back from the exposition."""
    text = metrics.exposition().decode("utf-8")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, tuple(sorted(labels.items()))))


BASE_STATS = StoreStats(
    first_index=1,
    last_index=10,
    durable_index=10,
    segments=1,
    obsolete_segments=0,
    physical_first_index=1,
    cache_entries=0,
    cache_bytes=0,
    buffered_bytes=0,
    syncs=0,
    fdatasyncs=0,
    synced_bytes=0,
    sync_seconds_total=0.0,
    failed=False,
    recovery=RecoveryReport(),
)


def store_stats(**fields: Any) -> StoreStats:
    return dataclasses.replace(BASE_STATS, **fields)


def fed() -> Metrics:
    """One of every update."""
    metrics = Metrics("n1")
    view = example_view()
    metrics.set_shard_status(view.status_now(1))
    metrics.set_shard_status(view.status_now(2))
    metrics.observe_append(1, records=3, size_bytes=300, seconds=0.002)
    metrics.observe_group_commit(batches=4, size_bytes=4096)
    metrics.observe_sync(0.0004)
    metrics.set_queue_depth(1, "appends", 7)
    metrics.count_overloaded("appends")
    metrics.count_corruption(1, "store")
    metrics.count_bad_frame("BadChecksum")
    metrics.count_bad_request("BadMessage")
    metrics.count_request_error("LsnTruncated")
    metrics.count_auth_failure("admin")
    metrics.absorb_server_counters({"future_counter": 1})
    metrics.absorb_store_stats(1, store_stats(syncs=5))
    return metrics


def test_every_family_is_exposed_with_its_type() -> None:
    text = fed().exposition().decode("utf-8")
    families = {family.name: family.type for family in text_string_to_metric_families(text)}
    # prometheus-client adds a `_created` gauge (the series' start time) per counter and
    # histogram: Prometheus uses it to tell a reset from a slow counter.
    created = {name for name in families if name.endswith("_created")}
    assert {name.removesuffix("_created") for name in created} == {
        name for name, kind in EXPECTED_FAMILIES.items() if kind in ("counter", "histogram")
    }
    assert {name: families[name] for name in families.keys() - created} == EXPECTED_FAMILIES
    for name in EXPECTED_FAMILIES:
        assert f"# HELP {name}" in text


def test_each_metrics_has_its_own_registry() -> None:
    first, second = Metrics("n1"), Metrics("n2")  # the global registry would refuse this
    first.observe_append(1, 1, 1, 0.001)
    assert value(first, "logsvc_appends_total", shard="1") == 1
    assert value(second, "logsvc_appends_total", shard="1") is None
    assert not [name for name in REGISTRY._names_to_collectors if name.startswith("logsvc_")]


def test_appends() -> None:
    metrics = Metrics("n1")
    metrics.observe_append(1, records=3, size_bytes=300, seconds=0.002)
    metrics.observe_append(1, records=2, size_bytes=50, seconds=0.2)
    assert value(metrics, "logsvc_appends_total", shard="1") == 2
    assert value(metrics, "logsvc_append_records_total", shard="1") == 5
    assert value(metrics, "logsvc_append_bytes_total", shard="1") == 350
    assert value(metrics, "logsvc_append_latency_seconds_count") == 2
    assert value(metrics, "logsvc_append_latency_seconds_bucket", le="0.0025") == 1
    assert value(metrics, "logsvc_append_latency_seconds_bucket", le="0.25") == 2


def test_shard_status_gauges() -> None:
    metrics = Metrics("n1")
    metrics.set_shard_status(example_view().status_now(1))
    shard = {"shard": "1"}
    assert value(metrics, "logsvc_shard_term", **shard) == 3
    assert value(metrics, "logsvc_shard_is_leader", **shard) == 1
    assert value(metrics, "logsvc_shard_first_lsn", **shard) == 11
    assert value(metrics, "logsvc_shard_next_lsn", **shard) == 501
    assert value(metrics, "logsvc_shard_physical_truncation_lag_entries", **shard) == 39
    assert value(metrics, "logsvc_replica_lag_entries", shard="1", replica="n3") == 5
    assert value(metrics, "logsvc_replica_match_index", shard="1", replica="n2") == 120
    assert value(metrics, "logsvc_replica_lag_records", shard="1", replica="n3") is None
    elected = datetime(2026, 5, 1, 12, tzinfo=UTC).timestamp()
    assert value(metrics, "logsvc_shard_last_election_timestamp_seconds", **shard) == elected


def test_replica_progress_goes_away_on_a_follower() -> None:
    metrics = Metrics("n1")
    status = example_view().status_now(1)
    metrics.set_shard_status(status)
    follower = dataclasses.replace(
        status,
        is_leader=False,
        replicas=tuple(ReplicaStatus(r.node_id) for r in status.replicas),
    )
    metrics.set_shard_status(follower)
    assert not [key for key in samples(metrics) if key[0].startswith("logsvc_replica_")]


def test_leader_changes_and_elections_from_successive_statuses() -> None:
    metrics = Metrics("n1")
    view = example_view()
    status = view.status_now(1)
    n2 = view.status_now(2).leader
    metrics.set_shard_status(status)  # the baseline: nothing counted
    assert value(metrics, "logsvc_leader_changes_total", shard="1") == 0
    assert value(metrics, "logsvc_elections_total", shard="1") == 0
    steps: list[ShardStatus] = [
        dataclasses.replace(status, term=4, leader=None),  # an election under way
        dataclasses.replace(status, term=6, leader=n2),  # two more terms; n2 won
        dataclasses.replace(status, term=6, leader=n2),  # nothing new
        dataclasses.replace(status, term=7, leader=status.leader),  # back to n1
    ]
    for step in steps:
        metrics.set_shard_status(step)
    assert value(metrics, "logsvc_leader_changes_total", shard="1") == 2
    assert value(metrics, "logsvc_elections_total", shard="1") == 4


def test_server_counters_are_absorbed_by_what_grew() -> None:
    metrics = Metrics("n1")
    counters = {
        "bad_frames:BadChecksum": 2,
        "bad_requests:BadMessage": 1,
        "errors:LsnTruncated": 3,
        "auth_failures": 4,
        "overloaded": 5,
        "connections_refused": 6,
    }
    metrics.absorb_server_counters(counters)
    metrics.absorb_server_counters({**counters, "bad_frames:BadChecksum": 7})
    assert value(metrics, "logsvc_bad_frames_total", reason="BadChecksum") == 7
    assert value(metrics, "logsvc_bad_requests_total", reason="BadMessage") == 1
    assert value(metrics, "logsvc_request_errors_total", error="LsnTruncated") == 3
    assert value(metrics, "logsvc_auth_failures_total", plane="data") == 4
    assert value(metrics, "logsvc_overloaded_rejections_total", queue="data_plane") == 5
    assert value(metrics, "logsvc_overloaded_rejections_total", queue="connections") == 6


def test_store_stats_are_absorbed_and_a_reset_counts_anew() -> None:
    metrics = Metrics("n1")
    metrics.absorb_store_stats(1, store_stats(syncs=10, fdatasyncs=12, synced_bytes=4096))
    metrics.absorb_store_stats(1, store_stats(syncs=15, fdatasyncs=18, synced_bytes=8192))
    assert value(metrics, "logsvc_store_syncs_total", shard="1") == 15
    metrics.absorb_store_stats(1, store_stats(syncs=2))  # the store was reopened
    assert value(metrics, "logsvc_store_syncs_total", shard="1") == 17
    assert value(metrics, "logsvc_store_synced_bytes_total", shard="1") == 8192
    assert value(metrics, "logsvc_store_durable_index", shard="1") == 10


def test_free_form_labels_are_bounded() -> None:
    metrics = Metrics("n1", AdminLimits(metric_label_values_max=2))
    for reason in ("A", "B", "C", "D", "A"):
        metrics.count_bad_frame(reason)
    assert value(metrics, "logsvc_bad_frames_total", reason="A") == 2
    assert value(metrics, "logsvc_bad_frames_total", reason="B") == 1
    assert value(metrics, "logsvc_bad_frames_total", reason="other") == 2
    assert value(metrics, "logsvc_bad_frames_total", reason="C") is None


def test_forget_shard_drops_its_series() -> None:
    metrics = fed()
    metrics.forget_shard(1)
    left = [key for key in samples(metrics) if ("shard", "1") in key[1]]
    assert left == []
    assert value(metrics, "logsvc_shard_term", shard="2") == 5
