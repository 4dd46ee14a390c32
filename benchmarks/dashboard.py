"""Dashboard benchmark (issue 31): what a page attached to `logs --follow` costs, 4 nodes streaming.

The `logs --follow` path of benchmarks/logs.py (a 4-host namespace cluster, each node printing
``--lines`` numbered lines as fast as it can, followed from its node.log), measured without and with
a dashboard attached: a LiveRun fed every block (RankedOutput.on_block, as `logs --follow
--dashboard` and `launch --dashboard` do), its server running, and one viewer reading the event
stream. Each measurement runs in a process of its own, forked from the same parent (the cluster up,
every module imported): its controller RSS at the start (the parent's), at its peak (the kernel's
high-water mark) and that peak over the start, so that neither path inherits the other's heap.
Lines/s (aggregate), lines lost, and what the dashboard's model holds at the end (node text kept:
lines, points, pending blocks). At more than one size (lines per node): what the dashboard keeps
must not grow with the number of lines. Target: the dashboard costs at most 10 % of the throughput.

    sudo .venv-test/bin/python benchmarks/dashboard.py [--lines 50000,125000,250000,500000] [--runs 3]
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import statistics
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import logs  # type: ignore[import-not-found]  # noqa: E402
from logs import NODES, PRINTER, Row, run_logs  # type: ignore[import-not-found]  # noqa: E402

from orchestrator.dashboard.model import LiveRun  # noqa: E402
from orchestrator.dashboard.server import DashboardServer, Listen  # noqa: E402
from tests.cluster import NamespaceCluster  # noqa: E402


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rss_mb() -> float:
    """The controller's resident memory now (MiB)."""
    return _status_mb("VmRSS")


def peak_mb() -> float:
    """The controller's resident memory at its highest since :func:`reset_peak` (MiB)."""
    return _status_mb("VmHWM")


def reset_peak() -> float:
    """Start a new high-water mark (Linux: 5 to clear_refs); the RSS now, after a collection."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    return rss_mb()


def held_kib(live: LiveRun) -> float:
    """Node text the model holds (lines per rank and launcher, pending blocks) and its chart points."""
    text = sum(len(line) for rank in live.ranks.values() for line in rank.lines)
    text += sum(len(line) for lines in live.launcher_lines.values() for line in lines)
    text += sum(len(block) for blocks in live._pending.values() for block in blocks)
    points = sum(len(rank.points) for rank in live.ranks.values()) * 4 * 8
    return (text + points) / 1024


def viewer(url: str, stop: threading.Event, got: list[int]) -> None:
    """One page's worth of reading: the event stream, byte counts only."""
    with urllib.request.urlopen(url + "api/stream", timeout=30) as stream:
        while not stop.is_set():
            chunk = stream.readline()
            if not chunk:
                return
            got[0] += len(chunk)


def with_dashboard(
    cluster: NamespaceCluster, known: Path, printer: Path, lines: int, tmp: Path
) -> tuple[Row, float]:
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
    row.path = f"+ dashboard ({got[0] / 1e6:.1f} MB sent)"
    return row, held_kib(live)


class _Counted(list[float]):
    """A Tally's latencies, counted, the first ``KEEP`` kept: benchmarks/logs.py keeps one float per
    line (about 32 bytes: 32 MiB at 4 x 250,000 lines), which would be measured as the controller's
    growth with the number of lines. This benchmark reports neither latency."""

    KEEP = 10_000

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def append(self, value: float) -> None:
        self.count += 1
        if self.count <= self.KEEP:
            super().append(value)

    def __len__(self) -> int:
        return self.count


def _count_latencies() -> None:
    """Every Tally of this process keeps its latencies in a :class:`_Counted` (a forked child only)."""
    line = logs.Tally.line

    def counted_line(self: Any, text: str) -> None:
        if not isinstance(self.latencies, _Counted):
            self.latencies = _Counted()
        line(self, text)

    logs.Tally.line = counted_line  # type: ignore[method-assign]


def measure(
    cluster: NamespaceCluster, known: Path, printer: Path, lines: int, tmp: Path, dashboard: bool
) -> tuple[Row, float, float, float]:
    """One run in a child forked from here: (row, RSS at its start, its peak, model KiB)."""
    context = multiprocessing.get_context("fork")
    parent_end, child_end = context.Pipe(duplex=False)

    def child() -> None:
        _count_latencies()
        start = reset_peak()
        if dashboard:
            row, held = with_dashboard(cluster, known, printer, lines, tmp)
        else:
            row, held = run_logs(cluster, known, printer, lines, 0.0, tmp), float("nan")
            row.path = "logs --follow"
        child_end.send((row, start, peak_mb(), held))

    process = context.Process(target=child)
    process.start()
    got = parent_end.recv()
    process.join()
    return got  # type: ignore[no-any-return]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--lines", default="50000,250000", help="lines per node, one size or several (comma-separated)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per path (the median run is shown)")
    args = parser.parse_args()
    sizes = [int(n) for n in args.lines.split(",")]
    # per (size, path): (row, RSS at the start, peak, model's KiB)
    rows: dict[tuple[int, str], list[tuple[Row, float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="cb-bench-dash-") as tmp_name, NamespaceCluster(NODES) as cluster:
        tmp = Path(tmp_name)
        printer = tmp / "printer.py"
        printer.write_text(PRINTER)
        known = tmp / "known_hosts"
        known.write_text(cluster.known_hosts_text())
        for _ in range(args.runs):  # alternated: both see the same machine load over time
            for lines in sizes:
                for path in ("plain", "dashboard"):
                    got = measure(cluster, known, printer, lines, tmp, path == "dashboard")
                    rows.setdefault((lines, path), []).append(got)
    print(f"\n{NODES} nodes, median of {args.runs} run(s) (by lines/s); RSS of the run's own process")
    print(
        f"{'lines/node':>10}  {'path':<30}{'lines/s':>10}{'lost':>6}{'start MiB':>10}{'peak MiB':>10}"
        f"{'peak-start':>11}{'model KiB':>10}{'vs plain':>9}{'CPU us/line':>12}"
    )
    for lines in sizes:
        base = statistics.median(r.lines_per_s for r, *_ in rows[(lines, "plain")])
        for path in ("plain", "dashboard"):
            runs = rows[(lines, path)]
            row, start, peak, held = sorted(runs, key=lambda x: x[0].lines_per_s)[len(runs) // 2]
            grew = statistics.median(p - s for _, s, p, _ in runs)
            print(
                f"{lines:>10,}  {row.path:<30}{row.lines_per_s:>10,.0f}{row.lost:>6}"
                f"{start:>10.0f}{peak:>10.0f}{grew:>11.0f}{held:>10.0f}{row.lines_per_s / base:>9.2f}"
                f"{statistics.median(r.cpu_us for r, *_ in runs):>12.2f}"
            )
    print("(CPU us/line: the controller's CPU time per line, the median of the runs: what the machine's")
    print("load changes least)")
    print("\ntarget: the dashboard costs at most 10 % of the throughput (>= 0.90); its memory does not")
    print(
        "grow with the lines per node (peak-start, the median of the runs, and model KiB alike at every size)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
