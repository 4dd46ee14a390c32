"""Nodes whose workdirs are one directory (here: the namespace hosts share this machine's disk, as NFS
homes would), and the progress a sync shows while it works, on the namespace cluster with tiny wheels
built here (no network: see test_env_sync.py).

`check` names the nodes that share and the fix; `sync` refuses to build there before anything is
installed, and says that is the cause (not pip, not the index); `{node}` in `workdir` fixes it. Piped
output gets plain progress lines while the nodes work.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory
from tests.integration.test_env_sync import make_wheel

Bootstrap = Callable[..., CliRun]
NAMES = ("node1", "node2", "node3")


def _inventory(cluster: NamespaceCluster, tmp_path: Path, workdir: str, wheels: Path) -> Path:
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable, "workdir": workdir}
        for h in cluster.hosts
    ]
    env: dict[str, Any] = {"packages": ["tinya==1.0"], "find_links": [str(wheels)], "no_index": True}
    return write_inventory(tmp_path / "hosts.yaml", nodes, name="ns", master="node1", env=env)


def test_a_shared_workdir_is_named_by_check_refused_by_sync_and_fixed_by_node_in_workdir(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "tinya", "1.0")
    shared = tmp_path / "shared"
    inv = _inventory(cluster, tmp_path, str(shared), wheels)

    checked = bootstrap("-i", str(inv), "check", "--json", timeout=300)
    doc = json.loads(checked.stdout)
    workdir = {n["name"]: n["checks"]["workdir"] for n in doc["nodes"]}
    for name in NAMES:
        verdict = workdir[name]
        others = [n for n in NAMES if n != name]
        assert verdict["level"] == "fail", verdict
        assert f"{shared} is the same directory on {', '.join(others)}" in verdict["reason"], verdict
        assert "{node}" in verdict["fix"] and "workdir" in verdict["fix"], verdict

    run = bootstrap("-i", str(inv), "sync", "--only", "env", timeout=300)
    assert run.returncode == 1, run
    # the headline: the shared directory, once, with the fix; not the installer's or the index's fault
    assert "node1, node2, node3 share " + str(shared) in run.stderr, run.stderr
    assert "not a pip or index problem" in run.stderr and "{node}" in run.stderr
    assert "fix the requirements or the index settings" not in run.stderr
    assert "0/3 nodes synced, 3 failed" in run.stderr and ", ok" not in run.stderr
    assert not (shared / "venv").exists() and not (shared / "venv.versions").exists()  # nothing built

    fixed = _inventory(cluster, tmp_path, str(tmp_path / "own" / "{node}"), wheels)
    checked = bootstrap("-i", str(fixed), "check", "--json", timeout=300)
    doc = json.loads(checked.stdout)
    for node in doc["nodes"]:
        assert node["checks"]["workdir"]["level"] == "ok", node["checks"]["workdir"]
    # piped output (not a terminal): a plain line per working node every interval (0.2 s here)
    run = bootstrap(
        "-i", str(fixed), "sync", "--only", "env", env={"BOOTSTRAP_PROGRESS_INTERVAL": "0.2"}, timeout=300
    )
    assert run.returncode == 0, run
    assert "3/3 nodes synced (0 unchanged), identical" in run.stderr
    progress = re.findall(r"^\[(node\d)\] (.+) \((\d+) s\)$", run.stderr, re.M)
    assert {node for node, _, _ in progress} == set(NAMES), run.stderr
    activities = {activity for _, activity, _ in progress}
    known = ("creating the environment", "resolving packages", "collecting tinya", "installing tinya")
    assert activities & set(known), activities
    for name in NAMES:
        assert f"{name}: env check ok" in run.stderr and f"{name}: env build ok" in run.stderr
        assert (tmp_path / "own" / name / "venv" / "bin" / "python").exists()
