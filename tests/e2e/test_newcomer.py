"""The newcomer's path of docs/quickstart.md (issue 15), on a fresh namespace cluster shaped like the
machines a newcomer meets: Python but no torch on the nodes (each node's `python` is a venv made here
without it), an sshd without the sftp subsystem (a hardened host), and one filesystem under every
node's workdir (as NFS homes are).

The walk: first contact (host keys refused with their fingerprints, then accepted), `check` (no torch:
its fix names `bootstrap sync --from-master`; the shared workdir is named), the pipeline with
`--sync-from-master` (refused before installing anything: the nodes share one directory, said as
such), `{node}` in `workdir`, the pipeline again: torch arrives on every node (piped progress lines
while it installs), then firewall, ntp, check, validate and training. `check` afterwards is green.

`bootstrap keys` (password-only hosts) is left out: these hosts take the test's key from the start.
The nodes have no route to an index: the master's packages come from a local wheel directory the test
fills from this machine's disk (`pip download` of exactly what `bootstrap sync --freeze` lists), named
in the inventory (`env.find_links`, `env.no_index`), as an offline lab would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import NamespaceCluster
from tests.conftest import BOOTSTRAP, CHRONY_DIRS, CliRun, require_cluster_support

Run = Callable[..., CliRun]
NAMES = ("node1", "node2")


@pytest.fixture
def hardened(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NamespaceCluster]:
    """Two fresh hosts whose sshd offers no sftp subsystem (the fewest that make a cluster: each
    host installs torch, the longest part of this test)."""
    require_cluster_support()
    cluster = NamespaceCluster(
        2, workdir=tmp_path_factory.mktemp("newcomer"), private_dirs=CHRONY_DIRS, sftp=False
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def run(hardened: NamespaceCluster, tmp_path: Path) -> Run:
    """`bootstrap` in the controller namespace, HOME with only the client key (no known_hosts yet),
    output piped (not a terminal), from the newcomer's project directory."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh").chmod(0o700)
    key = home / ".ssh" / "id_ed25519"
    shutil.copyfile(hardened.client_key, key)
    key.chmod(0o600)

    def bootstrap(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> CliRun:
        full = {"HOME": str(home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        full.update(env or {})
        argv = hardened.controller_argv([BOOTSTRAP, *args], env=full)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
        return CliRun([BOOTSTRAP, *args], proc.returncode, proc.stdout, proc.stderr)

    return bootstrap


def _write(tmp_path: Path, nodes: list[dict[str, Any]], workdir: str, python: Path, wheels: Path) -> Path:
    doc = {
        "cluster": {
            "name": "lab",
            "master": "node1",
            "backend": "gloo",
            # where packages come from (no index reachable here); no package is named: no cluster.env
            "env": {"find_links": [str(wheels)], "no_index": True},
            "train": {"args": ["--epochs", "1", "--max-steps", "5"]},
        },
        "defaults": {"user": "root", "python": str(python), "workdir": workdir},
        "nodes": nodes,
    }
    path = tmp_path / "hosts.yaml"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def _checks(run: CliRun) -> dict[str, dict[str, Any]]:
    doc = json.loads(run.stdout)
    return {n["name"]: n.get("checks") or {} for n in doc["nodes"]}


def test_a_newcomer_reaches_training_from_bare_hosts(
    hardened: NamespaceCluster, run: Run, tmp_path: Path
) -> None:
    bare = tmp_path / "bare-python"  # the nodes' Python: no torch in it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = bare / "bin" / "python"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    shared = tmp_path / "cb"  # every node's workdir: one directory, as an NFS home would be
    inv = _write(
        tmp_path, [{"name": h.name, "host": h.addr} for h in hardened.hosts], str(shared), python, wheels
    )

    # first contact: refused with each host's fingerprint, then accepted (compared, in real life)
    first = run("-i", str(inv), "check")
    assert first.returncode == 3, first
    assert "offered a host key that is not in" in first.stderr and "--accept-new-host-keys" in first.stderr
    checked = run("-i", str(inv), "check", "--accept-new-host-keys", "--json")
    assert checked.returncode == 1, checked
    assert set(_checks(checked)) == set(NAMES)
    for checks in _checks(checked).values():
        versions = checks["versions"]
        assert versions["level"] == "fail" and "torch is not installed" in versions["reason"], versions
        assert "`bootstrap sync --from-master`" in versions["fix"] and "pip install" not in versions["fix"]
        workdir = checks["workdir"]
        assert workdir["level"] == "warn" and f"{shared} is the same directory on" in workdir["reason"]
        assert "{node}" in workdir["fix"], workdir

    # the lock the nodes will get, and (this lab has no index) its wheels from this machine's disk
    frozen = run("-i", str(inv), "sync", "--freeze", "requirements.txt")
    assert frozen.returncode == 0, frozen
    lock = tmp_path / "requirements.txt"
    assert re.search(r"^torch==\d+\.\d+\.\d+", lock.read_text(), re.M), lock.read_text()
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), "-r", str(lock)],
        check=True,
        timeout=600,
    )

    # the pipeline with the master's environment: refused before anything is installed
    refused = run("-i", str(inv), "--sync-from-master")
    assert refused.returncode == 1, refused
    assert f"node1, node2 share {shared}" in refused.stderr, refused.stderr
    assert "not a pip or index problem" in refused.stderr
    assert f"`bootstrap -i {inv} sync --from-master` repeats just that step" in refused.stderr
    assert not (shared / "venv").exists()

    # {node} in workdir: a directory per node; the pipeline again, piped: progress lines every
    # BOOTSTRAP_PROGRESS_INTERVAL seconds (docs/sync.md; 10 by default, longer than the install
    # takes here)
    inv = _write(
        tmp_path,
        [{"name": h.name, "host": h.addr} for h in hardened.hosts],
        str(shared / "{node}"),
        python,
        wheels,
    )
    trained = run("-i", str(inv), "--sync-from-master", env={"BOOTSTRAP_PROGRESS_INTERVAL": "2"}, timeout=900)
    assert trained.returncode == 0, trained
    out, err = trained.stdout, trained.stderr
    progress = re.findall(r"^\[(node\d)\] (.+) \((\d+) s\)$", err, re.M)
    assert {node for node, _, _ in progress} == set(NAMES), err
    assert all(int(seconds) >= 2 for _, _, seconds in progress), progress
    assert "2/2 nodes synced (0 unchanged), identical" in err, err
    assert "ready to train" in err
    for node, rank in (("node1", 0), ("node2", 1)):
        assert re.search(rf"^\[{node}:{rank}\] \[rank {rank}/2\]", out, re.M), out
    for name in NAMES:  # each node trained in its own venv, made from the master's environment
        venv_python = shared / name / "venv" / "bin" / "python"
        installed = "import importlib.metadata as m; print(m.version('torch'))"  # torch's import: trained
        version = hardened.host_run(hardened.host(name), [str(venv_python), "-c", installed])
        assert version.returncode == 0, version.stderr
        assert str(version.stdout).strip() in lock.read_text(), version.stdout

    after = run("-i", str(inv), "check", "--json")
    assert after.returncode == 0, after
    for name, checks in _checks(after).items():
        assert checks["versions"]["level"] == "ok" and checks["workdir"]["level"] == "ok", (name, checks)
