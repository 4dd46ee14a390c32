"""`bootstrap firewall` against real firewalls in the namespace hosts: nftables, iptables (nft backend)
and ufw, each set to drop incoming traffic on the master (ssh allowed), with real listeners.

The master (node1) listens on the rendezvous port and on a port inside its ephemeral range (where gloo
ranks listen). Before the step a peer cannot connect, after it can, after --remove it cannot again; the
controller (not a node) never can. The master also serves the cluster's time (the default
``cluster.time``), so it also gets UDP 123 from each worker: one rule more per peer
(tests/integration/test_timesync.py shows chrony syncing through them). Only the master's namespace
firewall is changed, and it is flushed after every test.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from orchestrator.steps.firewall.linux import nft_persist_file
from orchestrator.steps.firewall.rules import ClusterTag
from tests.cluster import NamespaceCluster, TestHost
from tests.conftest import CliRun, require_cluster_support, write_inventory

Bootstrap = Callable[..., CliRun]
RDZV_PORT = 29500
GLOO_PORT = 40123  # inside Linux's default ephemeral range 32768-60999: where gloo ranks listen
IDS = ClusterTag("fwtest")
TAG = IDS.tag  # cluster-bootstrap:fwtest:<digest>

NFT_DROP = """\
table inet filter {
    chain input {
        type filter hook input priority 0; policy drop;
        ct state established,related accept
        iif "lo" accept
        tcp dport 22 accept
    }
}
"""

LISTENER = """
import socket, sys, threading
socks = []
for port in map(int, sys.argv[1:]):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(16); socks.append(s)
print("listening", flush=True)
def serve(s):
    while True:
        c, _ = s.accept(); c.close()
for s in socks[1:]:
    threading.Thread(target=serve, args=(s,), daemon=True).start()
serve(socks[0])
"""

CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
except OSError:
    sys.exit(1)
"""


def _ns(cluster: NamespaceCluster, ns: str, *argv: str, input: str | None = None) -> str:
    res = cluster.ns_run(ns, list(argv), input=input)
    assert res.returncode == 0, f"{argv}: {res.stderr}"
    return str(res.stdout)


def can_connect(cluster: NamespaceCluster, from_ns: str, host: TestHost, port: int) -> bool:
    """A TCP connection from ``from_ns`` to ``host:port``: True when accepted. A dropped SYN is never
    answered, so "not allowed" costs the timeout; allowed connections answer at once."""
    res = cluster.ns_run(from_ns, [sys.executable, "-c", CONNECT, host.addr, str(port), "1.5"])
    return res.returncode == 0


def reachable(
    cluster: NamespaceCluster, target: TestHost, sources: list[str], ports: list[int]
) -> set[tuple[str, int]]:
    """Which (source namespace, port) pairs connect; tried all at once (a refusal costs the timeout)."""
    pairs = [(ns, port) for ns in sources for port in ports]
    with ThreadPoolExecutor(len(pairs)) as pool:
        ok = list(pool.map(lambda p: can_connect(cluster, p[0], target, p[1]), pairs))
    return {pair for pair, good in zip(pairs, ok, strict=True) if good}


