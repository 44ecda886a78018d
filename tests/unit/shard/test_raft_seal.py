"""The Raft port's message seal (logsvc/shard/raft_seal.py, FORMAT.md "Raft transport
seal"): the golden vector, derived again from the spec with the primitives alone; messages
open only under the same secret and unchanged; counters order a connection's messages; the
receiver's key cache is bounded; a replica with another secret never joins its group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

from logsvc.shard import raft_seal
from logsvc.shard.raft_seal import MessageSealer, SealBroken

from .raft_harness import Cluster, wait_until

GOLDEN = Path(__file__).parent / "golden" / "raft_seal_v2.hex"
GOLDEN_SECRET = "golden-cluster-secret-1"
GOLDEN_SALT = bytes(range(16))
GOLDEN_MESSAGE = b"logsvc raft seal golden vector"
SECRET = "a-cluster-secret-of-some-length"


def test_the_golden_vector_is_what_format_md_describes() -> None:
    golden = bytes.fromhex(GOLDEN.read_text())
    sealer = MessageSealer(GOLDEN_SECRET, sender_salt=GOLDEN_SALT)
    assert sealer.encrypt_at_time(GOLDEN_MESSAGE) == golden
    # The same bytes from FORMAT.md's recipe, with the primitives alone.
    master = PBKDF2HMAC(
        algorithm=hashes.SHA256(), length=32, salt=b"logsvc raft seal v2 master", iterations=100_000
    ).derive(GOLDEN_SECRET.encode())
    key = HKDF(
        algorithm=hashes.SHA256(),
        length=32,
        salt=GOLDEN_SALT,
        info=b"logsvc raft seal v2 sender key",
    ).derive(master)
    header = bytes([2]) + GOLDEN_SALT + (1).to_bytes(8, "big")
    nonce = bytes(4) + (1).to_bytes(8, "big")
    assert header + AESGCM(key).encrypt(nonce, GOLDEN_MESSAGE, header) == golden
    assert MessageSealer(GOLDEN_SECRET).decrypt(golden) == GOLDEN_MESSAGE


def test_a_message_opens_under_the_same_secret_and_hides_its_content() -> None:
    sender, receiver = MessageSealer(SECRET), MessageSealer(SECRET)
    message = os.urandom(100) + b"append_entries" * 100
    sealed = sender.encrypt_at_time(message, 12345)
    assert b"append_entries" not in sealed
    assert receiver.decrypt(sealed) == message
    assert sender.decrypt(sealed) == message  # its own messages too (one key per salt)


def test_another_secret_is_refused() -> None:
    sealed = MessageSealer(SECRET).encrypt_at_time(b"vote for me")
    with pytest.raises(SealBroken, match="fails authentication"):
        MessageSealer(SECRET + "x").decrypt(sealed)


def test_a_flip_of_any_byte_is_refused() -> None:
    sealed = MessageSealer(SECRET).encrypt_at_time(b"entries" * 3)
    receiver = MessageSealer(SECRET)
    for position in range(len(sealed)):
        damaged = bytearray(sealed)
        damaged[position] ^= 0x40
        with pytest.raises(SealBroken):
            receiver.decrypt(bytes(damaged))
    assert receiver.decrypt(sealed) == b"entries" * 3  # and the intact one still opens


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "shorter than a seal"),
        (bytes(40), "shorter than a seal"),
        (Fernet(Fernet.generate_key()).encrypt(b"x" * 30), "earlier build's Fernet"),
    ],
    ids=["empty", "short", "fernet"],
)
def test_what_is_not_a_seal_is_refused_by_name(data: bytes, match: str) -> None:
    receiver = MessageSealer(SECRET)
    with pytest.raises(SealBroken, match=match):
        receiver.extract_timestamp(data)
    with pytest.raises(SealBroken, match=match):
        receiver.decrypt(data)


def test_counters_increase_message_by_message_and_are_authenticated() -> None:
    sender, receiver = MessageSealer(SECRET), MessageSealer(SECRET)
    sealed = [sender.encrypt_at_time(b"m%d" % i, 7) for i in range(5)]
    assert [receiver.extract_timestamp(s) for s in sealed] == [1, 2, 3, 4, 5]
    # A counter moved forward (to pass pysyncobj's "not older than the last" check) no
    # longer opens: the header is authenticated.
    forged = bytearray(sealed[0])
    forged[17 + 7] = 9  # the counter's last byte
    assert receiver.extract_timestamp(bytes(forged)) == 9
    with pytest.raises(SealBroken):
        receiver.decrypt(bytes(forged))


def test_the_receivers_sender_keys_are_bounded() -> None:
    receiver = MessageSealer(SECRET)
    senders = [MessageSealer(SECRET) for _ in range(raft_seal.RECEIVE_KEYS_MAX + 10)]
    for sender in senders:
        assert receiver.decrypt(sender.encrypt_at_time(b"hello")) == b"hello"
    assert len(receiver._opening) == raft_seal.RECEIVE_KEYS_MAX
    # The first sender's key was evicted; its next message still opens (derived again).
    assert receiver.decrypt(senders[0].encrypt_at_time(b"again")) == b"again"


def test_a_replica_with_another_secret_never_joins(tmp_path: Path) -> None:
    cluster = Cluster(str(tmp_path))
    odd = cluster.replicas[2]
    try:
        cluster.start(cluster.replicas[0])
        cluster.start(cluster.replicas[1])
        cluster.start(odd, secret="another-cluster-secret")
        leader = cluster.leader()
        assert leader is not odd
        acknowledged = cluster.propose([b"\x00one", b"\x00two"])
        assert set(acknowledged) == {b"\x00one", b"\x00two"}
        wait_until(
            lambda: all(
                r.handler.commands() == [b"\x00one", b"\x00two"] for r in cluster.replicas[:2]
            ),
            "both replicas with the secret apply",
        )
        assert odd.node is not None
        assert not odd.node.is_leader
        assert odd.handler.commands() == []
    finally:
        cluster.close()
