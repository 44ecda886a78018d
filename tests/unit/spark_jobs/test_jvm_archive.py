"""spark_jobs/jvm_archive.py without a JVM: what names an archive (the java binary, the
Spark jars, the JVM options), when one is used (on, present, and starting with a dynamic
archive's magic: a damaged file is never handed to the JVM), and the background build (one
at a time by its lock; none when off or built). tests/spark/test_jvm_archive.py builds and
maps a real one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spark_jobs import jvm_archive

OPTIONS = "-XX:+UseSerialGC"


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake JAVA_HOME and SPARK_HOME (two jars) and an empty cache directory."""
    java = tmp_path / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_bytes(b"java")
    jars = tmp_path / "spark" / "jars"
    jars.mkdir(parents=True)
    (jars / "a.jar").write_bytes(b"a")
    (jars / "b.jar").write_bytes(b"b")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.setenv(jvm_archive.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(jvm_archive.ARCHIVE_ENV, "1")
    return tmp_path


def write_archive(path: str, magic: int = jvm_archive.DYNAMIC_MAGIC) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as file:
        file.write(magic.to_bytes(4, "little") + b"\0" * 60)


def test_the_name_follows_the_java_the_jars_and_the_options(install: Path) -> None:
    first = jvm_archive.archive_path(OPTIONS)
    assert first is not None and first.startswith(str(install / "cache"))
    assert jvm_archive.archive_path(OPTIONS) == first
    assert jvm_archive.archive_path(OPTIONS + " -Xmx1g") != first
    (install / "spark" / "jars" / "b.jar").write_bytes(b"bb")  # an upgraded jar
    second = jvm_archive.archive_path(OPTIONS)
    assert second != first
    (install / "jdk" / "bin" / "java").write_bytes(b"java 21")  # another JDK
    assert jvm_archive.archive_path(OPTIONS) not in (first, second)


def test_only_a_present_archive_with_the_magic_is_used(install: Path) -> None:
    path = jvm_archive.archive_path(OPTIONS)
    assert path is not None
    assert jvm_archive.use_option(OPTIONS) is None  # not built
    write_archive(path, magic=0x12345678)  # damaged (or half written by hand)
    assert jvm_archive.use_option(OPTIONS) is None
    write_archive(path)
    assert jvm_archive.use_option(OPTIONS) == f"-XX:SharedArchiveFile={path}"
    os.environ[jvm_archive.ARCHIVE_ENV] = "0"
    assert jvm_archive.use_option(OPTIONS) is None


def test_one_background_build_at_a_time(install: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[list[str]] = []

    def popen(argv: list[str], **kwargs: Any) -> None:
        assert kwargs["start_new_session"] and kwargs["stdout"] == subprocess.DEVNULL
        started.append(argv)

    monkeypatch.setattr(subprocess, "Popen", popen)
    assert jvm_archive.build_in_background(OPTIONS)
    assert started[0][1:5] == ["-m", "spark_jobs.jvm_archive", "build", "--options"]
    assert not jvm_archive.build_in_background(OPTIONS)  # its lock is held
    assert len(started) == 1
    lock = install / "cache" / jvm_archive.LOCK
    old = os.stat(lock).st_mtime - jvm_archive.LOCK_STALE_S - 1
    os.utime(lock, (old, old))  # a build that died without removing its lock
    assert jvm_archive.build_in_background(OPTIONS)
    os.remove(lock)
    path = jvm_archive.archive_path(OPTIONS)
    assert path is not None
    write_archive(path)
    assert not jvm_archive.build_in_background(OPTIONS)  # built already
    os.remove(path)
    monkeypatch.setenv(jvm_archive.ARCHIVE_ENV, "0")
    assert not jvm_archive.build_in_background(OPTIONS)
    assert len(started) == 2


def test_a_new_archive_removes_the_others(install: Path) -> None:
    cache = install / "cache"
    cache.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = f"spark-driver-x.jsa.tmp-{dead.pid}"  # a build that died
    for name in ("spark-driver-old.jsa", "spark-driver-new.jsa", left):
        (cache / name).write_bytes(b"x")
    running = f"spark-driver-y.jsa.tmp-{os.getpid()}"  # a build still running
    (cache / running).write_bytes(b"x")
    (cache / "other").write_bytes(b"x")
    jvm_archive._remove_others(str(cache), keep="spark-driver-new.jsa")
    assert sorted(os.listdir(cache)) == sorted(["spark-driver-new.jsa", running, "other"])
