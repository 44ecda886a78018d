"""What every logsvc config file shares: the error type (naming the key), bounded reads of
files that may hold a secret (refused when group or others may read or write them), TOML
error positions, and "host:port" addresses. Used by the node configuration
(`logsvc/config.py`) and the client's (`logsvc/client_config.py`); imports nothing of
logsvc, so a client never loads the server's modules (or pysyncobj) to read its config.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tomllib

KIB = 1024
MIB = 1024 * KIB

EXIT_CONFIG_ERROR = 2

# A config file is a few KiB and a secret file a few dozen bytes; every read is bounded.
CONFIG_FILE_BYTES_MAX = 1 * MIB
SECRET_FILE_BYTES_MAX = 64 * KIB

# Group and others may neither read nor write a file holding a secret: reading leaks it,
# writing lets someone substitute a secret they know.
SECRET_FILE_MODE_FORBIDDEN = stat.S_IRGRP | stat.S_IWGRP | stat.S_IROTH | stat.S_IWOTH

PORT_MAX = 65535

PORT_DIGITS = re.compile(r"[0-9]{1,5}")
_TOML_POSITION = re.compile(r"\s*\(at (line \d+, column \d+|end of document)\)\Z")


class ConfigError(Exception):
    """An invalid configuration (a node's or a client's).

    `key` is the key path (`shards[1].replicas`), or the file's path for a problem with a
    whole file (unreadable, bad TOML, too permissive); `rule` says what is required.
    """

    def __init__(self, key: str, rule: str) -> None:
        super().__init__(f"config error: {key}: {rule}")
        self.key = key
        self.rule = rule


def main_config_error(exc: ConfigError) -> int:
    """For the CLI: print the message (no traceback) to stderr; return the exit code, 2."""
    print(exc, file=sys.stderr)
    return EXIT_CONFIG_ERROR


def read_secret_file(path: str, key: str) -> str:
    """The default `SecretReader`: the file's contents, stripped, from a regular file that
    group and others can neither read nor write."""
    data, mode = read_private_file(path, key, SECRET_FILE_BYTES_MAX, label=path)
    if mode & SECRET_FILE_MODE_FORBIDDEN:
        raise ConfigError(
            key,
            f"{path} is readable or writable by group or others "
            f"(mode {stat.S_IMODE(mode):04o}); run `chmod 600 {path}`",
        )
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(key, f"{path} is not UTF-8 text") from None


def read_private_file(path: str, key: str, bytes_max: int, *, label: str = "") -> tuple[bytes, int]:
    """(contents, st_mode) of a regular file of at most `bytes_max` bytes. The mode comes
    from the open descriptor, so it is the mode of the file actually read."""
    prefix = f"{label}: " if label else ""
    try:
        # O_NONBLOCK: opening a FIFO must not hang the daemon; it is refused just below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(key, f"{prefix}cannot open: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(key, f"{prefix}is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= bytes_max:  # bounded: stops one byte past the limit, or at EOF
            chunk = os.read(fd, bytes_max + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise ConfigError(key, f"{prefix}cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > bytes_max:
        raise ConfigError(key, f"{prefix}is larger than {bytes_max} bytes")
    return data, mode


def toml_error_rule(exc: tomllib.TOMLDecodeError) -> str:
    # Python 3.11's tomllib puts the position at the end of the message only.
    message = str(exc)
    found = _TOML_POSITION.search(message)
    if found is None:
        return f"invalid TOML: {message}"
    return f"invalid TOML at {found.group(1)}: {message[: found.start()]}"


def split_address(text: str) -> tuple[str, int]:
    """ "host:port" or "[v6]:port" -> (host, port); ValueError with the rule."""
    shape = f'must be "host:port" (got {text!r})'
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ValueError(shape)
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ValueError(shape)
        if ":" in host:
            raise ValueError(shape + '; write an IPv6 host in brackets: "[::1]:7101"')
    if not host or not PORT_DIGITS.fullmatch(port_text):
        raise ValueError(shape)
    port = int(port_text)
    if not 1 <= port <= PORT_MAX:
        raise ValueError(f"port must be in 1..{PORT_MAX} (got {port})")
    return host, port
