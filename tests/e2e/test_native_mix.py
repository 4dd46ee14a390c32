"""A native Windows node cannot train beside Linux nodes (FIELD_NOTES: Windows wheels of torch have only
gloo's UV transport, Linux wheels only its TCP transport): `check`, `launch`, `validate` and the main
pipeline refuse such an inventory with exit 2 (a configuration error) before connecting to any node,
whatever `--nodes` selects and whichever node is down. node1 and node2 are Linux nodes over SSH; node3 is
a Windows machine in native mode: the WS-Management test server in node3's namespace, its Windows side
played (tests/e2e/windows_host.py), recording every request that reaches it."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster import NamespaceCluster, TestHost
from tests.conftest import CliRun, write_inventory
from tests.e2e.windows_host import start_windows_host
from tests.winrm_server.host import HostedServer

Bootstrap = Callable[..., CliRun]
SECRET = "Wq9!distinctive-native-mix-PASSWORD"
ENV = {"CBT_WIN_PASSWORD": SECRET}


@pytest.fixture
def windows_node3(cluster: NamespaceCluster) -> Iterator[HostedServer]:
    hosted = start_windows_host(cluster, cluster.hosts[2], username="bob", password=SECRET)
    try:
        yield hosted
    finally:
        hosted.stop()


def _inventory(
    path: Path, linux: list[TestHost], windows: TestHost, hosted: HostedServer, master: str
) -> Path:
    nodes: list[dict[str, object]] = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in linux
    ]
    nodes.append(
        {
            "name": windows.name,
            "host": windows.addr,
            "os": "windows",
            "user": "bob",
            "password_env": "CBT_WIN_PASSWORD",
            "winrm": {"ca_bundle": str(hosted.ca_file)},
            "windows": {"mode": "native"},
            "python": "C:\\Python312\\python.exe",
        }
    )
    return write_inventory(path, nodes, name="mixed", master=master, backend="gloo")


def _connections(cluster: NamespaceCluster, host: TestHost) -> int:
    """SSH connections the host's sshd accepted so far (LogLevel VERBOSE logs each one)."""
    return cluster.sshd_log(host).count("Connection from ")


def _assert_refused(run: CliRun, inventory: Path, native: str, others: list[str]) -> None:
    assert run.returncode == 2, run  # a configuration error: not 1 (a failed check), not 3 (unreachable)
    text = run.stderr
    assert f"{inventory}: native Windows node {native} (windows.mode: native)" in text, text
    assert "cannot train with " + ", ".join(others) + " (Linux)" in text, text
    assert "gloo's UV (libuv) transport" in text and "only its TCP transport" in text, text
    assert f"set windows: {{mode: wsl}} for {native}" in text, text  # what to do
    assert "make every node of the cluster native Windows" in text, text
    assert "Traceback" not in text and SECRET not in run.stdout + text


def test_check_validate_launch_and_the_pipeline_refuse_a_native_node_beside_linux_nodes(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    windows_node3: HostedServer,
    tmp_path: Path,
) -> None:
    node1, node2, node3 = cluster.hosts
    inv = _inventory(tmp_path / "mixed.yaml", [node1, node2], node3, windows_node3, master="node1")
    before = {h.name: _connections(cluster, h) for h in (node1, node2)}
    run_id = f"mix-refused-{time.monotonic_ns()}"
    runs = {
        "check": bootstrap("-i", str(inv), "check", cwd=tmp_path, env=ENV, timeout=60),
        # only the native node selected: it would answer alone, and nothing would be wrong with it
        "check --nodes node3": bootstrap(
            "-i", str(inv), "check", "--nodes", "node3", cwd=tmp_path, env=ENV, timeout=60
        ),
        "check --json": bootstrap("-i", str(inv), "--json", "check", cwd=tmp_path, env=ENV, timeout=60),
        "launch": bootstrap("-i", str(inv), "launch", "--run-id", run_id, cwd=tmp_path, env=ENV, timeout=60),
        "launch --nodes node3": bootstrap(
            "-i", str(inv), "launch", "--nodes", "node3", cwd=tmp_path, env=ENV, timeout=60
        ),
        "validate": bootstrap("-i", str(inv), "validate", cwd=tmp_path, env=ENV, timeout=60),
        "pipeline": bootstrap("-i", str(inv), cwd=tmp_path, env=ENV, timeout=60),
    }
    records = windows_node3.records()
    for name, run in runs.items():
        assert run.returncode == 2, f"{name}: {run}"
        _assert_refused(run, inv, "node3", ["node1", "node2"])
    assert runs["check --json"].stdout == ""  # no document: nothing was checked
    # nothing connected anywhere: not one WinRM request reached node3, no SSH connection node1 or
    # node2, no run directory here or on a node
    assert records == [], json.dumps(records)[:2000]
    assert {h.name: _connections(cluster, h) for h in (node1, node2)} == before
    assert not (tmp_path / "runs").exists()
    assert not Path(f"/root/cluster-bootstrap/runs/{run_id}").exists()


def test_a_linux_node_that_is_down_does_not_hide_the_mix(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    windows_node3: HostedServer,
    tmp_path: Path,
) -> None:
    """The Linux node is down: only the native node would answer, and a refusal computed from the
    nodes that answered would let it pass (then exit 3 for the unreachable node, the mix unnamed)."""
    _, node2, node3 = cluster.hosts
    inv = _inventory(tmp_path / "down.yaml", [node2], node3, windows_node3, master="node3")
    cluster.stop_sshd(node2)
    try:
        check = bootstrap("-i", str(inv), "check", cwd=tmp_path, env=ENV, timeout=60)
        launch = bootstrap("-i", str(inv), "launch", cwd=tmp_path, env=ENV, timeout=60)
    finally:
        cluster.start_sshd(node2)
    _assert_refused(check, inv, "node3", ["node2"])
    _assert_refused(launch, inv, "node3", ["node2"])
    assert windows_node3.records() == []
    assert not (tmp_path / "runs").exists()
