"""`logsvc doctor --repair [--yes]`: a shard journal the store refuses to open (a corrupt
segment) is repaired only on request, by moving its damaged suffix aside, never deleting it
(issue 20, item 4; ARCHITECTURE.md §11).

How: the journal is written by a real `ShardStore` (five segments of synced batches, as in
test_doctor.py); a byte is flipped in a sealed segment, so the store refuses to open it.
`--repair` without `--yes` (through the CLI's `main`) prints the plan and exits 1 with every
byte unchanged; `--repair --yes` moves the suffix into `journal/quarantine-*` (the kept
prefix plus the moved bytes are the damaged journal's bytes, byte for byte), after which the
real store opens with the entries below the damage, and the doctor notes the quarantine. A
running node's locked journal is refused (exit 3), and `--yes` alone or `--repair` without
`--shard` are usage errors (2).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from logsvc import cli, doctor
from logsvc.store import Corruption, ShardStore
from logsvc.store.records import SEGMENT_HEADER_BYTES
from tests.unit.test_doctor import LIMITS, check, codes, flip, make_journal, segments, tree


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def run(data_dir: Path, *extra: str) -> int:
    return cli.main(["doctor", "--data-dir", str(data_dir), *extra])


def test_repair_moves_the_damaged_suffix_aside_only_with_yes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "n1"
    journal = data_dir / "shards" / "1" / "journal"
    make_journal(journal)
    segs = segments(journal)
    assert len(segs) >= 4
    damaged = segs[1]
    flip(damaged, SEGMENT_HEADER_BYTES + 60)  # the payload of its first record
    with pytest.raises(Corruption):
        ShardStore.open(str(journal), limits=LIMITS).close()
    before = files(data_dir)
    listing = tree(data_dir)

    assert run(data_dir, "--shard", "1", "--repair") == doctor.EXIT_PROBLEMS
    out, err = capsys.readouterr()
    assert "pass --yes" in err
    assert f"damage: {damaged} at byte {SEGMENT_HEADER_BYTES}" in out
    first_lost = int(damaged.name[:20])
    assert f"indexes [{first_lost}, 61)" in out
    assert tree(data_dir) == listing  # nothing changed

    assert run(data_dir, "--shard", "1", "--repair", "--yes") == doctor.EXIT_HEALTHY
    out, _ = capsys.readouterr()
    assert "repaired" in out
    (quarantine,) = journal.glob("quarantine-*")
    assert damaged.read_bytes() == before[f"shards/1/journal/{damaged.name}"][:SEGMENT_HEADER_BYTES]
    moved = (quarantine / f"{damaged.name}.from-{SEGMENT_HEADER_BYTES}").read_bytes()
    original = before[f"shards/1/journal/{damaged.name}"]
    assert damaged.read_bytes() + moved == original
    for later in segs[2:]:
        assert not later.exists()
        assert (quarantine / later.name).read_bytes() == before[f"shards/1/journal/{later.name}"]

    store = ShardStore.open(str(journal), limits=LIMITS)
    try:
        assert store.last_index == first_lost - 1
        assert [e.index for e in store.read(1, first_lost, max_bytes=1 << 20)][-1] == first_lost - 1
    finally:
        store.close()
    report = check(data_dir)
    assert "quarantine_kept" in codes(report, "info")
    assert report.exit_code == doctor.EXIT_HEALTHY


def test_repair_refuses_a_running_node_and_bad_usage(tmp_path: Path) -> None:
    data_dir = tmp_path / "n1"
    journal = data_dir / "shards" / "1" / "journal"
    make_journal(journal)
    flip(segments(journal)[1], SEGMENT_HEADER_BYTES + 60)
    listing = tree(data_dir)
    fd = os.open(journal / "LOCK", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the running node holds it
        assert run(data_dir, "--shard", "1", "--repair", "--yes") == doctor.EXIT_RUNNING
    finally:
        os.close(fd)
    assert run(data_dir, "--repair") == 2
    assert run(data_dir, "--shard", "1", "--yes") == 2
    assert tree(data_dir) == listing
