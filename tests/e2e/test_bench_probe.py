"""`bootstrap bench` with one slow host (node3 gets a quarter of one CPU: bench_support.throttled): the
probe measures every rank and ranks node3 slowest by a clear margin, gives it the smallest share, and
its table for humans says so. The hosts share this machine's cores: assertions compare ranks measured
side by side, never an absolute time. (The scaling report: test_bench_scaling.py; training with the
shares it measures: test_bench.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.e2e.bench_support import TRAIN, bench_inventory, favoured, run_bench, throttled


def test_the_probe_ranks_the_slow_host_slowest_and_gives_it_the_smallest_share(
    trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    node1, node2, node3 = cluster.hosts
    # node1 and node2 outweigh the other tests' work here, node3 is capped (bench_support)
    with favoured(node1), favoured(node2), throttled(node3, favoured=True):
        inv = bench_inventory(cluster, tmp_path / "h.yaml", args=TRAIN)
        run = run_bench(cluster, trusted_home, "-i", str(inv), "bench", "--repeats", "3", cwd=tmp_path)
    assert run.returncode == 0, str(run)
    print(run.stdout)  # the table, for the report (pytest -s)
    assert "slowest: rank 2 on node3" in run.stderr, run.stderr
    # what --json prints, kept beside the per-node output
    (saved,) = (tmp_path / "runs").glob("bench-*/bench.json")
    doc = json.loads(saved.read_text())
    speeds = {r["node"]: r["samples_per_s"] for r in doc["probe"]["ranks"]}
    # node3 is the slowest rank, clearly
    assert doc["probe"]["slowest"]["node"] == "node3", speeds
    assert speeds["node3"] < 0.6 * min(speeds["node1"], speeds["node2"]), speeds
    assert all(r["device"].startswith("CPU ") for r in doc["probe"]["ranks"]), doc["probe"]["ranks"]
    shares = doc["shares"]["shares"]
    assert sum(shares) == 3 * 64 and shares[2] == min(shares) and min(shares) >= 1, shares
    # and the table for humans names each rank with its share
    for rank, node in enumerate(("node1", "node2", "node3")):
        assert re.search(rf"\b{rank}\W+{node}\b.*\b{shares[rank]}\W*$", run.stdout, re.M), run.stdout
