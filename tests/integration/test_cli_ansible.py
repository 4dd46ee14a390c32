"""A lab's existing Ansible inventory drives the real CLI against the namespace cluster, unchanged."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun


def test_ansible_inventory_checks_the_cluster(
    bootstrap: Callable[..., CliRun], trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    n1, n2, n3 = cluster.hosts
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        f"""\
all:
  vars:
    ansible_user: root
    ansible_python_interpreter: {sys.executable}
    ansible_become: true          # Ansible-only: ignored with a note
    bootstrap_cluster_name: lab
  children:
    masters:
      hosts:
        head: {{ansible_host: {n1.addr}}}
    workers:
      vars:
        bootstrap_nproc: 2
      hosts:
        w1: {{ansible_host: {n2.addr}}}
        w2:
          ansible_host: {n3.addr}
          ansible_port: 22
"""
    )
    run = bootstrap("-i", str(inv), "--json", "check")
    assert run.returncode == 0, run
    doc = json.loads(run.stdout)
    assert doc["inventory"]["cluster"]["master"] == "head"
    assert [n["name"] for n in doc["nodes"]] == ["head", "w1", "w2"]
    assert [n["facts"]["hostname"] for n in doc["nodes"]] == ["node1", "node2", "node3"]
    assert "ansible_become" in run.stderr  # noted, not an error
    run = bootstrap("-i", str(inv), "run", "--nodes", "tag:workers", "--", "hostname")
    assert run.returncode == 0, run
    assert sorted(run.stdout.split()) == ["[w1]", "[w2]", "node2", "node3"]
