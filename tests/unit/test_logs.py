"""A node's log lines (logsvc/logs.py): `[node] log_format = "json"` gives one JSON object a
line with ts, level, logger, msg, node, and shard and term when known, a traceback as a
string field; "text" carries the same facts; `log_level` filters; the secret and the token
never reach the output, even when a line tries to print them.

How: the formatters write to a StringIO; the daemon's own start-up (`serve()`, with its
event loop replaced by a coroutine that logs what a node logs) writes to captured stderr,
which is then parsed line by line and grepped for the secret values. The root logger's
handlers are restored after every test.
"""

from __future__ import annotations

import io
import json
import logging
import os
import threading
import tomllib
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from logsvc import logs
from logsvc.config import ConfigError, NodeConfig, load_node_config, parse_node_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SECRET = "cluster-secret-value-0123456789"
TOKEN = "client-token-value-9876543210"
JSON_KEYS_ALWAYS = ["ts", "level", "logger", "msg", "node"]


@pytest.fixture(autouse=True)
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        logs.bind_shard(None)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def configured(log_format: str, level: str = "debug") -> io.StringIO:
    stream = io.StringIO()
    logs.configure(
        node_id="n1", level=level, log_format=log_format, secrets=(SECRET, TOKEN), stream=stream
    )
    return stream


# ------------------------------------------------------------------------------ JSON


def test_json_lines_carry_the_schema() -> None:
    stream = configured("json")
    log = logging.getLogger("logsvc.raft")

    log.info("compacted the journal to raft index %d", 812, extra={"shard": 4, "term": 7})
    log.warning("no context here")

    first, second = json_lines(stream.getvalue())
    assert list(first) == [*JSON_KEYS_ALWAYS, "shard", "term"]
    assert first["level"] == "info"
    assert first["logger"] == "logsvc.raft"
    assert first["msg"] == "compacted the journal to raft index 812"
    assert (first["node"], first["shard"], first["term"]) == ("n1", 4, 7)
    assert first["ts"].endswith("Z")
    stamp = datetime.fromisoformat(first["ts"].replace("Z", "+00:00"))
    assert stamp.utcoffset() == timedelta(0)
    assert list(second) == JSON_KEYS_ALWAYS  # unknown shard and term are left out
    assert second["level"] == "warning"


def test_exception_info_is_one_string_field() -> None:
    stream = configured("json")
    try:
        raise ValueError("bad frame")
    except ValueError:
        logging.getLogger("logsvc.server").exception("internal error serving %s", "peer")

    [line] = json_lines(stream.getvalue())
    assert line["level"] == "error"
    assert isinstance(line["exc"], str)
    assert line["exc"].startswith("Traceback")
    assert "ValueError: bad frame" in line["exc"]
    assert "\n" not in stream.getvalue().strip()  # still one line


def test_a_bound_shard_names_every_line_of_its_thread_only() -> None:
    stream = configured("json")

    def replica_thread() -> None:
        logs.bind_shard(3)  # what a Raft tick thread does at its start
        logging.getLogger("pysyncobj.syncobj").info("a line from pysyncobj")
        logging.getLogger("logsvc.raft").info("explicit wins", extra={"shard": 5})

    thread = threading.Thread(target=replica_thread)
    thread.start()
    thread.join()
    logging.getLogger("logsvc.node").info("main thread")

    lines = json_lines(stream.getvalue())
    assert [line.get("shard") for line in lines] == [3, 5, None]


def test_log_level_filters() -> None:
    stream = configured("json", level="warning")
    logging.getLogger("logsvc.node").info("hidden")
    logging.getLogger("logsvc.node").error("shown")
    assert [line["msg"] for line in json_lines(stream.getvalue())] == ["shown"]


def test_text_lines_carry_the_same_facts() -> None:
    stream = configured("text")
    logging.getLogger("logsvc.raft").info("installed", extra={"shard": 2, "term": 9})
    logging.getLogger("logsvc.node").info("serving")

    first, second = stream.getvalue().splitlines()
    assert " INFO node=n1 shard=2 term=9 logsvc.raft: installed" in first
    assert " INFO node=n1 logsvc.node: serving" in second


def test_uvicorn_lines_go_through_the_node_format() -> None:
    """The admin server gives uvicorn no handlers of its own (log_config=None)."""
    from logsvc.node.admin_server import AdminServer

    stream = configured("json")
    AdminServer(object(), "127.0.0.1", 1)  # configures uvicorn's loggers; nothing starts
    logging.getLogger("uvicorn.error").warning("from uvicorn")

    [line] = json_lines(stream.getvalue())
    assert (line["logger"], line["msg"], line["node"]) == ("uvicorn.error", "from uvicorn", "n1")


