"""The node's Prometheus metrics: definitions, update methods, exposition.

The only module importing prometheus-client. A `Metrics` owns its own `CollectorRegistry`
(never the library's global one), so two nodes in one test process, or two tests, never
share a series. The daemon updates it three ways:

* events, as they happen: `observe_append`, `observe_group_commit`, `observe_sync`,
  `count_overloaded`, `count_corruption`, `count_bad_frame`, `count_auth_failure`...;
* totals kept elsewhere, absorbed before a scrape: `absorb_server_counters` (the data
  plane's `DataPlaneServer.counters`) and `absorb_store_stats` (a shard store's
  `StoreStats`) add what grew since the last call (a total that went down was reset,
  e.g. a store reopened, and counts from zero);
* state, set before a scrape: `set_shard_status` (the admin port's `ShardStatus`; it also
  derives leader changes and elections from successive statuses), `set_queue_depth`.

Then `exposition()` is the /metrics body (text format 0.0.4). Every name starts with
`logsvc_`; counters end in `_total`, and units come last (`_seconds`, `_bytes`).

Cardinality. Per-shard series carry `shard` (bounded by the shards a node hosts); the
histograms carry no label at all (a shard label would multiply every bucket by the shard
count) - per-shard rates are in the counters. Free-form labels (a bad frame's reason, an
error class, a queue name) keep at most `metric_label_values_max` distinct values; later
ones are counted under "other".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from logsvc.admin.limits import DEFAULT_ADMIN_LIMITS, AdminLimits
from logsvc.admin.port import EXPOSITION_CONTENT_TYPE
from logsvc.admin.status import ShardStatus
from logsvc.store import StoreStats

assert EXPOSITION_CONTENT_TYPE == CONTENT_TYPE_PLAIN_0_0_4, "generate_latest's format"

# Buckets, in the metric's unit. Appends are acknowledged after a majority fsync: from
# ~0.5 ms (local NVMe, one replica set on one host) to seconds (a leader change).
APPEND_LATENCY_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
# One fdatasync: ~50 us on NVMe with a power-loss-protected cache, to ~1 s on a busy disk.
SYNC_LATENCY_BUCKETS_S: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
# Client batches per group commit: 1 (no concurrency) to group_batches_max (1024).
GROUP_COMMIT_BATCHES_BUCKETS: Final = tuple(float(2**n) for n in range(11))
# Bytes per group commit: 1 KiB to the 16 MiB of a store record.
GROUP_COMMIT_BYTES_BUCKETS: Final = tuple(float(4**n * 1024) for n in range(8))

# The data plane's counter keys (logsvc/node/server.py) and where each goes.
_SERVER_PREFIXES: Final = ("bad_frames:", "bad_requests:", "errors:")

Plane = Literal["data", "admin"]
OTHER: Final = "other"


class _LabelValues:
    """At most `values_max` distinct values of one free-form label; then "other"."""

    __slots__ = ("_seen", "_values_max")

    def __init__(self, values_max: int) -> None:
        assert values_max >= 1
        self._values_max = values_max
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) >= self._values_max:
            return OTHER
        self._seen.add(value)
        return value


class _Totals:
    """Turns totals read from elsewhere into increments: what grew since the last read."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[tuple[str, ...], float] = {}

    def grown(self, key: tuple[str, ...], total: float) -> float:
        assert total >= 0
        last = self._last.get(key, 0.0)
        self._last[key] = total
        return total - last if total >= last else total  # went down: reset, count anew

    def forget(self, shard: str) -> None:
        for key in [key for key in self._last if key[:1] == (shard,)]:
            del self._last[key]


