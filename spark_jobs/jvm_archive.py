"""The driver JVM's class-data archive (AppCDS) for the per-log jobs (session.PER_LOG_JOBS).

Why: replay_as_of and lsn_audit do their work in Python workers, so the driver JVM's
start-up is most of what Spark adds to them (issue 23: 7.4 of the audit's 21.6 CPU-s at
10M entries). Most of a JVM's start is loading and verifying Spark's ~13,000 classes; a
class-data archive holds them parsed and verified, and the JVM maps it instead. Measured
(a session on local[2] built, one tiny per-log-shaped job, stopped; 2-core box, loaded):
the driver JVM 8.6 -> 4.4 CPU-s, the whole start 10.8 -> 6.7 CPU-s.

How (JDK 17, which has no `-XX:+AutoCreateSharedArchive`):

* The archive is a JDK *dynamic* archive, dumped at the exit of a JVM started with
  `-XX:ArchiveClassesAtExit=<file>` (`build`: a session on local[2] running one tiny
  mapInArrow job, the shape of spark_engine.per_log, then stopped; its JVM is made to exit
  and waited for, bounded by BUILD_S_MAX). It is written under a temporary name and renamed
  into place only once the JVM exited and the file starts with the archive's magic, so a
  reader never maps half an archive.
* It lives in the cache directory (`$SPARK_JOBS_CACHE_DIR`, else `$XDG_CACHE_HOME/logsvc`,
  else `~/.cache/logsvc`) under a name that fingerprints what it depends on: the `java`
  binary Spark's launcher runs (`$JAVA_HOME/bin/java`, else `java` on PATH; its real path,
  size and mtime), every jar of the Spark install (name, size, mtime), the JVM options, and
  FORMAT_VERSION. Anything else (another JDK, an upgraded pyspark) names another file, which
  does not exist yet: the run goes without, and the archive is built for the next. Building a
  new one removes the others (each is ~150 MB).
* A stale or damaged archive the fingerprint did not catch is refused by the JVM itself,
  which then starts without it (`-Xshare:auto`, the default) and prints nothing (measured
  with a file of random bytes: the same CPU as no archive, no output).
* The first per-log Spark run that finds no archive starts `build` after its own session
  stopped, as a detached process (`python -m spark_jobs.jvm_archive build`: one at a time,
  by an exclusive lock file), so that run is not slowed and the next one starts faster; or
  run that command once at setup. `SPARK_JOBS_JVM_ARCHIVE=0` turns the archive off: neither
  used nor built (the tests set it, so a test run writes nothing to the user's cache).
* Under spark-submit the driver JVM is started before our code runs: no archive.

`python -m spark_jobs.jvm_archive build|status` (exit 0, or 1 when a build fails, 2 on a bad
argument).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

from spark_jobs.errors import JvmArchiveNotBuilt

FORMAT_VERSION = 1
"""Part of the fingerprint: raise it when what `build` runs changes."""

ARCHIVE_ENV = "SPARK_JOBS_JVM_ARCHIVE"
"""`0`: no archive is used or built."""
CACHE_ENV = "SPARK_JOBS_CACHE_DIR"
PREFIX = "spark-driver-"
SUFFIX = ".jsa"
LOCK = "jvm-archive-build.lock"

DYNAMIC_MAGIC = 0xF00BABA8
"""The first four bytes (little-endian) of a JDK dynamic archive (HotSpot's
CDS_DYNAMIC_ARCHIVE_MAGIC): a file without them is not promoted."""

BUILD_S_MAX = 300.0
"""How long a build may take (the JVM's start, one job, the dump at exit: ~15-45 s on the
loaded 2-core box) before it is stopped and nothing is kept."""

JVM_EXIT_WAIT_S_MAX = 120.0
"""How long a build waits for its JVM to write the archive and exit once asked to (the dump
itself took ~4 CPU-s measured)."""

LOCK_STALE_S = BUILD_S_MAX + 60.0
"""A lock file older than this is a build that died without removing it."""

assert JVM_EXIT_WAIT_S_MAX < BUILD_S_MAX < LOCK_STALE_S


def enabled() -> bool:
    return os.environ.get(ARCHIVE_ENV, "1") != "0"


def cache_dir() -> str:
    given = os.environ.get(CACHE_ENV)
    if given:
        return os.path.abspath(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "logsvc")


def java_binary() -> str | None:
    """The `java` Spark's launcher (bin/spark-class) runs: `$JAVA_HOME/bin/java`, else the
    first on PATH; its real path."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def spark_jars_dir() -> str | None:
    """The jars of the Spark install pyspark launches (`$SPARK_HOME/jars`, else pyspark's
    own), found without importing pyspark."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        spec = importlib.util.find_spec("pyspark")
        if spec is None or not spec.submodule_search_locations:
            return None
        home = next(iter(spec.submodule_search_locations))
    jars = os.path.join(home, "jars")
    return jars if os.path.isdir(jars) else None


def fingerprint(java_options: str) -> str | None:
    """What the archive depends on, hashed; None when no java or no Spark jars are found."""
    java, jars = java_binary(), spark_jars_dir()
    if java is None or jars is None:
        return None
    digest = hashlib.sha256()

    def add(*parts: object) -> None:
        digest.update(("\0".join(str(p) for p in parts) + "\n").encode())

    add("format", FORMAT_VERSION)
    add("options", java_options)
    stat = os.stat(java)
    add("java", java, stat.st_size, stat.st_mtime_ns)
    with os.scandir(jars) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            info = entry.stat()
            add("jar", entry.name, info.st_size, info.st_mtime_ns)
    return digest.hexdigest()[:20]


def archive_path(java_options: str) -> str | None:
    key = fingerprint(java_options)
    return None if key is None else os.path.join(cache_dir(), f"{PREFIX}{key}{SUFFIX}")


def is_archive(path: str) -> bool:
    """`path` is a file starting with a dynamic archive's magic."""
    try:
        with open(path, "rb") as file:
            head = file.read(4)
    except OSError:
        return False
    return len(head) == 4 and int.from_bytes(head, "little") == DYNAMIC_MAGIC