def test_a_replica_names_its_shard_and_term(tmp_path: Path) -> None:
    """End to end: a real single-replica shard (its Raft tick thread binds the shard)
    compacts its journal, and the line saying so carries shard and term."""
    from logsvc.shard.raft.config import RaftConfig
    from logsvc.shard.replica import ReplicaConfig, ShardReplica

    from .shard.raft_harness import SECRET as RAFT_SECRET
    from .shard.raft_harness import free_port, wait_until

    stream = configured("json", level="info")
    raft = RaftConfig(
        self_address=f"127.0.0.1:{free_port()}",
        peers=(),
        secret=RAFT_SECRET,
        snapshot_path=str(tmp_path / "snapshot"),
        election_timeout_ms_min=200,
        election_timeout_ms_max=400,
        heartbeat_ms=50,
        leader_fallback_ms=1000,
    )
    replica = ShardReplica(ReplicaConfig(data_dir=str(tmp_path), raft=raft, node_id="n1", shard=5))
    try:
        replica.start()
        wait_until(lambda: replica.is_leader, "the single replica to lead")
        for round_ in range(2):
            for seq in range(1 + 5 * round_, 6 + 5 * round_):
                replica.append("writer", seq, (f"record {seq}".encode(),))
            replica.truncate(int(replica.status()["next_lsn"]) - 1)
        wait_until(lambda: "compacted the journal" in stream.getvalue(), "the compaction line")
    finally:
        replica.close()

    [line] = [x for x in json_lines(stream.getvalue()) if "compacted" in x["msg"]]
    assert (line["logger"], line["node"], line["shard"]) == ("logsvc.raft", "n1", 5)
    assert line["term"] >= 1


# ------------------------------------------------------------------------- secrets


def write_config(tmp_path: Path, log_format: str) -> Path:
    """local-n1.toml with the secret and token inline (so the file is mode 600) and the
    given log format."""
    text = (CONFIGS / "local-n1.toml").read_text()
    text = text.replace('secret_file = "secret"', f'secret = "{SECRET}"')
    text = text.replace('token_file = "token"', f'token = "{TOKEN}"')
    text = text.replace('log_level = "info"', f'log_level = "debug"\nlog_format = "{log_format}"')
    path = tmp_path / "n1.toml"
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_the_daemon_never_logs_the_secret_or_the_token(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    log_format: str,
) -> None:
    from logsvc.node import daemon

    path = write_config(tmp_path, log_format)
    config = load_node_config(str(path))
    assert (config.secret, config.token, config.log_format) == (SECRET, TOKEN, log_format)

    async def a_node_that_logs(config: NodeConfig, *_: object, **__: object) -> None:
        log = logging.getLogger("logsvc.node")
        log.info("starting with %r", config)  # the config's repr hides both
        log.debug("config %s", config)
        log.warning("careless line: secret=%s token=%s", config.secret, config.token)
        try:
            raise ConnectionError(f"handshake failed with password {config.secret}")
        except ConnectionError:
            log.exception("raft connection error", extra={"shard": 1, "term": 2})
        logging.getLogger("logsvc.raft").info("term %d", 2, extra={"shard": 1, "term": 2})

    monkeypatch.setattr(daemon, "_run", a_node_that_logs)
    assert daemon.serve(str(path)) == 0

    output = capsys.readouterr().err
    assert SECRET not in output
    assert TOKEN not in output
    assert output.count(logs.REDACTED) == 3  # the careless line twice, the traceback once
    if log_format == "json":
        lines = [line for line in json_lines(output) if line["logger"].startswith("logsvc")]
        assert len(lines) == 5
        assert {line["node"] for line in lines} == {"n1"}
        assert "exc" in lines[3]
        assert lines[4]["shard"] == 1 and lines[4]["term"] == 2
    else:
        assert "node=n1 shard=1 term=2 logsvc.raft: term 2" in output


# -------------------------------------------------------------------------- config


def document(**node: object) -> dict[str, Any]:
    data = tomllib.loads((CONFIGS / "local-n1.toml").read_text())
    data["node"].update(node)
    data["cluster"] = {
        "secret": SECRET,
        "token": TOKEN,
        "nodes": data["cluster"]["nodes"],
    }
    return data


def parse(data: dict[str, Any]) -> NodeConfig:
    return parse_node_config(data, source="/etc/logsvc/n1.toml")


def test_log_format_defaults_to_text_and_is_validated() -> None:
    assert parse(document()).log_format == "text"
    assert parse(document(log_format="json")).log_format == "json"
    for bad, rule in (("xml", "must be one of text, json (got 'xml')"), (1, "must be a string")):
        with pytest.raises(ConfigError) as refused:
            parse(document(log_format=bad))
        assert refused.value.key == "node.log_format"
        assert refused.value.rule.startswith(rule)


def test_the_production_example_logs_json() -> None:
    files = {"/etc/logsvc/secret": SECRET, "/etc/logsvc/token": TOKEN}
    path = CONFIGS / "production-example.toml"
    config = parse_node_config(
        tomllib.loads(path.read_text()), source=str(path), read_secret=lambda p, key: files[p]
    )
    assert (config.log_format, config.log_level) == ("json", "info")
