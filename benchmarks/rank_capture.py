"""The node-side rank capture alone: two print() ranks into ``rank_capture.py mux``, lines/s and its CPU.

No cluster, no SSH: the mux runs here as launch.sh runs it (``mux DIR /bin/sh -c "worker ... &
worker ... & wait"``, PYTHONUNBUFFERED, so each print() is two writes), its stdout read and every
line checked here (lost, misordered, mangled). Reports the mux's own CPU per line (read from the
exited process before it is reaped) and everything's (ranks, workers, the ranks' drainers, which
this process reaps as their subreaper, and the mux): far less noisy on shared cores than
benchmarks/logs.py, whose ``ranks`` path runs the same mux behind SSH.

    python benchmarks/rank_capture.py [--lines 250000] [--runs 3] [--capture PATH]

``--capture`` (repeatable) compares copies of rank_capture.py, run alternately (old vs new).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CAPTURE = REPO / "orchestrator" / "steps" / "probes" / "rank_capture.py"

PRINTER = """\
import sys, time
n = int(sys.argv[1])
t = time.time
pad = "x" * 40
for i in range(n):
    print(f"{i} {t():.6f} {pad}")
"""


def one(capture: str, lines: int, tmp: str) -> dict[str, float]:
    printer = os.path.join(tmp, "printer.py")
    Path(printer).write_text(PRINTER)
    ranks = tempfile.mkdtemp(dir=tmp)
    per = lines // 2
    worker = f"{sys.executable} {capture} worker {ranks}/r {sys.executable} {printer} {per}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    before = os.times()
    begin = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, capture, "mux", f"{ranks}/r", "/bin/sh", "-c",
         f"LOCAL_RANK=0 {worker} & LOCAL_RANK=1 {worker} & wait"],
        stdout=subprocess.PIPE,
        env=env,
    )  # fmt: skip
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    expected, bad, got, partial = [0, 0], 0, 0, b""
    while data := os.read(fd, 1 << 20):
        data = partial + data
        end = data.rfind(b"\n") + 1
        partial = data[end:]
        for line in data[:end].split(b"\n")[:-1]:
            head, _, rest = line.partition(b"]:")
            fields = rest.split(b" ")
            rank = int(head[len(b"[default") :]) if head.startswith(b"[default") else -1
            if (
                rank not in (0, 1)
                or len(fields) != 3
                or fields[2] != b"x" * 40
                or int(fields[0]) != expected[rank]
            ):
                bad += 1
            else:
                expected[rank] += 1
            got += 1
    elapsed = time.monotonic() - begin
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: its counters stay
    stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # its own, not its children's
    proc.wait()
    while True:  # the orphaned drainers are ours to reap (a subreaper): their CPU counts too
        try:
            os.wait()
        except ChildProcessError:
            break
    after = os.times()
    every = sum(after[2:4]) - sum(before[2:4])
    return {
        "lines_per_s": got / elapsed,
        "lost": lines - sum(expected),
        "bad": bad + len(partial),
        "cpu_us": cpu / max(got, 1) * 1e6,
        "all_us": every / max(got, 1) * 1e6,
    }


def subreaper() -> None:
    """Orphans below us (the ranks' drainers) become our children, so their CPU is counted."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=250_000, help="lines in all (two ranks, half each)")
    parser.add_argument("--runs", type=int, default=3, help="runs per capture (the median is shown)")
    parser.add_argument(
        "--capture", action="append", help="rank_capture.py to measure (default: this tree's)"
    )
    args = parser.parse_args()
    captures = args.capture or [str(CAPTURE)]
    subreaper()
    results: dict[str, list[dict[str, float]]] = {c: [] for c in captures}
    with tempfile.TemporaryDirectory(prefix="cb-bench-capture-") as tmp:
        for _ in range(args.runs):
            for capture in captures:  # alternately: shared cores drift, pairs stay comparable
                results[capture].append(one(capture, args.lines, tmp))
    print(f"\n2 print() ranks, {args.lines} lines in all, median of {args.runs}")
    print(
        f"{'capture':<50}{'lines/s':>12}{'lost':>6}{'bad':>6}{'mux CPU us/line':>17}{'all CPU us/line':>17}"
    )
    for capture, rows in results.items():
        print(
            f"{capture[-50:]:<50}{statistics.median(r['lines_per_s'] for r in rows):>12,.0f}"
            f"{max(r['lost'] for r in rows):>6.0f}{max(r['bad'] for r in rows):>6.0f}"
            f"{statistics.median(r['cpu_us'] for r in rows):>17.2f}"
            f"{statistics.median(r['all_us'] for r in rows):>17.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
