"""Kernel-level network faults in a throwaway network namespace (chaos-plan §3, §4.3).

The proxy mesh (proxy.py) is the default; this is the optional kernel option for one CI
scenario and soak: real packet loss (TCP retransmits, the stream stays intact), and
partitions that the nodes cannot tell from a cable pull. It needs root, `unshare`, `ip`
and `iptables` (Debian: `apt-get install -y iptables`); `available()` says whether they
work here and, if not, why.

Nothing ever touches the host's rules: a whole scenario runs inside `unshare --net`
(`run_in_netns`, which re-executes a command there after bringing `lo` up), and
`KernelNet` refuses to run outside a private namespace. When the command exits, the
namespace and every rule in it vanish. `unshare --net` makes no PID namespace: whoever
starts processes inside must stop them (run_in_netns kills its process group on timeout).

All nodes share 127.0.0.1, so rules tell them apart by the process's group id: each node
runs under its own gid (`popen_group(gid)` for subprocess.Popen, or `setpriv_argv`), and
iptables matches `-m owner --gid-owner G` on OUTPUT (locally generated packets are owned by
the sending socket's process). pysyncobj uses one TCP connection per pair, dialled by
either side, so "nothing from A reaches B" takes two rules:

    A's packets to B's listening ports   -m owner --gid-owner A -m multiport --dports PB
    A's packets on connections B dialled -m owner --gid-owner A -m connmark --mark B

the second relying on a mangle rule that marks each new connection with the gid of the
process that opened it. Loss is `-m statistic --mode random --probability p` on one gid's
packets. Every rule lives in our own chain (LOGSVC_CHAOS) and carries a comment, so
`heal()` is one flush and `counters()` reports packets dropped per fault (a scenario
confirms that its fault took effect). The kernel has no netem: no delay or reorder here
(use the proxy).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Set by `run_in_netns` for the command it runs: the namespace it was started from (the
# host's). Where PID 1's namespace cannot be read (here: a VM whose init we may not
# inspect), this is how `inside_private_netns` knows it is not on the host.
NETNS_ENV = "LOGSVC_CHAOS_HOST_NETNS"
CHAIN = "LOGSVC_CHAOS"
COMMENT_PREFIX = "logsvc-chaos:"
# Node i runs under gid GID_BASE + i: far from system and user groups; no /etc/group entry
# is needed to run under a gid.
GID_BASE = 47_000
# One iptables call; the xtables lock is waited for at most IPTABLES_LOCK_S of it.
IPTABLES_S_MAX = 15.0
IPTABLES_LOCK_S = 5
# iptables' multiport match takes at most 15 ports per rule.
MULTIPORT_PORTS_MAX = 15
# Probing availability runs one throwaway namespace.
PROBE_S_MAX = 20.0


@dataclass(frozen=True, slots=True)
class NodeNet:
    """How the kernel tells a node apart: its gid, and the ports it listens on (its Raft
    ports, one per shard)."""

    gid: int
    ports: tuple[int, ...]

    def __post_init__(self) -> None:
        assert self.gid > 0, "gid 0 is the harness's own (root)"
        assert self.ports, "a node listens on at least one port"
        assert all(1 <= port <= 65535 for port in self.ports)


def gid_for(index: int) -> int:
    """The gid of the index-th node (0-based)."""
    assert 0 <= index < 1000
    return GID_BASE + index


def popen_group(gid: int) -> dict[str, Any]:
    """subprocess.Popen keyword arguments to run a child under `gid` with no supplementary
    groups (what `setpriv --regid G --clear-groups` does; needs root)."""
    return {"group": gid, "extra_groups": []}


def setpriv_argv(gid: int, argv: Sequence[str]) -> list[str]:
    """`argv` run under `gid` through setpriv (for shells and non-Python launchers)."""
    return ["setpriv", f"--regid={gid}", "--clear-groups", "--", *argv]


# ------------------------------------------------------------------ the namespace


def _netns_id(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def inside_private_netns() -> bool:
    """True when this process's network namespace is known not to be the host's: it
    differs from PID 1's or, where that cannot be read, from the one `run_in_netns` was
    started from. When in doubt, False (never touch what may be the host's rules)."""
    own = _netns_id("self")
    if own is None:
        return False
    init = _netns_id("1")
    if init is not None:
        return own != init
    host = os.environ.get(NETNS_ENV, "")
    return bool(host) and host != own


def netns_argv(argv: Sequence[str]) -> list[str]:
    """`argv` run in a new network namespace whose loopback is up."""
    return ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]


