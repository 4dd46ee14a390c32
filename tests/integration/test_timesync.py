"""`bootstrap ntp` for real: chrony in three namespace hosts, each with its own /etc/chrony, /run/chrony
and /var/lib/chrony. The master serves, the workers follow it, offsets are measured; a second run
restarts nothing; --restore puts every file back byte for byte and stops every chronyd it started.

All namespaces share this machine's clock: every chronyd here runs with -x (never adjusts the clock),
which the step decides by itself for a node in another network namespace than PID 1, and the tests
also pass the hidden --no-clock-control. This machine's own chrony is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import NamespaceCluster, TestHost
from tests.conftest import require_cluster_support, write_inventory

BOOTSTRAP = str(Path(sys.executable).parent / "bootstrap")
PRIVATE = ["/etc/chrony", "/run/chrony", "/var/lib/chrony"]

# node1 (master): Debian's layout, with a confdir: we add a drop-in and never touch this file
DEBIAN_CONF = (
    b"# Debian-like test configuration\n"
    b"confdir /etc/chrony/conf.d\n"
    b"sourcedir /etc/chrony/sources.d\n"
    b"driftfile /var/lib/chrony/chrony.drift\n"
    b"makestep 1 3\n"
)
# node2: RHEL's layout (no confdir, an unreachable pool, no final newline): we edit a marked block
RHEL_CONF = b"pool 2.rhel.pool.ntp.org iburst\ndriftfile /var/lib/chrony/drift\nmakestep 1.0 3\n# the end"
# node3: chronyd installed but no configuration at all: we write the whole file


@dataclass
class Run:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        command = " ".join(self.argv)
        return f"$ {command}\n[exit {self.returncode}]\n--- stdout\n{self.stdout}--- stderr\n{self.stderr}"

    def json(self) -> dict[str, Any]:
        assert self.stdout, self
        doc: dict[str, Any] = json.loads(self.stdout)
        return doc


@pytest.fixture(scope="module")
def chrony_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    require_cluster_support()
    if shutil.which("chronyd") is None and not Path("/usr/sbin/chronyd").exists():
        message = "chronyd is not installed (apt-get install -y chrony; tests/run.sh does)"
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    cluster = NamespaceCluster(3, workdir=tmp_path_factory.mktemp("chrony"), private_dirs=PRIVATE)
    try:
        cluster.start()
        yield cluster
    finally:
        # whatever a failing test left: stop.kill()s every process in the namespaces
        cluster.stop()


@pytest.fixture(scope="module")
def home(chrony_cluster: NamespaceCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700)
    shutil.copyfile(chrony_cluster.client_key, ssh / "id_ed25519")
    (ssh / "id_ed25519").chmod(0o600)
    (ssh / "known_hosts").write_text(chrony_cluster.known_hosts_text())
    return home


def _cli(cluster: NamespaceCluster, home: Path, *args: str, timeout: float = 180) -> Run:
    env = {"HOME": str(home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = cluster.controller_argv([BOOTSTRAP, *args], env=env)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    return Run([BOOTSTRAP, *args], proc.returncode, proc.stdout, proc.stderr)


def _inventory(cluster: NamespaceCluster, path: Path, user: str = "root", **time: Any) -> Path:
    nodes: list[dict[str, object]] = [{"name": h.name, "host": h.addr, "user": user} for h in cluster.hosts]
    cluster_settings: dict[str, object] = {"master": "node1"}
    if time:
        cluster_settings["time"] = time
    return write_inventory(path, nodes, **cluster_settings)


def _etc(cluster: NamespaceCluster, host: TestHost) -> Path:
    return cluster.private_dir(host, "/etc/chrony")


def _snapshot(cluster: NamespaceCluster) -> dict[str, dict[str, bytes]]:
    """Every file under each host's /etc/chrony, by relative path."""
    out = {}
    for host in cluster.hosts:
        root = _etc(cluster, host)
        out[host.name] = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    return out


def _chronyd_pids(cluster: NamespaceCluster, host: TestHost) -> list[int]:
    """Every chronyd process inside the host's network namespace (not this machine's own)."""
    listed = subprocess.run(["ip", "netns", "pids", host.ns], capture_output=True, text=True, check=True)
    pids = []
    for word in listed.stdout.split():
        try:
            if Path(f"/proc/{word}/comm").read_text().strip() == "chronyd":
                pids.append(int(word))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return pids


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


