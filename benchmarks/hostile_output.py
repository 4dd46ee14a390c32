"""Hostile node output: `bootstrap run` over a node printing N MB without a newline.

A node (here: this machine, ``connection: local``, so only the controller's own work is measured)
runs ``head -c N /dev/zero | tr '\\0' x`` (or ``\\r`` with ``--progress``: a progress bar redrawn in
place), and the controller streams it: split into lines, labelled, neutralised, written to its log
and to stdout (``/dev/null`` here). Measured per size: wall seconds and the controller's peak
resident memory (``ru_maxrss`` of the bootstrap process and its children), for this checkout and,
with ``--against REV``, for an older commit (its ``orchestrator/`` exported with ``git archive``).
The log file is checked to hold every byte (and the newline that ends the last line).

    .venv-test/bin/python benchmarks/hostile_output.py [--sizes 20,40,80,400] [--against e209dbf]
                                                      [--against-max 80] [--progress]

Prints a markdown table. Sizes above ``--against-max`` MB are not run against the older commit
(its time grows with the square of the size: 80 MB took it tens of seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

INVENTORY = """\
cluster:
  name: hostile
  master: here
nodes:
  - name: here
    connection: local
"""

#: run in a fresh interpreter, so that the peak memory of its children is this one run's only
MEASURE = """\
import resource, subprocess, sys, json, time
start = time.monotonic()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
wall = time.monotonic() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"wall": wall, "rss_kib": peak, "code": done.returncode}))
"""


def _measure(source: Path, size_mb: int, work: Path, *, progress: bool) -> dict[str, float]:
    inventory = work / "hosts.yaml"
    inventory.write_text(INVENTORY)
    state = Path(tempfile.mkdtemp(prefix="state-", dir=work))
    fill = "\\r" if progress else "x"
    command = f"head -c {size_mb * 1_000_000} /dev/zero | tr '\\0' '{fill}'"
    env = {**os.environ, "PYTHONPATH": str(source), "XDG_STATE_HOME": str(state), "NO_COLOR": "1"}
    argv = [sys.executable, "-m", "orchestrator", "-i", str(inventory), "run", "--", command]
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, *argv],
        env=env,
        cwd=work,  # not the checkout: `python -m` would import the package from the current directory
        capture_output=True,
        text=True,
        check=True,
    )
    measured = json.loads(out.stdout)
    if measured["code"] != 0:
        raise SystemExit(f"bootstrap run failed (exit {measured['code']}) with {source}")
    logs = list(state.rglob("here.log"))
    logged = logs[0].stat().st_size if logs else 0
    if logged not in (size_mb * 1_000_000, size_mb * 1_000_000 + 1):  # + the last line's newline
        raise SystemExit(f"the log holds {logged} bytes, not {size_mb * 1_000_000} ({source})")
    return measured


def _export(rev: str, into: Path) -> Path:
    """The older commit's package, importable from ``into``."""
    into.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "orchestrator"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="20,40,80,400", help="MB printed without a newline")
    parser.add_argument("--against", help="an older commit to compare with (e.g. e209dbf)")
    parser.add_argument("--against-max", type=int, default=80, help="largest size run against it (MB)")
    parser.add_argument("--progress", action="store_true", help="print \\r instead of x (a progress bar)")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="hostile-output-") as tmp:
        work = Path(tmp)
        older = _export(args.against, work / "older") if args.against else None
        what = "\\r (a progress bar)" if args.progress else "x"
        print(f"`bootstrap run` over a local node printing N MB of {what} without a newline\n")
        head = "| MB | this checkout: s | MB/s | peak RSS MiB |"
        rule = "| ---: | ---: | ---: | ---: |"
        if older is not None:
            head += f" {args.against}: s | peak RSS MiB |"
            rule += " ---: | ---: |"
        print(head)
        print(rule)
        for size in sizes:
            now = _measure(REPO, size, work, progress=args.progress)
            row = f"| {size} | {now['wall']:.2f} | {size / now['wall']:.0f} | {now['rss_kib'] / 1024:.0f} |"
            if older is not None:
                if size <= args.against_max:
                    then = _measure(older, size, work, progress=args.progress)
                    row += f" {then['wall']:.2f} | {then['rss_kib'] / 1024:.0f} |"
                else:
                    row += " not run | not run |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
