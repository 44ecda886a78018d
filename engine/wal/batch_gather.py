"""Reading many entries' bytes at once: `_Gather` (the buffer holding a call's entries and
where each starts and ends), row views of fixed fields (`_fields`, `_rows_equal`), and
`_gather_runs`, which joins many byte runs of the buffer in bounded steps. Pure numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def _places(indexes: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | slice:
    """`indexes` (rising, distinct) as a slice when they are one run, the usual case (a
    call's entries all of the fast shape, in one group): numpy then copies the run's
    elements in one pass instead of gathering or scattering them one index at a time."""
    if len(indexes) and int(indexes[-1]) - int(indexes[0]) == len(indexes) - 1:
        return slice(int(indexes[0]), int(indexes[-1]) + 1)
    return indexes


class _Gather:
    """The entries of one call: the buffer holding them, and where each starts and ends;
    fields of many entries read at once."""

    __slots__ = ("data", "ends", "raw", "starts")

    def __init__(
        self, raw: bytes, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
    ) -> None:
        self.raw = raw
        self.data = np.frombuffer(raw, dtype=np.uint8)
        self.starts = starts
        self.ends = ends

    def entry(self, index: int) -> bytes:
        return self.raw[int(self.starts[index]) : int(self.ends[index])]

    def prefix(self, members: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint8]:
        """The first `width` bytes of each member (each at least that long), (n, width), C
        order: rows of a sliding window over the buffer (a view), so the one copy made is
        of those bytes (no index per byte)."""
        assert width >= 1
        if not len(members):
            return np.zeros((0, width), dtype=np.uint8)
        windows = np.lib.stride_tricks.sliding_window_view(self.data, width)
        found: npt.NDArray[np.uint8] = windows[self.starts[_places(members)]]
        return found

    def bytes_at(self, positions: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint8]:
        """`width` bytes at each absolute position, (n, width); positions past the data read its
        last bytes (the caller has checked bounds or masks those entries out)."""
        if len(self.data) < width:
            return np.zeros((len(positions), width), dtype=np.uint8)
        clipped = np.minimum(positions, len(self.data) - width)
        return self.data[clipped[:, None] + np.arange(width)]

    def uint(self, positions: npt.NDArray[np.int64], width: int) -> npt.NDArray[np.uint64]:
        raw = np.ascontiguousarray(self.bytes_at(positions, width))
        return raw.view(f"<u{width}").reshape(len(positions)).astype(np.uint64)


def _rows_equal(matrix: npt.NDArray[np.uint8], at: int, expected: bytes) -> npt.NDArray[np.bool_]:
    """Whether the bytes of each row of `matrix` (n, width; C order) from `at` are `expected`,
    byte for byte: each row's run read in place as one fixed-size byte string (numpy's `S`
    equality ignores only trailing NULs, which two strings of one length can differ in only
    if they are equal)."""
    size = len(expected)
    if not size:
        return np.ones(len(matrix), dtype=np.bool_)
    rows = _fields(matrix, at, np.dtype(f"S{size}"))
    found: npt.NDArray[np.bool_] = rows == np.bytes_(expected)
    return found


def _fields(matrix: npt.NDArray[np.uint8], at: int, dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """One `dtype` value per row of `matrix` (n, width; C order), at byte `at` of the row: a
    view (unaligned reads), no copy."""
    assert matrix.flags.c_contiguous and at + dtype.itemsize <= matrix.shape[1]
    if not len(matrix):
        return np.zeros(0, dtype=dtype)
    return np.ndarray(
        (len(matrix),), dtype=dtype, buffer=matrix, offset=at, strides=(matrix.shape[1],)
    )


GATHER_BYTES_MAX = 4 * 2**20
"""Value bytes gathered per step by `_gather_runs`: its index takes 8 bytes per byte
gathered, so a step's index stays under 32 MiB (one run longer than this, at most an entry's
2 MiB, is one step), whatever a call's values add up to."""


RUN_WINDOW_BYTES_MAX = 64
"""Runs up to this long (each of a call) are gathered as rows of a sliding window, then the
bytes of each run kept (`_gather_runs`): a copy of at most 64 bytes and a mask of as many a
run, instead of an 8-byte index per byte gathered."""


def _gather_runs(
    data: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
) -> npt.NDArray[np.uint8]:
    """The runs `data[starts[i]:starts[i] + lengths[i]]` joined: short runs through one
    window (RUN_WINDOW_BYTES_MAX), others in steps of at most GATHER_BYTES_MAX bytes (or
    one run)."""
    if not len(lengths):
        return np.empty(0, dtype=np.uint8)
    longest = int(lengths.max())
    if longest <= RUN_WINDOW_BYTES_MAX:
        width = max(1, min(longest, len(data)))
        # A window starting past len(data) - width is moved back (the run then begins
        # `shift` bytes into its row).
        placed = np.minimum(starts, len(data) - width)
        rows = np.lib.stride_tricks.sliding_window_view(data, width)[placed]
        shift = (starts - placed)[:, None]
        columns = np.arange(width)
        keep = (columns >= shift) & (columns < shift + lengths[:, None])
        found: npt.NDArray[np.uint8] = rows[keep]
        return found
    ends = np.cumsum(lengths)
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    first = done = 0
    while first < len(lengths):
        stop = max(first + 1, int(np.searchsorted(ends, done + GATHER_BYTES_MAX, side="right")))
        step = lengths[first:stop]
        size = int(ends[stop - 1]) - done
        placed = ends[first:stop] - step - done  # where each run goes in this step
        index = np.repeat(starts[first:stop] - placed, step) + np.arange(size)
        out[done : done + size] = data[index]
        done += size
        first = stop
    return out