def run_in_netns(
    argv: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` in a throwaway network namespace; capture its output (text). On timeout
    its whole process group is killed and TimeoutError raised. Needs root."""
    child_env = dict(os.environ if env is None else env)
    host = _netns_id("self")
    assert host is not None, "no /proc/self/ns/net"
    # A nested call keeps the outermost (host) namespace.
    child_env[NETNS_ENV] = host if not inside_private_netns() else os.environ[NETNS_ENV]
    process = subprocess.Popen(
        netns_argv(argv),
        env=child_env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=10)
        raise TimeoutError(
            f"{argv} in a network namespace ran over {timeout_s} s\n"
            f"stdout:\n{stdout[-4000:]}\nstderr:\n{stderr[-4000:]}"
        ) from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def pytest_in_netns(
    node_id: str, *, timeout_s: float, extra_args: Sequence[str] = (), cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Re-run one pytest test (e.g. "tests/chaos/test_scenarios.py::test_c10") inside a
    throwaway namespace. The test itself checks `inside_private_netns()` to know it is the
    inner run."""
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node_id]
    return run_in_netns([*argv, *extra_args], timeout_s=timeout_s, cwd=cwd)


_PROBE_SCRIPT = """
set -e
ip link set lo up
iptables -w 5 -t mangle -A OUTPUT -m conntrack --ctstate NEW -m owner --gid-owner 47999 \
    -j CONNMARK --set-mark 47999
iptables -w 5 -A OUTPUT -p tcp -m owner --gid-owner 47998 -m multiport --dports 1,2 \
    -m comment --comment probe -j DROP
iptables -w 5 -A OUTPUT -m owner --gid-owner 47998 -m connmark --mark 47999 -j DROP
iptables -w 5 -A OUTPUT -m owner --gid-owner 47998 -m statistic --mode random \
    --probability 0.5 -j DROP
iptables -w 5 -L OUTPUT -v -x -n >/dev/null
"""


@functools.cache
def available() -> tuple[bool, str]:
    """(True, what was checked) if kernel-level faults work here, else (False, why not)."""
    if os.geteuid() != 0:
        return False, "needs root (unshare --net, iptables)"
    for tool, package in (("unshare", "util-linux"), ("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return False, f"{tool} not found (apt-get install -y {package})"
    if not os.path.exists("/proc/self/ns/net"):
        return False, "no network namespaces (/proc/self/ns/net missing)"
    try:
        probe = subprocess.run(
            ["unshare", "--net", "--", "sh", "-c", _PROBE_SCRIPT],
            capture_output=True,
            text=True,
            timeout=PROBE_S_MAX,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"unshare --net failed: {exc}"
    if probe.returncode != 0:
        why = (probe.stderr or probe.stdout).strip().splitlines()
        return False, f"iptables in a new namespace failed: {why[-1] if why else probe.returncode}"
    return True, "root; unshare --net; iptables owner, multiport, connmark, statistic, comment"


# ------------------------------------------------------------------ the rules


class KernelNet:
    """iptables faults between nodes, in the current private network namespace.

    `install()` once before starting the nodes (connections are marked as they open);
    `block`, `partition`, `isolate` and `loss` add rules; `heal` removes them all;
    `counters` reads what each fault matched (packets, bytes), keyed by its name
    ("block:a->b", "loss:a").
    """

    def __init__(self, nodes: Mapping[str, NodeNet], *, iptables: str = "iptables") -> None:
        if not inside_private_netns():
            raise RuntimeError(
                "KernelNet runs only inside a private network namespace (run_in_netns): "
                "it must never change the host's rules"
            )
        gids = [node.gid for node in nodes.values()]
        assert len(set(gids)) == len(gids), "each node needs its own gid"
        self.nodes = dict(nodes)
        self._iptables = iptables
        self._installed = False

    def install(self) -> None:
        assert not self._installed
        self._run("-N", CHAIN)
        self._run("-I", "OUTPUT", "1", "-j", CHAIN)
        for name, node in sorted(self.nodes.items()):
            # Each new connection remembers the gid of the node that opened it.
            self._run(
                "-t", "mangle", "-A", "OUTPUT",
                "-m", "conntrack", "--ctstate", "NEW",
                "-m", "owner", "--gid-owner", str(node.gid),
                "-m", "comment", "--comment", f"{COMMENT_PREFIX}mark:{name}",
                "-j", "CONNMARK", "--set-mark", str(node.gid),
            )  # fmt: skip
        self._installed = True

    def block(self, src: str, dst: str) -> None:
        """Drop every packet node `src` sends to node `dst` (one way)."""
        assert self._installed, "install() first"
        sender, receiver = self.nodes[src], self.nodes[dst]
        assert src != dst
        comment = f"{COMMENT_PREFIX}block:{src}->{dst}"
        owner = ["-m", "owner", "--gid-owner", str(sender.gid)]
        ports = sorted(receiver.ports)
        for lo in range(0, len(ports), MULTIPORT_PORTS_MAX):
            chunk = ",".join(str(port) for port in ports[lo : lo + MULTIPORT_PORTS_MAX])
            self._run(
                "-A", CHAIN, "-p", "tcp", *owner, "-m", "multiport", "--dports", chunk,
                "-m", "comment", "--comment", comment, "-j", "DROP",
            )  # fmt: skip
        self._run(
            "-A", CHAIN, *owner, "-m", "connmark", "--mark", str(receiver.gid),
            "-m", "comment", "--comment", comment, "-j", "DROP",
        )  # fmt: skip

    def partition(self, a: str, b: str) -> None:
        """Nothing passes between a and b, either way."""
        self.block(a, b)
        self.block(b, a)

    def isolate(self, node: str) -> None:
        """`node` is cut off from every other node."""
        for other in sorted(self.nodes):
            if other != node:
                self.partition(node, other)

    def loss(self, node: str, probability: float) -> None:
        """Drop each packet `node` sends with `probability` (to anyone, TCP and UDP)."""
        assert self._installed, "install() first"
        assert 0.0 < probability <= 1.0
        self._run(
            "-A", CHAIN, "-m", "owner", "--gid-owner", str(self.nodes[node].gid),
            "-m", "statistic", "--mode", "random", "--probability", f"{probability:.6f}",
            "-m", "comment", "--comment", f"{COMMENT_PREFIX}loss:{node}", "-j", "DROP",
        )  # fmt: skip

    def heal(self) -> None:
        """Remove every fault (connection marks stay: they only label)."""
        self._run("-F", CHAIN)

    def counters(self) -> dict[str, tuple[int, int]]:
        """Fault name -> (packets, bytes) dropped so far by its rules (summed)."""
        listing = self._run("-L", CHAIN, "-v", "-x", "-n")
        totals: dict[str, tuple[int, int]] = {}
        for line in listing.splitlines():
            found = _COUNTER_LINE.match(line)
            if found is None:
                continue
            name = found.group("name")
            packets, size = totals.get(name, (0, 0))
            totals[name] = (packets + int(found.group("packets")), size + int(found.group("bytes")))
        return totals

    def rules(self) -> str:
        """Our chain and marks, as `iptables -S` prints them (for a scenario's log)."""
        return self._run("-S", CHAIN) + self._run("-t", "mangle", "-S", "OUTPUT")

    def _run(self, *args: str) -> str:
        argv = [self._iptables, "-w", str(IPTABLES_LOCK_S), *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=IPTABLES_S_MAX)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
        return done.stdout


_COUNTER_LINE = re.compile(
    rf"\s*(?P<packets>\d+)\s+(?P<bytes>\d+)\s.*/\* {re.escape(COMMENT_PREFIX)}(?P<name>\S+) \*/"
)


# ------------------------------------------------------------------ the self-check
#
# `python -m tests.chaos.harness.netns self-check`, run inside a throwaway namespace by
# tests/chaos/test_netns.py, prints one JSON object of what it observed. The helper roles
# below run as child processes under a node's gid.


def _child(role: str, *args: str, gid: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.chaos.harness.netns", role, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        **popen_group(gid),
    )


def _ask(child: subprocess.Popen[str], line: str) -> str:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(line + "\n")
    child.stdin.flush()
    return child.stdout.readline().strip()


def _serve() -> None:
    """Role `serve`: an echo server; prints its port, serves until its stdin closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)

    def echo(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    sys.stdin.read()  # until EOF: the self-check is done (daemon threads end with us)


def _client() -> None:
    """Role `client`: one command per stdin line, one answer line each.
    `connect PORT` (a fresh connection), `send` (on the held one), `udp PORT COUNT`."""
    held: socket.socket | None = None
    for line in sys.stdin:
        words = line.split()
        try:
            if words[0] == "connect":
                with socket.create_connection(("127.0.0.1", int(words[1])), timeout=1.0) as s:
                    s.sendall(b"x")
                    answer = "ok" if s.recv(1) == b"x" else "closed"
            elif words[0] == "hold":
                held = socket.create_connection(("127.0.0.1", int(words[1])), timeout=1.0)
                answer = "ok"
            elif words[0] == "send":
                assert held is not None
                held.sendall(b"y")
                answer = "ok" if held.recv(1) == b"y" else "closed"
            elif words[0] == "udp":
                refused = 0  # a datagram dropped in OUTPUT fails sendto with EPERM
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    for _ in range(int(words[2])):
                        try:
                            s.sendto(b"u", ("127.0.0.1", int(words[1])))
                        except PermissionError:
                            refused += 1
                answer = f"sent, {refused} refused"
            else:
                answer = f"unknown {words[0]}"
        except TimeoutError:
            answer = "timeout"
        except OSError as exc:
            answer = type(exc).__name__
        print(answer, flush=True)


def self_check() -> dict[str, Any]:
    """Two nodes a, b under their own gids, in this (private) namespace."""
    result: dict[str, Any] = {}
    children: list[subprocess.Popen[str]] = []
    try:
        server_a = _child("serve", gid=gid_for(0))
        server_b = _child("serve", gid=gid_for(1))
        children += [server_a, server_b]
        assert server_a.stdout is not None and server_b.stdout is not None
        port_a, port_b = int(server_a.stdout.readline()), int(server_b.stdout.readline())
        net = KernelNet({"a": NodeNet(gid_for(0), (port_a,)), "b": NodeNet(gid_for(1), (port_b,))})
        net.install()
        client_a = _child("client", gid=gid_for(0))
        client_b = _child("client", gid=gid_for(1))
        children += [client_a, client_b]
        result["before"] = [
            _ask(client_a, f"connect {port_b}"),
            _ask(client_b, f"connect {port_a}"),
        ]
        result["hold"] = _ask(client_b, f"hold {port_a}")  # b dials a, before the fault

        net.block("a", "b")  # a's packets to b, including replies on b's connection
        result["one_way"] = {
            "a_dials_b": _ask(client_a, f"connect {port_b}"),
            # b's SYN arrives; a's SYN-ACK (owned by a's listener) is dropped.
            "b_dials_a": _ask(client_b, f"connect {port_a}"),
            "held_reply": _ask(client_b, "send"),
        }
        net.heal()
        net.partition("a", "b")
        result["partition"] = [
            _ask(client_a, f"connect {port_b}"),
            _ask(client_b, f"connect {port_a}"),
        ]
        net.heal()
        result["healed"] = [
            _ask(client_a, f"connect {port_b}"),
            _ask(client_b, f"connect {port_a}"),
        ]

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:  # gid 0: no rules
            # Room for every datagram: the sink reads only after the client sent them all.
            sink.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
            sink.bind(("127.0.0.1", 0))
            sink.settimeout(0.5)
            net.loss("a", 0.5)
            sent = 200
            result["udp"] = _ask(client_a, f"udp {sink.getsockname()[1]} {sent}")
            received = 0
            with contextlib.suppress(TimeoutError):
                while received < sent:
                    sink.recv(16)
                    received += 1
        result["loss"] = {"sent": sent, "received": received, "dropped": net.counters()}
        result["rules"] = net.rules()
    finally:
        for child in children:
            if child.stdin is not None:
                with contextlib.suppress(OSError):
                    child.stdin.close()
        deadline = time.monotonic() + 5
        for child in children:
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(5)
    return result


def _main(argv: Sequence[str]) -> int:
    if argv[:1] == ["serve"]:
        _serve()
    elif argv[:1] == ["client"]:
        _client()
    elif argv[:1] == ["self-check"]:
        print(json.dumps(self_check(), sort_keys=True))
    else:
        print("usage: python -m tests.chaos.harness.netns self-check", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
