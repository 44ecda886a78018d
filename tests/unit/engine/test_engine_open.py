"""What `Engine.open` accepts as an engine's directory, and that everything it raises is an
`EngineError` (issue 20 items 6 and 7).

Proves: a directory holding other things (an `/etc`), a path that is a file, and a `wal/`
holding files that are not WAL segments are refused with `NotAnEngine` naming the path and
what was found, and nothing is created in them; what the file backend itself leaves in
`wal/` (segments, `*.tmp` segments, `LOCK`, `quarantine*` entries) is accepted, and so is a
directory written by an older version (a lock file without a pid); `create=False` refuses a
missing or empty directory with `NotFound`; a second open of a directory whose WAL is open
is `EngineLocked` naming the holder's pid, also from another process; a damaged segment and
a bad client config are `EngineError`s with the original error kept as the cause. Driven
in-process on real directories; the second process is a real one.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import (
    BadInput,
    Engine,
    EngineError,
    EngineLocked,
    NotAnEngine,
    NotFound,
    OpenFailed,
)
from tae_driver.backends import segment
from tae_driver.errors import StorageCorruption


def run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


async def open_close(path: Path, **options: object) -> None:
    eng = await Engine.open(str(path), **options)  # type: ignore[arg-type]
    await eng.close()


def test_a_directory_of_other_things_is_not_an_engine_and_stays_untouched(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "passwd").write_text("root:x:0:0\n")
    (etc / "hosts").write_text("127.0.0.1 localhost\n")
    with pytest.raises(NotAnEngine) as refused:
        run(open_close(etc))
    assert refused.value.path == str(etc)
    assert "hosts" in str(refused.value) and "passwd" in str(refused.value)
    assert sorted(os.listdir(etc)) == ["hosts", "passwd"]  # no wal/, no objects/
    assert isinstance(refused.value, BadInput)


def test_a_file_is_not_an_engine(tmp_path: Path) -> None:
    a_file = tmp_path / "engine"
    a_file.write_text("hello")
    with pytest.raises(NotAnEngine, match="is a file"):
        run(open_close(a_file))
    wal_file = tmp_path / "walfile"
    wal_file.mkdir()
    (wal_file / "wal").write_text("not a directory")
    with pytest.raises(NotAnEngine, match="wal is a file"):
        run(open_close(wal_file))


def test_junk_in_wal_is_refused_but_what_the_backend_writes_is_kept(tmp_path: Path) -> None:
    run(open_close(tmp_path))
    wal = tmp_path / "wal"
    (wal / (segment.segment_file_name(99) + ".tmp")).write_bytes(b"")  # a creation cut short
    (wal / "quarantine-0001").mkdir()  # a damaged segment set aside
    run(open_close(tmp_path))
    (wal / "notes.txt").write_text("junk")
    with pytest.raises(NotAnEngine, match=r"wal/ holds notes\.txt"):
        run(open_close(tmp_path))


def test_an_engine_directory_of_an_older_version_still_opens(tmp_path: Path) -> None:
    run(open_close(tmp_path))
    (tmp_path / "wal" / "LOCK").write_bytes(b"")  # before the lock held a pid
    (tmp_path / "tn.toml").write_text("# an operator's file beside the engine\n")
    run(open_close(tmp_path, create=False))
    wal_only = tmp_path / "part1"
    run(open_close(wal_only, objects="none"))
    assert os.listdir(wal_only) == ["wal"]
    run(open_close(wal_only, objects="none", create=False))


def test_create_false_requires_an_existing_engine(tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        run(open_close(tmp_path / "missing", create=False))
    assert not (tmp_path / "missing").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotFound):
        run(open_close(tmp_path / "empty", create=False))
    assert os.listdir(tmp_path / "empty") == []


def test_a_second_open_is_engine_locked_naming_the_holder(tmp_path: Path) -> None:
    async def scenario() -> None:
        first = await Engine.open(str(tmp_path))
        try:
            with pytest.raises(EngineLocked) as locked:
                await Engine.open(str(tmp_path))
            assert locked.value.holder_pid == os.getpid()
            assert str(os.getpid()) in str(locked.value)
        finally:
            await first.close()

    run(scenario())
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_ENGINE, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        try:
            run(open_close(tmp_path))
        except EngineError as exc:  # what a caller writes: it must catch this
            assert isinstance(exc, EngineLocked) and exc.holder_pid == holder.pid
        else:
            raise AssertionError("a second process opened a locked engine")
    finally:
        holder.kill()
        holder.wait(60)
    run(open_close(tmp_path))  # the lock died with its holder


HOLD_THE_ENGINE = """
import asyncio, sys
from engine import Engine
async def main():
    eng = await Engine.open(sys.argv[1])
    print("open", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await eng.close()
asyncio.run(main())
"""


def test_a_damaged_wal_and_a_bad_client_config_are_engine_errors(tmp_path: Path) -> None:
    damaged = tmp_path / "damaged"
    (damaged / "wal").mkdir(parents=True)
    (damaged / "wal" / segment.segment_file_name(1)).write_bytes(b"\x00" * 64)
    with pytest.raises(EngineError) as failed:  # OpenFailed, or WalCorruption naming DSNs
        run(open_close(damaged))
    assert isinstance(failed.value.__cause__, StorageCorruption)
    unreadable = tmp_path / "unreadable"
    (unreadable / "wal" / segment.segment_file_name(1)).mkdir(parents=True)  # the OS refuses
    with pytest.raises(OpenFailed) as refused:
        run(open_close(unreadable))
    assert isinstance(refused.value.__cause__, IsADirectoryError)
    with pytest.raises(BadInput, match="client_config"):
        run(
            open_close(
                tmp_path / "remote", wal="logsvc", client_config=str(tmp_path / "no.toml"), shard=1
            )
        )


NOT_RAISED_TO_CALLERS = {
    # Each with why it never reaches a caller of the engine's API:
    "engine.storage.table.ApplyError",  # replay makes it WalCorruption, a commit AssertionError
    "engine.tn.channel.ChannelClosed",  # the CN client's transport: it moves to another TN
    "engine.tn.channel.ConnectionLost",  # likewise
    "engine.tn.local.LocalTNError",  # the harness that runs TN processes for tests and demos
    "engine.bench.distributed.ChildFailed",  # a benchmark's child process
    "engine.testing.workload.VerifyFailed",  # the crash-test workload's read-back child process
    "engine.cn.node.CheckpointRetired",  # caught inside the pull: the CN asks again
    "engine.wal.columns.ColumnsDamaged",  # the entry codec makes it WalCorruption (its DSN)
    "engine.wal.keys.KeysDamaged",  # likewise, for a DeleteKeys command's keys
}


def test_every_error_class_the_engine_defines_is_an_engine_error() -> None:
    import importlib
    import inspect
    import pkgutil

    import engine

    outside = []
    for info in pkgutil.walk_packages(engine.__path__, "engine."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == info.name
                and not name.startswith("_")
                and not issubclass(obj, EngineError)
            ):
                outside.append(f"{info.name}.{name}")
    assert sorted(outside) == sorted(NOT_RAISED_TO_CALLERS)
