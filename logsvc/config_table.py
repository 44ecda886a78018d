"""The config loader's reading of TOML: `_Table`, one TOML table being read (its key path,
its unknown keys refused with a "did you mean", every value's TOML type checked, a boolean
never an integer), and the checks of "host:port" addresses and hosts read from it. Every
problem is a `ConfigError` naming the dotted key path. Used by the node configuration
(`logsvc/config.py`) and the TN's (`engine/tn/config.py`), which share these rules.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import date, datetime, time

from logsvc.config_files import ConfigError, split_address

_HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


# ---------------------------------------------------------------- addresses and hosts


def _address(table: _Table, name: str) -> str:
    value = table.string(name)
    try:
        host, _ = split_address(value)
    except ValueError as exc:
        raise ConfigError(table.key(name), str(exc)) from None
    problem = _host_problem(host)
    if problem:
        raise ConfigError(table.key(name), problem)
    return value


def _raft_host(table: _Table, name: str) -> str:
    value = table.string(name)
    host = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        if ":" in host:
            raise ConfigError(
                table.key(name),
                f"must be a host without a port (got {value!r}); the Raft port of "
                "shard s is raft_port_base + s",
            ) from None
    problem = _host_problem(host)
    if problem:
        raise ConfigError(table.key(name), problem)
    return host


def _host_problem(host: str) -> str:
    """Why `host` is unusable, or "" if it is fine."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        if _HOSTNAME.fullmatch(host):
            return ""
        return f"{host!r} is not a host name or IP address"
    if ip.is_unspecified:
        # Every address is both where this node listens and where the others (and
        # clients) connect; "any interface" is not something one can connect to.
        return f"must be an address others can connect to, not the wildcard {host}"
    return ""


def _host_identity(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))  # one spelling per IPv6 address
    except ValueError:
        return host.lower()


# ------------------------------------------------------------------------ TOML tables


def _join(path: str, key: str) -> str:
    shown = key if _BARE_KEY.fullmatch(key) else json.dumps(key)
    return f"{path}.{shown}" if path else shown


def _toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime | date | time):
        return "a date/time"
    return type(value).__name__


class _Table:
    """One TOML table being read: knows its key path; rejects unknown keys up front, so a
    typo is reported as a typo and not as the missing key it was meant to be."""

    __slots__ = ("_data", "path")

    def __init__(self, data: Mapping[str, object], path: str, allowed: Sequence[str]) -> None:
        self._data = data
        self.path = path
        unknown = [key for key in data if key not in allowed]
        if unknown:
            rule = "unknown key"
            close = difflib.get_close_matches(unknown[0], allowed, n=1)
            if close:
                rule += f" (did you mean {close[0]!r}?)"
            if len(unknown) > 1:
                rule += "; also unknown: " + ", ".join(self.key(k) for k in unknown[1:])
            rule += "; allowed here: " + ", ".join(allowed)
            raise ConfigError(self.key(unknown[0]), rule)

    def __contains__(self, name: str) -> bool:
        return name in self._data

    def key(self, name: str) -> str:
        return _join(self.path, name)

    def _get(self, name: str) -> object:
        if name not in self._data:
            raise ConfigError(self.key(name), "required key is missing")
        return self._data[name]

    def _wrong_type(self, name: str, expected: str, value: object) -> ConfigError:
        # The value itself is never shown: it might be a secret.
        return ConfigError(self.key(name), f"must be {expected} (got {_toml_type(value)})")

    def string(self, name: str, *, default: str | None = None) -> str:
        if default is not None and name not in self._data:
            return default
        value = self._get(name)
        if not isinstance(value, str):
            raise self._wrong_type(name, "a string", value)
        return value

    def integer(self, name: str) -> int:
        value = self._get(name)
        if not isinstance(value, int) or isinstance(value, bool):  # bool is an int subclass
            raise self._wrong_type(name, "an integer", value)
        return value

    def number(self, name: str) -> float:
        value = self._get(name)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self._wrong_type(name, "a number", value)
        if not math.isfinite(value):  # TOML has nan and inf
            raise ConfigError(self.key(name), f"must be a finite number (got {value})")
        return float(value)

    def strings(self, name: str) -> list[str]:
        value = self._get(name)
        if not isinstance(value, list):
            raise self._wrong_type(name, "an array of strings", value)
        for index, item in enumerate(value):
            if not isinstance(item, str):
                raise ConfigError(
                    f"{self.key(name)}[{index}]", f"must be a string (got {_toml_type(item)})"
                )
        return [str(item) for item in value]

    def table(self, name: str, allowed: Sequence[str]) -> _Table:
        value = self._get(name)
        if not isinstance(value, dict):
            raise self._wrong_type(name, f"a table ([{self.key(name)}])", value)
        return _Table(value, self.key(name), allowed)

    def optional_table(self, name: str, allowed: Sequence[str]) -> _Table | None:
        return self.table(name, allowed) if name in self._data else None

    def tables(self, name: str, allowed: Sequence[str]) -> list[_Table]:
        value = self._get(name)
        shape = f"an array of tables ([[{self.key(name)}]])"
        if not isinstance(value, list):
            raise self._wrong_type(name, shape, value)
        tables: list[_Table] = []
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise ConfigError(
                    f"{self.key(name)}[{index}]", f"must be a table (got {_toml_type(item)})"
                )
            tables.append(_Table(item, f"{self.key(name)}[{index}]", allowed))
        return tables
