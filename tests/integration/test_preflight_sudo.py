"""`bootstrap check` says, before the firewall and time steps run, which login cannot become root.

Real users on the namespace cluster: root, one without any sudo rule, one with passwordless sudo.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory

Bootstrap = Callable[..., CliRun]
#: Python under /root is not readable by other users: Debian's own (no torch: versions fail, unasked)
PYTHON = "/usr/bin/python3"
#: names no other test file uses: files run side by side (tests/run.sh), users are this machine's
NO_SUDO, SUDO_OK = "cbtpfnosudo", "cbtpfsudook"


@pytest.fixture
def users(cluster: NamespaceCluster) -> Iterator[None]:
    cluster.add_user(NO_SUDO, sudo="none")
    cluster.add_user(SUDO_OK, sudo="nopasswd")
    try:
        yield
    finally:
        cluster.remove_user(NO_SUDO)
        cluster.remove_user(SUDO_OK)


def _inventory(cluster: NamespaceCluster, path: Path, **settings: Any) -> Path:
    users = {"node1": "root", "node2": NO_SUDO, "node3": SUDO_OK}
    nodes = [{"name": h.name, "host": h.addr, "user": users[h.name], "python": PYTHON} for h in cluster.hosts]
    return write_inventory(path, nodes, master="node1", **settings)


def _sudo_verdicts(run: CliRun) -> dict[str, dict[str, Any]]:
    assert run.stdout, run
    return {n["name"]: n["checks"]["sudo"] for n in json.loads(run.stdout)["nodes"]}


def test_a_login_without_passwordless_sudo_fails_before_the_pipeline_needs_root(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, users: None, tmp_path: Path
) -> None:
    inv = _inventory(cluster, tmp_path / "h.yaml")  # 3 nodes: the pipeline runs firewall and time sync
    run = bootstrap("-i", str(inv), "--json", "check")
    assert run.returncode == 1, run
    sudo = _sudo_verdicts(run)
    assert sudo["node1"]["level"] == "ok" and sudo["node1"]["reason"].startswith("logged in as root")
    assert (
        sudo["node3"]["level"] == "ok"
        and f"{SUDO_OK} can run root commands with `sudo -n`" in sudo["node3"]["reason"]
    )
    strict = sudo["node2"]
    assert strict["level"] == "fail", strict
    assert strict["reason"].startswith(f"{NO_SUDO} cannot run root commands without a password here (")
    assert "firewall and time sync steps would stop here" in strict["reason"]
    assert f"on node2, as root: `echo '{NO_SUDO} ALL=(root) NOPASSWD: ALL' > /etc/sudoers.d/" in strict["fix"]
    assert strict["data"]["needed_by"] == ["firewall", "time sync"]

    human = bootstrap("-i", str(inv), "check")
    assert human.returncode == 1, human
    assert re.search(rf"node2 FAIL sudo: {NO_SUDO} cannot run root commands without a password", human.stderr)
    assert "NOPASSWD: ALL" in human.stderr and "NOT ready to train" in human.stderr


def test_without_managed_firewall_and_time_it_is_only_a_warning(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, users: None, tmp_path: Path
) -> None:
    inv = _inventory(cluster, tmp_path / "h.yaml", firewall={"manage": False}, time={"manage": False})
    sudo = _sudo_verdicts(bootstrap("-i", str(inv), "--json", "check"))
    assert sudo["node2"]["level"] == "warn", sudo["node2"]
    assert "this cluster's pipeline runs neither" in sudo["node2"]["reason"]
    assert "NOPASSWD" in sudo["node2"]["fix"]
    assert {sudo[n]["level"] for n in ("node1", "node3")} == {"ok"}


def test_the_pipeline_stops_before_changing_anything_when_a_node_cannot_become_root(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, users: None, tmp_path: Path
) -> None:
    """The main pipeline asks first: no code synced, no firewall rule, no chrony configuration on any
    node, and the line to add is named."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "marker.txt").write_text("never synced\n")
    dest = f"/tmp/cbt-sudo-gate-{tmp_path.name}"
    inv = _inventory(cluster, tmp_path / "h.yaml", code={"source": str(project), "dest": dest})
    run = bootstrap("-i", str(inv), "--json", cwd=tmp_path)
    assert run.returncode == 1, run
    doc = json.loads(run.stdout)
    assert doc["stopped"].startswith("not going on: the firewall and time sync step(s) need root"), doc
    assert all("exit_code" not in phase for phase in doc["phases"].values()), doc["phases"]
    assert f"node2: {NO_SUDO} cannot run root commands without a password" in run.stderr
    assert f"echo '{NO_SUDO} ALL=(root) NOPASSWD: ALL' > /etc/sudoers.d/cluster-bootstrap" in run.stderr
    assert "node1: " not in run.stderr and "node3: " not in run.stderr  # root, passwordless sudo
    for host in cluster.hosts:  # the sync never ran
        assert cluster.host_run(host, ["test", "-e", dest]).returncode == 1
