"""`bootstrap bench --scaling`: the table and its page, every point measured (1 and 2 nodes, equal
and measured shares; each rank's bar). The report's shape is checked here, on hosts as they are:
what a slow host does to the shares and the speed is test_bench_probe.py's and test_bench.py's (a
throttled host there would only slow each of these trainings' torch imports down 4 times). Two
hosts: three trainings (a set of one trains once) show every kind of point; a third host would add
two more trainings of the same shape."""

from __future__ import annotations

import re
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.e2e.bench_support import TRAIN, Points, bench_inventory, run_bench


def test_the_scaling_report_measures_every_point(
    trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    # a small batch keeps its training runs short
    inv = bench_inventory(cluster, tmp_path / "h.yaml", hosts=2, args=[*TRAIN, "--batch-size", "64"])
    scaled = run_bench(
        cluster, trusted_home, "-i", str(inv), "bench", "--scaling", "--steps", "10", "--repeats", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert scaled.returncode == 0, str(scaled)
    print(scaled.stdout)
    (page,) = (tmp_path / "runs").glob("bench-*/scaling.html")
    points = Points()
    points.feed(page.read_text())
    series = {(p["data-series"], p["data-nodes"]) for p in points.points}
    assert series == {(m, str(n)) for m in ("equal", "measured") for n in (1, 2)}, series
    assert {(b["data-mode"], b["data-rank"]) for b in points.bars} == {
        (m, str(r)) for m in ("equal", "measured") for r in (0, 1)
    }
    # the table: a row per node count; one rank trained once, its figure stands for both modes
    one = re.search(r"^│\s+1 │\s+1 │\s+(\d+) │\s+1\.00x │\s+100 % │\s+(\d+) │", scaled.stdout, re.M)
    assert one and one[1] == one[2], scaled.stdout
    assert re.search(r"^│\s+2 │\s+2 │\s+\d+ │", scaled.stdout, re.M), scaled.stdout
