"""`bootstrap check` against the namespace cluster: each cause of a rendezvous hang produced for real."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import NamespaceCluster, TestHost
from tests.conftest import CliRun, write_inventory

Bootstrap = Callable[..., CliRun]
PYTHON = sys.executable  # the test venv: torch 2.13.0 (CPU), readable by root on every host
FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


def _nodes(cluster: NamespaceCluster, **per_node: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": h.name, "host": h.addr, "user": "root", "python": PYTHON, **per_node.get(h.name, {})}
        for h in cluster.hosts
    ]


def _check(bootstrap: Bootstrap, inventory: Path, *args: str) -> tuple[CliRun, dict[str, Any]]:
    run = bootstrap("-i", str(inventory), "--json", "check", *args)
    assert run.stdout, run
    doc = json.loads(run.stdout)
    return run, {n["name"]: n for n in doc["nodes"]} | {"_doc": doc}


def test_healthy_cluster_is_ready(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    # the namespaces share this machine's disk: each node gets a workdir of its own, as on a LAN
    own = {h.name: {"workdir": str(tmp_path / "work" / h.name)} for h in cluster.hosts}
    inv = write_inventory(tmp_path / "h.yaml", _nodes(cluster, **own), master="node1")
    run, nodes = _check(bootstrap, inv)
    assert run.returncode == 0, run
    for host in cluster.hosts:
        checks = nodes[host.name]["checks"]
        assert {c["level"] for c in checks.values()} == {"ok"}, {
            name: (c["level"], c["reason"]) for name, c in checks.items() if c["level"] != "ok"
        }
        assert checks["interface"]["data"]["source"] == host.addr
        assert abs(checks["clock"]["data"]["offset_s"]) < 0.5  # one kernel clock for all namespaces
    assert nodes["_doc"]["backend"] == "gloo" and "cannot run NCCL" in nodes["_doc"]["backend_reason"]
    human = bootstrap("-i", str(inv), "check")
    assert human.returncode == 0 and "ready to train" in human.stderr
    # -v: every verdict, one line for the nodes it fits alike (not the same words three times)
    verbose = bootstrap("-i", str(inv), "-v", "check")
    assert re.search(r"^node1, node2, node3 ok reachability: master port", verbose.stderr, re.M), verbose
    assert re.search(r"^node2 ok interface: eth0 \(", verbose.stderr, re.M), verbose  # its own words


def _stub_torch_venv(root: Path, version: str) -> str:
    """A second environment whose torch reports another version (only the real 2.13 wheel is on disk)."""
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(root)], check=True)
    site = next(root.glob("lib/python3*/site-packages"))
    pkg = site / "torch"
    (pkg / "distributed").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"__version__ = {version!r}\nfrom . import version, cuda, distributed\n")
    (pkg / "version.py").write_text("cuda = None\n")
    (pkg / "cuda.py").write_text(
        "def is_available():\n    return False\n\ndef device_count():\n    return 0\n"
    )
    (pkg / "distributed" / "__init__.py").write_text(
        "def is_available():\n    return True\n\ndef is_gloo_available():\n    return True\n\n"
        "def is_nccl_available():\n    return False\n"
    )
    return str(root / "bin" / "python")


def test_version_mismatches_fail_the_nodes_that_differ(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    other = _stub_torch_venv(tmp_path / "venv-2.12", "2.12.0+cpu")
    nodes = _nodes(cluster, node2={"python": "/usr/bin/python3"}, node3={"python": other})
    run, by = _check(bootstrap, write_inventory(tmp_path / "h.yaml", nodes, master="node1"))
    assert run.returncode == 1, run
    assert by["node1"]["checks"]["versions"]["level"] == "ok"
    v2, v3 = by["node2"]["checks"]["versions"], by["node3"]["checks"]["versions"]
    assert v2["level"] == "fail" and "torch is not installed" in v2["reason"]
    assert v3["level"] == "fail" and "torch 2.12.0+cpu here, 2.13.0+cpu on the master" in v3["reason"]
    assert by["_doc"]["versions"]["node3"]["torch"] == "2.12.0+cpu"
    human = bootstrap("-i", str(write_inventory(tmp_path / "h2.yaml", nodes, master="node1")), "check")
    assert re.search(r"node3 FAIL versions: torch 2\.12\.0\+cpu here", human.stderr), human
    assert "NOT ready to train" in human.stderr


@contextmanager
def hostname_on_loopback(host: TestHost) -> Iterator[None]:
    """The Debian/Ubuntu default: the host's own name mapped to 127.0.1.1 in its /etc/hosts."""
    hosts = Path(f"/etc/netns/{host.ns}/hosts")
    before = hosts.read_text()
    hosts.write_text(f"127.0.1.1\t{host.hostname}\n{before}")
    try:
        yield
    finally:
        hosts.write_text(before)


def test_hostname_on_loopback_and_a_wrong_interface(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    nodes = _nodes(cluster, node3={"interface": "eth9"})
    with hostname_on_loopback(cluster.hosts[1]):
        run, by = _check(bootstrap, write_inventory(tmp_path / "h.yaml", nodes, master="node1"))
    assert run.returncode == 1, run
    i2, i3 = by["node2"]["checks"]["interface"], by["node3"]["checks"]["interface"]
    assert i2["level"] == "warn" and "resolves to 127.0.1.1" in i2["reason"]
    assert "GLOO_SOCKET_IFNAME=" in i2["fix"]
    assert i3["level"] == "fail" and "'eth9'" in i3["reason"] and "does not exist" in i3["reason"]
    assert by["node1"]["checks"]["interface"]["level"] == "ok"


@pytest.mark.skipif(not FAKETIME.exists(), reason="libfaketime missing (tests/run.sh installs it)")
def test_skewed_clock_is_measured(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    host = cluster.hosts[2]
    cluster.set_session_env(host, {"LD_PRELOAD": str(FAKETIME), "FAKETIME": "+30s"})
    try:
        run, by = _check(bootstrap, write_inventory(tmp_path / "h.yaml", _nodes(cluster), master="node1"))
    finally:
        cluster.set_session_env(host, None)
    clock = by["node3"]["checks"]["clock"]
    assert clock["level"] == "warn", clock
    assert 29 < clock["data"]["offset_s"] < 31
    assert by["node2"]["checks"]["clock"]["level"] == "ok"
    assert run.returncode == 0, run  # a skewed clock alone does not stop a static rendezvous


@contextmanager
def dropping_incoming_tcp(cluster: NamespaceCluster, host: TestHost) -> Iterator[None]:
    """That host's firewall drops every incoming TCP connection except SSH."""
    rules = textwrap.dedent(
        """\
        table inet cbt_preflight {
          chain input {
            type filter hook input priority 0; policy accept;
            tcp dport 22 accept
            ip protocol tcp ct state new drop
          }
        }
        """
    )
    done = cluster.ns_run(host.ns, ["nft", "-f", "-"], input=rules)
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        cluster.ns_run(host.ns, ["nft", "delete", "table", "inet", "cbt_preflight"])


def test_closed_ports_name_the_pairs(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    with dropping_incoming_tcp(cluster, cluster.hosts[1]):
        run, by = _check(bootstrap, write_inventory(tmp_path / "h.yaml", _nodes(cluster), master="node1"))
    assert run.returncode == 1, run
    r2 = by["node2"]["checks"]["reachability"]
    assert (
        r2["level"] == "fail" and "node1" in r2["reason"] + r2["fix"] and "node3" in r2["reason"] + r2["fix"]
    )
    r1 = by["node1"]["checks"]["reachability"]
    assert r1["level"] == "fail" and "node2" in r1["reason"]