@pytest.fixture(scope="module")
def seeded(chrony_cluster: NamespaceCluster) -> dict[str, dict[str, bytes]]:
    node1, node2, _ = chrony_cluster.hosts
    (_etc(chrony_cluster, node1) / "conf.d").mkdir(exist_ok=True)
    (_etc(chrony_cluster, node1) / "sources.d").mkdir(exist_ok=True)
    (_etc(chrony_cluster, node1) / "chrony.conf").write_bytes(DEBIAN_CONF)
    (_etc(chrony_cluster, node2) / "chrony.conf").write_bytes(RHEL_CONF)
    (_etc(chrony_cluster, node2) / "chrony.conf").chmod(0o640)
    return _snapshot(chrony_cluster)


def test_master_serves_workers_follow_then_restore(
    chrony_cluster: NamespaceCluster, home: Path, seeded: dict[str, dict[str, bytes]], tmp_path: Path
) -> None:
    cluster = chrony_cluster
    node1, node2, node3 = cluster.hosts
    inventory = str(_inventory(cluster, tmp_path / "hosts.yaml"))

    # --dry-run: the diff per node, the scripts, and nothing changes
    dry = _cli(cluster, home, "-i", inventory, "ntp", "--dry-run", "--no-clock-control")
    assert dry.returncode == 0, dry
    assert f"+local stratum 10\n+allow {node2.addr}\n+allow {node3.addr}" in dry.stdout, dry
    assert f"+server {node1.addr} iburst prefer" in dry.stdout, dry
    assert "+++ /etc/chrony/conf.d/cluster-bootstrap.conf" in dry.stdout, dry
    assert _snapshot(cluster) == seeded
    assert all(not _chronyd_pids(cluster, h) for h in cluster.hosts)

    # first run: configured, started, synced to the master, offsets reported
    first = _cli(cluster, home, "-i", inventory, "--json", "ntp", "--no-clock-control")
    assert first.returncode == 0, first
    nodes = {n["name"]: n for n in first.json()["nodes"]}
    assert nodes["node1"]["role"] == "server" and nodes["node1"]["mode"] == "dropin"
    assert nodes["node2"]["mode"] == "block" and nodes["node3"]["mode"] == "file"
    for worker in (node2, node3):
        entry = nodes[worker.name]
        assert entry["role"] == "client" and entry["state"] == "added", entry
        assert entry["selected"] == node1.addr, entry  # chrony's ^* is the master
        assert abs(entry["chrony_offset_ms"]) < 1.0, entry
    for entry in nodes.values():
        assert entry["ok"] and entry["clock_control"] is False, entry
        assert abs(entry["offset_ms"]) < 1.0 + entry["offset_error_ms"], entry  # one kernel clock
    pids = {}
    for host in cluster.hosts:
        running = _chronyd_pids(cluster, host)
        assert len(running) == 1, (host.name, running)
        assert "-x" in _cmdline(running[0]), _cmdline(running[0])  # never steers this machine's clock
        pids[host.name] = running[0]
    after = _snapshot(cluster)
    assert after["node1"]["chrony.conf"] == DEBIAN_CONF  # Debian layout: the distribution file untouched
    assert after["node1"]["conf.d/cluster-bootstrap.conf"].endswith(
        f"local stratum 10\nallow {node2.addr}\nallow {node3.addr}\n".encode()
    )
    assert after["node2"]["chrony.conf.cluster-bootstrap.bak"] == RHEL_CONF
    assert after["node2"]["chrony.conf"].startswith(RHEL_CONF + b"\n# BEGIN cluster-bootstrap")
    assert (_etc(cluster, node2) / "chrony.conf").stat().st_mode & 0o777 == 0o640

    # second run: nothing restarted, says unchanged
    second = _cli(cluster, home, "-i", inventory, "--json", "ntp", "--no-clock-control")
    assert second.returncode == 0, second
    assert {n["state"] for n in second.json()["nodes"]} == {"unchanged"}, second
    assert {h.name: _chronyd_pids(cluster, h) for h in cluster.hosts} == {k: [v] for k, v in pids.items()}
    assert _snapshot(cluster) == after

    # --restore --dry-run: what would be put back, nothing done
    dry_restore = _cli(cluster, home, "-i", inventory, "ntp", "--restore", "--dry-run")
    assert dry_restore.returncode == 0, dry_restore
    assert f"-server {node1.addr} iburst prefer" in dry_restore.stdout, dry_restore
    assert "chrony.conf.cluster-bootstrap.bak /etc/chrony/chrony.conf" in dry_restore.stdout, dry_restore
    assert _snapshot(cluster) == after and all(_chronyd_pids(cluster, h) for h in cluster.hosts)

    # --restore: files back byte for byte, every chronyd we started stopped
    restore = _cli(cluster, home, "-i", inventory, "--json", "ntp", "--restore")
    assert restore.returncode == 0, restore
    assert {n["name"]: n["state"] for n in restore.json()["nodes"]} == dict.fromkeys(
        ("node1", "node2", "node3"), "restored"
    )
    assert _snapshot(cluster) == seeded
    assert (_etc(cluster, node2) / "chrony.conf").stat().st_mode & 0o777 == 0o640
    for host in cluster.hosts:
        assert not _chronyd_pids(cluster, host), host.name
    again = _cli(cluster, home, "-i", inventory, "--json", "ntp", "--restore")
    assert again.returncode == 0, again
    assert {n["state"] for n in again.json()["nodes"]} == {"nothing to restore"}


