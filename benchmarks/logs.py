"""Log streaming benchmark: lines/s from 4 nodes printing as fast as they can, lines lost, latency.

Builds a 4-host namespace cluster (tests/cluster.py: real sshd per host). Every node runs a printer
that writes numbered lines carrying the time they were printed (``I TIMESTAMP padding``), as fast
as Python can. The controller checks the numbering (lost, duplicated or reordered lines) and, since
the namespaces share one clock, the latency from print to arrival. Paths measured:

  - ``ssh``: the baseline, OpenSSH's client running the printer on each node (``ssh node script``),
    its stdout read line by line here
  - ``ssh, 2 print() ranks``: the baseline for the ``ranks`` path, the same print() printers as it
    (PYTHONUNBUFFERED) but each rank on its own ``ssh node script`` (two sessions per node, so no
    line of one rank can be cut by the other's): what those ranks cost without any capture
  - ``launch``: bootstrap's foreground streaming path as `launch` uses it: the script run through
    the platform's logged() (tee into node.log) and stop-on-hangup wrappers over our SSH transport,
    each line through LineSplitter -> split_rank -> the controller log (RunLog) -> the UI's
    LinePrinter (to /dev/null: a terminal's speed is not ours to measure)
  - ``ranks``: the launch path with 2 ranks per node writing with plain ``print()`` under
    PYTHONUNBUFFERED (two writes per line), each rank captured to its own file and forwarded a
    complete line at a time by the node-side ``rank_capture.py mux`` (as launch.sh runs torchrun);
    every line of every rank is checked (lost, misordered, mangled)
  - ``logs``: `bootstrap logs --follow` on a detached run: the printer started detached
    (node.log on the node), its log tailed from byte offsets while it is written, by one Python
    process on the node (what the CLI uses) and by the shell fallback (tail + awk per poll)

Every path's per-line work on the controller includes parsing the number and timestamp (the same
for the baseline), and every line's text is compared with what was printed: a line cut, glued to
another or carrying another rank's text counts as mangled. CPU per line: ``CPU us/line`` is the
controller's (this process and its ssh clients), ``node us`` the nodes' (everything each host's
sshd reaped once the path's sessions ended, and the ranks' drainers, which this process reaps as
their subreaper), ``all us`` both: on shared cores far steadier than lines/s, and 2 cores divided
by it is the most any path can carry here. Targets (issue 7): >= 200k lines/s
aggregate, 0 lost, p99 <= 100 ms, and throughput >= 0.8 x the baseline; the print() path (issue 33):
>= 0.9 x ssh at full speed, 0 lost, 0 mangled.

    sudo .venv-test/bin/python benchmarks/logs.py [--lines 250000] [--runs 3] [--capture OLD/rank_capture.py]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from orchestrator.cli.ui import LinePrinter  # noqa: E402
from orchestrator.logs import RankedOutput, RunLog  # noqa: E402
from orchestrator.platforms import PosixShell  # noqa: E402
from orchestrator.runs.control import follow_node  # noqa: E402
from orchestrator.runs.layout import run_dir_for  # noqa: E402
from orchestrator.runs.posix import PosixRuns  # noqa: E402
from orchestrator.runs.start import start_node  # noqa: E402
from orchestrator.steps.launch import rank_capture_file  # noqa: E402
from orchestrator.transports import SSHOptions  # noqa: E402
from orchestrator.transports.ssh import SSHTransport  # noqa: E402
from tests import netns  # noqa: E402
from tests.cluster import NamespaceCluster  # noqa: E402

NODES = 4
PRINTER = """\
import sys, time
n = int(sys.argv[1])
rate = float(sys.argv[2])  # lines/s; 0: as fast as possible
w = sys.stdout.write
t = time.time
pad = "x" * 40
begin = t()
for i in range(n):
    w(f"[default0]:{i} {t():.6f} {pad}\\n")
    if rate and i % 50 == 49:
        sys.stdout.flush()
        ahead = begin + (i + 1) / rate - t()
        if ahead > 0:
            time.sleep(ahead)
sys.stdout.flush()
"""


#: the same lines through print(): with PYTHONUNBUFFERED, text and newline are two writes
PRINT_PRINTER = """\
import sys, time
n = int(sys.argv[1])
rate = float(sys.argv[2])
t = time.time
pad = "x" * 40
begin = t()
for i in range(n):
    print(f"{i} {t():.6f} {pad}")
    if rate and i % 50 == 49:
        ahead = begin + (i + 1) / rate - t()
        if ahead > 0:
            time.sleep(ahead)
