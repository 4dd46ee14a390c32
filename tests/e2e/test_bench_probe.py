"""`bootstrap bench` with one slow host (node3 gets a quarter of one CPU: bench_support.throttled): the
probe measures every rank and ranks node3 slowest by a clear margin, gives it the smallest share, and
its table for humans says so. The hosts share this machine's cores: assertions compare ranks measured
side by side, never an absolute time. (The scaling report: test_bench_scaling.py; training with the
shares it measures: test_bench.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.e2e.bench_support import (
    TRAIN,
    bench_inventory,
    run_bench,
    throttled,
)


def test_the_probe_ranks_the_slow_host_slowest_and_gives_it_the_smallest_share(
    trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    with throttled(cluster.hosts[2]):
        inv = bench_inventory(cluster, tmp_path / "h.yaml", args=TRAIN)
        # node3 is the slowest rank, clearly
        run = run_bench(
            cluster, trusted_home, "-i", str(inv), "bench", "--json", "--repeats", "5", cwd=tmp_path
        )
        assert run.returncode == 0, str(run)
        doc = json.loads(run.stdout)
        speeds = {r["node"]: r["samples_per_s"] for r in doc["probe"]["ranks"]}
        assert doc["probe"]["slowest"]["node"] == "node3", speeds
        assert speeds["node3"] < 0.6 * min(speeds["node1"], speeds["node2"]), speeds
        assert all(r["device"].startswith("CPU ") for r in doc["probe"]["ranks"]), doc["probe"]["ranks"]
        shares = doc["shares"]["shares"]
        assert sum(shares) == 3 * 64 and shares[2] == min(shares) and min(shares) >= 1, shares
        human = run_bench(cluster, trusted_home, "-i", str(inv), "bench", "--repeats", "2", cwd=tmp_path)
        assert human.returncode == 0, str(human)
        assert "slowest: rank 2 on node3" in human.stderr, human.stderr
        print(human.stdout)  # the table, for the report (pytest -s)
