"""A node's log lines: text for a terminal, or one JSON object a line for a log pipeline.

    [node]
    log_level = "info"       # debug | info | warning | error
    log_format = "json"      # text (default) | json

JSON lines (`log_format = "json"`), one object per record, keys in this order:

    {"ts": "2024-05-01T12:00:00.123Z", "level": "warning", "logger": "logsvc.raft",
     "msg": "compacted the journal to raft index 812 (snapshot point)", "node": "n1",
     "shard": 4, "term": 7}

| key    | type   | when    | meaning |
|--------|--------|---------|---------|
| ts     | string | always  | ISO-8601 UTC with milliseconds and `Z` |
| level  | string | always  | debug, info, warning, error or critical |
| logger | string | always  | the Python logger (`logsvc.raft`, `pysyncobj.syncobj`...) |
| msg    | string | always  | the message, arguments applied |
| node   | string | always  | `[node] id` |
| shard  | int    | known   | `extra={"shard": n}` on the call, else the shard bound to the thread |
| term   | int    | known   | `extra={"term": t}` on the call (Raft term at the time of the line) |
| exc    | string | exc set | the formatted traceback (`log.exception`, `exc_info=`) |
| stack  | string | stack   | `stack_info=True` |

Keys are never absent when their column says "always"; "known" keys are left out rather
than written as null. Text lines carry the same facts:

    2024-05-01 12:00:00,123 WARNING node=n1 shard=4 term=7 logsvc.raft: compacted ...

Where the shard comes from: a Raft replica's tick thread calls `bind_shard(shard)` once,
so every line that thread emits (ours, pysyncobj's and the store's) names its shard without
each call passing it. The binding is a `contextvars.ContextVar`: per thread and per
asyncio task, never leaking to another replica's thread.

Secrets: the config's `repr()` already hides the cluster secret and the token, and no code
logs them. The formatters are also given both values and replace any occurrence in a line
with `[redacted]`, so a future `log.info("%s", something_holding_the_secret)` still cannot
write one to a log file (tests/unit/test_logs.py greps the output of a live setup).
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final, Protocol, TextIO


class NodeLogSettings(Protocol):
    """What logging reads of a node's config (logsvc.config.NodeConfig has it): a
    protocol, so that this module, imported by nearly every other, imports no config."""

    @property
    def node_id(self) -> str: ...
    @property
    def log_level(self) -> str: ...
    @property
    def log_format(self) -> str: ...
    @property
    def secret(self) -> str: ...
    @property
    def token(self) -> str: ...


REDACTED: Final = "[redacted]"
# A value shorter than this is not one of our secrets (the config requires >= 16
# characters); replacing it everywhere would mangle ordinary words.
SECRET_CHARS_MIN_REDACTED = 8

_shard: contextvars.ContextVar[int | None] = contextvars.ContextVar("logsvc_shard", default=None)


def bind_shard(shard: int | None) -> None:
    """Name `shard` on every later line of this thread (or asyncio task), until bound to
    another (a Raft scheduler's worker binds each replica's shard for its tick)."""
    _shard.set(shard)


def bound_shard() -> int | None:
    return _shard.get()


def _context_int(record: logging.LogRecord, name: str) -> int | None:
    """`extra={name: ...}` of the call if it is an int, else None."""
    value = record.__dict__.get(name)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _shard_of(record: logging.LogRecord) -> int | None:
    explicit = _context_int(record, "shard")
    return explicit if explicit is not None else _shard.get()


class _Redactor:
    __slots__ = ("_secrets",)

    def __init__(self, secrets: Sequence[str]) -> None:
        # Longest first, so a secret containing another is replaced whole.
        self._secrets = sorted(
            {s for s in secrets if len(s) >= SECRET_CHARS_MIN_REDACTED}, key=len, reverse=True
        )

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record (the schema is in the module docstring)."""

    def __init__(self, node_id: str, secrets: Sequence[str] = ()) -> None:
        super().__init__()
        self._node_id = node_id
        self._redact = _Redactor(secrets)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": _iso_utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": self._redact(record.getMessage()),
            "node": self._node_id,
        }
        shard = _shard_of(record)
        if shard is not None:
            line["shard"] = shard
        term = _context_int(record, "term")
        if term is not None:
            line["term"] = term
        if record.exc_info:
            line["exc"] = self._redact(self.formatException(record.exc_info))
        elif record.exc_text:
            line["exc"] = self._redact(record.exc_text)
        if record.stack_info:
            line["stack"] = self._redact(self.formatStack(record.stack_info))
        # ASCII only: a line must stay writable whatever the locale of stderr is.
        return json.dumps(line, ensure_ascii=True, default=str)


class TextFormatter(logging.Formatter):
    """`ts LEVEL node=n1 [shard=s] [term=t] logger: message`, then any traceback."""

    def __init__(self, node_id: str, secrets: Sequence[str] = ()) -> None:
        super().__init__("%(asctime)s %(levelname)s %(logsvc_context)s%(name)s: %(message)s")
        self._node_id = node_id
        self._redact = _Redactor(secrets)

    def format(self, record: logging.LogRecord) -> str:
        context = f"node={self._node_id} "
        shard = _shard_of(record)
        if shard is not None:
            context += f"shard={shard} "
        term = _context_int(record, "term")
        if term is not None:
            context += f"term={term} "
        record.logsvc_context = context
        return self._redact(super().format(record))


def _iso_utc(created_s: float) -> str:
    stamp = datetime.fromtimestamp(created_s, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.removesuffix("+00:00") + "Z"


def formatter(
    log_format: str, node_id: str, secrets: Sequence[str] = ()
) -> JsonFormatter | TextFormatter:
    assert log_format in ("text", "json"), log_format  # the config loader checked it
    if log_format == "json":
        return JsonFormatter(node_id, secrets)
    return TextFormatter(node_id, secrets)


def configure(
    *,
    node_id: str,
    level: str,
    log_format: str,
    secrets: Sequence[str] = (),
    stream: TextIO | None = None,
) -> logging.Handler:
    """Send every logger's records through one handler on `stream` (stderr by default;
    under systemd that is the journal). Replaces handlers installed earlier (the CLI sets
    up plain warnings before the config is known). Returns the handler."""
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(log_format, node_id, secrets))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler


def configure_for_node(config: NodeLogSettings, stream: TextIO | None = None) -> logging.Handler:
    """The daemon's logging, from a validated node config."""
    return configure(
        node_id=config.node_id,
        level=config.log_level,
        log_format=config.log_format,
        secrets=(config.secret, config.token),
        stream=stream,
    )
