"""Pipeline benchmark (issue 13): the main pipeline's setup phases on ONE session vs the same phases
run as four separate commands, and a full 3-node `bootstrap` with training before vs after the
pipeline moved below the CLI.

Builds a namespace cluster (tests/cluster.py: real sshd per host; root logins, since the firewall and
time phases run as root), then times whole CLI processes from the controller namespace:

  1. setup, nothing to change, on --nodes hosts (16): `bootstrap --until check` (sync of a small code
     tree, firewall, ntp, check: one session) beside `sync`, `firewall`, `ntp`, `check` run one after
     the other (four sessions); after a first run that set everything up. Also counts the SSH logins
     each accepted (sshd's "Accepted publickey" lines), per node.
  2. full job on 3 hosts: `bootstrap` (check, validate, a 15-step training) with this checkout and with
     the code of --before (a git worktree run with PYTHONPATH), alternated.

Targets (issue 13): setup <= 5 s at 16 nodes and >= 2x faster than the four commands; one login per
node per pipeline.

    sudo .venv-test/bin/python benchmarks/pipeline.py [--runs 3] [--nodes 16] [--before 4a2e34b]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster import NamespaceCluster  # noqa: E402
from tests.conftest import CHRONY_DIRS  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from fanout import (  # noqa: E402
    _own_children_cpu,
    _sessions_over,
    _sshd_cpu,
    _sshd_pids,
    processes_per_node,
)

BIN = Path(sys.executable).parent


def _logins(cluster: NamespaceCluster, hosts: list) -> int:
    total = 0
    for host in hosts:
        if host.sshd_log is not None and host.sshd_log.exists():
            total += host.sshd_log.read_text(errors="replace").count("Accepted publickey")
    return total


#: (CPU seconds of the command, of the nodes' side) of every _run, in order
CPU: list[tuple[float, float]] = []


def _run(cluster: NamespaceCluster, argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """Wall seconds of ``argv``; its CPU and the nodes' (every sshd and all it ran) go to CPU."""
    pids = _sshd_pids(cluster)
    _sessions_over(pids)
    own, nodes = _own_children_cpu(), _sshd_cpu(pids)
    start = time.monotonic()
    proc = subprocess.run(
        cluster.controller_argv(argv, env=env), capture_output=True, text=True, timeout=900, cwd=cwd
    )
    took = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    _sessions_over(pids)
    node_cpu = _sshd_cpu(pids) - nodes
    CPU.append((_own_children_cpu() - own + node_cpu, node_cpu))
    return took


def _inventory(path: Path, hosts: list, project: Path | None, **train: object) -> Path:
    # every namespace host shares this machine's file system: a workdir of its own per node, as
    # nodes with their own disks have (one shared one is synced once, from one node: not measured)
    nodes = [
        {
            "name": h.name,
            "host": h.addr,
            "user": "root",
            "python": sys.executable,
            "workdir": "~/cb-bench-{node}",
        }
        for h in hosts
    ]
    cluster: dict[str, object] = {"name": path.stem, "master": hosts[0].name, "backend": "gloo"}
    if project is not None:
        cluster["code"] = {"source": str(project)}
    if train:
        cluster["train"] = train
    path.write_text(json.dumps({"nodes": nodes, "cluster": cluster}, indent=2))
    return path


