"""A latency histogram drawn as a PNG, with no plotting library: bars on a white canvas, an
axis, and labels in a 3x5 pixel font (digits and the few letters the labels use), written by
a minimal PNG encoder (8-bit grayscale, one zlib stream; PNG spec, ISO/IEC 15948).

Why not matplotlib: it brings numpy, pillow, fonttools and more into the install of every
executor for one small picture; a bar chart needs none of it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Any

WIDTH = 640
HEIGHT = 360
MARGIN_LEFT = 56
MARGIN_BOTTOM = 48
MARGIN_TOP = 40
SCALE = 2  # font pixels per glyph pixel
BARS_MAX = 64

# 3x5 glyphs, one string of 15 bits (rows top to bottom) per character.
_GLYPHS = {
    "0": "111101101101111",
    "1": "010110010010111",
    "2": "111001111100111",
    "3": "111001111001111",
    "4": "101101111001001",
    "5": "111100111001111",
    "6": "111100111101111",
    "7": "111001001001001",
    "8": "111101111101111",
    "9": "111101111001111",
    " ": "000000000000000",
    ".": "000000000000010",
    "-": "000000111000000",
    ":": "000010000010000",
    "=": "000111000111000",
    "<": "001010100010001",
    "p": "111101111100100",
    "m": "000111111101101",
    "s": "011100010001110",
    "x": "000101010101000",
    "n": "000110101101101",
    "t": "010111010010011",
    "l": "110010010010111",
    "a": "000011101101011",
    "y": "101101011001110",
    "c": "000011100100011",
    "o": "000010101101010",
    "u": "000101101101011",
    "e": "010101111100011",
    "i": "010000010010010",
    "h": "100100110101101",
    "r": "000110101100100",
    "d": "001001011101011",
    "k": "100101110110101",
    "b": "100100111101111",
    "f": "011100110100100",
    "v": "000101101101010",
    "g": "011101011001110",
    "w": "000101101111101",
}


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width = width
        self.height = height
        self.pixels = bytearray(b"\xff" * (width * height))

    def rect(self, x0: int, y0: int, x1: int, y1: int, shade: int) -> None:
        for y in range(max(0, y0), min(self.height, y1)):
            start = y * self.width
            self.pixels[start + max(0, x0) : start + min(self.width, x1)] = bytes(
                [shade] * (min(self.width, x1) - max(0, x0))
            )

    def text(self, x: int, y: int, text: str) -> None:
        for char in text.lower():
            glyph = _GLYPHS.get(char, _GLYPHS[" "])
            for index, bit in enumerate(glyph):
                if bit == "1":
                    gx, gy = x + (index % 3) * SCALE, y + (index // 3) * SCALE
                    self.rect(gx, gy, gx + SCALE, gy + SCALE, 0)
            x += 4 * SCALE

    def png(self) -> bytes:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width : (y + 1) * self.width])
            for y in range(self.height)
        )
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 0, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 9))
            + _chunk(b"IEND", b"")
        )


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def histogram_png(
    bucket_lo_ms: Sequence[int], counts: Sequence[int], summary: dict[str, Any]
) -> bytes:
    """Bars of `counts` over power-of-two latency buckets, labelled with each bucket's lower
    bound in ms, the largest count, and the percentiles of `summary`."""
    canvas = _Canvas(WIDTH, HEIGHT)
    if summary.get("txns"):
        canvas.text(
            8,
            8,
            f"n={summary['txns']} p50={summary['p50_ms']:g}ms p90={summary['p90_ms']:g}ms "
            f"p99={summary['p99_ms']:g}ms",
        )
    else:
        canvas.text(8, 8, "n=0")
    bars = list(zip(bucket_lo_ms, counts, strict=True))[:BARS_MAX]
    plot_w = WIDTH - MARGIN_LEFT - 8
    plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
    base_y = HEIGHT - MARGIN_BOTTOM
    canvas.rect(MARGIN_LEFT - 2, MARGIN_TOP, MARGIN_LEFT, base_y, 0)
    canvas.rect(MARGIN_LEFT - 2, base_y, WIDTH - 8, base_y + 2, 0)
    if bars:
        top = max(count for _, count in bars)
        canvas.text(4, MARGIN_TOP, str(top))
        canvas.text(4, base_y - 10, "0")
        slot = plot_w // len(bars)
        for position, (lo, count) in enumerate(bars):
            height = 0 if top == 0 else max(1, count * plot_h // top) if count else 0
            x0 = MARGIN_LEFT + position * slot + 2
            canvas.rect(x0, base_y - height, x0 + max(1, slot - 4), base_y, 96)
            if len(bars) <= 16 or position % 2 == 0:
                canvas.text(x0, base_y + 6, str(lo))
    canvas.text(MARGIN_LEFT, HEIGHT - 16, "commit ts - start ts: ms, log2 buckets")
    return canvas.png()
