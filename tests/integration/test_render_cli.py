"""`bootstrap render` on the namespace cluster: interfaces and addresses found on the nodes."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory


def test_render_uses_each_nodes_route_to_the_master(
    bootstrap: Callable[..., CliRun], trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts
    ]
    inv = write_inventory(tmp_path / "h.yaml", nodes, name="ns", master="node1")
    run = bootstrap("-i", str(inv), "--json", "render", "--run-id", "ns-1")
    assert run.returncode == 0, run
    scripts = json.loads(run.stdout)["scripts"]
    master = cluster.hosts[0].addr
    for rank, host in enumerate(cluster.hosts):
        text = scripts[host.name]
        interface = cluster.ns_run(host.ns, ["ip", "-4", "-o", "route", "get", master]).stdout
        dev = re.search(r"dev (\S+)", interface).group(1)  # type: ignore[union-attr]
        if host is cluster.hosts[0]:
            dev = re.search(
                r"^\d+: (\S+)\s+inet " + re.escape(master),
                cluster.ns_run(host.ns, ["ip", "-4", "-o", "addr"]).stdout,
                re.M,
            ).group(1)  # type: ignore[union-attr]
        assert f"export GLOO_SOCKET_IFNAME={dev}\n" in text, text
        assert f"--master-addr {master}" in text and f"--node-rank {rank}" in text
        assert "--nnodes 3" in text and "export OMP_NUM_THREADS=" in text
    # --nodes as for launch: the job those nodes make, sized to them (node3 is not contacted)
    out = tmp_path / "scripts"
    run = bootstrap("-i", str(inv), "render", "--out", str(out), "--nodes", "node1,node2")
    assert run.returncode == 0, run
    assert sorted(p.name for p in out.iterdir()) == [
        "cb_shares.json",
        "cb_shares.py",
        "node1.sh",
        "node2.sh",
        "rank_capture.py",
    ]
    assert "--nnodes 2 " in (out / "node2.sh").read_text()
    assert "copy both to the run directory on each node" in run.stderr  # where the script names them
    assert (out / "node2.sh").stat().st_mode & 0o777 == 0o700
    alone = bootstrap("-i", str(inv), "render", "--nodes", "node2")  # without the master: as launch says
    assert alone.returncode == 2 and "--master" in alone.stderr, alone
