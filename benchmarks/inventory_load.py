"""Inventory load time: a generated ~1 MB inventory in the native format and in Ansible's format.

Writes two files of about ``--size-mb`` each (native: a ``nodes:`` list; Ansible: racks of hosts under
``all.children`` with group and host variables), then times, in a fresh process per source tree:
  - ``parse``: ``orchestrator.inventory._yaml.load_yaml`` alone (the YAML library and our containers)
  - ``load``: ``load_inventory(path)`` (read, parse, map and validate: what the CLI does)
Each time is the median of ``--runs`` runs. ``--baseline REV`` also measures the package as it is in
git revision REV (extracted with ``git archive`` into a temporary directory; nothing in the work tree
or in git changes), so one run prints before and after side by side.

    python benchmarks/inventory_load.py [--runs 3] [--size-mb 1] [--baseline HEAD~1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def native_text(size: int) -> tuple[str, int]:
    """A native inventory of about ``size`` bytes, and its node count."""
    parts = [
        "cluster:\n  name: big\n  port: 29500\n  backend: gloo\n",
        "defaults:\n  user: trainer\n  key_file: ~/.ssh/id_ed25519\n  workdir: ~/cluster-bootstrap\n",
        "nodes:\n",
    ]
    total, count = sum(map(len, parts)), 0
    while total < size:
        entry = (
            f"  - name: node-{count:05d}\n"
            f"    host: 10.{count // 65536 % 256}.{count // 256 % 256}.{count % 256}\n"
            f"    gpus: {count % 3}\n"
            f"    tags: [rack{count // 40:03d}, {'gpu' if count % 3 else 'cpu'}]\n"
        )
        parts.append(entry)
        total += len(entry)
        count += 1
    return "".join(parts), count


def ansible_text(size: int) -> tuple[str, int]:
    """An Ansible YAML inventory of about ``size`` bytes, and its host count."""
    parts = [
        "all:\n  vars:\n    ansible_user: trainer\n    bootstrap_port: 29500\n"
        "    bootstrap_backend: gloo\n    ntp_server: pool.ntp.org\n  children:\n"
    ]
    total, count, rack = len(parts[0]), 0, 0
    while total < size:
        block = [f"    rack{rack:03d}:\n      vars:\n        bootstrap_gpus: {rack % 3}\n      hosts:\n"]
        for _ in range(40):
            block.append(
                f"        node-{count:05d}:\n"
                f"          ansible_host: 10.{count // 65536 % 256}.{count // 256 % 256}.{count % 256}\n"
                f"          ansible_become: yes\n"
            )
            count += 1
        text = "".join(block)
        parts.append(text)
        total += len(text)
        rack += 1
    return "".join(parts), count


def measure(files: dict[str, Path], runs: int) -> dict[str, dict[str, float]]:
    """Runs in the child: times of the package found first on sys.path."""
    from orchestrator.inventory import load_inventory
    from orchestrator.inventory._yaml import load_yaml

    result: dict[str, dict[str, float]] = {}
    for name, path in files.items():
        text = path.read_text(encoding="utf-8")
        parse, load = [], []
        nodes = 0
        for _ in range(runs):
            start = time.perf_counter()
            load_yaml(text, str(path))
            parse.append(time.perf_counter() - start)
            start = time.perf_counter()
            inv = load_inventory(path)
            load.append(time.perf_counter() - start)
            nodes = len(inv.nodes)
        result[name] = {"parse": statistics.median(parse), "load": statistics.median(load), "nodes": nodes}
    return result


def run_tree(tree: Path, files: dict[str, Path], runs: int) -> dict[str, dict[str, float]]:
    """Measure in a fresh interpreter whose ``orchestrator`` package is the one under ``tree``."""
    code = (
        "import json, sys; from pathlib import Path\n"
        f"sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(REPO / 'benchmarks')!r})\n"
        "import orchestrator, inventory_load as b\n"
        f"assert Path(orchestrator.__file__).resolve().is_relative_to(Path({str(tree)!r}).resolve())\n"
        f"files = {{k: Path(v) for k, v in {json.dumps({k: str(v) for k, v in files.items()})}.items()}}\n"
        f"print(json.dumps(b.measure(files, {runs})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree)
    if proc.returncode != 0:
        raise SystemExit(f"measuring {tree} failed:\n{proc.stderr[-3000:]}")
    data: dict[str, dict[str, float]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size-mb", type=float, default=1.0)
    parser.add_argument("--baseline", metavar="REV", help="also measure the package at this git revision")
    args = parser.parse_args()
    size = int(args.size_mb * 1_000_000)
    with tempfile.TemporaryDirectory(prefix="inventory-bench-") as tmp:
        work = Path(tmp)
        files: dict[str, Path] = {}
        for name, make in (("native", native_text), ("ansible", ansible_text)):
            text, _ = make(size)
            files[name] = work / f"{name}.yaml"
            files[name].write_text(text, encoding="utf-8")
        trees: list[tuple[str, Path]] = []
        if args.baseline:
            base = work / "baseline"
            base.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(REPO), "archive", "--format=tar", args.baseline, "orchestrator"],
                capture_output=True,
                check=True,
            )
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
            trees.append((f"{args.baseline} (before)", base))
        trees.append(("work tree", REPO))
        print(f"median of {args.runs} run(s); Python {sys.version.split()[0]}\n")
        print("| inventory | size | nodes | code | parse (s) | load_inventory (s) |")
        print("|---|---:|---:|---|---:|---:|")
        for label, tree in trees:
            times = run_tree(tree, files, args.runs)
            for name, path in files.items():
                row = times[name]
                size_text = f"{path.stat().st_size / 1e6:.2f} MB"
                print(
                    f"| {name} | {size_text} | {int(row['nodes'])} | {label} | "
                    f"{row['parse']:.3f} | {row['load']:.3f} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
