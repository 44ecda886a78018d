"""The client's errors: `LogsvcError` and its tree, the server's error codes mapped to them
(`_error`), and which answers a call may retry (`_RETRYABLE`).

    LogsvcError
      ServerError             the server answered an error (`code`); any code without a
                              class of its own is a plain ServerError
        NotLeader, Truncated (`first_lsn`), StaleEpoch, Overloaded, NotLeaseHolder,
        Unauthenticated
      UnknownShard            no node of the client's addresses hosts the shard
      Unavailable             no usable answer within the attempts allowed
      TooManyInFlight         every lane full for a whole request timeout
      ProducerFull            the producer holds `pending_records_max` (logsvc/producer.py)
"""

from __future__ import annotations

from collections.abc import Sequence

from logsvc.wire import messages as wire


class LogsvcError(Exception):
    """Base of every error the client raises."""


class ServerError(LogsvcError):
    """The server answered with an error; `code` says which."""

    def __init__(self, response: wire.ErrorResponse) -> None:
        super().__init__(f"{response.code.name}: {response.message}")
        self.code = response.code
        self.response = response


class NotLeader(ServerError):
    pass


class Truncated(ServerError):
    @property
    def first_lsn(self) -> int | None:
        return self.response.first_lsn


class StaleEpoch(ServerError):
    pass


class Overloaded(ServerError):
    pass


class NotLeaseHolder(ServerError):
    """The epoch is above the lease's: acquire the lease at that epoch first."""


class Unauthenticated(ServerError):
    pass


class UnknownShard(LogsvcError):
    """Every node of the client's addresses answered UNKNOWN_SHARD within one call: no
    node hosts the shard (a wrong shard id, or one never created), which retrying cannot
    change (issue 20: `logsvc status --shard 7` retried for 16 s). One node's answer alone is
    retried, since membership changes move a shard's replicas between nodes."""

    def __init__(self, shard: int, addresses: Sequence[str]) -> None:
        super().__init__(
            f"shard {shard} is not hosted by any node of the cluster "
            f"({', '.join(addresses)} each answered UNKNOWN_SHARD)"
        )
        self.shard = shard
        self.addresses = tuple(addresses)


class Unavailable(LogsvcError):
    """No node answered usefully within the attempts allowed."""


class TooManyInFlight(LogsvcError):
    """Every lane already has `dedupe_window` appends in flight and none freed up within
    the request timeout: the caller is sending faster than the cluster answers."""


_ERRORS: dict[wire.ErrorCode, type[ServerError]] = {
    wire.ErrorCode.NOT_LEADER: NotLeader,
    wire.ErrorCode.TRUNCATED: Truncated,
    wire.ErrorCode.STALE_EPOCH: StaleEpoch,
    wire.ErrorCode.OVERLOADED: Overloaded,
    wire.ErrorCode.NOT_LEASE_HOLDER: NotLeaseHolder,
    wire.ErrorCode.UNAUTHENTICATED: Unauthenticated,
}
# Answers after which the same request may be sent again (to the same or another node).
# UNKNOWN_SHARD: the client's addresses are the cluster's nodes, and membership changes
# move a shard's replicas between them; the node asked does not (or no longer) host it. Once
# every address has answered it in one call, no node hosts the shard: `UnknownShard`.
_RETRYABLE = {
    wire.ErrorCode.NOT_LEADER,
    wire.ErrorCode.OVERLOADED,
    wire.ErrorCode.OUTCOME_UNKNOWN,
    wire.ErrorCode.UNAVAILABLE,
    wire.ErrorCode.UNKNOWN_SHARD,
}


def _error(response: wire.ErrorResponse) -> ServerError:
    return _ERRORS.get(response.code, ServerError)(response)
