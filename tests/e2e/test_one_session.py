"""The main pipeline is one session (issue 13): a full `bootstrap -i hosts.yaml` with code sync, the
firewall and time sync managed, the preflight, validation and training logs in to each node exactly
once, as each node's own sshd records it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory

Bootstrap = Callable[..., CliRun]


def _logins(cluster: NamespaceCluster) -> dict[str, int]:
    counts = {}
    for host in cluster.hosts:
        assert host.sshd_log is not None
        text = host.sshd_log.read_text(errors="replace") if host.sshd_log.exists() else ""
        counts[host.name] = text.count("Accepted publickey")
    return counts


def test_the_whole_pipeline_logs_in_to_each_node_once(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("synced by the pipeline\n")
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts
    ]
    inventory = write_inventory(
        tmp_path / "hosts.yaml",
        nodes,
        name="one",
        master="node1",
        backend="gloo",
        code={"source": str(project)},
        train={"args": ["--epochs", "1", "--max-steps", "5"]},
    )
    before = _logins(cluster)
    run = bootstrap("-i", str(inventory), "--json", cwd=tmp_path, timeout=400)
    after = _logins(cluster)
    assert run.returncode == 0, run
    doc = json.loads(run.stdout)
    # every phase ran, on one session
    assert {name: doc["phases"][name].get("exit_code") for name in doc["phases"]} == {
        "sync": 0,
        "firewall": 0,
        "ntp": 0,
        "check": 0,
        "validate": 0,
        "launch": 0,
    }, doc["phases"]
    assert {name: after[name] - before[name] for name in after} == {h.name: 1 for h in cluster.hosts}, (
        before,
        after,
    )
