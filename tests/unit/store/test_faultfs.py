"""Tests of FaultFS (tests/support/faultfs.py), the in-memory disk under the store's crash tests.

What this proves: the double keeps its promises. If it kept unsynced bytes, lost synced
ones, kept a name that was never dir-synced or invented bytes, every storage test built on it
would prove nothing.

How:
* contract tests run one scenario against `OsFileSystem` on a temporary directory and against
  `FaultFS`, so the double answers like the real port (errnos, short reads, POSIX unlink);
* durability tests write, sync and rename, cut the power, and look at what survived;
* a hypothesis property runs random op sequences beside a tiny model and checks that a power
  loss in every mode keeps exactly the durable names, every synced byte, and nothing that was
  never written except garbage (torn) or zeroed pages (zeros) in the unsynced region;
* the rest pins crashes, injected errors, locks, damage helpers and crash-state enumeration.
No threads, no sleeps: randomness comes from seeded `random.Random`s.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logsvc.store.fs import LOCK_FILE_NAME, FileSystem, OsFileSystem, WritableFile
from tests.support.faultfs import (
    FAULT_OPS,
    GARBAGE_BYTES_MAX,
    PAGE_SIZE_BYTES,
    POWER_LOSS_MODES,
    FaultFS,
    FaultOp,
    PowerLossMode,
)

D = "/d"


def _fault_fs_with_dir() -> FaultFS:
    fs = FaultFS()
    fs.makedirs(D)
    return fs


def _write_file(fs: FileSystem, path: str, data: bytes, *, sync: bool) -> WritableFile:
    writer = fs.open_write(path, create=True)
    writer.write(data)
    if sync:
        writer.fdatasync()
    return writer


def _errno_of(call: Callable[[], object]) -> int | None:
    with pytest.raises(OSError) as info:
        call()
    return info.value.errno


# --- Contract: FaultFS answers like OsFileSystem ------------------------------------------------


@pytest.fixture(params=["os", "fault"])
def port(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[FileSystem, str]:
    if request.param == "os":
        return OsFileSystem(), str(tmp_path)
    return _fault_fs_with_dir(), D


def test_written_bytes_are_readable_at_once_and_pread_is_short_at_eof(
    port: tuple[FileSystem, str],
) -> None:
    fs, root = port
    writer = _write_file(fs, f"{root}/f", b"hello", sync=False)
    writer.write(b" world")
    assert writer.size() == 11
    assert fs.read_file(f"{root}/f") == b"hello world"
    assert fs.file_size(f"{root}/f") == 11
    reader = fs.open_read(f"{root}/f")
    assert reader.pread(6, 100) == b"world"
    assert reader.pread(11, 4) == b""
    writer.truncate(5)
    assert fs.read_file(f"{root}/f") == b"hello"
    reader.close()
    writer.close()


def test_create_of_an_existing_name_fails_with_eexist(port: tuple[FileSystem, str]) -> None:
    fs, root = port
    _write_file(fs, f"{root}/f", b"x", sync=False).close()
    assert _errno_of(lambda: fs.open_write(f"{root}/f", create=True)) == errno.EEXIST


def test_missing_paths_fail_with_enoent(port: tuple[FileSystem, str]) -> None:
    fs, root = port
    missing = f"{root}/missing"
    calls: list[Callable[[], object]] = [
        lambda: fs.open_write(missing, create=False),
        lambda: fs.open_write(f"{missing}/f", create=True),
        lambda: fs.open_read(missing),
        lambda: fs.read_file(missing),
        lambda: fs.file_size(missing),
        lambda: fs.unlink(missing),
        lambda: fs.rename(missing, f"{root}/other"),
        lambda: fs.fsync_dir(missing),
        lambda: fs.listdir(missing),
    ]
    assert [_errno_of(call) for call in calls] == [errno.ENOENT] * len(calls)
    assert not fs.exists(missing)


def test_rename_replaces_the_destination(port: tuple[FileSystem, str]) -> None:
    fs, root = port
    _write_file(fs, f"{root}/a", b"A", sync=False).close()
    _write_file(fs, f"{root}/b", b"B", sync=False).close()
    fs.rename(f"{root}/a", f"{root}/b")
    assert fs.read_file(f"{root}/b") == b"A"
    assert not fs.exists(f"{root}/a")


def test_an_unlinked_file_stays_usable_through_open_handles(
    port: tuple[FileSystem, str],
) -> None:
    fs, root = port
    writer = _write_file(fs, f"{root}/f", b"abc", sync=False)
    reader = fs.open_read(f"{root}/f")
    fs.unlink(f"{root}/f")
    writer.write(b"def")
    assert reader.pread(0, 100) == b"abcdef"
    assert not fs.exists(f"{root}/f")
    assert fs.listdir(root) == []


def test_listdir_is_sorted_and_shows_subdirectories_and_the_lock_file(
    port: tuple[FileSystem, str],
) -> None:
    fs, root = port
    fs.makedirs(f"{root}/sub/deeper")
    fs.makedirs(f"{root}/sub")  # idempotent
    for name in ("zz", "aa"):
        _write_file(fs, f"{root}/{name}", b"", sync=False).close()
    fs.lock_dir(root).release()
    assert fs.listdir(root) == sorted(["aa", "sub", "zz", LOCK_FILE_NAME])
    assert fs.listdir(f"{root}/sub") == ["deeper"]


def test_lock_dir_is_exclusive_until_released(port: tuple[FileSystem, str]) -> None:
    fs, root = port
    held = fs.lock_dir(root)
    with pytest.raises(BlockingIOError):
        fs.lock_dir(root)
    held.release()
    fs.lock_dir(root).release()


# --- Power loss: what survives --------------------------------------------------------------


def test_trunc_power_loss_drops_unsynced_bytes_and_keeps_synced_ones() -> None:
    fs = _fault_fs_with_dir()
    writer = _write_file(fs, f"{D}/f", b"synced", sync=True)
    fs.fsync_dir(D)
    writer.write(b"+unsynced")
    assert fs.content(f"{D}/f") == b"synced+unsynced"
    fs.power_loss("trunc", random.Random(0))
    assert fs.content(f"{D}/f") == b"synced"
    assert fs.durable_content(f"{D}/f") == b"synced"


def test_a_synced_file_whose_name_was_never_dir_synced_vanishes() -> None:
    fs = _fault_fs_with_dir()
    _write_file(fs, f"{D}/f", b"data", sync=True)
    assert fs.durable_listdir(D) == []
    fs.power_loss("trunc", random.Random(0))
    assert not fs.exists(f"{D}/f")
    assert fs.listdir(D) == []


def test_a_rename_without_dir_sync_is_undone_and_the_old_destination_restored() -> None:
    fs = _fault_fs_with_dir()
    _write_file(fs, f"{D}/new.tmp", b"new", sync=True)
    _write_file(fs, f"{D}/meta", b"old", sync=True)
    fs.fsync_dir(D)
    fs.rename(f"{D}/new.tmp", f"{D}/meta")
    assert fs.listdir(D) == ["meta"]
    fs.power_loss("trunc", random.Random(0))
    assert fs.listdir(D) == ["meta", "new.tmp"]
    assert fs.content(f"{D}/meta") == b"old"
    assert fs.content(f"{D}/new.tmp") == b"new"


def test_a_rename_with_dir_sync_survives() -> None:
    fs = _fault_fs_with_dir()
    _write_file(fs, f"{D}/new.tmp", b"new", sync=True)
    fs.rename(f"{D}/new.tmp", f"{D}/meta")
    fs.fsync_dir(D)
    fs.power_loss("trunc", random.Random(0))
    assert fs.listdir(D) == ["meta"]
    assert fs.content(f"{D}/meta") == b"new"


def test_an_unlink_without_dir_sync_is_restored_and_with_it_is_final() -> None:
    fs = _fault_fs_with_dir()
    for name in ("final", "restored"):
        _write_file(fs, f"{D}/{name}", name.encode(), sync=True)
    fs.fsync_dir(D)
    fs.unlink(f"{D}/final")
    fs.fsync_dir(D)
    fs.unlink(f"{D}/restored")
    assert fs.listdir(D) == []
    fs.power_loss("trunc", random.Random(0))
    assert fs.listdir(D) == ["restored"]
    assert fs.content(f"{D}/restored") == b"restored"


def _file_after_power_loss(
    durable: bytes, unsynced: bytes, mode: PowerLossMode, seed: int
) -> bytes:
    fs = _fault_fs_with_dir()
    writer = _write_file(fs, f"{D}/f", durable, sync=True)
    fs.fsync_dir(D)
    writer.write(unsynced)
    fs.power_loss(mode, random.Random(seed))
    return fs.content(f"{D}/f")


def test_torn_power_loss_keeps_a_prefix_with_at_most_64_garbage_bytes_at_its_end() -> None:
    durable, unsynced = b"\xaa" * 100, b"\xff" * 1000
    results = [_file_after_power_loss(durable, unsynced, "torn", seed) for seed in range(60)]
    for after in results:
        assert after[:100] == durable
        assert 100 <= len(after) <= 1100
        intact_end = max(100, len(after) - 64)  # the brief's bound, not the module's constant
        assert after[100:intact_end] == unsynced[: intact_end - 100]
    assert len({len(after) for after in results}) > 20
    assert any(after[100:] != unsynced[: len(after) - 100] for after in results)


def test_a_truncate_and_rewrite_since_the_last_sync_either_reached_the_disk_or_not() -> None:
    results: set[bytes] = set()
    for mode in ("torn", "zeros"):
        for seed in range(30):
            fs = _fault_fs_with_dir()
            writer = _write_file(fs, f"{D}/f", b"abcdef", sync=True)
            fs.fsync_dir(D)
            writer.truncate(3)
            writer.write(b"XYZ")
            fs.power_loss(mode, random.Random(seed))
            results.add(fs.content(f"{D}/f"))
    assert b"abcdef" in results
    assert b"abc" in results
    rewritten = results - {b"abcdef"}
    assert all(after.startswith(b"abc") and len(after) <= 6 for after in rewritten)


def test_directories_are_synced_one_at_a_time() -> None:
    fs = _fault_fs_with_dir()
    fs.makedirs("/e")
    _write_file(fs, f"{D}/moved", b"m", sync=True)
    _write_file(fs, "/e/unsynced", b"u", sync=True)
    fs.fsync_dir(D)
    fs.rename(f"{D}/moved", "/e/moved")
    fs.fsync_dir(D)  # the source directory only: the file now has no durable name
    fs.power_loss("trunc", random.Random(0))
    assert fs.listdir(D) == []
    assert fs.listdir("/e") == []


def _page_segments(start: int, end: int) -> list[tuple[int, int]]:
    first = start - start % PAGE_SIZE_BYTES
    return [
        (max(page, start), min(page + PAGE_SIZE_BYTES, end))
        for page in range(first, end, PAGE_SIZE_BYTES)
    ]


def test_zeros_power_loss_zeroes_whole_unsynced_pages_and_never_synced_bytes() -> None:
    durable, unsynced = b"\xaa" * 100, b"\xff" * (3 * PAGE_SIZE_BYTES)
    full_bytes = len(durable) + len(unsynced)
    zeroed_full_length = 0
    for seed in range(40):
        after = _file_after_power_loss(durable, unsynced, "zeros", seed)
        assert after[:100] == durable
        assert 100 <= len(after) <= full_bytes
        segments = [after[lo:hi] for lo, hi in _page_segments(100, len(after))]
        for segment in segments:
            assert set(segment) <= {0xFF} or set(segment) == {0}
        if len(after) == full_bytes and any(set(segment) == {0} for segment in segments):
            zeroed_full_length += 1
    assert zeroed_full_length > 5


def test_power_loss_is_reproducible_from_its_seed() -> None:
    runs = [_file_after_power_loss(b"s" * 10, bytes(range(256)) * 40, "torn", 7) for _ in (1, 2)]
    assert runs[0] == runs[1]


# --- Property: any op sequence, any mode ---------------------------------------------------


NAMES = ("a", "b", "c")

# Up to 6.4 KB per write, so that the zeros mode has whole pages to zero.
_data = st.builds(
    lambda chunk, repeat: chunk * repeat, st.binary(min_size=1, max_size=64), st.integers(1, 100)
)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.sampled_from(NAMES)),
        st.tuples(st.just("write"), st.integers(0, 7), _data),
        st.tuples(st.just("sync"), st.integers(0, 7)),
        st.tuples(st.just("truncate"), st.integers(0, 7), st.integers(0, 100)),
        st.tuples(st.just("rename"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
        st.tuples(st.just("unlink"), st.sampled_from(NAMES)),
        st.tuples(st.just("dirsync")),
    ),
    max_size=40,
)


@dataclass
class _ModelFile:
    handle: WritableFile
    content: bytearray = field(default_factory=bytearray)
    durable: bytes = b""


@dataclass
class _Model:
    """What the durability contract says: per file content and durable content; per name
    the current and durable file."""

    files: list[_ModelFile] = field(default_factory=list)
    current: dict[str, int] = field(default_factory=dict)
    durable: dict[str, int] = field(default_factory=dict)


def _run_file_op(fs: FaultFS, model: _Model, op: tuple[object, ...]) -> None:
    if not model.files:
        return
    assert isinstance(op[1], int)
    file = model.files[op[1] % len(model.files)]
    if op[0] == "write":
        assert isinstance(op[2], bytes)
        file.handle.write(op[2])
        file.content += op[2]
    elif op[0] == "sync":
        file.handle.fdatasync()
        file.durable = bytes(file.content)
    else:
        assert isinstance(op[2], int)
        size_bytes = len(file.content) * op[2] // 100
        file.handle.truncate(size_bytes)
        del file.content[size_bytes:]


def _run_name_op(fs: FaultFS, model: _Model, op: tuple[object, ...]) -> None:
    name = str(op[1])
    if op[0] == "create":
        if name in model.current:
            assert _errno_of(lambda: fs.open_write(f"{D}/{name}", create=True)) == errno.EEXIST
            return
        model.files.append(_ModelFile(fs.open_write(f"{D}/{name}", create=True)))
        model.current[name] = len(model.files) - 1
    elif name not in model.current:
        assert _errno_of(lambda: fs.unlink(f"{D}/{name}")) == errno.ENOENT
    elif op[0] == "rename":
        fs.rename(f"{D}/{name}", f"{D}/{op[2]}")
        model.current[str(op[2])] = model.current.pop(name)
    else:
        fs.unlink(f"{D}/{name}")
        del model.current[name]


def _common_prefix_len(a: bytes, b: bytes) -> int:
    length = 0
    while length < min(len(a), len(b)) and a[length] == b[length]:
        length += 1
    return length


def _assert_plausible(mode: PowerLossMode, durable: bytes, written: bytes, after: bytes) -> None:
    """`after` is a content a power loss may leave for a file with these contents."""
    if mode == "trunc" or after == durable:
        assert after == durable
        return
    start = len(durable) if written.startswith(durable) else _common_prefix_len(durable, written)
    assert start <= len(after) <= len(written)
    assert after[:start] == written[:start]
    if mode == "torn":
        intact_end = max(start, len(after) - GARBAGE_BYTES_MAX)
        assert after[start:intact_end] == written[start:intact_end]
        return
    for lo, hi in _page_segments(start, len(after)):
        assert after[lo:hi] in (written[lo:hi], bytes(hi - lo))


@settings(max_examples=200, deadline=None)
@given(ops=_ops, mode=st.sampled_from(POWER_LOSS_MODES), seed=st.integers(0, 2**32))
def test_power_loss_keeps_durable_names_and_synced_bytes_and_invents_nothing(
    ops: list[tuple[object, ...]], mode: PowerLossMode, seed: int
) -> None:
    fs, model = _fault_fs_with_dir(), _Model()
    for op in ops:
        if op[0] == "dirsync":
            fs.fsync_dir(D)
            model.durable = dict(model.current)
        elif op[0] in ("write", "sync", "truncate"):
            _run_file_op(fs, model, op)
        else:
            _run_name_op(fs, model, op)
    for name, index in model.current.items():
        assert fs.content(f"{D}/{name}") == model.files[index].content
        assert fs.durable_content(f"{D}/{name}") == model.files[index].durable
    fs.power_loss(mode, random.Random(seed))
    assert fs.listdir(D) == sorted(model.durable)
    for name, index in model.durable.items():
        file = model.files[index]
        _assert_plausible(mode, file.durable, bytes(file.content), fs.content(f"{D}/{name}"))


# --- Crashes and handles ----------------------------------------------------------------------


def test_a_crash_keeps_the_page_cache_and_kills_every_old_handle() -> None:
    fs = _fault_fs_with_dir()
    writer = _write_file(fs, f"{D}/f", b"unsynced", sync=False)
    reader = fs.open_read(f"{D}/f")
    generation = fs.generation
    fs.crash()
    assert fs.generation == generation + 1
    assert fs.content(f"{D}/f") == b"unsynced"
    assert fs.listdir(D) == ["f"]
    calls: list[Callable[[], object]] = [
        lambda: writer.write(b"x"),
        lambda: writer.truncate(0),
        writer.fdatasync,
        writer.size,
        lambda: reader.pread(0, 1),
    ]
    assert [_errno_of(call) for call in calls] == [errno.EIO] * len(calls)
    writer.close()
    reader.close()
    restarted = fs.open_write(f"{D}/f", create=False)
    restarted.write(b"+more")
    assert fs.open_read(f"{D}/f").pread(0, 100) == b"unsynced+more"


def test_power_loss_kills_handles_too() -> None:
    fs = _fault_fs_with_dir()
    writer = _write_file(fs, f"{D}/f", b"x", sync=True)
    fs.power_loss("trunc", random.Random(0))
    assert _errno_of(writer.fdatasync) == errno.EIO


def test_a_closed_handle_fails_with_ebadf() -> None:
    fs = _fault_fs_with_dir()
    writer = _write_file(fs, f"{D}/f", b"x", sync=False)
    writer.close()
    assert _errno_of(lambda: writer.write(b"y")) == errno.EBADF


def test_a_crash_frees_locks_and_a_stale_release_keeps_the_new_holder() -> None:
    fs = _fault_fs_with_dir()
    before_crash = fs.lock_dir(D)
    fs.crash()
    after_crash = fs.lock_dir(D)
    before_crash.release()
    with pytest.raises(BlockingIOError):
        fs.lock_dir(D)
    after_crash.release()
    fs.lock_dir(D)


# --- Injected errors --------------------------------------------------------------------------


@pytest.mark.parametrize("op", FAULT_OPS)
def test_every_op_can_be_made_to_fail_once(op: FaultOp) -> None:
    fs = _fault_fs_with_dir()
    writer = _write_file(fs, f"{D}/f", b"abc", sync=False)
    reader = fs.open_read(f"{D}/f")
    calls: dict[str, Callable[[], object]] = {
        "write": lambda: writer.write(b"x"),
        "fdatasync": writer.fdatasync,
        "truncate": lambda: writer.truncate(1),
        "open_write": lambda: fs.open_write(f"{D}/f", create=False),
        "open_read": lambda: fs.open_read(f"{D}/f"),
        "read_file": lambda: fs.read_file(f"{D}/f"),
        "rename": lambda: fs.rename(f"{D}/f", f"{D}/g"),
        "unlink": lambda: fs.unlink(f"{D}/f"),
        "fsync_dir": lambda: fs.fsync_dir(D),
        "pread": lambda: reader.pread(0, 3),
    }
    assert set(calls) == set(FAULT_OPS)
    fs.inject_error(op, errno.EIO)
    assert _errno_of(calls[op]) == errno.EIO
    calls[op]()  # times=1: the next call succeeds


def test_an_injected_error_skips_after_calls_fires_times_and_filters_by_path() -> None:
    fs = _fault_fs_with_dir()
    segment = _write_file(fs, f"{D}/segment-1", b"s", sync=False)
    meta = _write_file(fs, f"{D}/meta", b"m", sync=False)
    fs.inject_error("fdatasync", errno.EIO, path_contains="segment", after=2, times=2)
    outcomes: list[int | None] = []
    for _ in range(5):
        meta.fdatasync()  # never matches, never counts
        try:
            segment.fdatasync()
            outcomes.append(None)
        except OSError as error:
            outcomes.append(error.errno)
    assert outcomes == [None, None, errno.EIO, errno.EIO, None]


def test_an_injected_rename_error_matches_either_path() -> None:
    fs = _fault_fs_with_dir()
    _write_file(fs, f"{D}/a.tmp", b"x", sync=False)
    fs.inject_error("rename", errno.EXDEV, path_contains="final")
    assert _errno_of(lambda: fs.rename(f"{D}/a.tmp", f"{D}/final")) == errno.EXDEV
    assert fs.listdir(D) == ["a.tmp"]


def test_a_failing_write_appends_nothing_unless_partial() -> None:
    fs = _fault_fs_with_dir()
    writer = _write_file(fs, f"{D}/f", b"head", sync=False)
    data = bytes(range(200))
    fs.inject_error("write", errno.ENOSPC)
    assert _errno_of(lambda: writer.write(data)) == errno.ENOSPC
    assert fs.content(f"{D}/f") == b"head"
    lengths = set()
    for _ in range(20):
        fs.inject_error("write", errno.ENOSPC, partial=True)
        before = fs.content(f"{D}/f")
        assert _errno_of(lambda: writer.write(data)) == errno.ENOSPC
        appended = fs.content(f"{D}/f")[len(before) :]
        assert data.startswith(appended)
        assert len(appended) < len(data)
        lengths.add(len(appended))
    assert len(lengths) > 5


def test_a_failed_fdatasync_loses_the_unsynced_bytes_on_disk_even_after_a_retry() -> None:
    # fsyncgate: the pages were marked clean without reaching the disk.
    fs = _fault_fs_with_dir()
    writer = _write_file(fs, f"{D}/f", b"A" * 10, sync=True)
    fs.fsync_dir(D)
    writer.write(b"B" * 10)
    fs.inject_error("fdatasync", errno.EIO)
    assert _errno_of(writer.fdatasync) == errno.EIO
    writer.write(b"C" * 5)
    writer.fdatasync()  # the retry "succeeds"
    assert fs.content(f"{D}/f") == b"A" * 10 + b"B" * 10 + b"C" * 5
    assert fs.durable_content(f"{D}/f") == b"A" * 10 + bytes(10) + b"C" * 5
    fs.power_loss("trunc", random.Random(0))
    assert fs.content(f"{D}/f") == b"A" * 10 + bytes(10) + b"C" * 5


# --- Offline damage and statistics ------------------------------------------------------------


def test_damage_helpers_change_the_disk_and_survive_power_loss() -> None:
    fs = _fault_fs_with_dir()
    _write_file(fs, f"{D}/f", b"\x00" * 8, sync=True)
    fs.fsync_dir(D)
    fs.flip_bit(f"{D}/f", 9)
    fs.set_bytes(f"{D}/f", 6, b"xyz")
    fs.power_loss("trunc", random.Random(0))
    assert fs.content(f"{D}/f") == b"\x00\x02\x00\x00\x00\x00xyz"
    fs.truncate_file(f"{D}/f", 3)
    fs.power_loss("torn", random.Random(0))
    assert fs.content(f"{D}/f") == b"\x00\x02\x00"


def test_stats_count_successful_calls() -> None:
    fs = _fault_fs_with_dir()
    writer = fs.open_write(f"{D}/f", create=True)
    for _ in range(10):
        writer.write(b"12345")
    writer.fdatasync()
    fs.fsync_dir(D)
    stats = fs.stats
    assert (stats.write_count, stats.written_bytes) == (10, 50)
    assert (stats.fdatasync_count, stats.fsync_dir_count) == (1, 1)


# --- Crash-state enumeration ------------------------------------------------------------------


def test_crash_states_cover_each_sync_point_and_torn_variants_of_the_next_write() -> None:
    fs = FaultFS(trace=True)
    fs.makedirs(D)  # ops: 0 mkdir
    writer = _write_file(fs, f"{D}/a", b"x" * 10, sync=True)  # 1 create, 2 write, 3 fdatasync
    fs.fsync_dir(D)  # 4
    writer.write(b"y" * 20)  # 5
    writer.fdatasync()  # 6
    states = list(fs.crash_states(random.Random(1), torn_variants=3))
    # Empty prefix (+3 torn variants of op 2), after op 3 (a sync follows: no torn variant),
    # after op 4 (+3 torn variants of op 5), after op 6.
    assert len(states) == 1 + 3 + 1 + 1 + 3 + 1
    assert not states[0].exists(D)
    # Before the directory sync the name of "a" is not durable, whatever reached its data.
    assert [state.listdir(D) for state in states[1:5]] == [[]] * 4
    assert states[5].content(f"{D}/a") == b"x" * 10
    for torn in states[6:9]:
        after = torn.content(f"{D}/a")
        assert after.startswith(b"x" * 10)
        assert 10 < len(after) <= 30
    assert states[9].content(f"{D}/a") == b"x" * 10 + b"y" * 20
    assert all(state.crash_point for state in states)


def test_crash_states_with_kept_names_persist_unsynced_directory_changes() -> None:
    fs = FaultFS(trace=True)
    fs.makedirs(D)
    writer = _write_file(fs, f"{D}/a", b"x" * 10, sync=True)  # create, write, fdatasync
    fs.rename(f"{D}/a", f"{D}/b")
    writer.fdatasync()
    states = list(fs.crash_states(random.Random(1), 0, names=("revert", "keep")))
    by_label = {state.crash_point: state for state in states}
    last_revert = by_label[max(k for k in by_label if k.endswith("revert"))]
    last_keep = by_label[max(k for k in by_label if k.endswith("keep"))]
    assert last_revert.listdir(D) == []  # the directory was never fsynced
    assert last_keep.listdir(D) == ["b"]  # a journal commit made create + rename durable
    assert last_keep.content(f"{D}/b") == b"x" * 10


def test_power_loss_names_random_keeps_or_reverts_each_change() -> None:
    outcomes = set()
    for seed in range(20):
        fs = _fault_fs_with_dir()
        _write_file(fs, f"{D}/new", b"data", sync=True)
        fs.power_loss("trunc", random.Random(seed), names="random")
        outcomes.add(tuple(name for name in fs.listdir(D) if name == "new"))
    assert outcomes == {(), ("new",)}


def test_crash_states_start_from_the_state_when_tracing_began() -> None:
    fs = _fault_fs_with_dir()
    writer = _write_file(fs, f"{D}/f", b"old", sync=True)
    fs.fsync_dir(D)
    writer.write(b"+new")
    fs.start_trace()
    writer.fdatasync()
    states = list(fs.crash_states(random.Random(0), torn_variants=2))
    assert [state.content(f"{D}/f") for state in states] == [b"old", b"old+new"]


def test_crash_states_replay_writes_to_a_file_unlinked_before_tracing() -> None:
    fs = _fault_fs_with_dir()
    writer = _write_file(fs, f"{D}/f", b"old", sync=True)
    fs.fsync_dir(D)
    fs.unlink(f"{D}/f")  # the name is still durable
    fs.start_trace()
    writer.write(b"+new")
    writer.fdatasync()
    states = list(fs.crash_states(random.Random(0), torn_variants=0))
    assert [state.content(f"{D}/f") for state in states] == [b"old", b"old+new"]


def test_crash_states_are_independent_and_not_tracing() -> None:
    fs = FaultFS(trace=True)
    fs.makedirs(D)
    writer = _write_file(fs, f"{D}/a", b"x", sync=True)
    fs.fsync_dir(D)
    writer.fdatasync()
    first, second = list(fs.crash_states(random.Random(0), torn_variants=0))[-2:]
    first.open_write(f"{D}/a", create=False).write(b"changed")
    assert second.content(f"{D}/a") == b"x"
    assert fs.content(f"{D}/a") == b"x"
    with pytest.raises(AssertionError):
        next(first.crash_states(random.Random(0), torn_variants=0))
