"""The reachability check against real hosts: sshd, the nodes' own Python, nftables per namespace.

Transports are built in-process (as in test_ssh_transport.py); their sockets are opened inside the
controller's namespace. node1 is the master. Every test ends by proving that no probe process is
left on any host.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.steps.preflight.reachability import PROBE_TAG, ReachNode, check_reachability
from orchestrator.transports import SSHTransport
from tests import netns
from tests.cluster import NamespaceCluster
from tests.conftest import root_transport

PYTHON = "/usr/bin/python3"
PORT = 29500  # every host has its own network namespace: no clash with the machine or other runs
TABLE = "cbt_test"
#: a host firewall that drops incoming TCP except ssh; {replies} lets answers to its own connections in
RULES = """\
table inet cbt_test {{
    chain input {{
        type filter hook input priority 0; policy accept;
        tcp dport 22 accept
        {replies}
        ip protocol tcp drop
    }}
}}
"""


@pytest.fixture
def transports(cluster: NamespaceCluster, tmp_path: Path) -> Iterator[dict[str, SSHTransport]]:
    known = tmp_path / "known_hosts"
    known.write_text(cluster.known_hosts_text())
    config = tmp_path / "ssh_config"
    config.write_text("")
    made: dict[str, SSHTransport] = {}
    try:
        with netns.inside(cluster.controller_ns):
            for host in cluster.hosts:
                t = root_transport(cluster, host, known, config)
                made[host.name] = t
                t.connect()
        yield made
        # before closing: a closed channel has the node stop the command's process group anyway
        assert _probes_left(cluster) == []
    finally:
        for t in made.values():
            t.close()


def _nodes(cluster: NamespaceCluster, transports: dict[str, SSHTransport]) -> list[ReachNode]:
    return [ReachNode(h.name, transports[h.name], PYTHON, h.addr) for h in cluster.hosts]


def _probes_left(cluster: NamespaceCluster, timeout: float = 3.0) -> list[str]:
    """Probe processes in any host's namespace, once there are none or time is up.

    `pgrep` alone would see the whole machine (namespaces share one PID space, and concurrent runs
    have probes of their own): only processes inside this cluster's namespaces count.
    """
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for host in cluster.hosts:
            listed = ["ip", "netns", "pids", host.ns]
            pids = subprocess.run(listed, capture_output=True, text=True, check=False).stdout.split()
            for pid in pids:
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if PROBE_TAG.encode() in argv:
                    found.append(f"{host.name}: pid {pid} {b' '.join(argv[-6:])!r}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.fixture
def firewall(cluster: NamespaceCluster) -> Iterator[Callable[[str, bool], None]]:
    """Load RULES into one host's namespace (replies: let answers in); the table always goes again."""
    loaded: list[str] = []

    def load(ns: str, replies: bool) -> None:
        text = RULES.format(replies="ct state established,related accept" if replies else "")
        res = cluster.ns_run(ns, ["nft", "-f", "-"], input=text)
        assert res.returncode == 0, res.stderr
        loaded.append(ns)

    try:
        yield load
    finally:
        for ns in loaded:
            cluster.ns_run(ns, ["nft", "delete", "table", "inet", TABLE])


def test_all_ok_on_three_nodes(cluster: NamespaceCluster, transports: dict[str, SSHTransport]) -> None:
    begin = time.monotonic()
    verdicts = check_reachability(_nodes(cluster, transports), "node1", PORT)
    took = time.monotonic() - begin
    assert set(verdicts) == {"node1", "node2", "node3"}
    for name, v in verdicts.items():
        assert v.check == "reachability"
        assert (v.level, v.fix) == ("ok", None), f"{name}: {v.reason} / {v.fix}"
        assert v.reason == (
            f"master port {PORT} free and reachable from all; full mesh on ephemeral ports ok (6 pairs)"
        )
        assert all(p["result"] == "ok" and p["ms"] is not None for p in v.data["pairs"])
    # each node: 3 rendezvous connections at most (its own + 2 into the master), 4 mesh pairs
    assert len(verdicts["node1"].data["pairs"]) == 3 + 4
    assert len(verdicts["node2"].data["pairs"]) == 1 + 4
    assert took < 10, f"all-ok check took {took:.2f}s"  # about a second is expected; never a deadline