@pytest.fixture
def listener(cluster: NamespaceCluster) -> Iterator[TestHost]:
    """node1 listening on the rendezvous port and an ephemeral port (stopped after the test)."""
    master = cluster.hosts[0]
    argv = ["ip", "netns", "exec", master.ns, sys.executable, "-c", LISTENER, str(RDZV_PORT), str(GLOO_PORT)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        yield master
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def master_firewall(cluster: NamespaceCluster) -> Iterator[TestHost]:
    """node1's namespace firewall, flushed after the test (the other hosts are never changed)."""
    master = cluster.hosts[0]
    _ns(cluster, master.ns, "nft", "flush", "ruleset")
    try:
        yield master
    finally:
        cluster.ns_run(master.ns, ["nft", "flush", "ruleset"])


def _inventory(
    cluster: NamespaceCluster, path: Path, hosts: list[TestHost] | None = None, **fw: object
) -> Path:
    nodes: list[dict[str, object]] = [
        {"name": h.name, "host": h.addr, "user": "root"} for h in hosts or cluster.hosts
    ]
    extra = {"firewall": fw} if fw else {}
    return write_inventory(path, nodes, name="fwtest", master="node1", port=RDZV_PORT, **extra)


def _json(run: CliRun) -> dict[str, Any]:
    try:
        return dict(json.loads(run.stdout))
    except ValueError:
        pytest.fail(f"not JSON:\n{run}")


def _by_node(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in doc["nodes"]}


def _our_nft_rules(cluster: NamespaceCluster, host: TestHost) -> list[dict[str, Any]]:
    doc = json.loads(_ns(cluster, host.ns, "nft", "-j", "list", "ruleset"))
    return [i["rule"] for i in doc["nftables"] if "rule" in i and i["rule"].get("comment") == TAG]


def _saddr(rule: dict[str, Any]) -> str:
    for e in rule["expr"]:
        m = e.get("match")
        if m and m["left"].get("payload", {}).get("field") == "saddr":
            return str(m["right"])
    raise AssertionError(rule)


def test_nftables_drop_policy_opened_for_peers_only_then_removed(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    master_firewall: TestHost,
    listener: TestHost,
    tmp_path: Path,
) -> None:
    master, peers = cluster.hosts[0], cluster.hosts[1:]
    peer_ns = [h.ns for h in peers]
    _ns(cluster, master.ns, "nft", "-f", "-", input=NFT_DROP)
    user_rules = _ns(cluster, master.ns, "nft", "list", "ruleset")
    assert reachable(cluster, master, peer_ns, [RDZV_PORT, GLOO_PORT]) == set()
    # why our rules go into the host's chain: an accept in a base chain of our own (even one running
    # first) does not override the host's drop; every base chain on the hook must accept
    own = (
        "table inet cbt_own {\n  chain input {\n    type filter hook input priority -10; policy accept;\n"
        f"    ip saddr {peers[0].addr} accept\n  }}\n}}\n"
    )
    _ns(cluster, master.ns, "nft", "-f", "-", input=own)
    assert reachable(cluster, master, [peers[0].ns], [GLOO_PORT]) == set()
    _ns(cluster, master.ns, "nft", "delete", "table", "inet", "cbt_own")
    inv = _inventory(cluster, tmp_path / "hosts.yaml")

    dry = bootstrap("-i", str(inv), "firewall", "--dry-run")
    assert dry.returncode == 0, dry
    assert "nft -f -" in dry.stdout and f"ip saddr {peers[0].addr} tcp dport {RDZV_PORT}" in dry.stdout
    assert _our_nft_rules(cluster, master) == []  # a dry run changes nothing

    run = bootstrap("-i", str(inv), "firewall", "--json")
    assert run.returncode == 0, run
    nodes = _by_node(_json(run))
    assert nodes["node1"]["kind"] == "nftables"
    assert nodes["node1"]["ports"] == [str(RDZV_PORT), "32768-60999", "123/udp"]
    assert nodes["node1"]["sources"] == sorted(h.addr for h in peers)
    assert nodes["node1"]["added"] == 6 and nodes["node1"]["removed"] == 0  # 2 peers x (2 TCP + NTP)
    for name in ("node2", "node3"):  # no firewall there
        assert nodes[name]["kind"] == "none" and nodes[name]["commands"] == [], nodes[name]
        assert any("nothing to open" in n for n in nodes[name]["notes"])
    assert reachable(cluster, master, peer_ns, [RDZV_PORT, GLOO_PORT]) == {
        (ns, p) for ns in peer_ns for p in (RDZV_PORT, GLOO_PORT)
    }
    # never open to the world: the controller is not a node
    assert not can_connect(cluster, cluster.controller_ns, master, GLOO_PORT)
    rules = _our_nft_rules(cluster, master)
    assert sorted({_saddr(r) for r in rules}) == sorted(h.addr for h in peers)  # peers only, no own address
    assert {(r["table"], r["chain"]) for r in rules} == {("filter", "input")}  # inside the deciding chain
    ntp = [r for r in rules if '"udp"' in json.dumps(r["expr"])]
    assert sorted(_saddr(r) for r in ntp) == sorted(h.addr for h in peers), ntp  # NTP: the workers only

    again = bootstrap("-i", str(inv), "firewall", "--json")
    assert again.returncode == 0, again
    master_again = _by_node(_json(again))["node1"]
    assert (master_again["added"], master_again["removed"], master_again["unchanged"]) == (0, 0, 6)
    assert master_again["commands"] == [] and master_again["status"] == "unchanged"
    assert len(_our_nft_rules(cluster, master)) == 6

    # node3 leaves the cluster: exactly its three rules go (two TCP, its NTP)
    smaller = _inventory(cluster, tmp_path / "two.yaml", cluster.hosts[:2])
    shrink = bootstrap("-i", str(smaller), "firewall", "--json")
    assert shrink.returncode == 0, shrink
    shrunk = _by_node(_json(shrink))["node1"]
    assert (shrunk["added"], shrunk["removed"], shrunk["unchanged"]) == (0, 3, 3), shrunk
    assert {_saddr(r) for r in _our_nft_rules(cluster, master)} == {peers[0].addr}

    removed = bootstrap("-i", str(inv), "firewall", "--remove")
    assert removed.returncode == 0, removed
    assert "3 removed" in removed.stdout
    assert _our_nft_rules(cluster, master) == []
    assert _ns(cluster, master.ns, "nft", "list", "ruleset") == user_rules  # theirs untouched
    assert reachable(cluster, master, peer_ns, [RDZV_PORT, GLOO_PORT]) == set()


def _ruleset(cluster: NamespaceCluster, host: TestHost) -> str:
    """The whole nftables ruleset of ``host`` as nft prints it, rule handles included."""
    return _ns(cluster, host.ns, "nft", "-a", "list", "ruleset")


@pytest.mark.parametrize(
    ("name_a", "name_b"),
    [
        ("fw test", "fw_test"),  # earlier versions tagged both cluster-bootstrap:fw_test
        ("lab-" + "x" * 60 + "-one", "lab-" + "x" * 60 + "-two"),  # the same first 64 characters
    ],
    ids=["space-vs-underscore", "same-first-64"],
)
def test_clusters_whose_old_tags_collide_keep_each_others_rules(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    master_firewall: TestHost,
    listener: TestHost,
    tmp_path: Path,
    name_a: str,
    name_b: str,
) -> None:
    """Two clusters on the same hosts whose names used to give one tag: removing one leaves the
    other's rules byte for byte (handles included), and its peers still connect."""
    master, peer = cluster.hosts[0], cluster.hosts[1]
    assert ClusterTag(name_a).legacy == ClusterTag(name_b).legacy  # the collision of earlier versions
    _ns(cluster, master.ns, "nft", "-f", "-", input=NFT_DROP)
    nodes: list[dict[str, object]] = [{"name": h.name, "host": h.addr, "user": "root"} for h in cluster.hosts]
    inv_b = write_inventory(tmp_path / "b.yaml", nodes, name=name_b, master="node1", port=RDZV_PORT)
    inv_a = write_inventory(
        tmp_path / "a.yaml",
        nodes,
        name=name_a,
        master="node1",
        port=RDZV_PORT,
        firewall={"extra_ports": [6006]},
    )

    run_b = bootstrap("-i", str(inv_b), "firewall", "--json")
    assert run_b.returncode == 0, run_b
    assert _by_node(_json(run_b))["node1"]["added"] == 6
    only_b = _ruleset(cluster, master)
    assert can_connect(cluster, peer.ns, master, GLOO_PORT)

    run_a = bootstrap("-i", str(inv_a), "firewall", "--json")
    assert run_a.returncode == 0, run_a
    a_node1 = _by_node(_json(run_a))["node1"]
    assert (a_node1["added"], a_node1["removed"], a_node1["unchanged"]) == (8, 0, 0), a_node1  # B's: not A's
    assert only_b.count("comment") + 8 == _ruleset(cluster, master).count("comment")

    removed = bootstrap("-i", str(inv_a), "firewall", "--remove", "--json")
    assert removed.returncode == 0, removed
    assert _by_node(_json(removed))["node1"]["removed"] == 8
    assert _ruleset(cluster, master) == only_b  # B's rules untouched, byte for byte
    assert can_connect(cluster, peer.ns, master, GLOO_PORT) and can_connect(
        cluster, peer.ns, master, RDZV_PORT
    )

    gone = bootstrap("-i", str(inv_b), "firewall", "--remove", "--json")
    assert _by_node(_json(gone))["node1"]["removed"] == 6, gone
    assert "cluster-bootstrap" not in _ruleset(cluster, master)


def test_rules_of_the_previous_tag_format_are_replaced_and_removable(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    master_firewall: TestHost,
    listener: TestHost,
    tmp_path: Path,
) -> None:
    """An upgrade leaves no rule nobody can remove: rules an earlier version tagged
    cluster-bootstrap:fwtest are replaced by a run and deleted by --remove; another cluster's old
    rules (cluster-bootstrap:fwtest2) stay."""
    master, peers = cluster.hosts[0], cluster.hosts[1:]
    _ns(cluster, master.ns, "nft", "-f", "-", input=NFT_DROP)
    theirs = _ruleset(cluster, master)

    def seed_old_rules() -> None:  # exactly what earlier versions ran
        lines = [
            f'insert rule inet filter input ip saddr {h.addr} tcp dport {port} accept comment "{tag}"'
            for h in peers
            for port, tag in ((RDZV_PORT, IDS.legacy), (GLOO_PORT, "cluster-bootstrap:fwtest2"))
        ]
        _ns(cluster, master.ns, "nft", "-f", "-", input="\n".join(lines) + "\n")

    def tagged(tag: str) -> list[dict[str, Any]]:
        doc = json.loads(_ns(cluster, master.ns, "nft", "-j", "list", "ruleset"))
        return [i["rule"] for i in doc["nftables"] if "rule" in i and i["rule"].get("comment") == tag]

    seed_old_rules()
    inv = _inventory(cluster, tmp_path / "hosts.yaml")
    run = bootstrap("-i", str(inv), "firewall", "--json")
    assert run.returncode == 0, run
    node1 = _by_node(_json(run))["node1"]
    assert (node1["added"], node1["removed"]) == (6, 2), node1
    assert any(IDS.legacy in note for note in node1["notes"]), node1
    assert (
        tagged(IDS.legacy) == [] and len(tagged(TAG)) == 6 and len(tagged("cluster-bootstrap:fwtest2")) == 2
    )

    seed_old_rules()  # rules of both formats at once
    removed = bootstrap("-i", str(inv), "firewall", "--remove", "--json")
    assert removed.returncode == 0, removed
    assert _by_node(_json(removed))["node1"]["removed"] == 8
    assert tagged(IDS.legacy) == [] and tagged(TAG) == [] and len(tagged("cluster-bootstrap:fwtest2")) == 4
    for rule in tagged("cluster-bootstrap:fwtest2"):  # the other cluster's, deleted by hand here
        _ns(
            cluster,
            master.ns,
            "nft",
            "delete",
            "rule",
            "inet",
            "filter",
            "input",
            "handle",
            str(rule["handle"]),
        )
    assert _ruleset(cluster, master) == theirs  # the host's own rules untouched


def test_iptables_nft_drop_policy(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    master_firewall: TestHost,
    listener: TestHost,
    tmp_path: Path,
) -> None:
    master, peer = cluster.hosts[0], cluster.hosts[1]
    for rule in (
        ["-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
        ["-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"],
        ["-A", "INPUT", "-p", "tcp", "-j", "REJECT"],
    ):
        _ns(cluster, master.ns, "iptables-nft", *rule)
    assert not can_connect(cluster, peer.ns, master, GLOO_PORT)
    inv = _inventory(cluster, tmp_path / "hosts.yaml", extra_ports=[6006])

    run = bootstrap("-i", str(inv), "firewall", "--json")
    assert run.returncode == 0, run
    node1 = _by_node(_json(run))["node1"]
    assert node1["kind"] == "iptables" and node1["places"] == ["iptables-nft INPUT"]
    assert node1["added"] == 8  # 2 peers x (rendezvous, ephemeral range, 6006, NTP)
    assert can_connect(cluster, peer.ns, master, GLOO_PORT) and can_connect(
        cluster, peer.ns, master, RDZV_PORT
    )
    listed = _ns(cluster, master.ns, "iptables-nft", "-S", "INPUT").splitlines()
    ours = [line for line in listed if TAG in line]
    peer_sources = {f"-A INPUT -s {h.addr}/32" for h in cluster.hosts[1:]}
    assert len(ours) == 8 and {" ".join(line.split()[:4]) for line in ours} == peer_sources
    assert sum(" -p udp " in line and "--dport 123 " in line for line in ours) == 2
    assert listed.index(ours[-1]) < next(i for i, line in enumerate(listed) if "REJECT" in line)

    again = bootstrap("-i", str(inv), "firewall", "--json")
    assert _by_node(_json(again))["node1"]["status"] == "unchanged", again

    removed = bootstrap("-i", str(inv), "firewall", "--remove", "--json")
    assert removed.returncode == 0, removed
    assert _by_node(_json(removed))["node1"]["removed"] == 8
    after = _ns(cluster, master.ns, "iptables-nft", "-S", "INPUT").splitlines()
    assert [line for line in after if TAG in line] == [] and len(after) == 4  # policy + their 3 rules
    assert not can_connect(cluster, peer.ns, master, GLOO_PORT)


def test_non_root_without_passwordless_sudo_fails_with_the_fix(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    cluster.add_user("cbtfwpw", sudo="password")
    try:
        nodes: list[dict[str, object]] = [
            {"name": h.name, "host": h.addr, "user": "cbtfwpw"} for h in cluster.hosts[:2]
        ]
        inv = write_inventory(tmp_path / "h.yaml", nodes, name="fwtest", master="node1")
        run = bootstrap("-i", str(inv), "firewall")
        assert run.returncode == 1, run
        assert "sudo refused" in run.stdout
        assert "node 'node1': reading the firewall needs root, and sudo wants a password" in run.stderr
        assert "cbtfwpw ALL=(root) NOPASSWD: ALL" in run.stderr
    finally:
        cluster.remove_user("cbtfwpw")


# -- ufw: needs its own /etc/ufw per host ---------------------------------------------------------


@pytest.fixture(scope="module")
def ufw_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    require_cluster_support()
    if shutil.which("ufw") is None:
        pytest.fail("ufw is not installed (tests/run.sh installs it)", pytrace=False)
    c = NamespaceCluster(3, workdir=tmp_path_factory.mktemp("ufwcluster"), private_dirs=["/etc/ufw"])
    try:
        c.start()
        for host in c.hosts:  # each host's /etc/ufw starts as a copy of the packaged defaults
            shutil.copytree("/etc/ufw", c.private_dir(host, "/etc/ufw"), dirs_exist_ok=True)
        yield c
    finally:
        c.stop()


def test_ufw_rules_with_comments_then_removed(
    ufw_cluster: NamespaceCluster, tmp_path: Path, ctl_home_for: Callable[[NamespaceCluster], Path]
) -> None:
    c = ufw_cluster
    master, peer = c.hosts[0], c.hosts[1]
    for argv in (["ufw", "allow", "22/tcp"], ["ufw", "--force", "enable"]):
        res = c.host_run(master, argv)
        assert res.returncode == 0, res.stderr
    argv = ["ip", "netns", "exec", master.ns, sys.executable, "-c", LISTENER, str(RDZV_PORT), str(GLOO_PORT)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        assert not can_connect(c, peer.ns, master, GLOO_PORT)
        inv = _inventory(c, tmp_path / "hosts.yaml")
        run = _cli(c, ctl_home_for(c), "-i", str(inv), "firewall", "--json")
        assert run.returncode == 0, run
        node1 = _by_node(_json(run))["node1"]
        assert node1["kind"] == "ufw" and node1["added"] == 6, node1
        assert can_connect(c, peer.ns, master, GLOO_PORT) and can_connect(c, peer.ns, master, RDZV_PORT)
        added = c.host_run(master, ["ufw", "show", "added"]).stdout
        assert added.count(f"comment '{TAG}'") == 6 and "ufw allow 22/tcp" in added
        assert added.count("port 123 proto udp comment") == 2, added

        again = _cli(c, ctl_home_for(c), "-i", str(inv), "firewall", "--json")
        assert _by_node(_json(again))["node1"]["status"] == "unchanged", again

        removed = _cli(c, ctl_home_for(c), "-i", str(inv), "firewall", "--remove", "--json")
        assert _by_node(_json(removed))["node1"]["removed"] == 6, removed
        left = c.host_run(master, ["ufw", "show", "added"]).stdout
        assert TAG not in left and "ufw allow 22/tcp" in left
        assert not can_connect(c, peer.ns, master, GLOO_PORT)
    finally:
        proc.kill()
        proc.wait()
        c.host_run(master, ["ufw", "--force", "disable"])


@pytest.fixture
def ctl_home_for(tmp_path: Path) -> Callable[[NamespaceCluster], Path]:
    """A controller HOME trusting ``c``'s hosts (the shared fixtures serve the session cluster only)."""

    def make(c: NamespaceCluster) -> Path:
        home = tmp_path / f"home-{c.prefix}"
        ssh = home / ".ssh"
        if not ssh.exists():
            ssh.mkdir(parents=True, mode=0o700)
            shutil.copyfile(c.client_key, ssh / "id_ed25519")
            (ssh / "id_ed25519").chmod(0o600)
            (ssh / "known_hosts").write_text(c.known_hosts_text())
        return home

    return make


def _cli(c: NamespaceCluster, home: Path, *args: str) -> CliRun:
    from tests.conftest import BOOTSTRAP

    env = {"HOME": str(home), "NO_COLOR": "1", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    proc = subprocess.run(
        c.controller_argv([BOOTSTRAP, *args], env=env), capture_output=True, text=True, timeout=120
    )
    return CliRun([BOOTSTRAP, *args], proc.returncode, proc.stdout, proc.stderr)


# -- firewalld: a private D-Bus system bus and firewalld in the master's namespaces ------------------

FIREWALLD_DIRS = ["/etc/firewalld", "/run/dbus", "/run/firewalld"]


@pytest.fixture(scope="module")
def firewalld_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    """node1 runs firewalld (nftables backend) on its own system bus; its defaults: zone public,
    ssh allowed, everything else rejected."""
    require_cluster_support()
    for tool in ("firewalld", "firewall-cmd", "dbus-daemon"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (tests/run.sh installs firewalld)", pytrace=False)
    workdir = tmp_path_factory.mktemp("fwdcluster")
    c = NamespaceCluster(3, workdir=workdir, private_dirs=FIREWALLD_DIRS)
    pids: list[int] = []
    try:
        c.start()
        master = c.hosts[0]
        shutil.copytree("/etc/firewalld", c.private_dir(master, "/etc/firewalld"), dirs_exist_ok=True)
        bus = c.host_run(master, ["dbus-daemon", "--system", "--fork", "--print-pid"])
        assert bus.returncode == 0, bus.stderr
        pids.append(int(bus.stdout.split()[0]))
        log = workdir / "firewalld.log"
        start = (
            f"firewalld --nofork --nopid --log-target file --log-file {log} </dev/null >>{log} 2>&1 & echo $!"
        )
        fwd = c.host_run(master, ["sh", "-c", start])
        pids.append(int(fwd.stdout.split()[0]))
        deadline = time.monotonic() + 60
        while c.host_run(master, ["firewall-cmd", "--state"]).returncode != 0:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)  # firewalld offers no way to wait for its start; polled as the condition
        yield c
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        c.stop()


def test_firewalld_policy_rich_rules_then_removed(
    firewalld_cluster: NamespaceCluster, tmp_path: Path, ctl_home_for: Callable[[NamespaceCluster], Path]
) -> None:
    c = firewalld_cluster
    master, peers = c.hosts[0], c.hosts[1:]
    home = ctl_home_for(c)
    argv = ["ip", "netns", "exec", master.ns, sys.executable, "-c", LISTENER, str(RDZV_PORT), str(GLOO_PORT)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
        assert reachable(c, master, [h.ns for h in peers], [RDZV_PORT, GLOO_PORT]) == set()
        inv = _inventory(c, tmp_path / "hosts.yaml")
        run = _cli(c, home, "-i", str(inv), "firewall", "--json")
        assert run.returncode == 0, run
        node1 = _by_node(_json(run))["node1"]
        assert node1["kind"] == "firewalld" and node1["added"] == 6, node1
        assert reachable(c, master, [h.ns for h in peers], [RDZV_PORT, GLOO_PORT]) == {
            (h.ns, p) for h in peers for p in (RDZV_PORT, GLOO_PORT)
        }
        assert not can_connect(c, c.controller_ns, master, GLOO_PORT)  # not a node: still rejected
        info = c.host_run(master, ["firewall-cmd", f"--info-policy={IDS.policy}"]).stdout
        assert info.count('rule family="ipv4" source address=') == 6
        assert info.count('port port="123" protocol="udp" accept') == 2, info
        described = ["firewall-cmd", "--permanent", f"--policy={IDS.policy}", "--get-description"]
        assert c.host_run(master, described).stdout.strip() == TAG

        again = _cli(c, home, "-i", str(inv), "firewall", "--json")
        assert _by_node(_json(again))["node1"]["status"] == "unchanged", again

        removed = _cli(c, home, "-i", str(inv), "firewall", "--remove", "--json")
        assert _by_node(_json(removed))["node1"]["removed"] == 6, removed
        assert reachable(c, master, [peers[0].ns], [GLOO_PORT]) == set()
        policies = c.host_run(master, ["firewall-cmd", "--permanent", "--get-policies"]).stdout
        assert IDS.policy not in policies.split()
    finally:
        proc.kill()
        proc.wait()


# -- persist: nftables rules survive a reload of /etc/nftables.conf (a reboot) -------------------------


def test_nftables_persist_survives_a_reload_and_remove_cleans_up(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, ctl_home_for: Callable[[NamespaceCluster], Path]
) -> None:
    """The host's /etc/nftables.conf and /etc/nftables.d are its own (ip netns exec bind-mounts
    /etc/netns/<ns>/nftables.conf; nftables.d is a private directory): nothing of this machine's."""
    require_cluster_support()
    c = NamespaceCluster(2, workdir=tmp_path_factory.mktemp("persist"), private_dirs=["/etc/nftables.d"])
    try:
        c.start()
        master, peer = c.hosts
        conf = Path("/etc/netns") / master.ns / "nftables.conf"
        conf.write_text("#!/usr/sbin/nft -f\nflush ruleset\n" + NFT_DROP)
        c.restart_sshd(master)  # sessions now see the host's own /etc/nftables.conf
        assert c.host_run(master, ["nft", "-f", "/etc/nftables.conf"]).returncode == 0  # "boot"
        inv = _inventory(c, tmp_path / "hosts.yaml", persist=True)
        home = ctl_home_for(c)

        run = _cli(c, home, "-i", str(inv), "firewall", "--json")
        assert run.returncode == 0, run
        assert _by_node(_json(run))["node1"]["added"] == 3  # 2 TCP + NTP from the one worker
        saved = c.private_dir(master, "/etc/nftables.d") / Path(nft_persist_file(TAG)).name
        assert saved.read_text().count(f"ip saddr {peer.addr} tcp dport") == 2
        assert saved.read_text().count(f"ip saddr {peer.addr} udp dport 123 accept") == 1
        assert conf.read_text().endswith(f'include "{nft_persist_file(TAG)}"\n')
        again = _cli(c, home, "-i", str(inv), "firewall", "--json")
        assert _by_node(_json(again))["node1"]["commands"] == [], again  # nothing rewritten either

        # a reboot: the ruleset is loaded from the files alone
        assert c.host_run(master, ["nft", "-f", "/etc/nftables.conf"]).returncode == 0
        assert len(_our_nft_rules(c, master)) == 3
        reloaded = _cli(c, home, "-i", str(inv), "firewall", "--json")
        assert _by_node(_json(reloaded))["node1"]["status"] == "unchanged", reloaded

        removed = _cli(c, home, "-i", str(inv), "firewall", "--remove", "--json")
        assert _by_node(_json(removed))["node1"]["removed"] == 3, removed
        assert not saved.exists() and "include" not in conf.read_text()
        assert conf.read_text() == "#!/usr/sbin/nft -f\nflush ruleset\n" + NFT_DROP  # theirs, unchanged
        assert _our_nft_rules(c, master) == []
    finally:
        c.stop()
