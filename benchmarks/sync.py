"""Sync benchmark: `bootstrap sync` of a 1,000-file code tree and of a tiny environment, 1/4/8 nodes.

Builds a namespace cluster (tests/cluster.py: real sshd per host) and times, from the controller
namespace, the whole CLI process (start-up included), median of --runs:
  - code, first sync: `bootstrap sync --only code` into empty destinations, cold controller hash cache
  - code, second sync: the same again, nothing changed (target: 8 nodes <= 2 s)
  - `bootstrap facts` on the same nodes: the floor any command pays (start-up, connect, one round trip)
  - env, first / second: `bootstrap sync --only env` of two tiny wheels from a local --find-links
    directory (no network; wheels built here like tests/integration/test_env_sync.py does)
Target for the first code sync: 8 nodes within 1.5x of 1 node. The hosts share this machine's file
system, so every node gets its own workdir (code goes to <workdir>/code, the venv to {node}/venv).
Logs in as a dedicated user with stock dotfiles, like benchmarks/fanout.py.

    sudo python benchmarks/sync.py [--runs 3] [--sizes 1,4,8] [--files 1000] [--no-env]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster import NamespaceCluster  # noqa: E402

BIN = Path(sys.executable).parent
USER = f"cbtsync{os.getpid() % 100000}"  # one per run: two benchmark runs must not share an account
WORDS = ("import", "def", "return", "class", "self", "for", "in", "if", "else", "with", "as", "from", "None")


def make_project(root: Path, files: int) -> int:
    """``files`` source-like files (0.5-8 kB) in 50 packages; returns the total size."""
    rng = random.Random(1)
    total = 0
    for i in range(files):
        path = root / f"pkg{i % 50:02d}" / f"module_{i:04d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [" ".join(rng.choices(WORDS, k=8)) for _ in range(rng.randint(10, 160))]
        text = "\n".join(lines) + "\n"
        path.write_text(text)
        total += len(text)
    past = time.time() - 3600  # an hour-old checkout, not files written within the cache's racy window
    for path in root.rglob("*"):
        os.utime(path, (past, past))
    return total


def make_wheel(directory: Path, name: str, version: str) -> None:
    """A minimal pure-Python wheel (METADATA, WHEEL, RECORD written by hand)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: cb-bench\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as zf:
        for arc, text in files.items():
            data = text.encode()
            zf.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        record.append(f"{dist}/RECORD,,")
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")


def run_cli(cluster: NamespaceCluster, argv: list[str], env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    start = time.monotonic()
    proc = subprocess.run(cluster.controller_argv(argv, env=env), capture_output=True, text=True, timeout=900)
    took = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return took, json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", default="1,4,8")
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--no-env", action="store_true", help="only the code rows")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    bootstrap = str(BIN / "bootstrap")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "orchestrator")], check=True)
    Times = list[float]
    rows: list[tuple[int, Times, Times, Times, Times | None, Times | None]] = []
    with tempfile.TemporaryDirectory(prefix="cb-bench-sync-") as tmp, NamespaceCluster(max(sizes)) as cluster:
        cluster.add_user(USER)
        user_home = Path(os.path.expanduser(f"~{USER}"))
        home = Path(tmp) / "home"
        (home / ".ssh").mkdir(parents=True, mode=0o700)
        shutil.copyfile(cluster.client_key, home / ".ssh" / "id_ed25519")
        (home / ".ssh" / "id_ed25519").chmod(0o600)
        (home / ".ssh" / "known_hosts").write_text(cluster.known_hosts_text())
        base_env = {"HOME": str(home), "NO_COLOR": "1", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        project = Path(tmp) / "project"
        size = make_project(project, args.files)
        wheels = user_home / "wheels"  # read by the nodes' user
        wheels.mkdir()
        for name in ("tinya", "tinyb"):
            make_wheel(wheels, name, "1.0")
        subprocess.run(["chown", "-R", f"{USER}:{USER}", str(wheels)], check=True)
        counter = 0

        def inventory(n: int, *, env: bool) -> Path:
            nonlocal counter
            counter += 1
            work = f"~/bench/{counter}"  # fresh, empty destinations for every first sync
            nodes = [
                {
                    "name": h.name,
                    "host": h.addr,
                    "user": USER,
                    "python": "/usr/bin/python3",  # readable by the benchmark user (with pip 23)
                    "workdir": f"{work}/{h.name}",
                }
                for h in cluster.hosts[:n]
            ]
            cluster_doc: dict[str, Any] = {"master": nodes[0]["name"], "code": {"source": str(project)}}
            if env:
                cluster_doc["env"] = {
                    "packages": ["tinya==1.0", "tinyb==1.0"],
                    "find_links": [str(wheels)],
                    "no_index": True,
                    "path": f"{work}/{{node}}/venv",
                }
            path = Path(tmp) / f"hosts-{counter}.yaml"
            path.write_text(json.dumps({"cluster": cluster_doc, "nodes": nodes}))
            return path

        def timed(n: int, what: str) -> tuple[list[float], list[float], list[float]]:
            first, second, floor = [], [], []
            for _ in range(args.runs):
                inv = inventory(n, env=what == "env")
                env = {**base_env, "XDG_CACHE_HOME": str(Path(tmp) / f"cache-{counter}")}  # cold
                argv = [bootstrap, "-i", str(inv), "sync", "--only", what, "--json"]
                took, doc = run_cli(cluster, argv, env)
                first.append(took)
                took, doc = run_cli(cluster, argv, env)
                second.append(took)
                if what == "code":
                    assert all(node["unchanged"] for node in doc["code"]["nodes"]), doc
                    # the floor of any command: CLI start-up, connecting, one round trip per node
                    floor.append(run_cli(cluster, [bootstrap, "-i", str(inv), "facts", "--json"], env)[0])
            return first, second, floor

        for n in sizes:
            code_first, code_second, floor = timed(n, "code")
            env_first, env_second = (None, None) if args.no_env else timed(n, "env")[:2]
            rows.append((n, code_first, code_second, floor, env_first, env_second))
    load = os.getloadavg()[0]
    print(
        f"\nbootstrap sync (whole CLI process, start-up included), seconds, median (best) of {args.runs} "
        f"runs; {os.cpu_count()} CPUs shared by the controller and every node, load average {load:.1f}; "
        f"code: {args.files} files, {size / 1e6:.1f} MB; env: 2 tiny wheels from --find-links\n"
    )

    def cell(values: list[float] | None) -> str:
        return "-" if values is None else f"{statistics.median(values):.2f} ({min(values):.2f})"

    print("| nodes | code first | code second | `bootstrap facts` (floor) | env first | env second |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, cf, cs, fl, ef, es in rows:
        print(f"| {n} | {cell(cf)} | {cell(cs)} | {cell(fl)} | {cell(ef)} | {cell(es)} |")
    one = next((r for r in rows if r[0] == 1), None)
    most = rows[-1]
    if one is not None and most[0] > 1:
        ratio = statistics.median(most[1]) / statistics.median(one[1])
        best = min(most[1]) / min(one[1])
        print(
            f"\nfirst code sync, {most[0]} nodes vs 1: {ratio:.2f}x median, {best:.2f}x best "
            f"(target <= 1.5x); second sync of {most[0]} nodes: {cell(most[2])} s (target <= 2 s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
