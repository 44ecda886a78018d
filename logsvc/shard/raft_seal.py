"""Sealing of the messages replicas exchange on the Raft port: AES-256-GCM, a key per sender.

pysyncobj pickles its messages, so the Raft port must only ever accept messages from
holders of the cluster secret (ARCHITECTURE.md §9). pysyncobj's own answer, Fernet (AES-CBC,
HMAC-SHA256 and base64 over every message), costs 76 us to seal and 68 us to open a 26 KB
AppendEntries: once per follower per entry on the leader's Raft thread, which is the hot
path of every append. AES-GCM seals the same message in about 2 us with the same guarantees
(secrecy and integrity under the secret). Decision record: docs/decisions/0003-raft-seal.md;
byte layout and golden vector: FORMAT.md beside this file ("Raft transport seal").

Keys. The cluster secret is stretched once per process (PBKDF2-HMAC-SHA256, 100,000
iterations, as pysyncobj did: a secret is at least 16 characters but may be a passphrase)
into a master key. Each sealer (one per Raft group per process) picks a random 16-byte
sender salt and seals with `HKDF(master, salt)`; the salt travels in every message, so a
receiver derives the same key (and keeps it, bounded). Nonces are the sender's message
counter: unique under its key, so GCM's one rule, never two messages under the same key
and nonce, holds by construction, not by chance (random 96-bit nonces under one key shared
by every node would wear out in hours at a busy cluster's message rate).

The counter doubles as what pysyncobj calls the message timestamp: each connection refuses
a message whose counter is below the last it accepted, so a message cannot be replayed
after a later one (pysyncobj's Fernet timestamps had one-second granularity).

Used from the Raft tick thread of its group only (every connection of a group is served
there); not thread-safe beyond that.
"""

from __future__ import annotations

import functools
import logging
import os
import struct
import time
from collections import OrderedDict
from typing import NoReturn

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

log = logging.getLogger("logsvc.raft")

SEAL_VERSION = 2  # byte 0. Fernet tokens (pysyncobj's sealing, our builds before) start "g".
# version u8 | sender salt 16 bytes | counter u64, big-endian (the nonce's last 8 bytes).
SEAL_HEADER = struct.Struct(">B16sQ")
SENDER_SALT_BYTES = 16
TAG_BYTES = 16  # GCM's authentication tag, after the ciphertext
COUNTER_MAX = 2**64 - 1

# PBKDF2 over the secret: fixed salt (the secret is the cluster's, not a user's), the
# iteration count pysyncobj used; about 50 ms once per process and secret.
MASTER_SALT = b"logsvc raft seal v2 master"
MASTER_ITERATIONS = 100_000
SENDER_KEY_INFO = b"logsvc raft seal v2 sender key"

# Sender keys a receiver keeps: one per peer group process (a restarted peer picks a new
# salt). A group has a few peers; 64 leaves room for restarts and bounds what a stream of
# forged salts can make it hold (each costs it one HKDF, about 10 us, and a dropped
# connection).
RECEIVE_KEYS_MAX = 64
# A peer with another secret (or damaged bytes) is refused on every connection attempt:
# said once per this many seconds per group, not once per attempt.
REFUSAL_LOG_INTERVAL_S = 10.0


class SealBroken(ValueError):
    """A message that is not sealed with the cluster secret in this format (another secret,
    an earlier build's Fernet token, damage). pysyncobj drops the connection."""


@functools.lru_cache(maxsize=4)
def _master_key(secret: str) -> bytes:
    kdf = PBKDF2HMAC(
        algorithm=hashes.SHA256(), length=32, salt=MASTER_SALT, iterations=MASTER_ITERATIONS
    )
    return kdf.derive(secret.encode("utf-8"))


def _sender_key(master: bytes, sender_salt: bytes) -> AESGCM:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=sender_salt, info=SENDER_KEY_INFO)
    return AESGCM(hkdf.derive(master))


def _nonce(counter: int) -> bytes:
    return b"\0\0\0\0" + counter.to_bytes(8, "big")


class MessageSealer:
    """What pysyncobj's connections call their `encryptor`: `encrypt_at_time`,
    `extract_timestamp`, `decrypt` (pysyncobj 0.3.17's names)."""

    def __init__(self, secret: str, sender_salt: bytes | None = None) -> None:
        """`sender_salt`: tests only (golden vectors); otherwise random."""
        assert secret, "the cluster secret is mandatory"
        self._master = _master_key(secret)
        self._salt = sender_salt if sender_salt is not None else os.urandom(SENDER_SALT_BYTES)
        assert len(self._salt) == SENDER_SALT_BYTES
        self._sealing = _sender_key(self._master, self._salt)
        self._counter = 0
        self._opening: OrderedDict[bytes, AESGCM] = OrderedDict()
        self._refusal_logged_at = -REFUSAL_LOG_INTERVAL_S

    def encrypt_at_time(self, data: bytes, current_time: int = 0) -> bytes:
        """Seal `data` (pysyncobj passes the time; the counter stands in for it)."""
        self._counter += 1
        counter = self._counter
        assert counter <= COUNTER_MAX, "2**64 messages from one sealer"
        header = SEAL_HEADER.pack(SEAL_VERSION, self._salt, counter)
        return header + self._sealing.encrypt(_nonce(counter), data, header)

    def extract_timestamp(self, data: bytes) -> int:
        """The sender's counter, unauthenticated: pysyncobj compares it with the last one on
        the connection, then calls `decrypt`, which authenticates it (it is in the AAD)."""
        return self._parse(data)[1]

    def decrypt(self, data: bytes) -> bytes:
        salt, counter = self._parse(data)
        opening = self._opening.get(salt)
        if opening is None:
            opening = _sender_key(self._master, salt)
            self._opening[salt] = opening
            if len(self._opening) > RECEIVE_KEYS_MAX:
                self._opening.popitem(last=False)  # the least recently seen sender
        else:
            self._opening.move_to_end(salt)
        header_bytes = SEAL_HEADER.size
        try:
            return opening.decrypt(
                _nonce(counter), memoryview(data)[header_bytes:], data[:header_bytes]
            )
        except InvalidTag:
            self._refused("it fails authentication (another cluster secret, or damaged)")

    def _parse(self, data: bytes) -> tuple[bytes, int]:
        if len(data) < SEAL_HEADER.size + TAG_BYTES:
            self._refused(f"it is {len(data)} bytes, shorter than a seal")
        version, salt, counter = SEAL_HEADER.unpack_from(data)
        if version != SEAL_VERSION:
            self._refused(
                f"its seal version is {version} (an earlier build's Fernet, "
                f"or not a logsvc node?), not {SEAL_VERSION}"
            )
        return salt, counter

    def _refused(self, why: str) -> NoReturn:
        now = time.monotonic()
        if now - self._refusal_logged_at >= REFUSAL_LOG_INTERVAL_S:
            self._refusal_logged_at = now
            log.warning("a Raft message was refused and its connection dropped: %s", why)
        raise SealBroken(why)
