"""Warm re-run benchmark (issue 28): a second `bootstrap` on a cluster where nothing needs to change,
beside the same run by hand (scp the script and its data, then `ssh ... torchrun` on every node in
parallel); and a re-run after one data file changed (only that file travels).

Builds a 3-host namespace cluster (tests/cluster.py: real sshd per host), a project (train.py and a
1 MiB data file beside it, synced as `cluster.code`), runs `bootstrap` once to set everything up, then
alternates, --runs times: `bootstrap -i hosts.yaml` and the hand run. Measured from the start of the
process to the first training line (`[rank N] training started`), and to its end. Each `bootstrap`
run is also split into where it spent its time before training: the moments its phases' reports
appear (code sync, firewall, time, preflight, validate, the launch line).

Target (issue 28): `bootstrap` <= the hand run + 1 s to the first training line (median).

    sudo .venv-test/bin/python benchmarks/warm.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.cluster import NamespaceCluster  # noqa: E402
from tests.conftest import CHRONY_DIRS  # noqa: E402

BIN = Path(sys.executable).parent
FIRST = re.compile(r"\[rank \d+\] training started")
TRAIN = """\
import os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
data = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "data.bin"), "rb").read()
print("[rank %d] training started (%d bytes of data)" % (dist.get_rank(), len(data)), flush=True)
dist.barrier()
dist.destroy_process_group()
"""
#: where the pipeline's phases show their reports (first line of each, stdout or stderr)
MARKS = {
    "code sync": re.compile(r"^(code$|sync: )"),  # the table, or an unchanged sync's one line
    "firewall": re.compile(r"^firewall: "),
    "time": re.compile(r"^time: "),
    "preflight": re.compile(r"^(preflight: |check: )"),
    "validate": re.compile(r"^(validate: skipped|\d+ of \d+ rank\(s\) joined)"),
    "launch line": re.compile(r"^run \S+: \d+ node"),
}


class Timed:
    """A process from the controller namespace, its lines stamped with seconds since its start."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.start = time.monotonic()
        self.lines: list[tuple[float, str, str]] = []
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
        self._pumps = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, "out")),
            threading.Thread(target=self._pump, args=(self.proc.stderr, "err")),
        ]
        for pump in self._pumps:
            pump.start()

    def _pump(self, stream, name: str) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            self.lines.append((time.monotonic() - self.start, name, line.rstrip("\n")))

    def wait(self) -> tuple[int, float]:
        code = self.proc.wait(timeout=600)
        took = time.monotonic() - self.start
        for pump in self._pumps:
            pump.join()
        return code, took

    def first(self, pattern: re.Pattern[str]) -> float | None:
        return next((t for t, _s, line in self.lines if pattern.search(line)), None)

    def text(self) -> str:
        return "\n".join(f"{t:6.2f} {s} {line}" for t, s, line in self.lines)


def _bootstrap(cluster: NamespaceCluster, inv: Path, env: dict[str, str], cwd: Path) -> Timed:
    run = Timed(cluster.controller_argv([str(BIN / "bootstrap"), "-i", str(inv)], env=env), cwd)
    code, run.total = run.wait()  # type: ignore[attr-defined]
    if code != 0:
        raise SystemExit(f"bootstrap failed ({code}):\n{run.text()[-4000:]}")
    return run


def _hand(cluster: NamespaceCluster, project: Path, home: Path, port: int) -> tuple[float, float]:
    """scp train.py and data.bin to every node, then torchrun over ssh on all three at once."""
    ssh = ["-i", str(home / ".ssh" / "id_ed25519"), "-o", "BatchMode=yes"]
    ssh += ["-o", f"UserKnownHostsFile={home / '.ssh' / 'known_hosts'}"]
    hosts = cluster.hosts[:3]
    master = hosts[0].addr
    start = time.monotonic()
    copies = [
        subprocess.Popen(
            cluster.controller_argv(
                [
                    "scp",
                    "-q",
                    *ssh,
                    str(project / "train.py"),
                    str(project / "data.bin"),
                    f"root@{h.addr}:/tmp/hand-{h.name}/",
                ]
            )
        )
        for h in hosts
    ]
    if any(c.wait(timeout=120) != 0 for c in copies):
        raise SystemExit("scp failed")
    runs = []
    for rank, h in enumerate(hosts):
        command = (
            f"cd /tmp/hand-{h.name} && GLOO_SOCKET_IFNAME=eth0 {sys.executable} -m torch.distributed.run "
            f"--nnodes 3 --node-rank {rank} --nproc-per-node 1 --master-addr {master} --master-port {port} "
            f"--local-addr {h.addr} train.py"
        )
        runs.append(Timed(cluster.controller_argv(["ssh", *ssh, f"root@{h.addr}", command]), Path("/")))
    first = None
    for run in runs:
        code, _took = run.wait()
        if code != 0:
            raise SystemExit(f"hand run failed on a node:\n{run.text()[-3000:]}")
        at = run.first(FIRST)
        if at is not None:
            at += run.start - start
            first = at if first is None else min(first, at)
    total = time.monotonic() - start
    assert first is not None
    return first, total


