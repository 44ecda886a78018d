"""The error codes of the TN protocol, and the exceptions they are on each side.

Why codes that carry the engine's error names (issue 15): a compute node's commit must fail
exactly as a local one would, so the client raises the very exception types the engine
raises (`WriteConflict`, `DuplicateKey` with its table and key, `TxnTooLarge` with its limit,
...), rebuilt from the code and the arguments the server sent (`ErrorReply.args`). The
protocol adds its own few: `Unauthorized`, `BadRequest`, `NotActive` (a standby asked to
commit), `SubscriberDropped`, and on the client side `TNUnavailable` and the engine's
`OutcomeUnknown`.

The tree of what is new here (the engine's own errors are in engine/errors.py)::

    EngineError
    ├── BadInput
    │   └── BadRequest              the request is malformed or over a limit; not retried
    ├── Overloaded
    │   └── SubscriberDropped       a subscriber's queue overflowed: pull, then subscribe again
    ├── Unauthorized                no (or a wrong) token on this connection
    ├── NotActive                   a standby TN was asked to commit: ask the active one
    ├── TNUnavailable               no TN could be reached within the client's bounds, and
    │                               nothing was sent (else: OutcomeUnknown)
    ├── TNInternalError             a bug in the TN (its log has the traceback)
    └── BadReply                    a reply the client cannot decode (a broken TN, or not a
                                    TN at all): the client drops that connection
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum

from engine.errors import (
    AlreadyExists,
    BadInput,
    DuplicateKey,
    EngineClosed,
    EngineError,
    Fenced,
    NotFound,
    Overloaded,
    SchemaError,
    SnapshotUnavailable,
    TxnTooLarge,
    WalFailed,
    WriteConflict,
)
from engine.logtail import LogtailUnavailable


class ErrorCode(IntEnum):
    """`ErrorReply.code`. 0 is reserved and never valid (a zeroed field never decodes).
    Adding a code bumps `limits.PROTOCOL`."""

    UNAUTHORIZED = 1
    BAD_REQUEST = 2
    UNKNOWN_OP = 3
    TOO_LARGE = 4
    NOT_ACTIVE = 5
    OVERLOADED = 6
    SUBSCRIBER_DROPPED = 7
    WRITE_CONFLICT = 8
    DUPLICATE_KEY = 9
    TXN_TOO_LARGE = 10
    NOT_FOUND = 11
    ALREADY_EXISTS = 12
    SCHEMA_ERROR = 13
    BAD_INPUT = 14
    SNAPSHOT_UNAVAILABLE = 15
    LOGTAIL_UNAVAILABLE = 16
    FENCED = 17
    WAL_FAILED = 18
    CLOSED = 19
    INTERNAL = 20


class BadRequest(BadInput):
    """A request the TN (or the client's own encoder) refuses: ill-formed, an unknown op, or
    over a limit. `code` is BAD_REQUEST, UNKNOWN_OP or TOO_LARGE."""

    def __init__(self, reason: str, code: ErrorCode = ErrorCode.BAD_REQUEST) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


class SubscriberDropped(Overloaded):
    """The TN dropped this subscription: its queue of entries to push passed its bound (the
    subscriber read too slowly). Entries after the last one received must be pulled."""

    def __init__(self, size_max: int) -> None:
        super().__init__("subscriber queue", size_max)


class Unauthorized(EngineError):
    """No successful `Authenticate` on this connection, or a wrong token."""


class NotActive(EngineError):
    """This TN is a standby: it serves reads, logtail and subscriptions, not commits."""


class TNUnavailable(EngineError):
    """No TN answered within the client's bounds, and the request was never sent (for a
    commit, its outcome is therefore known: it did not happen)."""


class TNInternalError(EngineError):
    """The TN hit a bug serving the request."""


class BadReply(EngineError):
    """A reply that does not decode, or breaks a rule of FORMAT.md."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- Exceptions to codes (the server) ------------------------------------------------------------