"""


PAD = "x" * 40  # what follows the number and the time on every printed line


@dataclass
class Tally:
    """Per-node numbering check and latencies (one instance per node: no locking needed)."""

    expected: int
    next: int = 0
    bad: int = 0  # out of order or duplicated
    mangled: int = 0  # not a line as printed (cut, glued to another, another's text in it)
    latencies: list[float] = field(default_factory=list)
    last_at: float = 0.0

    def line(self, text: str) -> None:
        now = time.time()
        try:
            number, stamp, pad = text.split(" ", 2)
            i, printed = int(number), float(stamp)
        except ValueError:
            self.mangled += 1
            return
        if pad != PAD:
            self.mangled += 1
            return
        if i != self.next:
            self.bad += 1
        self.next = i + 1
        self.latencies.append(now - printed)
        self.last_at = now

    @property
    def lost(self) -> int:
        return self.expected - len(self.latencies)


class TallySink:
    """The terminal: what bootstrap writes there (``[node:rank] I STAMP pad``) is checked per node."""

    def __init__(self) -> None:
        self.by_head: dict[str, Tally] = {}
        self.unlabelled = Tally(0)  # lines without a known [node:rank] head: all of them mangled

    def write(self, text: str) -> int:
        by_head = self.by_head
        for line in text.split("\n")[:-1]:
            head, _, rest = line.partition(" ")
            by_head.get(head, self.unlabelled).line(rest if head in by_head else "")
        return len(text)

    def flush(self) -> None:
        pass


@dataclass
class Row:
    path: str
    lines_per_s: float
    lost: int
    bad: int
    mangled: int
    p50_ms: float
    p99_ms: float
    cpu_us: float  # controller CPU (this process and the ssh clients) per line
    lines: int = 0
    node_us: float = float("nan")  # the nodes' CPU per line: sshd and all below it, drainers too


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _summarise(path: str, tallies: list[Tally], start: float, cpu: float) -> Row:
    end = max(t.last_at for t in tallies)
    received = sum(len(t.latencies) for t in tallies)
    every = sorted(x for t in tallies for x in t.latencies)
    p50 = every[len(every) // 2] if every else float("nan")
    p99 = every[min(len(every) - 1, int(len(every) * 0.99))] if every else float("nan")
    return Row(
        path,
        received / (end - start) if end > start else 0.0,
        sum(t.lost for t in tallies),
        sum(t.bad for t in tallies),
        sum(t.mangled for t in tallies),
        p50 * 1000,
        p99 * 1000,
        (_cpu() - cpu) / received * 1e6 if received else float("nan"),
        received,
    )


def _subreaper() -> None:
    """Orphans below us (the ranks' drainers, in sessions of their own) become ours to reap, so
    their CPU is counted with the nodes'."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _node_cpu(cluster: NamespaceCluster) -> float:
    """CPU seconds of every process each host's sshd has reaped (its sessions and all below)."""
    total = 0.0
    for sshd in cluster._sshd.values():
        fields = Path(f"/proc/{sshd.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")
    return total


def _settle(cluster: NamespaceCluster) -> float:
    """Wait until every host runs its sshd alone (the path's sessions reaped), reap the orphans
    that ended below us; returns their CPU seconds."""
    listeners = {s.proc.pid for s in cluster._sshd.values()}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pids = set()
        for host in cluster.hosts:
            out = subprocess.run(["ip", "netns", "pids", host.ns], capture_output=True, text=True).stdout
            pids.update(map(int, out.split()))
        if pids <= listeners:
            break
        time.sleep(0.05)
    before = _cpu()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid() and int(stat.parent.name) not in listeners:
            try:
                os.waitpid(int(stat.parent.name), 0)
            except ChildProcessError:
                pass
    return _cpu() - before


def _parallel(fns: list[Callable[[], Any]]) -> None:
    errors: list[BaseException] = []

    def guard(fn: Callable[[], Any]) -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guard, args=(fn,)) for fn in fns]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def run_ssh(cluster: NamespaceCluster, known: Path, printer: Path, lines: int, rate: float) -> Row:
    tallies = [Tally(lines) for _ in cluster.hosts]

    def one(host: Any, tally: Tally) -> None:
        argv = cluster.controller_argv(
            [
                "ssh",
                "-i",
                str(cluster.client_key),
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                f"UserKnownHostsFile={known}",
                f"root@{host.addr}",
                f"{sys.executable} {printer} {lines} {rate}",
            ]
        )
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            for text in proc.stdout:
                tally.line(text[11:].rstrip("\n"))  # after "[default0]:"

    start, cpu = time.time(), _cpu()
    _parallel([lambda h=h, t=t: one(h, t) for h, t in zip(cluster.hosts, tallies, strict=True)])
    return _summarise("ssh (baseline)", tallies, start, cpu)


