"""`S3ObjectStore` keeps the port's contract against a real S3-protocol server (moto in
server mode on loopback), types the server's error answers and its absence, and a put cut by
the server's death fails typed and leaves no object.

How: one moto server (tests/support/s3server.py) serves the module; each test gets a fresh
bucket. The contract tests of test_store.py are imported and run here against the S3 store
(all but the directory clash, which S3 does not check: store.py says so). Error answers: a
missing bucket (put, get, list, check_bucket) is `ObjectStoreFailed`; a port where nothing
listens is `ObjectStoreUnavailable` after the bounded retries, in bounded time. Crash: a
second server is SIGKILLed while it receives a 24 MiB put (the test watches the server's read
counter in /proc to kill it mid-body); the put raises `ObjectStoreUnavailable`; the server is
restarted on the same port. moto keeps state in memory, so the restarted server is empty
(bucket included): the test checks exactly that, then that the same store object works again
(put, get, list) once the bucket exists. The error classification is also checked on the
texts pyarrow gives for the AWS errors we do not provoke here (5xx, throttling, timeouts).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from engine.objects import blockfile
from engine.objects.errors import (
    BadObjectName,
    ObjectNotFound,
    ObjectStoreError,
    ObjectStoreFailed,
    ObjectStoreUnavailable,
)
from engine.objects.s3 import S3ObjectStore, _typed_aws_error
from tests.support.s3server import ACCESS_KEY, REGION, SECRET_KEY, MotoServer, free_port
from tests.unit.engine.objects.test_blockfile import SIMPLE, _simple_rows
from tests.unit.engine.objects.test_store import (  # the port's contract, run against S3 here
    test_bad_names_are_refused_before_any_io,
    test_delete_is_idempotent,
    test_empty_object,
    test_list_is_sorted_and_filtered_by_a_string_prefix,
    test_longest_valid_name,
    test_missing_objects_are_not_found,
    test_objects_are_immutable_and_a_retried_put_is_a_no_op,
    test_open_input_reads_parquet_by_random_access,
    test_put_get_size_range,
)

__all__ = [
    "test_bad_names_are_refused_before_any_io",
    "test_delete_is_idempotent",
    "test_empty_object",
    "test_list_is_sorted_and_filtered_by_a_string_prefix",
    "test_longest_valid_name",
    "test_missing_objects_are_not_found",
    "test_objects_are_immutable_and_a_retried_put_is_a_no_op",
    "test_open_input_reads_parquet_by_random_access",
    "test_put_get_size_range",
]

_bucket_counter = iter(range(1_000_000))


def _store(
    server: MotoServer, bucket: str, prefix: str = "engine/t1", **kw: float
) -> S3ObjectStore:
    return S3ObjectStore(
        server.endpoint,
        bucket,
        prefix,
        ACCESS_KEY,
        SECRET_KEY,
        REGION,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def server() -> Iterator[MotoServer]:
    with MotoServer() as running:
        yield running


@pytest.fixture
def store(server: MotoServer) -> S3ObjectStore:
    bucket = f"bucket-{next(_bucket_counter)}"
    server.create_bucket(bucket)
    return _store(server, bucket)


def test_description_and_layout(server: MotoServer, store: S3ObjectStore) -> None:
    assert store.description == f"s3://{store.bucket}/engine/t1"
    store.put("a/b", b"x")
    root = _store(server, store.bucket, prefix="")
    assert [info.name for info in root.list()] == ["engine/t1/a/b"]
    assert root.get("engine/t1/a/b") == b"x"
    with pytest.raises(BadObjectName):
        _store(server, store.bucket, prefix="bad prefix")
    with pytest.raises(ObjectStoreFailed, match="bad bucket"):
        _store(server, "Bad_Bucket")


def test_block_objects_round_trip_through_s3(store: S3ObjectStore) -> None:
    data = _simple_rows(list(range(0, 3000, 3)))
    written = blockfile.write_object(
        store,
        "tables/1/seg.parquet",
        schema=SIMPLE,
        table_id=1,
        level=2,
        data=data,
        block_rows=256,
    )
    meta = blockfile.read_meta(store, "tables/1/seg.parquet")
    assert meta.to_bytes() == written.to_bytes()
    with blockfile.BlockObjectReader(store, "tables/1/seg.parquet") as reader:
        assert reader.read_block(2).equals(data.slice(512, 256))
    assert pq.ParquetFile(store.open_input("tables/1/seg.parquet")).metadata.num_row_groups == 4


def test_a_missing_bucket_is_a_permanent_failure(server: MotoServer) -> None:
    store = _store(server, "no-such-bucket")
    with pytest.raises(ObjectStoreFailed, match="NO_SUCH_BUCKET"):
        store.put("a", b"1")
    for call in (lambda: store.get("a"), lambda: store.size("a"), store.check_bucket):
        with pytest.raises(ObjectStoreFailed, match="bucket does not exist"):
            call()


def test_no_server_is_unavailable_after_bounded_retries() -> None:
    store = S3ObjectStore(f"127.0.0.1:{free_port()}", "bucket", "", ACCESS_KEY, SECRET_KEY, REGION)
    began = time.monotonic()
    for call in (lambda: store.put("a", b"1"), lambda: store.get("a"), store.list):
        with pytest.raises(ObjectStoreUnavailable) as info:
            call()
        assert "NETWORK_CONNECTION" in str(info.value)
    assert time.monotonic() - began < 10


def _read_bytes_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/pid/io")


def test_a_put_cut_by_the_server_dying_fails_typed_and_the_store_works_after_restart() -> None:
    with MotoServer() as server:
        server.create_bucket("crash")
        store = _store(server, "crash")
        store.put("before", b"written before the crash")
        data = bytes(range(256)) * (24 * 4096)  # 24 MiB: seconds of work for moto
        outcome: list[BaseException | None] = []

        def put() -> None:
            try:
                store.put("big", data)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        reading_from = _read_bytes_of(server.pid)
        writer = threading.Thread(target=put)
        writer.start()
        deadline = time.monotonic() + 20
        while _read_bytes_of(server.pid) - reading_from < 2 * 1024 * 1024:
            assert time.monotonic() < deadline, "the server never received the put"
            assert writer.is_alive(), outcome
            time.sleep(0.002)
        server.kill()
        writer.join(30)
        assert not writer.is_alive()
        assert isinstance(outcome[0], ObjectStoreUnavailable), outcome
        # Restarted on the same port: a new moto, empty (its state lived in the old process).
        server.start()
        with pytest.raises(ObjectStoreFailed, match="bucket does not exist"):
            store.get("big")
        server.create_bucket("crash")
        for name in ("big", "before"):
            with pytest.raises(ObjectNotFound):
                store.get(name)
        store.put("big", data)
        assert store.get_range("big", 5_000_000, 10) == data[5_000_000:5_000_010]
        assert [info.name for info in store.list()] == ["big"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "When reading information for key 'k' in bucket 'b': AWS Error NETWORK_CONNECTION "
            "during HeadObject operation: curlCode: 7, Could not connect to server",
            ObjectStoreUnavailable,
        ),
        (
            "When uploading object with key 'k' in bucket 'b': AWS Error SLOW_DOWN during "
            "PutObject operation: Please reduce your request rate.",
            ObjectStoreUnavailable,
        ),
        (
            "AWS Error SERVICE_UNAVAILABLE during GetObject operation: Service Unavailable",
            ObjectStoreUnavailable,
        ),
        (
            "AWS Error UNKNOWN (HTTP status 503) during GetObject operation: ",
            ObjectStoreUnavailable,
        ),
        ("AWS Error INTERNAL_FAILURE during ListObjectsV2 operation", ObjectStoreUnavailable),
        ("curlCode: 28, Timeout was reached", ObjectStoreUnavailable),
        ("curlCode: 60, SSL peer certificate was not OK", ObjectStoreFailed),
        ("AWS Error ACCESS_DENIED during PutObject operation: Access Denied", ObjectStoreFailed),
        ("AWS Error NO_SUCH_BUCKET during PutObject operation", ObjectStoreFailed),
        ("AWS Error NO_SUCH_KEY during GetObject operation", ObjectNotFound),
        ("something pyarrow never said before", ObjectStoreFailed),
    ],
)
def test_error_classification(text: str, expected: type[ObjectStoreError]) -> None:
    error = _typed_aws_error("s3://b", "k", OSError(text))
    assert type(error) is expected