def test_unreachable_upstream_fails_with_the_numbers(
    chrony_cluster: NamespaceCluster, home: Path, seeded: dict[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """Servers nobody can reach: the step says which node selected no source and why, and exits 1."""
    cluster = chrony_cluster
    inventory = str(_inventory(cluster, tmp_path / "hosts.yaml", servers=[cluster.unused_addr]))
    try:
        run = _cli(
            cluster, home, "-i", inventory, "-n", "node3", "ntp", "--no-clock-control", "--sync-timeout", "8"
        )
        assert run.returncode == 1, run
        # known as soon as its requests go unanswered, not at the end of the 8 s
        assert "none of its servers answered an NTP request" in run.stderr, run
        assert cluster.unused_addr in run.stderr, run
    finally:
        restore = _cli(cluster, home, "-i", inventory, "-n", "node3", "ntp", "--restore")
        assert restore.returncode == 0, restore
    assert not _chronyd_pids(cluster, cluster.host("node3"))
    assert _snapshot(cluster) == seeded


def test_sudo_with_password_fails_clearly(
    chrony_cluster: NamespaceCluster, home: Path, seeded: dict[str, dict[str, bytes]], tmp_path: Path
) -> None:
    cluster = chrony_cluster
    cluster.add_user("cbtntppw", sudo="password")
    try:
        inventory = str(_inventory(cluster, tmp_path / "hosts.yaml", user="cbtntppw"))
        run = _cli(cluster, home, "-i", inventory, "-n", "node2", "ntp", "--no-clock-control")
        assert run.returncode == 1, run
        assert "sudo wants a password here" in run.stderr and "NOPASSWD" in run.stderr, run
    finally:
        cluster.remove_user("cbtntppw")
    assert _snapshot(cluster) == seeded


FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


@pytest.mark.skipif(not FAKETIME.exists(), reason="libfaketime missing (tests/run.sh installs it)")
def test_a_node_beyond_the_limit_fails_with_the_numbers(
    chrony_cluster: NamespaceCluster, home: Path, seeded: dict[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """node3's processes see a clock 5 s ahead (libfaketime, its chronyd included): chrony follows the
    master but cannot close the gap (-x), so the step fails naming node3 and the offsets."""
    cluster = chrony_cluster
    node3 = cluster.host("node3")
    inventory = str(_inventory(cluster, tmp_path / "hosts.yaml"))
    cluster.set_session_env(node3, {"LD_PRELOAD": str(FAKETIME), "FAKETIME": "+5s"})
    try:
        # node3 never gets within the limit: its wait ends at the timeout; node2 must select its source
        # within it even on a machine busy with other tests (5 s was not always enough)
        run = _cli(
            cluster, home, "-i", inventory, "--json", "ntp", "--no-clock-control", "--sync-timeout", "12"
        )
        assert run.returncode == 1, run
        nodes = {n["name"]: n for n in run.json()["nodes"]}
        assert nodes["node1"]["ok"] and nodes["node2"]["ok"], nodes
        bad = nodes["node3"]
        assert not bad["ok"] and 4900 < bad["chrony_offset_ms"] < 5100, bad
        assert 4000 < bad["offset_ms"] < 6000, bad
        assert "ms off after 12 s (limit 100 ms)" in bad["problem"], bad
        assert "node 'node3': chrony follows" in run.stderr, run
    finally:
        restore = _cli(cluster, home, "-i", inventory, "ntp", "--restore")
        cluster.set_session_env(node3, None)
        assert restore.returncode == 0, restore
    assert all(not _chronyd_pids(cluster, h) for h in cluster.hosts)
    assert _snapshot(cluster) == seeded


def test_a_worker_resolving_the_master_elsewhere_is_refused_and_the_others_follow_the_master(
    chrony_cluster: NamespaceCluster, home: Path, seeded: dict[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """The inventory names the master (host: node1); on node2 that name resolves to 6.6.6.6 (a wrong
    or poisoned /etc/hosts). node2 is refused, naming both addresses, and nothing is written there;
    node3 follows the master's own address, not what node2 resolved (earlier versions took a
    majority of the workers' answers, and a tie went to node2's)."""
    cluster = chrony_cluster
    node1, node2, node3 = cluster.hosts
    named = tmp_path / "home"
    shutil.copytree(home, named)
    with (named / ".ssh" / "known_hosts").open("a") as known:  # the controller dials node1 by name
        known.write(f"node1 {node1.host_key_line()}\n")
    nodes: list[dict[str, object]] = [{"name": "node1", "host": "node1", "user": "root"}]
    nodes += [{"name": h.name, "host": h.addr, "user": "root"} for h in (node2, node3)]
    inventory = str(write_inventory(tmp_path / "hosts.yaml", nodes, master="node1"))
    hosts = Path("/etc/netns") / node2.ns / "hosts"  # node2's /etc/hosts (a bind mount: same file)
    original = hosts.read_text()
    assert f"{node1.addr}\tnode1\n" in original
    hosts.write_text(original.replace(f"{node1.addr}\tnode1\n", "6.6.6.6\tnode1\n"))
    try:
        assert cluster.host_run(node2, ["getent", "ahostsv4", "node1"]).stdout.startswith("6.6.6.6 ")
        run = _cli(
            cluster, named, "-i", inventory, "--json", "ntp", "--no-clock-control", "--sync-timeout", "20"
        )
        assert run.returncode == 1, run
        entries = {n["name"]: n for n in run.json()["nodes"]}
        bad = entries["node2"]
        assert not bad["ok"] and "6.6.6.6" in bad["error"]["message"], bad
        assert f"the master is {node1.addr}" in bad["error"]["message"], bad
        assert "node 'node2': resolves the master's host 'node1' to 6.6.6.6" in run.stderr, run
        assert entries["node3"]["ok"] and entries["node3"]["selected"] == node1.addr, entries["node3"]
        assert entries["node1"]["ok"], entries["node1"]
        after = _snapshot(cluster)
        assert after["node2"] == seeded["node2"]  # nothing written on the refused worker
        assert f"server {node1.addr} iburst prefer".encode() in after["node3"]["chrony.conf"]
        assert not any(b"6.6.6.6" in data for files in after.values() for data in files.values())
        assert not _chronyd_pids(cluster, node2)
    finally:
        hosts.write_text(original)
        restore = _cli(cluster, named, "-i", inventory, "ntp", "--restore")
        assert restore.returncode == 0, restore
    assert all(not _chronyd_pids(cluster, h) for h in cluster.hosts)
    assert _snapshot(cluster) == seeded


#: an address a worker adds and prefers as the source of its route to the master (TEST-NET-2)
FORGED = "198.51.100.7"


def test_a_workers_own_address_opens_no_firewall_and_no_chrony_allow(
    chrony_cluster: NamespaceCluster, home: Path, seeded: dict[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """node2 adds 198.51.100.7 and makes it the source of its route to the master (what a compromised
    or misconfigured node can do): the firewall rules and the master's chrony ``allow`` lines name
    node2's inventory address, and a warning names node2. Earlier versions took the route's source:
    the master opened the rendezvous port, the ephemeral range and UDP 123 to 198.51.100.7, and chrony
    allowed it. Dry runs: nothing is changed on any node."""
    cluster = chrony_cluster
    node1, node2, node3 = cluster.hosts
    inventory = str(_inventory(cluster, tmp_path / "hosts.yaml"))
    route = json.loads(cluster.host_run(node2, ["ip", "-j", "-4", "route", "get", node1.addr]).stdout)
    dev = route[0]["dev"]
    forge = [
        ["ip", "addr", "add", f"{FORGED}/32", "dev", dev],
        ["ip", "route", "replace", f"{node1.addr}/32", "dev", dev, "src", FORGED],
    ]
    for argv in forge:
        assert cluster.host_run(node2, argv).returncode == 0, argv
    try:
        said = cluster.host_run(node2, ["ip", "-4", "route", "get", node1.addr]).stdout
        assert f"src {FORGED}" in said, said
        warning = f"node 'node2' says its address toward the master is {FORGED}, but it is {node2.addr}"

        fw = _cli(cluster, home, "-i", inventory, "--json", "firewall", "--dry-run")
        assert fw.returncode == 0, fw
        doc = fw.json()
        assert doc["addresses"] == {h.name: h.addr for h in cluster.hosts}, doc["addresses"]
        master = {n["name"]: n for n in doc["nodes"]}["node1"]
        assert master["sources"] == sorted([node2.addr, node3.addr]), master
        assert not any(FORGED in json.dumps(n) for n in doc["nodes"]), doc["nodes"]  # no rule, no source
        assert any(warning in w for w in doc["warnings"]) and warning in fw.stderr, fw

        ntp = _cli(cluster, home, "-i", inventory, "--json", "ntp", "--dry-run", "--no-clock-control")
        assert ntp.returncode == 0, ntp
        entries = {n["name"]: n for n in ntp.json()["nodes"]}
        assert f"allow {node2.addr}" in entries["node1"]["diff"], entries["node1"]
        assert f"allow {node3.addr}" in entries["node1"]["diff"], entries["node1"]
        assert not any(FORGED in json.dumps(n) for n in entries.values()), entries["node1"]["diff"]
        assert any(warning in w for w in ntp.json()["warnings"]), ntp
    finally:
        cluster.host_run(node2, ["ip", "route", "del", f"{node1.addr}/32"])
        cluster.host_run(node2, ["ip", "addr", "del", f"{FORGED}/32", "dev", dev])
    assert _snapshot(cluster) == seeded


# -- behind a drop-policy host firewall: the firewall step opens what ntp needs ------------------------

# Debian's /etc/nftables.conf shape with the usual hardening: drop what is not allowed (ssh allowed)
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


@pytest.fixture
def drop_policy(chrony_cluster: NamespaceCluster) -> Iterator[list[TestHost]]:
    """Every host's namespace firewall drops incoming traffic but ssh (flushed after the test; only
    the test's namespaces are touched, never this machine's firewall)."""
    for host in chrony_cluster.hosts:
        res = chrony_cluster.host_run(host, ["nft", "-f", "-"], input=NFT_DROP)
        assert res.returncode == 0, res.stderr
    try:
        yield chrony_cluster.hosts
    finally:
        for host in chrony_cluster.hosts:
            chrony_cluster.host_run(host, ["nft", "flush", "ruleset"])


def _ntp_rules(cluster: NamespaceCluster, host: TestHost) -> list[str]:
    """Our UDP 123 rules on ``host`` as nft lists them (one line each)."""
    listed = cluster.host_run(host, ["nft", "list", "ruleset"]).stdout
    return [
        line.strip()
        for line in listed.splitlines()
        if "udp dport 123" in line and "cluster-bootstrap" in line
    ]


def _timed(cluster: NamespaceCluster, home: Path, *args: str) -> tuple[Run, float]:
    started = time.monotonic()
    run = _cli(cluster, home, *args)
    return run, time.monotonic() - started


def test_firewall_then_ntp_behind_a_drop_policy_syncs_every_worker(
    chrony_cluster: NamespaceCluster,
    home: Path,
    seeded: dict[str, dict[str, bytes]],
    drop_policy: list[TestHost],
    tmp_path: Path,
) -> None:
    """The pipeline's order (firewall, then ntp) on hosts that drop everything but ssh: the firewall
    step opens UDP 123 on the master for the workers only, so every worker follows the master
    (earlier versions opened TCP only: every worker spent the whole 60 s wait and failed)."""
    cluster = chrony_cluster
    node1, node2, node3 = cluster.hosts
    inventory = str(_inventory(cluster, tmp_path / "hosts.yaml"))
    try:
        fw = _cli(cluster, home, "-i", inventory, "--json", "firewall")
        assert fw.returncode == 0, fw
        ntp, took = _timed(cluster, home, "-i", inventory, "--json", "ntp", "--no-clock-control")
        assert ntp.returncode == 0, f"ntp took {took:.1f} s\n{ntp}"
        nodes = {n["name"]: n for n in ntp.json()["nodes"]}
        for worker in (node2, node3):
            entry = nodes[worker.name]
            assert entry["ok"] and entry["state"] == "added", f"ntp took {took:.1f} s: {entry}"
            assert entry["selected"] == node1.addr, f"ntp took {took:.1f} s: {entry}"
        assert nodes["node1"]["ok"], nodes["node1"]

        # what the firewall step opened for it: UDP 123 on the master, from the workers only
        by_node = {n["name"]: n for n in fw.json()["nodes"]}
        assert "123/udp" in by_node["node1"]["ports"], by_node["node1"]
        assert not any("123" in p for name in ("node2", "node3") for p in by_node[name]["ports"]), by_node
        rules = _ntp_rules(cluster, node1)
        assert sorted(r.split()[2] for r in rules) == sorted([node2.addr, node3.addr]), rules  # workers only
        assert all(r.startswith("ip saddr ") and 'comment "cluster-bootstrap:' in r for r in rules), rules
        assert _ntp_rules(cluster, node2) == [] and _ntp_rules(cluster, node3) == []

        again = _cli(cluster, home, "-i", inventory, "--json", "firewall")
        assert again.returncode == 0, again
        master = {n["name"]: n for n in again.json()["nodes"]}["node1"]
        assert master["status"] == "unchanged" and master["commands"] == [], master
    finally:
        restore = _cli(cluster, home, "-i", inventory, "ntp", "--restore")
        removed = _cli(cluster, home, "-i", inventory, "--json", "firewall", "--remove")
    assert restore.returncode == 0, restore
    assert removed.returncode == 0, removed
    assert {n["name"]: n["removed"] for n in removed.json()["nodes"]}["node1"] == 6  # 2 peers x (2 TCP + UDP)
    assert all(_ntp_rules(cluster, h) == [] for h in cluster.hosts)
    assert "cluster-bootstrap" not in cluster.host_run(node1, ["nft", "list", "ruleset"]).stdout
    assert _snapshot(cluster) == seeded


def test_ntp_behind_a_drop_policy_without_the_firewall_step_fails_the_workers_with_the_reason(
    chrony_cluster: NamespaceCluster,
    home: Path,
    seeded: dict[str, dict[str, bytes]],
    drop_policy: list[TestHost],
    tmp_path: Path,
) -> None:
    """UDP 123 blocked on the master: each worker is reported failed (not `added`), with no source in
    the table, the reason and the fix; the step does not wait out its deadline. A rerun after the
    firewall step syncs the workers (chronyd is asked again at once, not at its next poll)."""
    cluster = chrony_cluster
    node1, node2, node3 = cluster.hosts
    inventory = str(_inventory(cluster, tmp_path / "hosts.yaml"))
    try:
        run, took = _timed(cluster, home, "-i", inventory, "--json", "ntp", "--no-clock-control")
        assert run.returncode == 1, f"ntp took {took:.1f} s\n{run}"
        nodes = {n["name"]: n for n in run.json()["nodes"]}
        assert nodes["node1"]["ok"], nodes["node1"]
        for worker in (node2, node3):
            entry = nodes[worker.name]
            assert not entry["ok"] and entry["state"] == "failed", f"ntp took {took:.1f} s: {entry}"
            assert entry["selected"] is None, entry
            assert "UDP 123 to the master is blocked: run `bootstrap firewall`" in entry["problem"], entry
            assert f"open UDP 123 from {worker.addr} on the master" in entry["problem"], entry
            assert f"node '{worker.name}': no time source: the master ({node1.addr})" in run.stderr, run

        # the table: failed, and no source for the workers (the master is what they lack)
        table = _cli(cluster, home, "-i", inventory, "ntp", "--no-clock-control")
        assert table.returncode == 1, table
        rows = {
            line.split()[1]: line
            for line in table.stdout.splitlines()
            if line.split()[1:2] in (["node2"], ["node3"])
        }
        assert set(rows) == {"node2", "node3"}, table
        for row in rows.values():
            assert "failed" in row and " none " in row and node1.addr not in row, table

        fw = _cli(cluster, home, "-i", inventory, "firewall")
        assert fw.returncode == 0, fw
        synced, took = _timed(cluster, home, "-i", inventory, "--json", "ntp", "--no-clock-control")
        assert synced.returncode == 0, f"ntp took {took:.1f} s\n{synced}"
        nodes = {n["name"]: n for n in synced.json()["nodes"]}
        assert all(nodes[w.name]["selected"] == node1.addr for w in (node2, node3)), f"{took:.1f} s: {nodes}"
    finally:
        restore = _cli(cluster, home, "-i", inventory, "ntp", "--restore")
        removed = _cli(cluster, home, "-i", inventory, "firewall", "--remove")
    assert restore.returncode == 0, restore
    assert removed.returncode == 0, removed
    assert _snapshot(cluster) == seeded
