"""Kernel-level faults (tests/chaos/harness/netns.py) work in a throwaway namespace and leave
nothing behind on the host.

How: `available()` always answers with a reason. Where it is True (root, unshare, ip,
iptables), `python -m tests.chaos.harness.netns self-check` runs inside `unshare --net`:
two echo servers and two clients under the gids of nodes a and b. It reports what each
connection attempt saw before any fault, with a one-way block a->b (a cannot dial b; b's
SYN reaches a but the answer never returns; a's reply on a connection b opened earlier is
dropped), with a partition both ways, after healing, and how many of 200 UDP datagrams
from a survived a 50 % loss rule, against the rule's own counter. The host's rules are
compared before and after. Elsewhere the test skips with the reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos.harness import netns

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def host_rules() -> str:
    """Everything a leak would show up in: iptables (filter and mangle) and nft."""
    out = []
    for argv in (
        ["iptables", "-S"],
        ["iptables", "-t", "mangle", "-S"],
        ["nft", "list", "ruleset"],
    ):
        if shutil.which(argv[0]) is not None:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=15)
            out.append(done.stdout)
    return "\n".join(out)


def test_available_answers_with_a_reason() -> None:
    ok, reason = netns.available()
    assert isinstance(ok, bool)
    assert reason


def test_kernel_net_refuses_to_touch_the_host_namespace() -> None:
    if netns.inside_private_netns():
        pytest.skip("already inside a private namespace")
    with pytest.raises(RuntimeError, match="private network namespace"):
        netns.KernelNet({"a": netns.NodeNet(netns.gid_for(0), (7000,))})


def test_argv_builders() -> None:
    assert netns.netns_argv(["python", "-m", "x"])[:3] == ["unshare", "--net", "--"]
    assert netns.netns_argv(["python"])[-1] == "python"
    assert netns.setpriv_argv(47001, ["python"]) == [
        "setpriv",
        "--regid=47001",
        "--clear-groups",
        "--",
        "python",
    ]
    assert netns.popen_group(47001) == {"group": 47001, "extra_groups": []}


def test_partitions_and_loss_in_a_throwaway_namespace() -> None:
    ok, reason = netns.available()
    if not ok:
        pytest.skip(f"kernel-level faults unavailable: {reason}")
    before = host_rules()
    done = netns.run_in_netns(
        [sys.executable, "-m", "tests.chaos.harness.netns", "self-check"],
        timeout_s=90,
        cwd=str(REPO),
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert seen["before"] == ["ok", "ok"]
    assert seen["hold"] == "ok"
    assert seen["one_way"] == {
        "a_dials_b": "timeout",
        "b_dials_a": "timeout",
        "held_reply": "timeout",  # dropped by the connection-mark rule
    }
    assert seen["partition"] == ["timeout", "timeout"]
    assert seen["healed"] == ["ok", "ok"]

    loss = seen["loss"]
    dropped_packets, _ = loss["dropped"]["loss:a"]
    refused = int(seen["udp"].split(", ")[1].split()[0])
    # The rule's counter is what the sender saw (plus perhaps a retransmission of a's
    # echo on b's earlier connection, which is also a's).
    assert refused <= dropped_packets <= refused + 5
    assert loss["received"] + refused == loss["sent"]
    assert 0.25 * loss["sent"] <= refused <= 0.75 * loss["sent"]  # p = 0.5, 200 draws

    assert "LOGSVC_CHAOS" in seen["rules"]
    assert host_rules() == before, "the namespace's rules leaked to the host"
    assert "LOGSVC_CHAOS" not in before


def test_a_test_reruns_itself_inside_a_namespace() -> None:
    """The pattern for a kernel-level scenario: the outer run re-executes this very test in
    a throwaway namespace, where it finds itself inside and may install rules."""
    if netns.inside_private_netns():
        net = netns.KernelNet({"a": netns.NodeNet(netns.gid_for(0), (7000,))})
        net.install()
        net.loss("a", 0.1)
        assert "loss:a" in net.counters()
        return
    ok, reason = netns.available()
    if not ok:
        pytest.skip(f"kernel-level faults unavailable: {reason}")
    before = host_rules()
    done = netns.pytest_in_netns(
        f"{Path(__file__).relative_to(REPO)}::test_a_test_reruns_itself_inside_a_namespace",
        timeout_s=90,
        cwd=str(REPO),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert host_rules() == before
