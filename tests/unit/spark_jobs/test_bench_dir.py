"""The benchmark reuses the WALs of a --dir only when they were generated with the same
entries and shards (its `generated.json`); other WALs are refused with exit 2 and one line,
before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_jobs import bench


def test_a_dir_of_other_wals_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / bench.GENERATED).write_text(json.dumps({"entries": 10, "shards": 2}))
    assert bench.main(["--entries", "12", "--shards", "2", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not 12 entries in 2" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [bench.GENERATED]  # nothing written
