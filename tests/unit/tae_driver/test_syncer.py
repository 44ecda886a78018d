"""The file backend's syncer thread and the driver's direct completion (issue 21, target 2).

What it proves, with a real thread and no sleeps (conditions are awaited, with deadlines):

* an append through the driver over the file backend costs two loop turns (the pump, and
  the one in which the syncer hands the group back); the `to_thread` path it replaces took
  six, counted the same way;
* the syncer's queue is bounded: with a group stuck in its write, `items_max` more wait and
  the next `put` raises `Overloaded`; they all complete once the write returns;
* after a failed write (fsyncgate) `write_group` is never called again: every later group is
  handed back with that error, unwritten;
* an idle thread exits, and the next `put` starts a new one;
* an old (version 2) directory opens, is read, and the next appends go to a new
  preallocated version 3 segment.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import deque
from pathlib import Path

import pytest

from tae_driver import limits, open_driver
from tae_driver.backends import segment
from tae_driver.backends.file import FileBackend
from tae_driver.backends.segment import FrameType
from tae_driver.backends.syncer import GroupSyncer
from tae_driver.errors import Overloaded
from tae_driver.replay import ReplayDecision, ReplayMode

WAIT_S_MAX = 30.0


class CountingLoop(asyncio.SelectorEventLoop):
    turns = 0

    def _run_once(self) -> None:
        self.turns += 1
        super()._run_once()  # type: ignore[misc]


def test_an_append_through_the_driver_takes_two_loop_turns(tmp_path: Path) -> None:
    appends = 200
    loop = CountingLoop()

    async def scenario() -> int:
        backend = await FileBackend.open(str(tmp_path))
        driver = open_driver(backend)
        await driver.replay(lambda dsn, entry: ReplayDecision.APPLY, ReplayMode.FOR_WRITE)
        await driver.append(b"warm up")
        before = loop.turns
        for index in range(appends):
            assert await driver.append(b"entry %d" % index) == index + 2
        turns = loop.turns - before
        await driver.close()
        await backend.close()
        return turns

    try:
        turns = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert turns <= 2 * appends + 2, turns / appends


async def wait_for(condition: object) -> None:
    assert callable(condition)
    deadline = time.monotonic() + WAIT_S_MAX
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def make_syncer(
    write_group: object, done: list[tuple[list[int], object, object]], **kwargs: object
) -> GroupSyncer[int, int]:
    assert callable(write_group)

    def on_done(group: list[int], result: int | None, error: BaseException | None) -> None:
        done.append((group, result, error))

    def take(queue: deque[int]) -> list[int]:
        group = list(queue)
        queue.clear()
        return group

    options: dict[str, object] = {"items_max": 4, "idle_exit_s": 5.0, **kwargs}
    return GroupSyncer(
        asyncio.get_running_loop(),
        name="test syncer",
        write_group=write_group,
        on_done=on_done,
        take=take,
        items_max=int(str(options["items_max"])),
        idle_exit_s=float(str(options["idle_exit_s"])),
    )


def test_the_queue_is_bounded_while_a_write_is_stuck() -> None:
    async def scenario() -> None:
        release = threading.Event()
        writing = threading.Event()
        written: list[list[int]] = []

        def write_group(group: list[int]) -> int:
            writing.set()
            assert release.wait(WAIT_S_MAX)
            written.append(group)
            return len(group)

        done: list[tuple[list[int], object, object]] = []
        syncer = make_syncer(write_group, done)
        syncer.put(0)
        await wait_for(writing.is_set)  # the thread holds group [0] in its write
        for item in range(1, 5):
            syncer.put(item)
        with pytest.raises(Overloaded) as info:
            syncer.put(5)
        assert info.value.size_max == 4
        assert syncer.queued() == 4
        release.set()
        await wait_for(lambda: sum(len(group) for group, _, _ in done) == 5)
        assert written == [[0], [1, 2, 3, 4]]  # the waiting ones went as one group
        assert [(result, error) for _, result, error in done] == [(1, None), (4, None)]
        thread = syncer.stop()
        assert thread is not None
        await asyncio.to_thread(thread.join, WAIT_S_MAX)
        assert not thread.is_alive()

    asyncio.run(scenario())


def test_after_a_failed_write_nothing_is_written_again() -> None:
    async def scenario() -> None:
        calls: list[list[int]] = []
        gate = threading.Event()

        def write_group(group: list[int]) -> int:
            calls.append(group)
            assert gate.wait(WAIT_S_MAX)
            raise OSError(5, "EIO on fsync")

        done: list[tuple[list[int], object, object]] = []
        syncer = make_syncer(write_group, done)
        syncer.put(1)
        await wait_for(lambda: len(calls) == 1)
        syncer.put(2)
        gate.set()
        await wait_for(lambda: len(done) == 2)  # [1] failed, then [2] handed back unwritten
        syncer.put(3)
        await wait_for(lambda: len(done) == 3)
        assert calls == [[1]]  # groups [2] and [3] were never written
        errors = [error for _, _, error in done]
        assert all(isinstance(error, OSError) for error in errors)
        assert errors[0] is errors[1] is errors[2]
        assert [group for group, _, _ in done] == [[1], [2], [3]]

    asyncio.run(scenario())


def test_an_idle_thread_exits_and_the_next_put_starts_one() -> None:
    async def scenario() -> None:
        done: list[tuple[list[int], object, object]] = []
        syncer = make_syncer(lambda group: len(group), done, idle_exit_s=0.05)
        syncer.put(1)
        await wait_for(lambda: len(done) == 1)
        await wait_for(lambda: not syncer.running())
        assert syncer.threads_started == 1
        syncer.put(2)
        await wait_for(lambda: len(done) == 2)
        assert syncer.threads_started == 2
        assert [group for group, _, _ in done] == [[1], [2]]

    asyncio.run(scenario())


def test_a_version_2_directory_opens_and_appends_go_to_a_preallocated_v3_segment(
    tmp_path: Path,
) -> None:
    data = bytearray(segment.encode_segment_header(1, version=2))
    for lsn in range(1, 6):
        data += segment.encode_frame(FrameType.RECORD, lsn, b"old %d" % lsn, durable_lsn=lsn - 1)
    old = tmp_path / segment.segment_file_name(1)
    old.write_bytes(bytes(data))

    async def scenario() -> None:
        backend = await FileBackend.open(str(tmp_path))
        assert await backend.latest() == 5
        assert await backend.append(b"new 6") == 6
        await backend.close()
        again = await FileBackend.open(str(tmp_path))
        records, _ = await again.read(1, 1 << 20)
        assert [r.payload for r in records] == [b"old %d" % i for i in range(1, 6)] + [b"new 6"]
        await again.close()

    asyncio.run(scenario())
    assert old.read_bytes() == bytes(data)  # never appended to
    new = tmp_path / segment.segment_file_name(6)
    content = new.read_bytes()
    assert segment.decode_segment_header(content, "new").version == segment.SEGMENT_VERSION == 3
    assert len(content) == limits.FILE_SEGMENT_HEADER_BYTES + limits.FILE_PREALLOCATE_BYTES_DEFAULT
    scan = segment.scan_segment(content, "new", newest=True)
    assert (scan.last_lsn, scan.torn_offset) == (6, None)
    assert os.path.getsize(old) == len(data)


def test_a_full_queue_refuses_appends_not_the_truncate_frame(tmp_path: Path) -> None:
    """`FILE_PENDING_APPENDS_MAX` appends waiting behind a stuck fsync: the next append gets
    `Overloaded` at once (its LSN is not consumed), a truncate still goes through, and every
    accepted append completes, in order, once the disk answers."""
    armed = threading.Event()
    release = threading.Event()
    stuck = threading.Event()

    def fsync(fd: int) -> None:
        if armed.is_set():
            stuck.set()
            assert release.wait(WAIT_S_MAX)
        os.fdatasync(fd)

    async def scenario() -> None:
        backend = await FileBackend.open(str(tmp_path), fsync=fsync)
        assert await backend.append(b"first") == 1
        armed.set()
        second = asyncio.ensure_future(backend.append(b"second"))
        await wait_for(stuck.is_set)  # the syncer is inside the fsync of group [second]
        done: list[int] = []
        for _ in range(limits.FILE_PENDING_APPENDS_MAX):
            backend.append_direct(b"q", lambda lsn, error: done.append(lsn))
        with pytest.raises(Overloaded):
            backend.append_direct(b"refused", lambda lsn, error: None)
        truncating = asyncio.ensure_future(backend.truncate(1))
        await asyncio.sleep(0)  # the truncate frame is queued behind the full queue
        armed.clear()
        release.set()
        assert await asyncio.wait_for(second, WAIT_S_MAX) == 2
        await asyncio.wait_for(truncating, WAIT_S_MAX)
        await wait_for(lambda: len(done) == limits.FILE_PENDING_APPENDS_MAX)
        assert done == list(range(3, 3 + limits.FILE_PENDING_APPENDS_MAX))
        # The refused append took no LSN.
        assert await backend.append(b"after") == 3 + limits.FILE_PENDING_APPENDS_MAX
        assert await backend.truncated() == 1
        await backend.close()

    asyncio.run(scenario())
