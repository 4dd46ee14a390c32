"""Nodes without a route to a package index (issue 28): `bootstrap --sync-from-master`, no
`cluster.env`, trains.

The namespace hosts have no route out, and here no package source of their own either (each host's
`/root/.config/pip` is an empty directory of its own: this machine's pip configuration names local
wheel directories, which a lab's nodes would not have). Their pip would look for torch on PyPI and
fail after its retries. The controller reaches an index: this machine's own package directories
stand for it (`PIP_INDEX_URL` and friends in its environment, as a user's pip configuration would
say). The environment probe finds that the nodes reach no index, and the sync takes the offline path
by itself: the controller downloads the master's set and pushes the wheels.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import NamespaceCluster
from tests.conftest import BOOTSTRAP, CHRONY_DIRS, CliRun, require_cluster_support

NAMES = ("node1", "node2")


@pytest.fixture
def isolated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    """Two hosts (the fewest that make a cluster: each installs torch) without pip configuration."""
    require_cluster_support()
    for source in ("/opt/pypi/simple", "/opt/wheels"):
        assert Path(source).is_dir(), f"{source}: this machine's package sources are missing"
    cluster = NamespaceCluster(
        2, workdir=tmp_path_factory.mktemp("noindex"), private_dirs=(*CHRONY_DIRS, "/root/.config/pip")
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_nodes_without_an_index_get_the_masters_environment_from_this_machine(
    isolated: NamespaceCluster, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh").chmod(0o700)
    shutil.copyfile(isolated.client_key, home / ".ssh" / "id_ed25519")
    (home / ".ssh" / "id_ed25519").chmod(0o600)
    (home / ".ssh" / "known_hosts").write_text(isolated.known_hosts_text())
    bare = tmp_path / "bare-python"  # the nodes' Python: no torch (the master's comes from here)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    doc = {
        "cluster": {
            "name": "lab",
            "master": "node1",
            "backend": "gloo",
            "train": {"args": ["--epochs", "1", "--max-steps", "5"]},
        },
        "defaults": {
            "user": "root",
            "python": str(bare / "bin" / "python"),
            "workdir": str(tmp_path / "cb" / "{node}"),
        },
        "nodes": [{"name": h.name, "host": h.addr} for h in isolated.hosts],
    }
    inv = tmp_path / "hosts.yaml"
    inv.write_text(json.dumps(doc, indent=2) + "\n")
    env = {"HOME": str(home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def bootstrap(*args: str) -> CliRun:
        argv = isolated.controller_argv([BOOTSTRAP, "-i", str(inv), *args], env=env)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900, cwd=tmp_path)
        return CliRun(argv, proc.returncode, proc.stdout, proc.stderr)

    # the index this machine reaches: a directory holding the master's set (the controller's
    # namespace has no route out either), filled from this machine's own package sources
    frozen = bootstrap("sync", "--freeze", "lock.txt")
    assert frozen.returncode == 0, frozen.stderr
    wheels = tmp_path / "index"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), "-r", "lock.txt"],
        check=True,
        timeout=600,
        cwd=tmp_path,
    )
    env.update({"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)})  # the controller's pip settings

    run = bootstrap("--sync-from-master")

    assert run.returncode == 0, run.stderr
    err = run.stderr
    said = re.findall(r"^(.*) cannot reach the package index \((.+?)\): this machine downloads", err, re.M)
    assert len(said) == 1, err  # one line, for both nodes
    assert said[0][0] == "node1, node2" and "pypi.org" in said[0][1], said
    assert "previous environment" not in err and "No matching distribution" not in err, err
    assert "2/2 nodes synced (0 unchanged), identical" in err, err
    for node, rank in (("node1", 0), ("node2", 1)):
        assert re.search(rf"^\[{node}:{rank}\] \[rank {rank}/2\]", run.stdout, re.M), run.stdout
    for name in NAMES:  # each node trained in its own venv, built from the wheels pushed to it
        wheels = tmp_path / "cb" / name / "venv.wheels"
        assert any(p.name.startswith("torch-") for p in wheels.glob("*.whl")), list(wheels.iterdir())
