"""Clean exits: the embedded default's job (`bootstrap` with no arguments) N times, aborts counted.

Each run checks this machine, validates two gloo ranks and trains the example on them (README command
1's job). A run counts as an abort when a rank died by a signal after training (torch's
"terminate called without an active exception", SIGABRT, exit -6: examples/train_ddp.py `finish` says
why) and as a failure for any other non-zero exit. Target (issue 17): 0 aborts in 30 runs.

    python benchmarks/exit_stress.py [--runs 30]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
_ABORT = re.compile(r"terminate called|SIGABRT|exitcode\s*:\s*-6|exit -6")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    bootstrap = shutil.which("bootstrap", path=str(BIN)) or "bootstrap"
    aborts = failures = 0
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="cb-exit-") as tmp:
        env = {**os.environ, "NO_COLOR": "1"}
        for i in range(1, args.runs + 1):
            start = time.monotonic()
            proc = subprocess.run(
                [bootstrap], cwd=tmp, env=env, capture_output=True, text=True, timeout=600, check=False
            )
            times.append(time.monotonic() - start)
            output = proc.stdout + proc.stderr
            if _ABORT.search(output):
                aborts += 1
                verdict = "ABORT"
            elif proc.returncode != 0:
                failures += 1
                verdict = f"exit {proc.returncode}"
            else:
                verdict = "ok"
            print(f"run {i:>3}/{args.runs}: {verdict} ({times[-1]:.1f}s)", flush=True)
            if verdict != "ok":
                print("  " + "\n  ".join(output.strip().splitlines()[-12:]), flush=True)
    print()
    print("| runs | ok | aborts (SIGABRT at exit) | other failures | median run |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    ok = args.runs - aborts - failures
    print(f"| {args.runs} | {ok} | {aborts} | {failures} | {statistics.median(times):.1f} s |")
    return 1 if aborts or failures else 0


if __name__ == "__main__":
    sys.exit(main())
