"""configs/logsvc@.service runs `logsvc serve --config /etc/logsvc/<node id>.toml` as the
logsvc user, restarts on failure but not on a config error, gives the daemon more time to
stop than its shutdown needs, is hardened with exactly the data directory writable (the
production example's data_dir), and documents the permissions of the config path.

How: the unit is parsed with configparser (systemd's syntax is close enough with
strict=False and no interpolation: `%i` is systemd's); where `systemd-analyze` exists,
`systemd-analyze verify` checks it for real, on a copy instanced as n1 whose ExecStart
names this checkout's `logsvc` (verify requires the binary to exist).
"""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from logsvc.config import EXIT_CONFIG_ERROR
from logsvc.node.admin_server import STOP_WAIT_S_MAX
from logsvc.node.daemon import SHUTDOWN_GRACE_S
from logsvc.store.store import SYNCER_JOIN_S_MAX

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
UNIT = CONFIGS / "logsvc@.service"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    parser.read_string(UNIT.read_text())
    return parser


def seconds(value: str) -> float:
    found = re.fullmatch(r"(\d+)\s*(s|sec|min)?", value)
    assert found, value
    return int(found.group(1)) * (60 if found.group(2) == "min" else 1)


def test_exec_start_is_logsvc_serve_with_the_instance_config() -> None:
    service = unit()["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv == [
        "/opt/logsvc/.venv/bin/logsvc",
        "serve",
        "--config",
        "/etc/logsvc/%i.toml",
    ]
    assert service["User"] == "logsvc"
    assert service["Type"] == "exec"


def test_restart_and_stop_policy() -> None:
    service = unit()["Service"]
    assert service["Restart"] == "on-failure"
    assert str(EXIT_CONFIG_ERROR) in service["RestartPreventExitStatus"].split()
    assert service["KillSignal"] == "SIGTERM"
    # The daemon's stop: drain the data plane, stop the admin server, then join each
    # store's syncer (Raft threads are joined with the same bound).
    assert seconds(service["TimeoutStopSec"]) > (
        SHUTDOWN_GRACE_S + STOP_WAIT_S_MAX + SYNCER_JOIN_S_MAX
    )
    assert int(service["LimitNOFILE"]) >= 4096


def test_hardening_leaves_only_the_data_dir_writable() -> None:
    service = unit()["Service"]
    for key, value in (
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("ProtectHome", "yes"),
    ):
        assert service[key] == value, key
    assert service["ReadWritePaths"].split() == ["/var/lib/logsvc/%i"]
    # The production example (node n1) keeps its data where the unit lets it write.
    example = tomllib.loads((CONFIGS / "production-example.toml").read_text())
    node_id = example["node"]["id"]
    assert example["node"]["data_dir"] == service["ReadWritePaths"].replace("%i", node_id)
    assert f"/etc/logsvc/{node_id}.toml" in (CONFIGS / "production-example.toml").read_text()


def test_the_permissions_of_the_config_path_are_documented() -> None:
    for text in (UNIT.read_text(), (CONFIGS / "README.md").read_text()):
        assert "/etc/logsvc" in text
        assert "chmod 600" in text
        assert "640" in text  # a config without inline secrets
        assert "root:logsvc" in text
        assert "logsvc:logsvc" in text


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package: systemd)")
    logsvc = Path(sys.executable).parent / "logsvc"
    if not logsvc.exists():
        pytest.skip(f"{logsvc} is missing: the package is not installed in this venv")
    instance = tmp_path / "logsvc@n1.service"
    instance.write_text(UNIT.read_text().replace("/opt/logsvc/.venv/bin/logsvc", str(logsvc)))

    done = subprocess.run(
        [analyze, "verify", str(instance)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    # verify exits 0 on unknown keys and bad values ("..., ignoring"): any line about our
    # file is a mistake in it.
    assert instance.name not in output, output