_CODES: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    # Subclasses before their bases.
    (BadRequest, ErrorCode.BAD_REQUEST),  # the code is the instance's own: see code_of
    (SubscriberDropped, ErrorCode.SUBSCRIBER_DROPPED),
    (Overloaded, ErrorCode.OVERLOADED),
    (WriteConflict, ErrorCode.WRITE_CONFLICT),
    (DuplicateKey, ErrorCode.DUPLICATE_KEY),
    (TxnTooLarge, ErrorCode.TXN_TOO_LARGE),
    (NotFound, ErrorCode.NOT_FOUND),
    (AlreadyExists, ErrorCode.ALREADY_EXISTS),
    (SchemaError, ErrorCode.SCHEMA_ERROR),
    (BadInput, ErrorCode.BAD_INPUT),
    (SnapshotUnavailable, ErrorCode.SNAPSHOT_UNAVAILABLE),
    (LogtailUnavailable, ErrorCode.LOGTAIL_UNAVAILABLE),
    (Fenced, ErrorCode.FENCED),
    (WalFailed, ErrorCode.WAL_FAILED),
    (EngineClosed, ErrorCode.CLOSED),
    (NotActive, ErrorCode.NOT_ACTIVE),
    (Unauthorized, ErrorCode.UNAUTHORIZED),
)


def code_of(exc: BaseException) -> ErrorCode | None:
    """The code an operating error travels as; None for anything else (a bug: INTERNAL)."""
    if isinstance(exc, BadRequest):
        return exc.code
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return None


def args_of(exc: BaseException) -> tuple[object, ...]:
    """The constructor arguments that travel with a code (FORMAT.md "Errors"), so the
    client rebuilds the same exception with the same fields."""
    if isinstance(exc, DuplicateKey):
        return (exc.table, exc.key)
    if isinstance(exc, TxnTooLarge):
        return (exc.limit, exc.size, exc.size_max)
    if isinstance(exc, SubscriberDropped):
        return (exc.size_max,)
    if isinstance(exc, Overloaded):
        return (exc.queue, exc.size_max)
    return ()


# --- Codes to exceptions (the client) ------------------------------------------------------------


def _bad_request(code: ErrorCode) -> Callable[[str], BaseException]:
    return lambda message: BadRequest(message, code)


_PLAIN: dict[ErrorCode, Callable[[str], BaseException]] = {
    ErrorCode.UNAUTHORIZED: Unauthorized,
    ErrorCode.BAD_REQUEST: _bad_request(ErrorCode.BAD_REQUEST),
    ErrorCode.UNKNOWN_OP: _bad_request(ErrorCode.UNKNOWN_OP),
    ErrorCode.TOO_LARGE: _bad_request(ErrorCode.TOO_LARGE),
    ErrorCode.NOT_ACTIVE: NotActive,
    ErrorCode.WRITE_CONFLICT: WriteConflict,
    ErrorCode.NOT_FOUND: NotFound,
    ErrorCode.ALREADY_EXISTS: AlreadyExists,
    ErrorCode.SCHEMA_ERROR: SchemaError,
    ErrorCode.BAD_INPUT: BadInput,
    ErrorCode.SNAPSHOT_UNAVAILABLE: SnapshotUnavailable,
    ErrorCode.LOGTAIL_UNAVAILABLE: LogtailUnavailable,
    ErrorCode.FENCED: Fenced,
    ErrorCode.WAL_FAILED: WalFailed,
    ErrorCode.CLOSED: EngineClosed,
    ErrorCode.INTERNAL: TNInternalError,
}

ARGS_SHAPES: dict[ErrorCode, tuple[str, ...]] = {
    ErrorCode.DUPLICATE_KEY: ("str", "key"),
    ErrorCode.TXN_TOO_LARGE: ("str", "int", "int"),
    ErrorCode.OVERLOADED: ("str", "int"),
    ErrorCode.SUBSCRIBER_DROPPED: ("int",),
}
"""The `args` each code carries (every other code: none); the codec checks them."""

assert set(_PLAIN) | set(ARGS_SHAPES) == set(ErrorCode)
assert not set(_PLAIN) & set(ARGS_SHAPES)


def exception_of(code: ErrorCode, message: str, args: tuple[object, ...]) -> BaseException:
    """The exception an `ErrorReply` stands for (its args were checked by the codec)."""
    if code == ErrorCode.DUPLICATE_KEY:
        table, key = args
        assert isinstance(table, str)
        return DuplicateKey(table, key)
    if code == ErrorCode.TXN_TOO_LARGE:
        limit, size, size_max = args
        assert isinstance(limit, str) and isinstance(size, int) and isinstance(size_max, int)
        return TxnTooLarge(limit, size, size_max)
    if code == ErrorCode.OVERLOADED:
        queue, size_max = args
        assert isinstance(queue, str) and isinstance(size_max, int)
        return Overloaded(queue, size_max)
    if code == ErrorCode.SUBSCRIBER_DROPPED:
        (size_max,) = args
        assert isinstance(size_max, int)
        return SubscriberDropped(size_max)
    return _PLAIN[code](message)