def _row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="cb-warm-") as tmp_text,
        NamespaceCluster(3, private_dirs=CHRONY_DIRS) as cluster,
    ):
        tmp = Path(tmp_text)
        home = tmp / "home"
        (home / ".ssh").mkdir(parents=True, mode=0o700)
        key = home / ".ssh" / "id_ed25519"
        key.write_bytes(cluster.client_key.read_bytes())
        key.chmod(0o600)
        (home / ".ssh" / "known_hosts").write_text(cluster.known_hosts_text())
        for h in cluster.hosts:
            (Path("/tmp") / f"hand-{h.name}").mkdir(exist_ok=True)
        env = {"HOME": str(home), "NO_COLOR": "1", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        project = tmp / "project"
        project.mkdir()
        (project / "train.py").write_text(TRAIN)
        (project / "data.bin").write_bytes(os.urandom(1 << 20))
        nodes = [
            {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable,
             "workdir": str(tmp / "wd" / h.name)}
            for h in cluster.hosts
        ]  # fmt: skip
        cluster_doc = {"name": "warm", "master": "node1", "backend": "gloo", "port": 29641,
                       "train": {"script": "train.py"}, "code": {"source": str(project)}}  # fmt: skip
        inv = tmp / "hosts.yaml"
        inv.write_text(json.dumps({"nodes": nodes, "cluster": cluster_doc}, indent=2))
        _bootstrap(cluster, inv, env, tmp)  # sets everything up (and validates once)
        _bootstrap(cluster, inv, env, tmp)
        boot: list[Timed] = []
        hand: list[tuple[float, float]] = []
        for _ in range(args.runs):
            boot.append(_bootstrap(cluster, inv, env, tmp))
            hand.append(_hand(cluster, project, home, 29642))
        med = statistics.median
        b_first = [r.first(FIRST) or 0.0 for r in boot]
        b_total = [r.total for r in boot]  # type: ignore[attr-defined]
        print(f"\nwarm re-run, nothing to change, 3 nodes, {args.runs} runs each, alternated (seconds)")
        print("| how | first training line (median) | min | max | total (median) |")
        print("| --- | ---: | ---: | ---: | ---: |")
        _row("`bootstrap -i hosts.yaml`", f"{med(b_first):.2f}", f"{min(b_first):.2f}", f"{max(b_first):.2f}",
             f"{med(b_total):.2f}")  # fmt: skip
        h_first, h_total = [h[0] for h in hand], [h[1] for h in hand]
        _row("by hand: scp + ssh torchrun x3 in parallel", f"{med(h_first):.2f}", f"{min(h_first):.2f}",
             f"{max(h_first):.2f}", f"{med(h_total):.2f}")  # fmt: skip
        gap = med(b_first) - med(h_first)
        print(
            f"| bootstrap - hand | {gap:+.2f} | | | target <= +1.00: {'met' if gap <= 1.0 else 'NOT met'} |"
        )

        print("\nwhere `bootstrap` spends its time before training (median moment each report appears, s)")
        print("| phase report | at (median) | since the previous |")
        print("| --- | ---: | ---: |")
        previous = 0.0
        for name, pattern in [*MARKS.items(), ("first training line", FIRST)]:
            moments = [m for r in boot if (m := r.first(pattern)) is not None]
            if not moments:
                continue
            at = med(moments)
            _row(name, f"{at:.2f}", f"{at - previous:+.2f}")
            previous = at

        data = project / "data.bin"
        changed = bytearray(data.read_bytes())
        changed[:16] = os.urandom(16)
        data.write_bytes(bytes(changed))
        run = _bootstrap(cluster, inv, env, tmp)
        rows = [line for _t, _s, line in run.lines if re.match(r"^│ node\d", line)][:3]
        print("\nre-run after data.bin changed: the code sync's report")
        for line in rows:
            print("    " + line)
        for h in cluster.hosts:
            shutil.rmtree(Path("/tmp") / f"hand-{h.name}", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
