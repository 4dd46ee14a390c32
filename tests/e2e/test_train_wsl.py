"""A Windows machine in WSL mode trains beside a Linux node: node1 (the master) over SSH, node3 reached as a
Windows node through the WS-Management test server running in node3's namespace (NTLM over HTTPS, the
test CA in the inventory). Its wsl.exe commands run for real in that namespace, so node3's ranks are
real torch processes in the gloo group with the others, driven through WinRS the way a real Windows
host would be (the Windows side itself, PowerShell, is not run: see docs/windows.md). node2 sits these
out: a second Linux node would only train beside them again."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory
from tests.e2e.windows_host import start_windows_host
from tests.winrm_server.host import HostedServer

Bootstrap = Callable[..., CliRun]
SECRET = "Wq9!distinctive-WSL-train-PASSWORD"
ENV = {"CBT_WIN_PASSWORD": SECRET}


@pytest.fixture
def windows_node3(cluster: NamespaceCluster) -> Iterator[HostedServer]:
    hosted = start_windows_host(cluster, cluster.hosts[2], username="bob", password=SECRET)
    try:
        yield hosted
    finally:
        hosted.stop()


def _inventory(cluster: NamespaceCluster, hosted: HostedServer, path: Path, **train: object) -> Path:
    nodes: list[dict[str, object]] = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts[:1]
    ]
    nodes.append(
        {
            "name": "node3",
            "host": cluster.hosts[2].addr,
            "os": "windows",
            "user": "bob",
            "password_env": "CBT_WIN_PASSWORD",
            "winrm": {"ca_bundle": str(hosted.ca_file)},
            "windows": {"mode": "wsl", "distro": "Ubuntu-22.04"},
            "python": sys.executable,  # inside the "distribution": node3's namespace on this machine
        }
    )
    return write_inventory(path, nodes, name="mixed", master="node1", backend="gloo", train=train)


def test_a_wsl_node_trains_beside_a_linux_node(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    windows_node3: HostedServer,
    tmp_path: Path,
) -> None:
    inv = _inventory(cluster, windows_node3, tmp_path / "h.yaml", args=["--epochs", "1", "--max-steps", "15"])
    run = bootstrap("-i", str(inv), cwd=tmp_path, timeout=300, env=ENV)  # check, validate, launch
    commands, parse_errors = windows_node3.commands(), windows_node3.parse_errors()
    assert run.returncode == 0, run.stdout + run.stderr
    for node, rank in (("node1", 0), ("node3", 1)):
        assert re.search(rf"^\[{node}:{rank}\] \[rank {rank}/2\]", run.stdout, re.M), run.stdout
    assert re.search(r"^\[node1:0\] done: ", run.stdout, re.M), run.stdout
    # node3 was driven through WinRS: the Linux side through wsl.exe for the inventory's distribution,
    # the Windows side (its facts) through PowerShell
    wsl = [c for c in commands if c.lower().startswith("wsl.exe -d ubuntu-22.04 ")]
    assert wsl and all(c in wsl or c.lower().startswith("powershell.exe ") for c in commands), commands
    assert parse_errors == []
    assert SECRET not in run.stdout + run.stderr
    assert "ready to train" in run.stderr and "2 of 2 rank(s) joined" in run.stderr, run.stderr
    (run_dir,) = (d for d in (tmp_path / "runs").iterdir() if not d.name.startswith("validate-"))
    controller_log = (run_dir / "node3.log").read_text()
    assert re.search(r"^\[default0\]:\[rank 1/2\]", controller_log, re.M), controller_log
    # the node's own log, written inside the "distribution" (node3's namespace, this filesystem)
    node_log = Path(f"/root/cluster-bootstrap/runs/{run_dir.name}/node3/node.log")
    # before the run's log exists, the launch may say what else still runs on the node: the Linux
    # node's validation ending, other tests' runs (every namespace host, and the WSL "distribution",
    # sees this machine's one PID space); the controller keeps such notices in its copy, the run's own
    # log starts with the run
    notices = re.compile(r"^bootstrap: \d+ process\(es\) of run \S+ still running on this node .*\n", re.M)
    assert node_log.read_text() == notices.sub("", controller_log)


def test_a_failing_wsl_node_stops_the_linux_node_and_is_named(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    windows_node3: HostedServer,
    tmp_path: Path,
) -> None:
    marker = f"cbt-wslfail-{time.monotonic_ns()}"
    script = tmp_path / f"{marker}.py"
    script.write_text(
        "import socket, sys, time\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if socket.gethostname() == 'node3':\n"
        "    print('node3 gives up', flush=True)\n"
        "    sys.exit(3)\n"
        "time.sleep(300)\n"
    )
    inv = _inventory(cluster, windows_node3, tmp_path / "h.yaml", script=str(script))
    begin = time.monotonic()
    run = bootstrap("-i", str(inv), "launch", cwd=tmp_path, timeout=300, env=ENV)
    assert run.returncode == 1, run
    assert time.monotonic() - begin < 120
    assert re.search(r"node3\W+exit 3 \(rank 1\)", run.stderr), (
        run.stderr
    )  # the rank's code, not torchrun's 1
    assert re.search(r"^\[node3:1\] node3 gives up$", run.stdout, re.M), run.stdout + run.stderr
    assert re.search(r"^ *\[node3\] exitcode *: 3", run.stderr, re.M), run.stderr  # its last lines
    assert re.search(r"node1\W+stopped", run.stderr), run
    for host in cluster.hosts:  # nothing of the run is left on any node
        deadline = time.monotonic() + 15
        while marker in cluster.ns_run(host.ns, ["pgrep", "-af", marker]).stdout:
            assert time.monotonic() < deadline, f"{host.name} still runs the job"
            time.sleep(0.1)


def test_facts_show_the_windows_build_and_modes_of_a_wsl_node(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    windows_node3: HostedServer,
    tmp_path: Path,
) -> None:
    inv = _inventory(cluster, windows_node3, tmp_path / "h.yaml")
    run = bootstrap("-i", str(inv), "facts", "--nodes", "node3", cwd=tmp_path, env=ENV)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    header = next(line for line in lines if line.startswith("┃"))
    column = [c.strip() for c in header.split("┃")].index("os")
    # the table folds long cells over several lines: join the os cell of node3's row
    os_cell = " ".join(line.split("│")[column].strip() for line in lines if line.startswith("│"))
    assert "in WSL on Microsoft Windows 11 Pro (build 22631.4460); modes: wsl" in os_cell, run.stdout