def run_ssh_print(cluster: NamespaceCluster, known: Path, printer: Path, lines: int, rate: float) -> Row:
    """The ``ranks`` path's printers without the capture: each print() rank on its own ssh session."""
    per_rank = lines // 2
    tallies = [Tally(per_rank) for _ in range(2 * len(cluster.hosts))]

    def one(host: Any, tally: Tally) -> None:
        argv = cluster.controller_argv(
            [
                "ssh",
                "-i",
                str(cluster.client_key),
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                f"UserKnownHostsFile={known}",
                f"root@{host.addr}",
                f"PYTHONUNBUFFERED=1 {sys.executable} {printer} {per_rank} {rate / 2}",
            ]
        )
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
            assert proc.stdout is not None
            for text in proc.stdout:
                tally.line(text.rstrip("\n"))

    ranks = [host for host in cluster.hosts for _ in range(2)]
    start, cpu = time.time(), _cpu()
    _parallel([lambda h=h, t=t: one(h, t) for h, t in zip(ranks, tallies, strict=True)])
    return _summarise("ssh, 2 print() ranks", tallies, start, cpu)


def _transports(cluster: NamespaceCluster, known: Path) -> list[SSHTransport]:
    found = []
    with netns.inside(cluster.controller_ns):
        for host in cluster.hosts:
            t = SSHTransport(
                host.name,
                PosixShell(),
                host=host.addr,
                port=None,
                user="root",
                key_file=str(cluster.client_key),
                password=lambda: None,
                options=SSHOptions(known_hosts=known, ssh_config=Path("/dev/null")),
                identities_only=True,
            )
            t.connect()
            found.append(t)
    return found


def run_launch(
    cluster: NamespaceCluster, known: Path, printer: Path, lines: int, rate: float, tmp: Path
) -> Row:
    transports = _transports(cluster, known)
    tallies = {h.name: Tally(lines) for h in cluster.hosts}
    log = RunLog(tmp / "runs" / f"bench-{time.monotonic_ns()}")
    sink = TallySink()
    printer_ui = LinePrinter([h.name for h in cluster.hosts], sink, color=False)  # type: ignore[arg-type]
    outputs = {}
    for rank, host in enumerate(cluster.hosts):  # what `launch` does with every node's output
        outputs[host.name] = RankedOutput(host.name, log, printer_ui, first_rank=rank, nproc=1)
        sink.by_head[printer_ui.head(host.name, rank).rstrip()] = tallies[host.name]

    def one(t: SSHTransport) -> None:
        platform = t.platform
        assert isinstance(platform, PosixShell)
        node_log = str(tmp / f"{t.node_name}-node.log")
        command = PosixRuns(platform).logged(f"{sys.executable} {printer} {lines} {rate}", node_log)
        result = t.run(command, on_line=outputs[t.node_name], keep_lines=200)
        assert result.ok, result

    start, cpu = time.time(), _cpu()
    _parallel([lambda t=t: one(t) for t in transports])
    log.close()
    for t in transports:
        t.close()
    return _summarise("bootstrap launch", [*tallies.values(), sink.unlabelled], start, cpu)