def _row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument(
        "--before", default="4a2e34b", help="commit whose CLI glued six commands (default: 4a2e34b)"
    )
    parser.add_argument("--skip-full", action="store_true", help="only the setup phases")
    parser.add_argument(
        "--compare", type=Path, help="another checkout: its `--until check` timed beside this one's"
    )
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "orchestrator")], check=True)
    with (
        tempfile.TemporaryDirectory(prefix="cb-pipe-") as tmp_text,
        NamespaceCluster(max(args.nodes, 3), private_dirs=CHRONY_DIRS) as cluster,
    ):
        tmp = Path(tmp_text)
        home = tmp / "home"
        (home / ".ssh").mkdir(parents=True, mode=0o700)
        key = home / ".ssh" / "id_ed25519"
        key.write_bytes(cluster.client_key.read_bytes())
        key.chmod(0o600)
        (home / ".ssh" / "known_hosts").write_text(cluster.known_hosts_text())
        env = {"HOME": str(home), "NO_COLOR": "1", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        project = tmp / "project"
        (project / "pkg").mkdir(parents=True)
        for i in range(50):
            (project / "pkg" / f"m{i}.py").write_text(f"VALUE = {i}\n" * 20)
        hosts = cluster.hosts[: args.nodes]
        inv = str(_inventory(tmp / "setup.yaml", hosts, project))
        bootstrap = str(BIN / "bootstrap")
        _run(cluster, [bootstrap, "-i", inv, "--until", "check"], env, tmp)  # sets everything up
        one, four, logins_one, logins_four = [], [], [], []
        each: dict[str, list[float]] = {}
        cpu_one: list[tuple[float, float]] = []
        other: list[float] = []
        cpu_other: list[tuple[float, float]] = []
        for _ in range(args.runs):
            before = _logins(cluster, hosts)
            one.append(_run(cluster, [bootstrap, "-i", inv, "--until", "check"], env, tmp))
            cpu_one.append(CPU[-1])
            logins_one.append((_logins(cluster, hosts) - before) / len(hosts))
            if args.compare is not None:
                compare_env = {**env, "PYTHONPATH": str(args.compare.resolve())}
                other.append(_run(cluster, [bootstrap, "-i", inv, "--until", "check"], compare_env, tmp))
                cpu_other.append(CPU[-1])
            before = _logins(cluster, hosts)
            total = 0.0
            for command in (["sync", "--only", "code"], ["firewall"], ["ntp"], ["check"]):
                took = _run(cluster, [bootstrap, "-i", inv, *command], env, tmp)
                each.setdefault(command[0], []).append(took)
                total += took
            four.append(total)
            logins_four.append((_logins(cluster, hosts) - before) / len(hosts))
        print(f"\nsetup phases (sync, firewall, ntp, check), nothing to change, {len(hosts)} nodes,", end="")
        print(f" {args.runs} runs")
        print("| how | median s | min s | SSH logins per node |")
        print("| --- | ---: | ---: | ---: |")
        med = statistics.median
        _row(
            "pipeline `--until check` (one session)",
            f"{med(one):.2f}",
            f"{min(one):.2f}",
            f"{med(logins_one):g}",
        )
        for name, times in each.items():
            _row(f"  `bootstrap {name}` alone", f"{med(times):.2f}", f"{min(times):.2f}", "1")
        _row("4 separate commands", f"{med(four):.2f}", f"{min(four):.2f}", f"{med(logins_four):g}")
        print(f"| speed-up | {statistics.median(four) / statistics.median(one):.1f}x | | |")
        n = len(hosts)
        counts = []
        if shutil.which("strace"):  # one more, untimed, run of each: one node's processes
            pipeline = [bootstrap, "-i", inv, "--until", "check"]
            counts.append(("this checkout", processes_per_node(cluster, pipeline, env)))
            if args.compare is not None:
                compare_env = {**env, "PYTHONPATH": str(args.compare.resolve())}
                counts.append((str(args.compare), processes_per_node(cluster, pipeline, compare_env)))
        for label, (forks, execs, top) in counts:
            print(f"{label}: one node ran {forks} processes, {execs} programs ({top})")
        print(
            "\n`--until check`: CPU ms per node (all / the node's side / the controller), "
            f"load {os.getloadavg()[0]:.1f}"
        )
        print("| code | wall median s | CPU all | nodes' side | controller |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for label, walls, cpus in (("this checkout", one, cpu_one), (str(args.compare), other, cpu_other)):
            if walls:
                total, node_side = med(c for c, _ in cpus), med(c for _, c in cpus)
                _row(
                    label,
                    f"{med(walls):.2f}",
                    f"{total * 1000 / n:.0f}",
                    f"{node_side * 1000 / n:.0f}",
                    f"{(total - node_side) * 1000 / n:.0f}",
                )
        if args.skip_full:
            return 0
        worktree = tmp / "before"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(worktree), args.before],
            check=True,
        )
        try:
            three = cluster.hosts[:3]
            full = str(
                _inventory(tmp / "full.yaml", three, None, args=["--epochs", "1", "--max-steps", "15"])
            )
            old_env = {**env, "PYTHONPATH": str(worktree)}
            times: dict[str, list[float]] = {"after": [], "before": []}
            logins: dict[str, list[float]] = {"after": [], "before": []}
            for _ in range(args.runs):
                for label, argv, run_env in (
                    ("after", [bootstrap, "-i", full], env),
                    ("before", [sys.executable, "-m", "orchestrator", "-i", full], old_env),
                ):
                    start_logins = _logins(cluster, three)
                    times[label].append(_run(cluster, argv, run_env, tmp))
                    logins[label].append((_logins(cluster, three) - start_logins) / 3)
            print(
                f"\nfull `bootstrap` (check, validate, 15 training steps), 3 nodes, {args.runs} runs each,",
                end="",
            )
            print(" alternated")
            print("| code | median s | min s | SSH logins per node |")
            print("| --- | ---: | ---: | ---: |")
            for label, name in (("before", f"before ({args.before})"), ("after", "after (this checkout)")):
                took, per_node = times[label], logins[label]
                _row(name, f"{med(took):.2f}", f"{min(took):.2f}", f"{med(per_node):g}")
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
