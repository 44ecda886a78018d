"""Limits of the admin plane, with units and reasons.

The admin API is small and slow-paced (operators and a Prometheus scrape every few
seconds), so its bounds are about not letting a client make the node do unbounded work:
a bounded body, a bounded number of requests in flight, a bounded wait on the node, and a
bounded number of label values per metric. The relations are checked by `validate()` and
asserted at import for the defaults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from logsvc.config_files import PORT_MAX
from logsvc.node_config import NODE_ID_CHARS_MAX
from logsvc.shard.limits import U64_MAX

# A node id, as the config accepts it (logsvc.config._NODE_ID): path parameters and bodies
# naming a node are checked against the same rule, so a bad id is a 422, never a lookup.
NODE_ID_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
NODE_ID_CHARS: Final = NODE_ID_CHARS_MAX

# Shard ids are positive, and the Raft port of shard s is raft_port_base + s <= 65535, so
# no valid shard id is above PORT_MAX (config.py checks both).
SHARD_ID_MIN: Final = 1
SHARD_ID_MAX: Final = PORT_MAX

# LSNs and epochs are u64 in the commands (msgpack, snapshots). JSON integers this large
# lose precision in JavaScript; Python clients and the CLI are exact.
LSN_MAX: Final = U64_MAX
EPOCH_MAX: Final = U64_MAX

# The largest valid body is {"target_node_id": "<64 chars>"} or {"lsn": <20 digits>,
# "epoch": <20 digits>}: well under 256 bytes. 4 KiB leaves room for whitespace and is
# still nothing to buffer.
REQUEST_BODY_BYTES_MAX_DEFAULT: Final = 4 * 1024


@dataclass(frozen=True, slots=True)
class AdminLimits:
    # A request body longer than this is refused with 413 before it is parsed (by its
    # Content-Length, or while it is read when it has none).
    request_body_bytes_max: int = REQUEST_BODY_BYTES_MAX_DEFAULT

    # Requests being served at once; one more is answered 503 "overloaded" at once. A
    # scrape and a few operators need a handful; a runaway script must not pile up
    # membership changes (each holds a replica lock for up to 30 s).
    requests_inflight_max: int = 32

    # The longest the app waits on one NodeView call before answering 504
    # "outcome_unknown". A backstop: the view bounds its own calls (a membership change
    # waits 30 s for its commit, MEMBERSHIP_TIMEOUT_S_DEFAULT in shard/replica.py).
    view_call_s_max: float = 60.0

    # /readyz: how many Raft entries this replica's applied index may trail the leader's
    # commit index and still count as caught up. Not 0: under load a healthy follower is
    # always a few entries behind (one heartbeat's worth of group commits).
    ready_apply_lag_entries_max: int = 1024

    # Distinct values of one free-form metric label (a bad frame's reason, an error's
    # class name): past it, new values are counted under "other", so a bug that makes
    # reasons unbounded cannot make the scrape unbounded.
    metric_label_values_max: int = 64

    def validate(self) -> AdminLimits:
        for limit in dataclasses.fields(self):
            value = getattr(self, limit.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{limit.name}: must be a number, got {value!r}")
            if value < 0 or (value == 0 and limit.name != "ready_apply_lag_entries_max"):
                raise ValueError(f"{limit.name}: must be positive, got {value}")
        if self.request_body_bytes_max < 256:
            raise ValueError(
                "request_body_bytes_max: must be at least 256 (the largest valid body), "
                f"got {self.request_body_bytes_max}"
            )
        return self


DEFAULT_ADMIN_LIMITS: Final = AdminLimits().validate()

assert NODE_ID_CHARS >= 1
assert SHARD_ID_MIN <= SHARD_ID_MAX
