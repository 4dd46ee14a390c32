"""Dashboard benchmark (issue 31): what a page attached to `logs --follow` costs, 4 nodes streaming.

The `logs --follow` path of benchmarks/logs.py (a 4-host namespace cluster, each node printing
``--lines`` numbered lines as fast as it can, followed from its node.log), measured without and with
a dashboard attached: a LiveRun fed every block (RankedOutput.on_block, as `logs --follow
--dashboard` and `launch --dashboard` do), its server running, and one viewer reading the event
stream. Lines/s (aggregate), lines lost, and the controller's RSS after each run and at its peak.
Target: the dashboard costs at most 10 % of the throughput, and its memory stays bounded.

    sudo .venv-test/bin/python benchmarks/dashboard.py [--lines 250000] [--runs 3]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from logs import NODES, PRINTER, Row, run_logs  # type: ignore[import-not-found]  # noqa: E402

from orchestrator.dashboard.model import LiveRun  # noqa: E402
from orchestrator.dashboard.server import DashboardServer, Listen  # noqa: E402
from tests.cluster import NamespaceCluster  # noqa: E402


def rss_mb() -> float:
    """The controller's resident memory now (MiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def viewer(url: str, stop: threading.Event, got: list[int]) -> None:
    """One page's worth of reading: the event stream, byte counts only."""
    with urllib.request.urlopen(url + "api/stream", timeout=30) as stream:
        while not stop.is_set():
            chunk = stream.readline()
            if not chunk:
                return
            got[0] += len(chunk)


def with_dashboard(cluster: NamespaceCluster, known: Path, printer: Path, lines: int, tmp: Path) -> Row:
    names = [h.name for h in cluster.hosts]
    live = LiveRun(names, run_id="bench", labels={n: (i, 1) for i, n in enumerate(names)}, command="logs")
    server = DashboardServer(live, Listen("127.0.0.1", 0))
    server.start()
    stop, got = threading.Event(), [0]
    reader = threading.Thread(target=viewer, args=(server.url, stop, got), daemon=True)
    reader.start()
    try:
        row: Row = run_logs(cluster, known, printer, lines, 0.0, tmp, on_block=live.block)
    finally:
        stop.set()
        server.stop()
    row.path = f"logs --follow + dashboard ({got[0] / 1e6:.1f} MB sent)"
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=250_000, help="lines per node")
    parser.add_argument("--runs", type=int, default=3, help="runs per path (the median run is shown)")
    args = parser.parse_args()
    rows: dict[str, list[tuple[Row, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="cb-bench-dash-") as tmp_name, NamespaceCluster(NODES) as cluster:
        tmp = Path(tmp_name)
        printer = tmp / "printer.py"
        printer.write_text(PRINTER)
        known = tmp / "known_hosts"
        known.write_text(cluster.known_hosts_text())
        for _ in range(args.runs):  # alternated: both see the same machine load over time
            plain = run_logs(cluster, known, printer, args.lines, 0.0, tmp)
            rows.setdefault("logs --follow", []).append((plain, rss_mb(), peak_mb()))
            attached = with_dashboard(cluster, known, printer, args.lines, tmp)
            rows.setdefault("logs --follow + dashboard", []).append((attached, rss_mb(), peak_mb()))
    print(f"\n{NODES} nodes x {args.lines:,} lines, median of {args.runs} run(s)")
    print(f"{'path':<48}{'lines/s':>12}{'lost':>6}{'RSS MiB':>9}{'peak MiB':>10}{'vs plain':>10}")
    base = statistics.median(r.lines_per_s for r, _, _ in rows["logs --follow"])
    for runs in rows.values():
        row, rss, peak = sorted(runs, key=lambda x: x[0].lines_per_s)[len(runs) // 2]
        print(
            f"{row.path:<48}{row.lines_per_s:>12,.0f}{row.lost:>6}{rss:>9.0f}{peak:>10.0f}"
            f"{row.lines_per_s / base:>10.2f}"
        )
    print("\ntarget: the dashboard costs at most 10 % of the throughput (>= 0.90); RSS bounded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