def run_ranks(
    cluster: NamespaceCluster,
    known: Path,
    printer: Path,
    lines: int,
    rate: float,
    tmp: Path,
    capture: Path | None = None,
) -> Row:
    """Two print() ranks per node through the node-side capture, as launch.sh starts them.
    ``capture``: another rank_capture.py than this tree's (its row is named after it)."""
    transports = _transports(cluster, known)
    per_rank = lines // 2
    tallies = []
    log = RunLog(tmp / "runs" / f"bench-{time.monotonic_ns()}")
    sink = TallySink()
    printer_ui = LinePrinter([h.name for h in cluster.hosts], sink, color=False)  # type: ignore[arg-type]
    outputs = {}
    for i, host in enumerate(cluster.hosts):
        outputs[host.name] = RankedOutput(host.name, log, printer_ui, first_rank=2 * i, nproc=2)
        for local in range(2):
            tallies.append(Tally(per_rank))
            sink.by_head[printer_ui.head(host.name, 2 * i + local).rstrip()] = tallies[-1]
    name = "launch, 2 print() ranks" + (f" [{capture}]" if capture else "")
    capture = capture or rank_capture_file()

    def one(t: SSHTransport) -> None:
        platform = t.platform
        assert isinstance(platform, PosixShell)
        ranks_dir = tmp / f"{t.node_name}-ranks-{time.monotonic_ns()}"
        # each rank prints half the node's lines at half its rate: the node's totals match the others'
        worker = (
            f"{sys.executable} {capture} worker {ranks_dir} {sys.executable} {printer} {per_rank} {rate / 2}"
        )
        two = platform.quote(f"LOCAL_RANK=0 RANK=0 {worker} & LOCAL_RANK=1 RANK=1 {worker} & wait")
        command = PosixRuns(platform).logged(
            f"PYTHONUNBUFFERED=1 {sys.executable} {capture} mux {ranks_dir} /bin/sh -c {two}",
            str(tmp / f"{t.node_name}-node.log"),
        )
        result = t.run(command, on_line=outputs[t.node_name], keep_lines=200)
        assert result.ok, result

    start, cpu = time.time(), _cpu()
    _parallel([lambda t=t: one(t) for t in transports])
    log.close()
    for t in transports:
        t.close()
    return _summarise(name, [*tallies, sink.unlabelled], start, cpu)


