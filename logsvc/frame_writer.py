"""Coalesced frame writes on an asyncio stream: the data plane's server and client both
use it.

A pipelined connection answers (or sends) many frames in one event-loop iteration: a
group commit completes dozens of appends at once. Writing each frame on its own costs a
send() system call per frame; here the frames written during one iteration are joined and
leave in one write, scheduled with `call_soon` (so no frame waits for anything but the
end of the current iteration). Order is kept: frames leave in the order written.

Bounded: `buffered_bytes()` counts what is queued here plus the transport's buffer; callers
wait (`drain_if_over`) past their limit, the back-pressure a slow reader gets.
"""

from __future__ import annotations

import asyncio


class FrameWriter:
    def __init__(self, writer: asyncio.StreamWriter, buffer_bytes_max: int) -> None:
        assert buffer_bytes_max > 0
        self._writer = writer
        self._buffer_bytes_max = buffer_bytes_max
        self._chunks: list[bytes] = []
        self._chunk_bytes = 0
        self._scheduled = False

    def write(self, frame: bytes) -> None:
        self._chunks.append(frame)
        self._chunk_bytes += len(frame)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Hand what is queued to the transport now (also the scheduled callback)."""
        self._scheduled = False
        if not self._chunks:
            return
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._chunk_bytes = 0
        if not self._writer.is_closing():
            self._writer.write(data)

    def buffered_bytes(self) -> int:
        return self._chunk_bytes + self._writer.transport.get_write_buffer_size()

    def over_limit(self) -> bool:
        return self.buffered_bytes() > self._buffer_bytes_max

    async def drain_if_over(self) -> None:
        """Wait for the peer to read while more than the limit is buffered."""
        if self.over_limit():
            self.flush()
            await self._writer.drain()
