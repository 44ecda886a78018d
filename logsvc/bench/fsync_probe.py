"""What zero-ahead (logsvc/store/FORMAT.md "Zero-ahead") saves on a file system: the cost of
one fdatasync after a small write that grows a file, fills fallocated (unwritten) space, or
overwrites zeros written and synced before, measured side by side.

`python -m logsvc.bench.fsync_probe --dir DIR [--rounds N] [--record-bytes B]`: each round
writes one record into each of the three files in turn and fdatasyncs it, so a load that
changes during the run weighs on the three alike (a shared machine makes separate runs
incomparable). Prints one JSON line per kind: p10/p50/p90 of the fdatasync alone, in us.

On ext4 with a journal, growing the file (and converting unwritten extents) makes the
fdatasync commit the journal; overwriting written blocks does not. A file system without a
journal shows little difference. The files are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from logsvc.bench.measure import percentile

KINDS = ("grow", "fallocate", "zeros")
ROUNDS_MAX = 100_000  # bounds the run: each round is three fdatasyncs
RECORD_BYTES_MAX = 1 << 20


def probe(dir_path: str, rounds: int, record_bytes: int) -> list[dict[str, object]]:
    assert 1 <= rounds <= ROUNDS_MAX
    assert 1 <= record_bytes <= RECORD_BYTES_MAX
    work = tempfile.mkdtemp(prefix="fsync-probe-", dir=dir_path)
    space_bytes = rounds * record_bytes + 4096
    fds: dict[str, int] = {}
    try:
        for kind in KINDS:
            fd = os.open(os.path.join(work, kind), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            fds[kind] = fd
            if kind == "zeros":
                os.pwrite(fd, bytes(space_bytes), 0)
            elif kind == "fallocate":
                os.posix_fallocate(fd, 0, space_bytes)
            os.fdatasync(fd)
        record = b"x" * record_bytes
        samples_us: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for round_number in range(rounds):
            for kind, fd in fds.items():
                os.pwrite(fd, record, round_number * record_bytes)
                began = time.perf_counter()
                os.fdatasync(fd)
                samples_us[kind].append((time.perf_counter() - began) * 1e6)
    finally:
        for kind, fd in fds.items():
            os.close(fd)
            os.unlink(os.path.join(work, kind))
        os.rmdir(work)
    results: list[dict[str, object]] = []
    for kind in KINDS:
        ordered = sorted(samples_us[kind])
        line: dict[str, object] = {"kind": kind, "rounds": rounds, "record_bytes": record_bytes}
        for name, fraction in (("p10_us", 0.10), ("p50_us", 0.50), ("p90_us", 0.90)):
            value = percentile(ordered, fraction)
            assert value is not None  # rounds >= 1
            line[name] = round(value)
        results.append(line)
    return results


def _bounded_int(name: str, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: not an integer: {text!r}") from None
        if not 1 <= value <= high:
            raise argparse.ArgumentTypeError(f"{name}: must be 1..{high}, got {value}")
        return value

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    if not __debug__:
        print("fsync_probe: error: refusing to run under python -O (asserts off)", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(
        prog="python -m logsvc.bench.fsync_probe",
        description="fdatasync after a growing write, into fallocated space, over written "
        "zeros: interleaved, one JSON line per kind",
    )
    parser.add_argument("--dir", required=True, help="a directory on the file system to probe")
    parser.add_argument("--rounds", type=_bounded_int("--rounds", ROUNDS_MAX), default=600)
    parser.add_argument(
        "--record-bytes", type=_bounded_int("--record-bytes", RECORD_BYTES_MAX), default=140
    )
    args = parser.parse_args(argv)
    if not os.path.isdir(args.dir):
        print(f"fsync_probe: error: --dir: not a directory: {args.dir}", file=sys.stderr)
        return 2
    for line in probe(args.dir, args.rounds, args.record_bytes):
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