def run_logs(
    cluster: NamespaceCluster,
    known: Path,
    printer: Path,
    lines: int,
    rate: float,
    tmp: Path,
    python: str | None = sys.executable,
    on_block: Callable[[str, str], None] | None = None,
) -> Row:
    """``on_block``: also given every block of output, as RankedOutput gives it (benchmarks/dashboard.py)."""
    transports = _transports(cluster, known)
    tallies = {h.name: Tally(lines) for h in cluster.hosts}
    run_id = f"bench-{time.monotonic_ns()}"
    log = RunLog(tmp / "runs" / run_id)
    nodes = {h.name: SimpleNamespace(name=h.name, workdir=str(tmp / "work"), nproc=1) for h in cluster.hosts}
    sink = TallySink()
    printer_ui = LinePrinter([h.name for h in cluster.hosts], sink, color=False)  # type: ignore[arg-type]
    for rank, host in enumerate(cluster.hosts):
        sink.by_head[printer_ui.head(host.name, rank).rstrip()] = tallies[host.name]
    outputs = {  # what `logs` does with every node's output
        h.name: RankedOutput(h.name, log, printer_ui, first_rank=rank, nproc=1, on_block=on_block)
        for rank, h in enumerate(cluster.hosts)
    }
    for t in transports:
        run_dir = run_dir_for(nodes[t.node_name], run_id)  # type: ignore[arg-type]
        Path(run_dir).mkdir(parents=True)
        Path(run_dir, "launch.sh").write_text(f"exec {sys.executable} {printer} {lines} {rate}\n")

    errors: list[BaseException] = []

    def one(t: SSHTransport) -> None:
        try:
            with netns.inside(cluster.controller_ns):
                node: Any = nodes[t.node_name]
                follow_node(node, t, run_id, follow=True, output=outputs[t.node_name], python=python)
        except BaseException as exc:
            errors.append(exc)

    # followers first (they wait for the launcher), then every printer detached: latency is
    # measured from print, not from whenever a follower happened to start
    followers = [threading.Thread(target=one, args=(t,)) for t in transports]
    start, cpu = time.time(), _cpu()
    for thread in followers:
        thread.start()
    for t in transports:
        start_node(nodes[t.node_name], t, run_id)  # type: ignore[arg-type]
    for thread in followers:
        thread.join()
    if errors:
        raise errors[0]
    log.close()
    for t in transports:
        t.close()
    name = "bootstrap logs --follow" if python else "logs --follow (sh+awk)"
    return _summarise(name, [*tallies.values(), sink.unlabelled], start, cpu)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=250_000, help="lines per node")
    parser.add_argument("--runs", type=int, default=3, help="runs per path (the median run is shown)")
    parser.add_argument(
        "--rate", type=float, default=5000, help="lines/s per node for the latency phase (paced printers)"
    )
    parser.add_argument(
        "--only",
        default="ssh,launch,ranks,logs,shell",
        help="paths to measure (comma-separated; default: all; ranks brings its own baseline, sshprint)",
    )
    parser.add_argument(
        "--capture",
        action="append",
        type=Path,
        default=[],
        help="also measure the ranks path with this rank_capture.py (repeatable; an old copy, say)",
    )
    args = parser.parse_args()
    _subreaper()
    only = set(args.only.split(","))
    phases = {"as fast as possible": 0.0, f"paced, {args.rate:g} lines/s per node": args.rate}
    results: dict[tuple[str, str], list[Row]] = {}
    with tempfile.TemporaryDirectory(prefix="cb-bench-logs-") as tmp_name, NamespaceCluster(NODES) as cluster:
        tmp = Path(tmp_name)
        printer = tmp / "printer.py"
        printer.write_text(PRINTER)
        print_printer = tmp / "print_printer.py"
        print_printer.write_text(PRINT_PRINTER)
        known = tmp / "known_hosts"
        known.write_text(cluster.known_hosts_text())
        for phase, rate in phases.items():
            lines = args.lines if not rate else min(args.lines, int(rate * 5))  # paced: about 5 s
            for _ in range(args.runs):
                paths: dict[str, Callable[[int, float], Row]] = {
                    "ssh": lambda n, r: run_ssh(cluster, known, printer, n, r),
                    "sshprint": lambda n, r: run_ssh_print(cluster, known, print_printer, n, r),
                    "launch": lambda n, r: run_launch(cluster, known, printer, n, r, tmp),
                    "ranks": lambda n, r: run_ranks(cluster, known, print_printer, n, r, tmp),
                    **{
                        f"ranks {c}": lambda n, r, c=c: run_ranks(cluster, known, print_printer, n, r, tmp, c)
                        for c in args.capture
                    },
                    "logs": lambda n, r: run_logs(cluster, known, printer, n, r, tmp),
                    "shell": lambda n, r: run_logs(cluster, known, printer, n, r, tmp, python=None),
                }
                for name, measure in paths.items():
                    # the baselines: every ratio needs ssh, the ranks path its own printers' cost too
                    wanted = name in only or (name.startswith("ranks ") and "ranks" in only)
                    if wanted or name == "ssh" or (name == "sshprint" and "ranks" in only):
                        node = _node_cpu(cluster)
                        row = measure(lines, rate)
                        orphans = _settle(cluster)
                        if row.lines:
                            row.node_us = (_node_cpu(cluster) - node + orphans) / row.lines * 1e6
                        results.setdefault((phase, row.path), []).append(row)
    print(f"\n{NODES} nodes, median of {args.runs} run(s); lines per node: {args.lines} (paced: 5 s worth)")
    for phase in phases:
        base = statistics.median(r.lines_per_s for r in results[(phase, "ssh (baseline)")])
        prints = results.get((phase, "ssh, 2 print() ranks"))
        print_base = statistics.median(r.lines_per_s for r in prints) if prints else float("nan")
        print(f"\n{phase}")
        print(
            f"{'path':<26}{'lines/s':>12}{'lost':>6}{'misordered':>11}{'mangled':>8}{'p50 ms':>9}"
            f"{'p99 ms':>9}{'CPU us/line':>12}{'node us':>8}{'all us':>7}{'vs ssh':>8}"
            f"{'vs ssh print()':>15}"
        )
        for (ph, path), rows in results.items():
            if ph != phase:
                continue
            row = sorted(rows, key=lambda r: r.lines_per_s)[len(rows) // 2]
            print(
                f"{path:<26}{row.lines_per_s:>12,.0f}{row.lost:>6}{row.bad:>11}{row.mangled:>8}"
                f"{row.p50_ms:>9.1f}{row.p99_ms:>9.1f}{row.cpu_us:>12.1f}"
                f"{statistics.median(r.node_us for r in rows):>8.1f}"
                f"{statistics.median(r.cpu_us + r.node_us for r in rows):>7.1f}{row.lines_per_s / base:>8.2f}"
                f"{row.lines_per_s / print_base:>15.2f}"
            )
    print("\ntargets: >= 200,000 lines/s, 0 lost, 0 mangled, p99 <= 100 ms, >= 0.80 x ssh")
    print("vs ssh print(): against the ranks' own printers run over plain ssh (``ssh, 2 print() ranks``)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
