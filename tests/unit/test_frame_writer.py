"""FrameWriter: frames written in one event-loop iteration leave in one write, in order;
past the buffer limit the writer waits for the peer (drain).

How: a recording stand-in for asyncio's StreamWriter (its write/drain/transport surface),
driven on a real event loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from logsvc.frame_writer import FrameWriter


class _Transport:
    def __init__(self) -> None:
        self.buffered = 0

    def get_write_buffer_size(self) -> int:
        return self.buffered


class _RecordingWriter:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.drains = 0
        self.transport = _Transport()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    async def drain(self) -> None:
        self.drains += 1


def _writer(recording: _RecordingWriter, limit: int = 1024) -> FrameWriter:
    return FrameWriter(cast(Any, recording), limit)


def test_frames_of_one_iteration_leave_in_one_write_in_order() -> None:
    async def scenario() -> list[bytes]:
        recording = _RecordingWriter()
        out = _writer(recording)
        for i in range(5):
            out.write(bytes([i]))
        assert recording.writes == []  # not before the end of this iteration
        await asyncio.sleep(0)
        out.write(b"later")
        await asyncio.sleep(0)
        return recording.writes

    assert asyncio.run(scenario()) == [b"\x00\x01\x02\x03\x04", b"later"]


def test_over_the_limit_it_flushes_and_drains() -> None:
    async def scenario() -> tuple[list[bytes], int]:
        recording = _RecordingWriter()
        out = _writer(recording, limit=8)
        out.write(b"12345")
        await out.drain_if_over()
        assert recording.drains == 0  # 5 bytes: under the limit
        out.write(b"67890")
        await out.drain_if_over()
        return recording.writes, recording.drains

    assert asyncio.run(scenario()) == ([b"1234567890"], 1)


def test_nothing_is_written_to_a_closing_stream() -> None:
    async def scenario() -> list[bytes]:
        recording = _RecordingWriter()
        out = _writer(recording)
        out.write(b"x")
        recording.closing = True
        await asyncio.sleep(0)
        return recording.writes

    assert asyncio.run(scenario()) == []
