"""`python -m engine cn` writing and reading through a compute node (engine/tn/reader.py,
issue 24 item 5).

Proves: `cn --help` lists every command and the exit codes; `insert --json FILE` (a JSON array,
or JSON lines on stdin with `-`) commits the rows on the TN and prints the commit_ts the TN
gave; `delete --json FILE` takes keys as values or objects (so `scan --format json` output is
keys) and prints its commit_ts; `scan --at` reads the state at a commit_ts or a wall time,
`--where` and `--format json` as `engine scan`; the typed errors map to the documented exit
codes: DuplicateKey 3 (nothing committed), OutcomeUnknown 4 (the TN's WAL holds the append
past the client's bounds), bad JSON, an unknown column, a wrong type and a missing file 2,
an unknown table 1 (as `engine scan`), each on one line naming it; with commands on stdin,
`--json -` is refused and the session's exit code is its last failure's.

How: a real TN server on loopback (engine/tn/server.py) over an Engine with the memory WAL
and a directory of objects; a cn.toml pointing at it; the CLI's `main` run in a thread (it
runs its own event loop) while the test's loop serves the TN; stdout/stderr captured.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from engine import Column, Engine, Schema
from engine.cli import main
from engine.clock import ts_isoformat
from engine.errors import WriteConflict
from engine.objects.store import LocalDirStore
from engine.tn import reader
from engine.tn.server import TNServer
from engine.tn.service import TNService
from tae_driver.backends.memory import MemoryBackend

pytestmark = pytest.mark.timeout(120)

TOKEN = "tn-cli-test-token-0123"
ROWS = Schema(
    [
        Column("id", "int64"),
        Column("v", "string", nullable=True),
        Column("n", "float64", nullable=True),
    ],
    primary_key=["id"],
)


class Setup:
    def __init__(self, base: Path, engine: Engine, wal: MemoryBackend, server: TNServer) -> None:
        self.base = base
        self.engine = engine
        self.wal = wal
        self.server = server
        self.config = str(base / "cn.toml")

    async def cli(
        self, capsys: pytest.CaptureFixture[str], *words: str, stdin: bytes | None = None
    ) -> tuple[int, str, str]:
        """`python -m engine cn --config cn.toml WORDS...`: exit code, stdout, stderr."""
        saved = sys.stdin
        if stdin is not None:
            sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
        try:
            code = await asyncio.to_thread(main, ["cn", "--config", self.config, *words])
        finally:
            sys.stdin = saved
        out, err = capsys.readouterr()
        return code, out, err

    async def rows(self) -> list[dict[str, Any]]:
        async with self.engine.transaction() as txn:
            table = await txn.table("d", "t").scan()
        return sorted(table.to_pylist(), key=lambda row: row["id"])


def with_tn(
    tmp_path: Path, test: Callable[[Setup], Coroutine[Any, Any, None]], *, client: str = ""
) -> None:
    async def body() -> None:
        wal = MemoryBackend()
        objects = tmp_path / "objects"
        engine = await Engine.open(
            "unused", wal, objects=LocalDirStore(str(objects)), maintenance=False
        )
        async with engine.transaction() as txn:
            await txn.create_database("d")
            await txn.create_table("d", "t", ROWS)
        server = TNServer(TNService(engine), TOKEN)
        await server.start("127.0.0.1", 0)
        token = tmp_path / "tn.token"
        token.write_text(TOKEN + "\n")
        os.chmod(token, 0o600)
        (tmp_path / "cn.toml").write_text(
            f'tns = ["127.0.0.1:{server.port}"]\ntoken_file = "tn.token"\n'
            f'[objects]\ndir = "objects"\n{client}'
        )
        try:
            await test(Setup(tmp_path, engine, wal, server))
        finally:
            await server.close(grace_s=0.5)
            await engine.close()

    asyncio.run(asyncio.wait_for(body(), 100))


def test_help_lists_the_commands_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["cn", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for text in (
        "status",
        "tables",
        "scan DB.TABLE [--where FILTER]",
        "insert DB.TABLE --json FILE",
        "delete DB.TABLE --json FILE",
        "3  the transaction was refused: WriteConflict",
        "4  OutcomeUnknown",
    ):
        assert text in out, text


def test_insert_delete_and_scan_at_a_timestamp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def test(tn: Setup) -> None:
        rows_file = tn.base / "rows.json"
        rows_file.write_text(json.dumps([{"id": 1, "v": "a"}, {"id": 2, "n": "NaN"}, {"id": 3}]))
        code, out, err = await tn.cli(capsys, "insert", "d.t", "--json", str(rows_file))
        assert code == 0, (out, err)
        first_ts = tn.engine.visible_ts
        assert out == f"inserted 3 rows into d.t at commit_ts {first_ts}\n"

        lines = b'{"id": 4, "v": "d"}\n\n{"id": 5, "v": null}\n'
        code, out, err = await tn.cli(capsys, "insert", "d.t", "--json", "-", stdin=lines)
        assert code == 0, (out, err)
        assert out == f"inserted 2 rows into d.t at commit_ts {tn.engine.visible_ts}\n"

        keys_file = tn.base / "keys.json"
        keys_file.write_text('[1, {"id": 4, "v": "ignored"}, 99]')
        code, out, err = await tn.cli(capsys, "delete", "d.t", "--json", str(keys_file))
        assert code == 0, (out, err)
        assert out == f"deleted 2 of 3 keys from d.t at commit_ts {tn.engine.visible_ts}\n"
        assert [row["id"] for row in await tn.rows()] == [2, 3, 5]

        # Read back through the compute node: now, and as of the first insert.
        code, out, err = await tn.cli(capsys, "scan", "d.t", "--format", "json")
        assert code == 0, (out, err)
        got = [json.loads(line) for line in out.splitlines()]
        assert got == [
            {"id": 2, "v": None, "n": "NaN"},
            {"id": 3, "v": None, "n": None},
            {"id": 5, "v": None, "n": None},
        ]
        assert err == f"(3 of 3 rows at commit_ts {tn.engine.visible_ts})\n"
        for at in (str(first_ts), ts_isoformat(first_ts)):
            words = ["scan", "d.t", "--at", at, "--where", "v IS NOT NULL OR id = 3"]
            code, out, err = await tn.cli(capsys, *words, "--columns", "id", "--format", "csv")
            assert code == 0, (out, err)
            assert out.splitlines() == ['"id"', "1", "3"], at

    with_tn(tmp_path, test)


def test_a_duplicate_key_exits_3_and_commits_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def test(tn: Setup) -> None:
        rows_file = tn.base / "rows.json"
        rows_file.write_text('[{"id": 1}]')
        assert (await tn.cli(capsys, "insert", "d.t", "--json", str(rows_file)))[0] == 0
        before = tn.engine.visible_ts
        rows_file.write_text('[{"id": 2}, {"id": 1}]')
        code, out, err = await tn.cli(capsys, "insert", "d.t", "--json", str(rows_file))
        assert code == 3
        assert out.startswith("error: DuplicateKey: duplicate primary key 1 in d.t")
        assert out.count("\n") == 1 and "Traceback" not in out + err
        assert tn.engine.visible_ts == before
        assert [row["id"] for row in await tn.rows()] == [1]

    with_tn(tmp_path, test)


def test_no_answer_from_the_tn_is_outcome_unknown_exit_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def test(tn: Setup) -> None:
        rows_file = tn.base / "rows.json"
        rows_file.write_text('[{"id": 7}]')
        tn.wal.hold_appends = True  # the TN's WAL never answers: nobody can say
        code, out, err = await tn.cli(capsys, "insert", "d.t", "--json", str(rows_file))
        assert code == 4, (out, err)
        assert out.startswith("error: OutcomeUnknown: ")
        tn.wal.hold_appends = False
        for held in tn.wal.held():
            await tn.wal.release(held)

    impatient = (
        "[client]\nconnect_timeout_ms = 300\nrequest_timeout_ms = 300\nfailover_wait_ms = 800\n"
    )
    with_tn(tmp_path, test, client=impatient)


@pytest.mark.parametrize(
    ("command", "content", "says"),
    [
        ("insert", '[{"id": 1}, {"id": 2,]', "rows.json: bad JSON at line 1"),
        ("insert", '{"id": 1}\n{"id": }\n', "rows.json: bad JSON at line 2"),
        ("insert", '[{"id": 1, "nope": 2}]', "rows.json: row 1: unknown column 'nope'"),
        (
            "insert",
            '[{"id": 1}, {"id": "x"}]',
            "rows.json: row 2: column 'id' (int64) cannot take 'x'",
        ),
        ("insert", '[{"v": "no key"}]', "null"),
        ("insert", "[3]", "rows.json: row 1 is not a JSON object"),
        ("delete", '[{"v": 1}]', "rows.json: key 1: no 'id'"),
        ("delete", "[[1, 2]]", "a key has 1 values (id), not 2"),
        ("delete", "[null]", "rows.json: key 1: null in the key"),
    ],
)
def test_bad_input_exits_2_naming_it_and_commits_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, content: str, says: str
) -> None:
    async def test(tn: Setup) -> None:
        rows_file = tn.base / "rows.json"
        rows_file.write_text(content)
        before = tn.engine.visible_ts
        code, out, err = await tn.cli(capsys, command, "d.t", "--json", str(rows_file))
        assert code == 2, (out, err)
        assert out.startswith("error: ") and says in out, out
        assert out.count("\n") == 1 and "Traceback" not in out + err
        assert tn.engine.visible_ts == before

    with_tn(tmp_path, test)


def test_unknown_table_1_missing_file_and_stdin_in_a_session_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async def test(tn: Setup) -> None:
        rows_file = tn.base / "rows.json"
        rows_file.write_text('[{"id": 1}]')
        code, out, _ = await tn.cli(capsys, "insert", "d.nope", "--json", str(rows_file))
        assert code == 1 and out.startswith("error: NotFound: ") and "nope" in out
        code, out, _ = await tn.cli(capsys, "insert", "d.t", "--json", str(tn.base / "gone"))
        assert code == 2 and out.startswith(f"error: --json {tn.base / 'gone'}: No such file")
        code, out, _ = await tn.cli(capsys, "scan", "d.t", "--where", "idd = 1")
        assert (
            code == 2 and out == "error: unknown column 'idd' at character 1 (columns: id, v, n)\n"
        )
        # Commands from stdin: `--json -` cannot read them too; the last failure's code.
        session = f"insert d.t --json -\ninsert d.t --json {rows_file}\nscan d.t --limit -1\n"
        code, out, _ = await tn.cli(capsys, stdin=session.encode())
        assert code == 2
        assert (
            out.splitlines()[0]
            == "error: --json - reads stdin: give the command on the command line"
        )
        assert out.splitlines()[1].startswith("inserted 1 rows into d.t at commit_ts ")
        assert out.splitlines()[2] == "error: --limit must be >= 0, not -1"

    with_tn(tmp_path, test)


def test_exit_codes_of_the_typed_errors() -> None:
    from engine.errors import (
        DuplicateKey,
        NotFound,
        OutcomeUnknown,
        SchemaError,
        SnapshotUnavailable,
    )

    assert reader.exit_code(WriteConflict("key 1")) == reader.EXIT_REFUSED == 3
    assert reader.exit_code(DuplicateKey("d.t", 1)) == 3
    assert reader.exit_code(OutcomeUnknown("no TN answered")) == reader.EXIT_OUTCOME_UNKNOWN == 4
    assert reader.exit_code(NotFound("no table")) == reader.EXIT_FAILED == 1  # as engine scan
    assert reader.exit_code(SchemaError("no column")) == reader.EXIT_USAGE == 2
    assert reader.exit_code(SnapshotUnavailable("gone")) == reader.EXIT_FAILED == 1
