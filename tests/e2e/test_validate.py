"""`bootstrap validate` on the namespace cluster: every rank joins and all_reduce is timed; a rank that
cannot reach the master is named instead of hanging."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.cluster import NamespaceCluster, TestHost
from tests.conftest import CliRun, write_inventory

Bootstrap = Callable[..., CliRun]


def _inventory(cluster: NamespaceCluster, path: Path, port: int) -> Path:
    nodes: list[dict[str, object]] = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts
    ]
    nodes[0]["nproc"] = 2  # world of 4: ranks 0-1 on node1, 2 on node2, 3 on node3
    return write_inventory(path, nodes, name="val", master="node1", backend="gloo", port=port)


def _validation_workers(host: TestHost) -> list[str]:
    """Command lines of validation workers in ``host``'s network namespace (`pgrep` alone would see
    the whole machine: the namespaces share one PID space, and other clusters may validate now)."""
    pids = subprocess.run(["ip", "netns", "pids", host.ns], capture_output=True, text=True, check=True)
    found = []
    for pid in pids.stdout.split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "validate_worker" in cmdline:
            found.append(cmdline)
    return found


def test_every_rank_joins_and_all_reduce_is_timed(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    inv = _inventory(cluster, tmp_path / "h.yaml", 29531)
    run = bootstrap("-i", str(inv), "validate", "--sizes", "4K,64K", "--json", cwd=tmp_path, timeout=240)
    assert run.returncode == 0, run
    doc = json.loads(run.stdout)
    assert doc["ok"] and doc["correct"] is True and doc["joined"] == 4 and doc["world_size"] == 4, doc
    assert [r["bytes"] for r in doc["all_reduce"]] == [4096, 65536]
    assert all(r["latency_s"] > 0 and r["busbw"] > 0 and r["iters"] >= 3 for r in doc["all_reduce"])
    human = bootstrap("-i", str(inv), "validate", "--sizes", "4K", cwd=tmp_path, timeout=240)
    assert human.returncode == 0, human
    assert "4 of 4 rank(s) joined" in human.stderr and "all_reduce result correct" in human.stderr
    assert "4 KiB" in human.stdout and "busbw" in human.stdout


def test_a_rank_that_cannot_reach_the_master_is_named(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    port = 29532
    master, _, blocked = cluster.hosts
    table = f"cbtval{time.monotonic_ns() % 100000}"
    rules = (
        f"add table inet {table}\n"
        f"add chain inet {table} input {{ type filter hook input priority 0; }}\n"
        f"add rule inet {table} input ip saddr {blocked.addr} tcp dport {port} drop\n"
    )
    cluster.ns_run(master.ns, ["nft", "-f", "-"], input=rules, check=True)
    try:
        inv = _inventory(cluster, tmp_path / "h.yaml", port)
        begin = time.monotonic()
        run = bootstrap("-i", str(inv), "validate", "--timeout", "8", cwd=tmp_path, timeout=240)
        elapsed = time.monotonic() - begin
    finally:
        cluster.ns_run(master.ns, ["nft", "delete", "table", "inet", table], check=True)
    assert run.returncode == 1, run
    assert "ranks never joined: node3 (rank 3) (3 of 4 joined)" in run.stderr, run.stderr
    assert f"rank 3 on node3 cannot reach the master: {master.addr}:{port}" in run.stderr, run.stderr
    assert elapsed < 120, f"took {elapsed:.0f} s: the timeout did not cut the wait"
    for host in cluster.hosts:  # nothing of the validation is left running
        deadline = time.monotonic() + 15
        while _validation_workers(host):
            assert time.monotonic() < deadline, f"{host.name} still runs the validation worker"
            time.sleep(0.1)