def use_option(java_options: str) -> str | None:
    """The option that maps the archive for a driver JVM started with `java_options`, or
    None when there is none (off, or not built yet)."""
    if not enabled():
        return None
    path = archive_path(java_options)
    # Spark splits extraJavaOptions at spaces: a cache path with one cannot be passed.
    if path is None or " " in path or not is_archive(path):
        return None
    return f"-XX:SharedArchiveFile={path}"


# --- building -------------------------------------------------------------------------------------


def _identity(batches: Iterator[object]) -> Iterator[object]:
    """The build's job: batches through a Python worker unchanged (per_log's shape)."""
    yield from batches


def build(java_options: str) -> str:
    """Build the archive for `java_options` now (in this process: it starts a SparkSession,
    so call it where none runs, e.g. `python -m spark_jobs.jvm_archive build`). Its path."""
    path = archive_path(java_options)
    if path is None:
        raise JvmArchiveNotBuilt("no java binary or no Spark jars found")
    if " " in path:
        raise JvmArchiveNotBuilt(f"{path}: a JVM option cannot name a path with a space")
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    temp = f"{path}.tmp-{os.getpid()}"
    from spark_jobs.session import JAVA_OPTIONS_KEY, get_spark

    # -Xlog: the dump names every class it leaves out (hundreds of lines), as warnings.
    dump = f"-XX:ArchiveClassesAtExit={temp} -Xlog:cds*=off"
    conf = {JAVA_OPTIONS_KEY: f"{java_options} {dump}".strip()}
    started = time.monotonic()
    try:
        spark = get_spark("spark_jobs jvm archive", "local[2]", conf, data_sources=False)
        # The driver JVM (spark-submit exec's it): py4j offers no public handle on it.
        process = spark.sparkContext._gateway.proc  # noqa: SLF001
        frame = spark.range(0, 2, 1, numPartitions=2).mapInArrow(_identity, "id BIGINT")
        frame.collect()
        spark.stop()
        # The JVM exits when its stdin closes (PythonGatewayServer), and dumps then.
        process.stdin.close()
        wait_s = max(1.0, min(JVM_EXIT_WAIT_S_MAX, BUILD_S_MAX - (time.monotonic() - started)))
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise JvmArchiveNotBuilt(f"the JVM did not exit within {wait_s:.0f} s") from None
        if not is_archive(temp):
            raise JvmArchiveNotBuilt(f"the JVM exited ({process.returncode}) without an archive")
        os.replace(temp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temp)
    _remove_others(directory, keep=os.path.basename(path))
    return path


def _remove_others(directory: str, keep: str) -> None:
    """Archives of other fingerprints (each ~150 MB), and temporary files of builds that
    are no longer running."""
    for name in os.listdir(directory):
        if not name.startswith(PREFIX) or name == keep:
            continue
        if ".tmp-" in name and _alive(int(name.rsplit("-", 1)[1])):
            continue
        with contextlib.suppress(OSError):
            os.remove(os.path.join(directory, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def build_in_background(java_options: str) -> bool:
    """Start `python -m spark_jobs.jvm_archive build` detached (its own session, no output)
    unless the archive exists, the archive is off, or a build runs already. Whether one was
    started."""
    if not enabled() or use_option(java_options) is not None:
        return False
    path = archive_path(java_options)
    if path is None or " " in path:
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock = os.path.join(os.path.dirname(path), LOCK)
    with contextlib.suppress(FileNotFoundError):
        if time.time() - os.stat(lock).st_mtime > LOCK_STALE_S:
            os.remove(lock)
    try:
        handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.close(handle)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "spark_jobs.jvm_archive", "build", "--options", java_options]
    argv += ["--lock", lock]
    try:
        subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        os.remove(lock)
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    import argparse

    from spark_jobs.session import LEAN_JVM_OPTIONS

    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.jvm_archive",
        description="The driver JVM's class-data archive for replay_as_of and lsn_audit on "
        "Spark (a faster JVM start): build it now, or say where it is.",
    )
    parser.add_argument("action", choices=["build", "status"])
    parser.add_argument("--options", default=LEAN_JVM_OPTIONS, help=argparse.SUPPRESS)
    parser.add_argument("--lock", help=argparse.SUPPRESS)  # a background build's lock
    args = parser.parse_args(argv)
    try:
        if args.action == "status":
            path = archive_path(args.options)
            state = "off" if not enabled() else "built" if path and is_archive(path) else "none"
            print(f"jvm archive: {state}: {path or 'no java or no Spark jars found'}")
            return 0
        try:
            built = build(args.options)
        except (JvmArchiveNotBuilt, OSError, RuntimeError) as exc:  # RuntimeError: no JVM started
            print(f"jvm archive: not built: {exc}", file=sys.stderr)
            return 1
        print(f"jvm archive: built {built}")
        return 0
    finally:
        if args.lock:
            with contextlib.suppress(FileNotFoundError):
                os.remove(args.lock)


if __name__ == "__main__":
    sys.exit(main())
