"""tn.toml and cn.toml (engine/tn/config.py): the commented examples in configs/ load, and
every bad value is refused naming its key, with exit code 2 and no traceback, from each of
`engine serve`, `engine promote` and `engine cn`.

How: the examples are copied next to the files they name (a token of mode 600, a logsvc
client.toml); each bad case is one small edit of a valid file, run through the CLI's `main`
in-process (stderr captured); one case runs `python -m engine serve` as a process, to show
the exit code and the single line a shell sees.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engine import limits as engine_limits
from engine.cli import main
from engine.compaction import Policy
from engine.tn.config import load_cn, load_tn
from engine.tn.watch import WatchPolicy

CONFIGS = Path(__file__).resolve().parents[4] / "configs"
TOKEN = "tn-token-0123456789"

TN_TOML = """\
[tn]
data_dir = "tn1"
listen = "127.0.0.1:7901"
token_file = "tn.token"
peers = ["127.0.0.1:7902"]

[wal]
client_config = "cluster/client.toml"
shard = 1

[objects]
dir = "objects"
"""

CN_TOML = """\
tns = ["127.0.0.1:7901", "127.0.0.1:7902"]
token_file = "tn.token"

[objects]
dir = "objects"
"""

S3 = """
[objects.s3]
endpoint = "127.0.0.1:9000"
bucket = "tae"
access_key_file = "tn.token"
secret_key_file = "tn.token"
"""


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


@pytest.fixture
def base(tmp_path: Path) -> Path:
    private(tmp_path / "tn.token", TOKEN + "\n")
    (tmp_path / "cluster").mkdir()
    private(tmp_path / "cluster" / "token", "logsvc-token-0123456789\n")
    (tmp_path / "cluster" / "client.toml").write_text(
        'addresses = ["127.0.0.1:7101"]\ntoken_file = "token"\n'
    )
    return tmp_path


def test_the_examples_load(base: Path) -> None:
    for name in ("tn.toml", "cn.toml"):
        shutil.copy(CONFIGS / name, base / name)
    tn = load_tn(str(base / "tn.toml"))
    assert (tn.listen, tn.peers, tn.shard) == ("127.0.0.1:7901", ("127.0.0.1:7902",), 1)
    assert tn.token == TOKEN and TOKEN not in repr(tn)
    assert tn.objects.dir == str(base / "objects") and tn.data_dir == str(base / "tn1")
    assert tn.client_config == str(base / "cluster" / "client.toml")
    assert tn.watch == WatchPolicy()
    assert tn.maintenance == Policy(snapshot_grace_ms=engine_limits.CN_SNAPSHOT_GRACE_MS)
    cn = load_cn(str(base / "cn.toml"))
    assert cn.tns == ("127.0.0.1:7901", "127.0.0.1:7902") and cn.token == TOKEN
    assert cn.objects.dir == str(base / "objects")


def test_maintenance_overrides_the_engine_defaults(base: Path) -> None:
    text = TN_TOML + "\n[maintenance]\ncheckpoint_interval_ms = 1000\n"
    text += "checkpoint_wal_reserve_entries = 7\nhistory_retention_ms = 86400000\n"
    (base / "tn.toml").write_text(text)
    policy = load_tn(str(base / "tn.toml")).maintenance
    assert policy == Policy(
        checkpoint_interval_ms=1000,
        checkpoint_wal_reserve_entries=7,
        history_retention_ms=86_400_000,
        snapshot_grace_ms=engine_limits.CN_SNAPSHOT_GRACE_MS,
    )


def test_s3_objects_load(base: Path) -> None:
    (base / "tn.toml").write_text(TN_TOML.replace('[objects]\ndir = "objects"\n', S3))
    s3 = load_tn(str(base / "tn.toml")).objects.s3
    assert s3 is not None
    assert (s3.endpoint, s3.bucket, s3.prefix, s3.scheme) == ("127.0.0.1:9000", "tae", "", "http")
    assert TOKEN not in repr(s3)


Edit = Callable[[str], str]


def replace(old: str, new: str) -> Edit:
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new)

    return edit


def append(more: str) -> Edit:
    return lambda text: text + more


TN_CASES: list[tuple[str, Edit, str]] = [
    ("unknown section", append("[tnn]\nx = 1\n"), "tnn"),
    ("a typo", replace("listen =", "listne ="), "tn.listne"),
    ("missing listen", replace('listen = "127.0.0.1:7901"\n', ""), "tn.listen"),
    ("listen not host:port", replace('"127.0.0.1:7901"', '"7901"'), "tn.listen"),
    ("listen on the wildcard", replace('"127.0.0.1:7901"', '"0.0.0.0:7901"'), "tn.listen"),
    (
        "token twice",
        replace('token_file = "tn.token"', 'token_file = "tn.token"\ntoken = "t"'),
        "tn.token",
    ),
    ("no token", replace('token_file = "tn.token"\n', ""), "tn.token"),
    ("token file missing", replace('"tn.token"', '"nope"'), "tn.token_file"),
    (
        "peers not a list",
        replace('peers = ["127.0.0.1:7902"]', 'peers = "127.0.0.1:7902"'),
        "tn.peers",
    ),
    ("a bad peer", replace('"127.0.0.1:7902"', '"127.0.0.1"'), "tn.peers[0]"),
    ("peers list itself", replace('"127.0.0.1:7902"', '"127.0.0.1:7901"'), "tn.peers"),
    ("cache_bytes too small", replace("peers =", "cache_bytes = 10\npeers ="), "tn.cache_bytes"),
    ("cache_bytes a bool", replace("peers =", "cache_bytes = true\npeers ="), "tn.cache_bytes"),
    ("log_level", replace("peers =", 'log_level = "loud"\npeers ='), "tn.log_level"),
    ("log_format", replace("peers =", 'log_format = "xml"\npeers ='), "tn.log_format"),
    ("no [wal]", replace('[wal]\nclient_config = "cluster/client.toml"\nshard = 1\n', ""), "wal"),
    ("shard 0", replace("shard = 1", "shard = 0"), "wal.shard"),
    ("shard a string", replace("shard = 1", 'shard = "1"'), "wal.shard"),
    (
        "no client.toml",
        replace('"cluster/client.toml"', '"cluster/none.toml"'),
        "wal.client_config",
    ),
    ("dir and s3", append(S3), "objects.dir"),
    ("no [objects]", replace('[objects]\ndir = "objects"\n', ""), "objects"),
    (
        "s3 without a bucket",
        replace('[objects]\ndir = "objects"\n', S3.replace('bucket = "tae"\n', "")),
        "objects.s3.bucket",
    ),
    (
        "s3 over ftp",
        replace('[objects]\ndir = "objects"\n', S3 + 'scheme = "ftp"\n'),
        "objects.s3.scheme",
    ),
    ("watch failures 0", append("[watch]\nfailures_to_promote = 0\n"), "watch.failures_to_promote"),
    (
        "watch window too short",
        append("[watch]\nfailure_window_ms_max = 100\n"),
        "watch.failure_window_ms_max",
    ),
    ("watch typo", append("[watch]\nprobe_intervall_ms = 100\n"), "watch.probe_intervall_ms"),
    (
        "checkpoint interval 0",
        append("[maintenance]\ncheckpoint_interval_ms = 0\n"),
        "maintenance.checkpoint_interval_ms",
    ),
    (
        "maintenance typo",
        append("[maintenance]\nflush_age = 1000\n"),
        "maintenance.flush_age",
    ),
    (
        "a negative reserve",
        append("[maintenance]\ncheckpoint_wal_reserve_entries = -1\n"),
        "maintenance.checkpoint_wal_reserve_entries",
    ),
    (
        "a negative history window",
        append("[maintenance]\nhistory_retention_ms = -1\n"),
        "maintenance.history_retention_ms",
    ),
    (
        "a history window of seconds typed as milliseconds... times 1000",
        append("[maintenance]\nhistory_retention_ms = 86400000000\n"),
        "maintenance.history_retention_ms",
    ),
]

CN_CASES: list[tuple[str, Edit, str]] = [
    ("no tns", replace('tns = ["127.0.0.1:7901", "127.0.0.1:7902"]\n', ""), "tns"),
    ("empty tns", replace('["127.0.0.1:7901", "127.0.0.1:7902"]', "[]"), "tns"),
    ("a bad tn", replace('"127.0.0.1:7902"', '"nowhere"'), "tns[1]"),
    ("a typo", replace("tns =", 'clinet_id = "x"\ntns ='), "clinet_id"),
    ("an empty client_id", replace("tns =", 'client_id = ""\ntns ='), "client_id"),
    ("no objects", replace('[objects]\ndir = "objects"\n', ""), "objects"),
    ("a zero timeout", append("[client]\nrequest_timeout_ms = 0\n"), "client.request_timeout_ms"),
]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("edit", "key"), [case[1:] for case in TN_CASES], ids=[case[0] for case in TN_CASES]
)
def test_a_bad_tn_toml_exits_2_naming_the_key(
    base: Path, edit: Edit, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = base / "tn.toml"
    config.write_text(edit(TN_TOML))
    for command in ("serve", "promote"):
        code, err = run_cli([command, "--config", str(config)], capsys)
        assert code == 2, err
        assert err.startswith(f"config error: {key}: "), err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("edit", "key"), [case[1:] for case in CN_CASES], ids=[case[0] for case in CN_CASES]
)
def test_a_bad_cn_toml_exits_2_naming_the_key(
    base: Path, edit: Edit, key: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = base / "cn.toml"
    config.write_text(edit(CN_TOML))
    code, err = run_cli(["cn", "--config", str(config), "status"], capsys)
    assert code == 2, err
    assert err.startswith(f"config error: {key}: "), err


def test_secrets_in_readable_files_are_refused(
    base: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.chmod(base / "tn.token", 0o644)
    (base / "tn.toml").write_text(TN_TOML)
    code, err = run_cli(["serve", "--config", str(base / "tn.toml")], capsys)
    assert code == 2 and err.startswith("config error: tn.token_file: ") and "chmod 600" in err
    inline = TN_TOML.replace('token_file = "tn.token"', f'token = "{TOKEN}"')
    (base / "tn.toml").write_text(inline)
    os.chmod(base / "tn.toml", 0o644)
    code, err = run_cli(["serve", "--config", str(base / "tn.toml")], capsys)
    assert code == 2 and err.startswith(f"config error: {base / 'tn.toml'}: ") and TOKEN not in err
    os.chmod(base / "tn.toml", 0o600)
    assert load_tn(str(base / "tn.toml")).token == TOKEN


def test_bad_toml_names_the_file(base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (base / "tn.toml").write_text("[tn\n")
    code, err = run_cli(["serve", "--config", str(base / "tn.toml")], capsys)
    assert code == 2 and err.startswith(f"config error: {base / 'tn.toml'}: ")


def test_the_process_exits_2_with_one_line(base: Path) -> None:
    (base / "tn.toml").write_text(TN_TOML.replace("shard = 1", "shard = -1"))
    done = subprocess.run(
        [sys.executable, "-m", "engine", "serve", "--config", str(base / "tn.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "config error: wal.shard: must be in 1..4294967295 (got -1)"
