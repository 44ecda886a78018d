"""The object store port: every implementation keeps the contract of engine/objects/store.py,
and LocalDirStore survives a power loss at every step of a put and a delete.

How: the contract tests run the same assertions against `MemoryObjectStore`, `LocalDirStore`
on a real directory (tmp_path, real fsyncs) and `LocalDirStore` over `FaultFS` (the fault
file system of tests/support/). The S3 store runs the same contract against a moto server in
test_s3.py. The crash tests trace a put (and a delete) on FaultFS, replay every prefix of the
trace that ends at a sync, cut the power there (names not yet fsynced undone, or kept, and torn
variants of the unsynced write), reopen the store and check that the object is wholly there or
absent, never partial, that a put that returned is there, and that no temporary file
survives the reopen. Injected ENOSPC, EIO and EACCES become the typed errors, leaving nothing
under the name.
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.objects import limits
from engine.objects.errors import (
    BadObjectName,
    BadObjectRange,
    ObjectExists,
    ObjectNotFound,
    ObjectStoreFailed,
    ObjectStoreFull,
    ObjectStoreUnavailable,
)
from engine.objects.store import (
    TEMP_DIR_NAME,
    LocalDirStore,
    MemoryObjectStore,
    ObjectInfo,
    ObjectStore,
)
from tests.support.faultfs import FaultFS

ROOT = "/objects"


def _memory(tmp_path: Path) -> ObjectStore:
    return MemoryObjectStore()


def _local(tmp_path: Path) -> ObjectStore:
    return LocalDirStore(str(tmp_path / "objects"))


def _faultfs(tmp_path: Path) -> ObjectStore:
    return LocalDirStore(ROOT, FaultFS())


@pytest.fixture(params=[_memory, _local, _faultfs], ids=["memory", "local", "faultfs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    factory: Callable[[Path], ObjectStore] = request.param
    made = factory(tmp_path)
    yield made
    if isinstance(made, LocalDirStore):
        made.close()


# --- The contract -------------------------------------------------------------------------------


def test_put_get_size_range(store: ObjectStore) -> None:
    data = bytes(range(256)) * 40
    store.put("tables/7/blk-1.parquet", data)
    assert store.get("tables/7/blk-1.parquet") == data
    assert store.size("tables/7/blk-1.parquet") == len(data)
    assert store.get_range("tables/7/blk-1.parquet", 300, 17) == data[300:317]
    assert store.get_range("tables/7/blk-1.parquet", len(data) - 5, 5) == data[-5:]
    assert store.get_range("tables/7/blk-1.parquet", len(data), 0) == b""
    with pytest.raises(BadObjectRange) as info:
        store.get_range("tables/7/blk-1.parquet", len(data) - 4, 5)
    assert info.value.size_bytes == len(data)
    with pytest.raises(BadObjectRange):
        store.get_range("tables/7/blk-1.parquet", -1, 2)


def test_empty_object(store: ObjectStore) -> None:
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.size("empty") == 0
    assert store.list() == [ObjectInfo("empty", 0)]


def test_missing_objects_are_not_found(store: ObjectStore) -> None:
    store.put("a/b/c", b"x")
    for name in ["nope", "a/nope", "a/b/c/d", "a/b", "a"]:
        with pytest.raises(ObjectNotFound) as info:
            store.get(name)
        assert info.value.name == name
        with pytest.raises(ObjectNotFound):
            store.size(name)
        with pytest.raises(ObjectNotFound):
            store.get_range(name, 0, 0)
        with pytest.raises(ObjectNotFound):
            store.open_input(name)


def test_objects_are_immutable_and_a_retried_put_is_a_no_op(store: ObjectStore) -> None:
    store.put("x/y", b"first")
    store.put("x/y", b"first")  # the same bytes: a retry, accepted
    with pytest.raises(ObjectExists) as info:
        store.put("x/y", b"other")
    assert info.value.name == "x/y"
    with pytest.raises(ObjectExists):
        store.put("x/y", b"")
    assert store.get("x/y") == b"first"


def test_list_is_sorted_and_filtered_by_a_string_prefix(store: ObjectStore) -> None:
    names = ["b/1", "a-c", "a/b", "a/a/z", "a.x", "ab", "c", "a/bb/1"]
    for index, name in enumerate(names):
        store.put(name, b"x" * index)
    expected = sorted(names)
    assert [info.name for info in store.list()] == expected
    assert store.list("a/b") == [ObjectInfo("a/b", 2), ObjectInfo("a/bb/1", 7)]
    assert [i.name for i in store.list("a/")] == ["a/a/z", "a/b", "a/bb/1"]
    assert [i.name for i in store.list("a")] == [n for n in expected if n.startswith("a")]
    assert store.list("zzz") == []
    assert store.list("a/a/z") == [ObjectInfo("a/a/z", 3)]


def test_delete_is_idempotent(store: ObjectStore) -> None:
    store.put("d/1", b"one")
    store.delete("d/1")
    store.delete("d/1")
    store.delete("never/was")
    with pytest.raises(ObjectNotFound):
        store.get("d/1")
    assert store.list() == []
    store.put("d/1", b"other bytes after the delete")  # a deleted name is free again
    assert store.get("d/1") == b"other bytes after the delete"


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/abs",
        "a//b",
        "a/",
        ".",
        "..",
        "a/../b",
        ".tmp",
        "a/.hidden",
        "sp ace",
        "uni\u00e9",
        "back\\slash",
        "a" * (limits.OBJECT_NAME_BYTES_MAX + 1),
        "s" * (limits.OBJECT_NAME_SEGMENT_BYTES_MAX + 1),
        "/".join(["a"] * (limits.OBJECT_NAME_SEGMENTS_MAX + 1)),
    ],
)
def test_bad_names_are_refused_before_any_io(store: ObjectStore, name: str) -> None:
    for call in (
        lambda: store.put(name, b"x"),
        lambda: store.get(name),
        lambda: store.get_range(name, 0, 0),
        lambda: store.open_input(name),
        lambda: store.size(name),
        lambda: store.delete(name),
    ):
        with pytest.raises(BadObjectName):
            call()


def test_longest_valid_name(store: ObjectStore) -> None:
    segment = "s" * limits.OBJECT_NAME_SEGMENT_BYTES_MAX
    name = f"{segment}/{segment}"
    assert len(name) <= limits.OBJECT_NAME_BYTES_MAX
    store.put(name, b"deep")
    assert store.get(name) == b"deep"


def test_a_name_cannot_be_the_directory_of_another(store: ObjectStore) -> None:
    store.put("a/b", b"1")
    with pytest.raises(BadObjectName):
        store.put("a", b"2")
    with pytest.raises(BadObjectName):
        store.put("a/b/c", b"3")
    assert [i.name for i in store.list()] == ["a/b"]
    store.delete("a")  # a directory, not an object: nothing happens
    assert store.get("a/b") == b"1"


def test_open_input_reads_parquet_by_random_access(store: ObjectStore) -> None:
    table = pa.table({"id": pa.array(range(10_000), pa.int64()), "s": ["v"] * 10_000})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=1000)
    store.put("t.parquet", sink.getvalue().to_pybytes())
    source = store.open_input("t.parquet")
    parquet = pq.ParquetFile(source)
    assert parquet.metadata.num_row_groups == 10
    assert parquet.read_row_group(3, columns=["id"]).column("id").to_pylist() == list(
        range(3000, 4000)
    )
    source.close()


# --- LocalDirStore ------------------------------------------------------------------------------


def temporaries(listdir: Callable[[str], list[str]], root: str) -> list[str]:
    """Temporary files under the root (every store's own directory), locks aside."""
    temp = f"{root}/{TEMP_DIR_NAME}"
    out = []
    for sub in listdir(temp):
        try:
            names = listdir(f"{temp}/{sub}")
        except (NotADirectoryError, FileNotFoundError):
            out.append(sub)  # a loose file
            continue
        out.extend(f"{sub}/{name}" for name in names if name != "LOCK")
    return out


def os_listdir(path: str) -> list[str]:
    return sorted(os.listdir(path))


def test_local_files_are_the_objects_and_sit_where_tools_find_them(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    with LocalDirStore(str(root)) as store:
        store.put("tables/1/a.bin", b"abc")
        assert (root / "tables" / "1" / "a.bin").read_bytes() == b"abc"
        assert store.path_of("tables/1/a.bin") == str(root / "tables" / "1" / "a.bin")
        assert store.description == f"dir:{root}"
        assert temporaries(os_listdir, str(root)) == []


def test_local_store_removes_leftover_temporary_files_at_open(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    dead = root / TEMP_DIR_NAME / ("d" * 32)  # a killed store's directory: LOCK not held
    dead.mkdir(parents=True)
    (dead / "LOCK").write_bytes(b"")
    (dead / "0123abcd").write_bytes(b"half an object")
    (root / TEMP_DIR_NAME / "loose").write_bytes(b"an earlier layout's temporary file")
    with LocalDirStore(str(root)) as store:
        assert temporaries(os_listdir, str(root)) == []
        assert store.list() == []
        assert len(os.listdir(root / TEMP_DIR_NAME)) == 1  # its own; the dead one is gone


def test_local_store_removes_its_temporary_directory_at_close(tmp_path: Path) -> None:
    """Issue 20: every open left `.tmp/<uuid>/` behind, one more per engine open."""
    root = tmp_path / "objects"
    for _ in range(3):
        with LocalDirStore(str(root)) as store:
            store.put("x", b"1")
            assert len(os.listdir(root / TEMP_DIR_NAME)) == 1
    assert os.listdir(root / TEMP_DIR_NAME) == []


def test_writers_share_a_root_each_with_its_own_temporaries(tmp_path: Path) -> None:
    """Two engines may write one directory (a new one fencing an old one through the WAL's
    lease): a second store must not remove the first's temporary files while it lives."""
    root = str(tmp_path / "objects")
    with LocalDirStore(root) as first:
        first.put("x", b"1")
        (mine,) = os.listdir(os.path.join(root, TEMP_DIR_NAME))
        in_flight = os.path.join(root, TEMP_DIR_NAME, mine, "writing")
        with open(in_flight, "wb") as out:
            out.write(b"part of an object")
        with LocalDirStore(root) as second:
            second.put("y", b"2")
            assert first.get("y") == b"2" and second.get("x") == b"1"
            assert os.path.exists(in_flight)  # the first store is alive: untouched
        reader = LocalDirStore(root, read_only=True)
        assert reader.get("x") == b"1"
        with pytest.raises(ObjectStoreFailed, match="read-only"):
            reader.put("z", b"3")
        with pytest.raises(ObjectStoreFailed, match="read-only"):
            reader.delete("x")
        assert os.path.isdir(os.path.dirname(in_flight))  # nor its directory, at close
    LocalDirStore(root).close()  # every store closed: no temporary directory is left
    assert not os.path.exists(in_flight)
    assert os.listdir(os.path.join(root, TEMP_DIR_NAME)) == []


@pytest.mark.parametrize(
    ("op", "err", "expected"),
    [
        ("write", errno.ENOSPC, ObjectStoreFull),
        ("write", errno.EDQUOT, ObjectStoreFull),
        ("fdatasync", errno.EIO, ObjectStoreFailed),
        ("open_write", errno.EACCES, ObjectStoreFailed),
        ("rename", errno.EIO, ObjectStoreFailed),
        ("fsync_dir", errno.EIO, ObjectStoreFailed),
    ],
)
def test_local_io_errors_are_typed_and_leave_no_temporary_file(
    op: str, err: int, expected: type[Exception]
) -> None:
    fs = FaultFS()
    store = LocalDirStore(ROOT, fs)
    fs.inject_error(op, err, path_contains="")  # type: ignore[arg-type]
    with pytest.raises(expected) as info:
        store.put("a/b", b"payload" * 100)
    assert type(info.value) is expected
    assert info.value.name == "a/b"  # type: ignore[attr-defined]
    assert temporaries(fs.listdir, ROOT) == []
    if op != "fsync_dir":  # the rename happened before the directory fsync failed
        with pytest.raises(ObjectNotFound):
            store.get("a/b")
    store.close()


def test_local_read_errors_are_typed() -> None:
    fs = FaultFS()
    store = LocalDirStore(ROOT, fs)
    store.put("a", b"bytes")
    fs.inject_error("read_file", errno.EIO)
    with pytest.raises(ObjectStoreFailed):
        store.get("a")
    fs.inject_error("pread", errno.EIO)
    with pytest.raises(ObjectStoreFailed):
        store.get_range("a", 0, 2)
    assert store.get("a") == b"bytes"


def _crash_states(fs: FaultFS, seed: int) -> Iterator[FaultFS]:
    yield from fs.crash_states(random.Random(seed), torn_variants=3, names=("revert", "keep"))


def test_power_loss_at_every_step_of_a_put_leaves_the_whole_object_or_nothing() -> None:
    fs = FaultFS()
    store = LocalDirStore(ROOT, fs)
    store.put("seg/old", b"o" * 5000)
    fs.start_trace()
    data = bytes(random.Random(1).randbytes(20_000))
    store.put("seg/1/new.parquet", data)
    states = 0
    outcomes = set()
    for state in _crash_states(fs, seed=2):
        states += 1
        reopened = LocalDirStore(ROOT, state)
        assert reopened.get("seg/old") == b"o" * 5000, state.crash_point
        try:
            found = reopened.get("seg/1/new.parquet")
        except ObjectNotFound:
            outcomes.add("absent")
            assert [i.name for i in reopened.list()] == ["seg/old"], state.crash_point
        else:
            outcomes.add("whole")
            assert found == data, state.crash_point
        assert temporaries(state.listdir, ROOT) == [], state.crash_point
        # The reopened store works: the retried put lands (or is the no-op of a landed one).
        reopened.put("seg/1/new.parquet", data)
        assert reopened.get("seg/1/new.parquet") == data
        reopened.close()
    assert states >= 4
    assert outcomes == {"absent", "whole"}
    # After the put returned, a power loss keeps it.
    fs.power_loss("trunc", random.Random(3))
    assert LocalDirStore(ROOT, fs).get("seg/1/new.parquet") == data


def test_power_loss_during_a_delete_leaves_the_object_whole_or_gone() -> None:
    fs = FaultFS()
    store = LocalDirStore(ROOT, fs)
    store.put("a/x", b"x" * 3000)
    fs.start_trace()
    store.delete("a/x")
    outcomes = set()
    for state in _crash_states(fs, seed=4):
        reopened = LocalDirStore(ROOT, state)
        names = [info.name for info in reopened.list()]
        outcomes.add(tuple(names))
        if names:
            assert reopened.get("a/x") == b"x" * 3000, state.crash_point
        reopened.close()
    assert outcomes == {(), ("a/x",)}


def test_a_put_interrupted_by_a_crash_is_invisible_and_cleaned_at_reopen() -> None:
    fs = FaultFS()
    store = LocalDirStore(ROOT, fs)
    fs.inject_error("rename", errno.EIO)  # stands for the process dying before its rename
    fs.inject_error("unlink", errno.EIO)  # ... and so never removing its temporary file
    with pytest.raises(ObjectStoreFailed):
        store.put("n", b"data")
    assert len(temporaries(fs.listdir, ROOT)) == 1  # the orphan
    fs.crash()
    reopened = LocalDirStore(ROOT, fs)
    assert temporaries(fs.listdir, ROOT) == []
    with pytest.raises(ObjectNotFound):
        reopened.get("n")


# --- MemoryObjectStore's faults -----------------------------------------------------------------


def test_memory_store_fails_the_next_puts_and_leaves_nothing() -> None:
    store = MemoryObjectStore()
    store.fail_next("put", 2)
    for _ in range(2):
        with pytest.raises(ObjectStoreUnavailable):
            store.put("a", b"1")
        assert store.names() == []
    store.put("a", b"1")
    assert store.get("a") == b"1"


def test_memory_store_ambiguous_put_landed_and_its_retry_is_a_no_op() -> None:
    store = MemoryObjectStore()
    store.fail_next("put", after_effect=True)
    with pytest.raises(ObjectStoreUnavailable):
        store.put("a", b"1")
    assert store.get("a") == b"1"
    store.put("a", b"1")


def test_memory_store_fails_gets_lists_and_deletes_on_demand() -> None:
    store = MemoryObjectStore()
    store.put("a", b"123")
    store.fail_next("get", 3, error=ObjectStoreFailed)
    for call in (
        lambda: store.get("a"),
        lambda: store.get_range("a", 0, 1),
        lambda: store.open_input("a"),
    ):
        with pytest.raises(ObjectStoreFailed):
            call()
    store.fail_next("list")
    with pytest.raises(ObjectStoreUnavailable):
        store.list()
    store.fail_next("delete")
    with pytest.raises(ObjectStoreUnavailable):
        store.delete("a")
    assert store.get("a") == b"123"
    store.fail_next("size")
    store.crash()  # a restart forgets pending faults
    assert store.size("a") == 3