@pytest.mark.parametrize("replies", [True, False], ids=["drops-incoming", "drops-replies-too"])
def test_a_node_dropping_incoming_tcp_fails_and_is_named(
    cluster: NamespaceCluster,
    transports: dict[str, SSHTransport],
    firewall: Callable[[str, bool], None],
    replies: bool,
) -> None:
    node3 = cluster.host("node3")
    firewall(node3.ns, replies)
    addresses = ", ".join(h.addr for h in cluster.hosts)
    begin = time.monotonic()
    verdicts = check_reachability(_nodes(cluster, transports), "node1", PORT, connect_timeout=2.0)
    took = time.monotonic() - begin

    v3 = verdicts["node3"]
    assert v3.level == "fail"
    assert "not reachable from node1, node2 (timed out: a firewall dropping packets?)" in v3.reason
    assert v3.fix is not None
    assert f"allow TCP from the cluster's addresses ({addresses}) to ephemeral ports" in v3.fix
    assert "on node3; opening only the rendezvous port is not enough" in v3.fix
    if replies:
        # its own connections work: the answers come back
        assert "cannot reach" not in v3.reason
    else:
        assert f"cannot reach master node1 {cluster.host('node1').addr}:{PORT} (timed out" in v3.reason
        assert "reaches none of its peers" in v3.fix

    for name in ("node1", "node2"):
        v = verdicts[name]
        assert v.level == "fail", f"{name}: {v.reason}"
        assert f"cannot reach node3 {node3.addr}:" in v.reason and "(timed out" in v.reason
        assert v.fix is not None and "the likely cause is on node3" in v.fix
        assert ("not reachable from node3" in v.reason) is (not replies)
        failed = [p for p in v.data["pairs"] if p["result"] != "ok"]
        assert failed and all("node3" in (p["from"], p["to"]) for p in failed)
    assert took < 2.0 + 8, f"check with a dropping node took {took:.2f}s"


def test_a_busy_master_port_fails_the_master(
    cluster: NamespaceCluster, transports: dict[str, SSHTransport]
) -> None:
    master = cluster.host("node1")
    server = subprocess.Popen(
        ["ip", "netns", "exec", master.ns, PYTHON, "-m", "http.server", str(PORT), "--bind", master.addr],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "CLUSTER_BOOTSTRAP_RUN": "held-1/node1/1-2"},  # as a run of ours would
    )
    try:
        _await_listening(master.ns, master.addr, PORT, server)
        verdicts = check_reachability(_nodes(cluster, transports), "node1", PORT)
    finally:
        server.terminate()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    v1 = verdicts["node1"]
    assert v1.level == "fail"
    assert v1.reason.startswith(
        f"port {PORT} is already in use on the master (by python3 (pid {server.pid}, run held-1))"
    )
    assert v1.fix is not None and v1.fix.startswith(
        "a run of bootstrap holds it: `bootstrap stop --run held-1`"
    )
    assert "stop that program or choose another cluster port:" in v1.fix
    for name in ("node2", "node3"):
        assert (verdicts[name].level, verdicts[name].reason) == ("warn", "master port busy: skipped")
    # the mesh is still measured: nothing else is wrong
    assert all(p["result"] == "ok" for v in verdicts.values() for p in v.data["pairs"])
    assert not any(p["role"] == "rendezvous" for v in verdicts.values() for p in v.data["pairs"])


def test_a_node_without_python_fails_with_the_error(
    cluster: NamespaceCluster, transports: dict[str, SSHTransport]
) -> None:
    nodes = _nodes(cluster, transports)
    nodes[2] = ReachNode("node3", transports["node3"], "/nonexistent/python3", cluster.host("node3").addr)
    verdicts = check_reachability(nodes, "node1", PORT)
    v3 = verdicts["node3"]
    assert v3.level == "fail" and "/nonexistent/python3" in v3.reason and "not found" in v3.reason
    for name in ("node1", "node2"):
        assert verdicts[name].level == "warn" and "node3 not tested" in verdicts[name].reason


def _await_listening(ns: str, addr: str, port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    with netns.inside(ns):
        while True:
            try:
                with socket.create_connection((addr, port), timeout=1):
                    return
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
            time.sleep(0.02)
