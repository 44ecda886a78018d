"""The client configuration file (`client.toml`): where the nodes' data planes (and admin
APIs) are, and the token. Read by `logsvc.client.connect("client.toml")` and the CLI.
Imports only `logsvc.config_files`: a client program does not load the node's modules.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field

from logsvc.config_files import (
    CONFIG_FILE_BYTES_MAX,
    SECRET_FILE_MODE_FORBIDDEN,
    ConfigError,
    read_private_file,
    read_secret_file,
    split_address,
    toml_error_rule,
)


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """What `logsvc append/read/tail/truncate/status` need: where the nodes' data planes
    are and the token. `logsvc dev-cluster up` writes one as DIR/client.toml:

        addresses = ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]
        admin_addresses = ["127.0.0.1:7201", "127.0.0.1:7202", "127.0.0.1:7203"]
        token_file = "token"          # or token = "..." (then the file must be mode 600)

    `addresses` (required): "host:port" of data planes; the client finds the leaders from
    any of them. `admin_addresses` (optional, empty when absent): "host:port" of admin
    APIs, for `logsvc status` without `--shard` (the cluster table); it asks them in
    order until one answers, and `--admin HOST:PORT` overrides them. The token is the
    nodes' `token`: it opens both the data plane and the admin API.
    """

    source: str
    addresses: tuple[str, ...]
    token: str = field(repr=False)
    admin_addresses: tuple[str, ...] = ()


def load_client_config(path: str) -> ClientConfig:
    data_bytes, mode = read_private_file(path, path, CONFIG_FILE_BYTES_MAX)
    try:
        document = tomllib.loads(data_bytes.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(path, "is not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, toml_error_rule(exc)) from None
    unknown = sorted(set(document) - {"addresses", "admin_addresses", "token", "token_file"})
    if unknown:
        raise ConfigError(
            unknown[0], "unknown key (expected addresses, admin_addresses, token or token_file)"
        )
    addresses = _client_addresses(document.get("addresses"), "addresses")
    admin_addresses: tuple[str, ...] = ()
    if "admin_addresses" in document:
        admin_addresses = _client_addresses(document["admin_addresses"], "admin_addresses")
    base_dir = os.path.dirname(os.path.abspath(path))
    if ("token" in document) == ("token_file" in document):
        raise ConfigError("token", "give exactly one of token and token_file")
    if "token" in document:
        token = document["token"]
        if mode & SECRET_FILE_MODE_FORBIDDEN:
            raise ConfigError(
                path, f"holds token but is readable by group or others; run `chmod 600 {path}`"
            )
    else:
        token_file = document["token_file"]
        if not isinstance(token_file, str):
            raise ConfigError("token_file", "must be a path string")
        token = read_secret_file(os.path.join(base_dir, token_file), "token_file")
    if not isinstance(token, str) or not token:
        raise ConfigError("token", "must be a non-empty string")
    return ClientConfig(
        source=path, addresses=addresses, token=token, admin_addresses=admin_addresses
    )


def _client_addresses(value: object, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(key, 'must be a non-empty list of "host:port" strings')
    return tuple(client_address(item, f"{key}[{position}]") for position, item in enumerate(value))


def client_address(value: object, key: str) -> str:
    """A "host:port" (or "[v6]:port") a client connects to; else a ConfigError naming
    `key` (for the CLI too: `logsvc status --admin`)."""
    if not isinstance(value, str):
        raise ConfigError(key, 'must be a "host:port" string')
    try:
        split_address(value)
    except ValueError as exc:
        raise ConfigError(key, str(exc)) from None
    return value