class Metrics:
    """The metrics of one node. Not thread-safe for the derived state (leader changes,
    absorbed totals): call the update methods from one thread (the daemon's event loop);
    prometheus-client's own instruments are thread-safe."""

    def __init__(self, node_id: str, limits: AdminLimits = DEFAULT_ADMIN_LIMITS) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        label_values_max = limits.validate().metric_label_values_max
        self._reason = _LabelValues(label_values_max)
        self._request_reason = _LabelValues(label_values_max)
        self._error = _LabelValues(label_values_max)
        self._queue = _LabelValues(label_values_max)
        self._source = _LabelValues(label_values_max)
        self._event = _LabelValues(label_values_max)
        self._totals = _Totals()
        self._leader_seen: dict[str, str] = {}  # shard -> last known leader's node id
        self._term_seen: dict[str, int] = {}

        info = Gauge("logsvc_node_info", "This node (always 1).", ["node_id"], registry=r)
        info.labels(node_id).set(1)

        # -------------------------------------------------------------- appends
        self.appends = Counter(
            "logsvc_appends_total", "Append requests acknowledged.", ["shard"], registry=r
        )
        self.append_records = Counter(
            "logsvc_append_records_total",
            "Records appended (acknowledged).",
            ["shard"],
            registry=r,
        )
        self.append_bytes = Counter(
            "logsvc_append_bytes_total",
            "Record payload bytes appended (acknowledged).",
            ["shard"],
            registry=r,
        )
        self.append_latency = Histogram(
            "logsvc_append_latency_seconds",
            "From an append request's arrival to its acknowledgement (majority fsync).",
            buckets=APPEND_LATENCY_BUCKETS_S,
            registry=r,
        )
        # -------------------------------------------------------------- group commit, syncs
        self.group_commit_batches = Histogram(
            "logsvc_group_commit_batches",
            "Client append batches packed into one Raft entry (one group commit).",
            buckets=GROUP_COMMIT_BATCHES_BUCKETS,
            registry=r,
        )
        self.group_commit_bytes = Histogram(
            "logsvc_group_commit_bytes",
            "Record bytes in one group commit.",
            buckets=GROUP_COMMIT_BYTES_BUCKETS,
            registry=r,
        )
        self.sync_latency = Histogram(
            "logsvc_sync_latency_seconds",
            "One fdatasync of a shard store.",
            buckets=SYNC_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.store_syncs = Counter(
            "logsvc_store_syncs_total", "Syncs of the shard store.", ["shard"], registry=r
        )
        self.store_fdatasyncs = Counter(
            "logsvc_store_fdatasyncs_total",
            "fdatasync calls of the shard store (files and directories).",
            ["shard"],
            registry=r,
        )
        self.store_synced_bytes = Counter(
            "logsvc_store_synced_bytes_total",
            "Bytes made durable by the shard store.",
            ["shard"],
            registry=r,
        )
        self.store_sync_seconds = Counter(
            "logsvc_store_sync_seconds_total",
            "Time spent syncing the shard store.",
            ["shard"],
            registry=r,
        )
        self.store_durable_index = Gauge(
            "logsvc_store_durable_index",
            "Highest Raft index durable in the shard store.",
            ["shard"],
            registry=r,
        )
        # -------------------------------------------------------------- queues
        self.queue_depth = Gauge(
            "logsvc_queue_depth",
            "Items waiting in a bounded queue.",
            ["shard", "queue"],
            registry=r,
        )
        self.overloaded = Counter(
            "logsvc_overloaded_rejections_total",
            "Requests refused with Overloaded because a bounded queue was full.",
            ["queue"],
            registry=r,
        )
        # -------------------------------------------------------------- Raft
        self.leader_changes = Counter(
            "logsvc_leader_changes_total",
            "Times this replica saw the shard's leader change to another node.",
            ["shard"],
            registry=r,
        )
        self.elections = Counter(
            "logsvc_elections_total",
            "Raft terms this replica saw begin (each term begins with an election).",
            ["shard"],
            registry=r,
        )
        self.term = Gauge("logsvc_shard_term", "Current Raft term.", ["shard"], registry=r)
        self.is_leader = Gauge(
            "logsvc_shard_is_leader", "1 if this node leads the shard.", ["shard"], registry=r
        )
        self.leader_known = Gauge(
            "logsvc_shard_leader_known",
            "1 if this replica knows a leader.",
            ["shard"],
            registry=r,
        )
        self.failed = Gauge(
            "logsvc_shard_replica_failed",
            "1 if this replica stopped on a fatal error.",
            ["shard"],
            registry=r,
        )
        self.commit_index = Gauge(
            "logsvc_shard_commit_index", "Raft commit index.", ["shard"], registry=r
        )
        self.applied_index = Gauge(
            "logsvc_shard_applied_index", "Last Raft index applied here.", ["shard"], registry=r
        )
        self.apply_lag = Gauge(
            "logsvc_shard_apply_lag_entries",
            "Leader's commit index minus this replica's applied index.",
            ["shard"],
            registry=r,
        )
        self.last_election = Gauge(
            "logsvc_shard_last_election_timestamp_seconds",
            "Unix time this replica last saw a leader elected.",
            ["shard"],
            registry=r,
        )
        # -------------------------------------------------------------- replicas (leader)
        replica = ["shard", "replica"]
        self.replica_match_index = Gauge(
            "logsvc_replica_match_index",
            "A replica's match index (known on the leader).",
            replica,
            registry=r,
        )
        self.replica_lag_entries = Gauge(
            "logsvc_replica_lag_entries",
            "Raft entries a replica trails the leader by.",
            replica,
            registry=r,
        )
        self.replica_lag_records = Gauge(
            "logsvc_replica_lag_records",
            "Records a replica trails the leader by.",
            replica,
            registry=r,
        )
        self.replica_lag_seconds = Gauge(
            "logsvc_replica_lag_seconds",
            "How long ago a replica matched the leader's log.",
            replica,
            registry=r,
        )
        # -------------------------------------------------------------- truncation
        self.first_lsn = Gauge(
            "logsvc_shard_first_lsn",
            "The truncation point: the lowest retained LSN.",
            ["shard"],
            registry=r,
        )
        self.next_lsn = Gauge(
            "logsvc_shard_next_lsn", "The next LSN to be assigned.", ["shard"], registry=r
        )
        self.physical_truncation_lag = Gauge(
            "logsvc_shard_physical_truncation_lag_entries",
            "Raft entries truncated logically but still in files on disk.",
            ["shard"],
            registry=r,
        )
        # -------------------------------------------------------------- faults
        self.corruption = Counter(
            "logsvc_corruption_events_total",
            "Corruption found (store record, snapshot, command), by where it was found.",
            ["shard", "source"],
            registry=r,
        )
        self.bad_frames = Counter(
            "logsvc_bad_frames_total",
            "Data-plane frames refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.bad_requests = Counter(
            "logsvc_bad_requests_total",
            "Data-plane requests that framed but did not decode, by reason.",
            ["reason"],
            registry=r,
        )
        self.request_errors = Counter(
            "logsvc_request_errors_total",
            "Data-plane requests answered with an error.",
            ["error"],
            registry=r,
        )
        self.auth_failures = Counter(
            "logsvc_auth_failures_total",
            "Requests with a missing or wrong token.",
            ["plane"],
            registry=r,
        )
        self.server_events = Counter(
            "logsvc_server_events_total",
            "Other data-plane counters, by name.",
            ["event"],
            registry=r,
        )

    # ------------------------------------------------------------------ events

    def observe_append(self, shard: int, records: int, size_bytes: int, seconds: float) -> None:
        """One acknowledged append request of `records` records, `size_bytes` of payload,
        `seconds` from arrival to acknowledgement."""
        assert records >= 0
        assert size_bytes >= 0
        assert seconds >= 0
        label = str(shard)
        self.appends.labels(label).inc()
        self.append_records.labels(label).inc(records)
        self.append_bytes.labels(label).inc(size_bytes)
        self.append_latency.observe(seconds)

    def observe_group_commit(self, batches: int, size_bytes: int) -> None:
        """One Raft entry holding `batches` client batches, `size_bytes` of records."""
        assert batches >= 1
        assert size_bytes >= 0
        self.group_commit_batches.observe(batches)
        self.group_commit_bytes.observe(size_bytes)

    def observe_sync(self, seconds: float) -> None:
        assert seconds >= 0
        self.sync_latency.observe(seconds)

    def set_queue_depth(self, shard: int, queue: str, depth: int) -> None:
        assert depth >= 0
        self.queue_depth.labels(str(shard), self._queue(queue)).set(depth)

    def count_overloaded(self, queue: str, count: int = 1) -> None:
        self.overloaded.labels(self._queue(queue)).inc(count)

    def count_corruption(self, shard: int, source: str) -> None:
        self.corruption.labels(str(shard), self._source(source)).inc()

    def count_bad_frame(self, reason: str, count: int = 1) -> None:
        self.bad_frames.labels(self._reason(reason)).inc(count)

    def count_bad_request(self, reason: str, count: int = 1) -> None:
        self.bad_requests.labels(self._request_reason(reason)).inc(count)

    def count_request_error(self, error: str, count: int = 1) -> None:
        self.request_errors.labels(self._error(error)).inc(count)

    def count_auth_failure(self, plane: Plane, count: int = 1) -> None:
        assert plane in ("data", "admin")
        self.auth_failures.labels(plane).inc(count)

    # ------------------------------------------------------------------ totals

    def absorb_server_counters(self, counters: Mapping[str, int]) -> None:
        """The data plane's `DataPlaneServer.counters` (cumulative): count what grew."""
        for key, total in counters.items():
            grown = int(self._totals.grown(("server", key), total))
            if grown == 0:
                continue
            kind, sep, detail = key.partition(":")
            if sep and kind == "bad_frames":
                self.count_bad_frame(detail, grown)
            elif sep and kind == "bad_requests":
                self.count_bad_request(detail, grown)
            elif sep and kind == "errors":
                self.count_request_error(detail, grown)
            elif key == "auth_failures":
                self.count_auth_failure("data", grown)
            elif key == "overloaded":
                self.count_overloaded("data_plane", grown)
            elif key == "connections_refused":
                self.count_overloaded("connections", grown)
            else:  # a counter added to the server later: still exported
                self.server_events.labels(self._event(key)).inc(grown)

    def absorb_store_stats(self, shard: int, stats: StoreStats) -> None:
        """One shard store's `StoreStats` (cumulative counts since it was opened)."""
        label = str(shard)
        pairs: tuple[tuple[Counter, str, float], ...] = (
            (self.store_syncs, "syncs", stats.syncs),
            (self.store_fdatasyncs, "fdatasyncs", stats.fdatasyncs),
            (self.store_synced_bytes, "synced_bytes", stats.synced_bytes),
            (self.store_sync_seconds, "sync_seconds_total", stats.sync_seconds_total),
        )
        for counter, name, total in pairs:
            grown = self._totals.grown((label, "store", name), total)
            if grown:
                counter.labels(label).inc(grown)
            else:
                counter.labels(label)  # the series exists from the first absorb on
        self.store_durable_index.labels(label).set(stats.durable_index)

    # ------------------------------------------------------------------ state

    def set_shard_status(self, status: ShardStatus) -> None:
        """The state of one hosted shard, as the admin port reports it."""
        label = str(status.shard_id)
        self.term.labels(label).set(status.term)
        self.is_leader.labels(label).set(1 if status.is_leader else 0)
        self.leader_known.labels(label).set(0 if status.leader is None else 1)
        self.failed.labels(label).set(1 if status.failed else 0)
        self.commit_index.labels(label).set(status.commit_index)
        self.applied_index.labels(label).set(status.applied_index)
        self.first_lsn.labels(label).set(status.first_lsn)
        self.next_lsn.labels(label).set(status.next_lsn)
        self.physical_truncation_lag.labels(label).set(status.physical_truncation_lag_entries)
        apply_lag = status.apply_lag_entries
        if apply_lag is None:
            self.apply_lag.remove_by_labels({"shard": label})
        else:
            self.apply_lag.labels(label).set(apply_lag)
        if status.last_election_at is None:
            self.last_election.remove_by_labels({"shard": label})
        else:
            self.last_election.labels(label).set(status.last_election_at.timestamp())
        self._count_changes(label, status)
        self._set_replicas(label, status)

    def forget_shard(self, shard: int) -> None:
        """Drop every series of a shard this node no longer hosts."""
        label = str(shard)
        for metric in self._shard_metrics():
            metric.remove_by_labels({"shard": label})
        self._leader_seen.pop(label, None)
        self._term_seen.pop(label, None)
        self._totals.forget(label)

    def exposition(self) -> bytes:
        """The /metrics body: Prometheus text format 0.0.4 (EXPOSITION_CONTENT_TYPE)."""
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ internals

    def _count_changes(self, label: str, status: ShardStatus) -> None:
        """Leader changes and elections, from successive statuses. The first status of a
        shard only sets the baseline: what happened before this process is not counted."""
        leader = status.leader.node_id if status.leader is not None else None
        self.leader_changes.labels(label)
        self.elections.labels(label)
        if leader is not None:
            previous = self._leader_seen.get(label)
            if previous is not None and previous != leader:
                self.leader_changes.labels(label).inc()
            self._leader_seen[label] = leader
        term_seen = self._term_seen.get(label)
        if term_seen is not None and status.term > term_seen:
            self.elections.labels(label).inc(status.term - term_seen)
        if term_seen is None or status.term > term_seen:
            self._term_seen[label] = status.term

    def _set_replicas(self, label: str, status: ShardStatus) -> None:
        """Only the leader knows the replicas' progress: on a follower the series go away
        rather than keep the last values it saw while leading."""
        gauges = (
            self.replica_match_index,
            self.replica_lag_entries,
            self.replica_lag_records,
            self.replica_lag_seconds,
        )
        for gauge in gauges:
            gauge.remove_by_labels({"shard": label})
        for replica in status.replicas:
            values = (
                replica.match_index,
                replica.lag_entries,
                replica.lag_records,
                replica.lag_seconds,
            )
            for gauge, value in zip(gauges, values, strict=True):
                if value is not None:
                    gauge.labels(label, replica.node_id).set(value)

    def _shard_metrics(self) -> tuple[Counter | Gauge, ...]:
        return (
            self.appends,
            self.append_records,
            self.append_bytes,
            self.store_syncs,
            self.store_fdatasyncs,
            self.store_synced_bytes,
            self.store_sync_seconds,
            self.store_durable_index,
            self.queue_depth,
            self.leader_changes,
            self.elections,
            self.term,
            self.is_leader,
            self.leader_known,
            self.failed,
            self.commit_index,
            self.applied_index,
            self.apply_lag,
            self.last_election,
            self.replica_match_index,
            self.replica_lag_entries,
            self.replica_lag_records,
            self.replica_lag_seconds,
            self.first_lsn,
            self.next_lsn,
            self.physical_truncation_lag,
            self.corruption,
        )
