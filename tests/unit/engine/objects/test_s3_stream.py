"""`S3ObjectStore.put_stream` writes an object of any size holding one part at a time, against
a real S3-protocol server (moto in server mode on loopback, as test_s3.py).

How: a 36 MiB object is produced 1 MiB at a time; inside `produce`, after each write, the
Arrow memory pool's allocation (where pyarrow's S3 stream buffers its part) stays under two
parts (`S3_PART_BYTES`), and the Python heap (tracemalloc) under a few MiB, so the whole object
is never held; the object reads back byte for byte. A small object (under one part) is one
PutObject. A `produce` that fails, or a bucket that does not exist, leaves no object under the
name and raises `produce`'s own error or the store's typed one; an existing object of the name
is replaced (a retried task's output).
"""

from __future__ import annotations

import hashlib
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from engine.objects import limits
from engine.objects.errors import ObjectNotFound, ObjectStoreFailed
from engine.objects.s3 import S3ObjectStore
from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server() -> Iterator[MotoServer]:
    with MotoServer() as running:
        running.create_bucket("out")
        yield running


@pytest.fixture
def store(server: MotoServer) -> S3ObjectStore:
    return S3ObjectStore(server.endpoint, "out", "runs", ACCESS_KEY, SECRET_KEY, REGION)


def chunk(index: int) -> bytes:
    return hashlib.sha256(str(index).encode()).digest() * (MiB // 32)


def test_a_large_object_goes_up_a_part_at_a_time(store: S3ObjectStore) -> None:
    chunks = 36
    arrow_peak = 0
    digest = hashlib.sha256()

    def produce(out: Any) -> None:
        nonlocal arrow_peak
        for index in range(chunks):
            data = chunk(index)
            digest.update(data)
            out.write(data)
            arrow_peak = max(arrow_peak, pa.total_allocated_bytes())

    baseline = pa.total_allocated_bytes()
    tracemalloc.start()
    try:
        size = store.put_stream("big.bin", produce)
        _, python_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size == chunks * MiB == store.size("big.bin")
    assert arrow_peak - baseline < 2 * limits.S3_PART_BYTES
    assert python_peak < 8 * MiB  # the chunks come and go: never the whole 36 MiB
    assert hashlib.sha256(store.get("big.bin")).digest() == digest.digest()


def test_a_small_object_and_a_replaced_one(store: S3ObjectStore) -> None:
    assert store.put_stream("small", lambda out: out.write(b"abc")) == 3
    assert store.get("small") == b"abc"
    assert store.put_stream("small", lambda out: out.write(b"de")) == 2  # a retried task
    assert store.get("small") == b"de"


class Boom(Exception):
    pass


@pytest.mark.parametrize("before_failing_bytes", [0, 5, 12 * MiB])
def test_a_failed_produce_leaves_no_object(store: S3ObjectStore, before_failing_bytes: int) -> None:
    def produce(out: Any) -> None:
        written = 0
        while written < before_failing_bytes:
            out.write(chunk(written)[: min(MiB, before_failing_bytes - written)])
            written += MiB
        raise Boom

    with pytest.raises(Boom):
        store.put_stream(f"failed-{before_failing_bytes}", produce)
    with pytest.raises(ObjectNotFound):
        store.size(f"failed-{before_failing_bytes}")


def test_a_missing_bucket_is_typed_and_leaves_nothing(server: MotoServer) -> None:
    missing = S3ObjectStore(server.endpoint, "no-such-out", "", ACCESS_KEY, SECRET_KEY, REGION)
    with pytest.raises(ObjectStoreFailed):
        missing.put_stream("x", lambda out: out.write(b"1" * 100))
