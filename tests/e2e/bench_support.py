"""What the `bootstrap bench` tests share (test_bench_probe.py, test_bench_scaling.py, test_bench.py):
the slow host (a CPU quota on its sshd's cgroup), the inventory, running `bench`, and reading the
example's CB_METRIC records. Three files, so that the parts run side by side (tests/run.sh: one
file per worker).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import NamespaceCluster, TestHost
from tests.conftest import CliRun, write_inventory

Bootstrap = Callable[..., CliRun]
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_ddp.py"
PORT = 29547
# A quarter of one CPU (cpu.max / CFS quota), in 4 ms periods: a throttled rank stalls at most 3 ms at
# a time, in its collectives too. And a quarter of the default CPU weight: the hosts share this
# machine's two cores with other work, which can leave every process far less than a quarter of a
# core; then the quota binds no one and the weight keeps the slow host about 4 times slower.
QUOTA, PERIOD, WEIGHT_V2, SHARES_V1 = 1000, 4000, 25, 256
# 512 samples per rank and step: compute, not the collectives (whose size does not depend on the
# batch) or this machine's scheduling latency, is most of a step
BATCH = 512
TRAIN = ["--epochs", "1", "--samples", "80000", "--batch-size", str(BATCH), "--log-every", "10"]
TRAIN += ["--metric-warmup", "3"]
STEPS = 24  # 21 measured steps (3 of warm-up), losses compared at steps 10 and 20


# -- the slow host ---------------------------------------------------------------------------------


#: exists while the cpu controller is on in the root cgroup because a test of ours turned it on
ENABLED_MARK = Path("/run/cbt-slow-enabled-cpu")


def cpu_cgroup_root() -> tuple[Path, str] | None:
    """(directory, "v2"|"v1") of a hierarchy where the cpu controller can be used here."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    for line in mounts:
        _dev, where, kind, options, *_ = line.split()
        if kind == "cgroup2":
            controllers = Path(where, "cgroup.controllers")
            if controllers.exists() and "cpu" in controllers.read_text().split():
                return Path(where), "v2"
    for line in mounts:
        _dev, where, kind, options, *_ = line.split()
        if kind == "cgroup" and "cpu" in options.split(","):
            return Path(where), "v1"
    return None


def sshd_pid(host: TestHost) -> int:
    """The host's sshd listener (``sshd -D -e -f <its config>``), not a session's sshd."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # sshd rewrites its title: "sshd: /usr/sbin/sshd -D -e -f CONFIG [listener] ..."
        words = " ".join(a.decode(errors="replace") for a in argv if a).split()
        if words and "sshd" in words[0] and "-D" in words and str(host.sshd_config) in words:
            return int(entry.name)
    raise AssertionError(f"no sshd listener found for {host.name}")


@contextmanager
def throttled(host: TestHost, *, favoured: bool = False) -> Iterator[Path]:
    """Every process the host's sshd starts from now on gets QUOTA/PERIOD of a CPU. ``favoured``: beside
    hosts under :func:`favoured`, with a quarter of their weight (so the quota, not the rest of this
    machine's work, decides how slow the host is)."""
    weight_v2, shares_v1 = (FAVOURED_V2 // 4, FAVOURED_V1 // 4) if favoured else (WEIGHT_V2, SHARES_V1)
    with _cpu_group(host, "slow", weight_v2, shares_v1, quota=True) as group:
        yield group


#: cpu.weight (v2) and cpu.shares (v1) of a favoured host: 100 and 256 times the defaults (v1's maximum)
FAVOURED_V2, FAVOURED_V1 = 10000, 262144


@contextmanager
def favoured(host: TestHost) -> Iterator[Path]:
    """Every process the host's sshd starts from now on outweighs the rest of this machine's work (other
    tests' processes, each of which weighs the default): a speed comparison between runs on these
    hosts measures the hosts, not what else happened to run meanwhile."""
    with _cpu_group(host, "fast", FAVOURED_V2, FAVOURED_V1, quota=False) as group:
        yield group


@contextmanager
def _cpu_group(host: TestHost, kind: str, weight_v2: int, shares_v1: int, *, quota: bool) -> Iterator[Path]:
    """A cpu cgroup of ours holding the host's sshd listener (its sessions are born in it)."""
    found = cpu_cgroup_root()
    if found is None:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail("no cgroup hierarchy with the cpu controller: cannot weigh a host's CPU")
        pytest.skip("no cgroup hierarchy with the cpu controller here: cannot weigh a host's CPU")
    root, version = found
    group = root / f"cbt-{kind}-{os.getpid()}-{host.name}"
    enabled_cpu = False
    group.mkdir()
    try:
        if version == "v2":
            control = root / "cgroup.subtree_control"
            if "cpu" not in control.read_text().split():
                control.write_text("+cpu")
                ENABLED_MARK.touch()  # tests weigh hosts side by side: whoever leaves last turns it off
            enabled_cpu = ENABLED_MARK.exists()
            if quota:
                (group / "cpu.max").write_text(f"{QUOTA} {PERIOD}")
            (group / "cpu.weight").write_text(str(weight_v2))
        else:
            if quota:
                (group / "cpu.cfs_period_us").write_text(str(PERIOD))
                (group / "cpu.cfs_quota_us").write_text(str(QUOTA))
            (group / "cpu.shares").write_text(str(shares_v1))
        (group / "cgroup.procs").write_text(str(sshd_pid(host)))
        yield group
    finally:
        # every process still in the group (the sshd, sessions, a stray rank) back to the root, then
        # the group is removed; the machine's own cgroups are as they were
        for _ in range(50):
            pids = (group / "cgroup.procs").read_text().split()
            if not pids:
                break
            for pid in pids:
                try:
                    (root / "cgroup.procs").write_text(pid)
                except OSError:  # exited meanwhile
                    pass
        group.rmdir()
        # another test may weigh a host of its own meanwhile (tests run side by side): the last one
        # out turns the controller off
        if enabled_cpu and not any(root.glob("cbt-slow-*")) and not any(root.glob("cbt-fast-*")):
            (root / "cgroup.subtree_control").write_text("-cpu")
            ENABLED_MARK.unlink(missing_ok=True)


# -- helpers ---------------------------------------------------------------------------------------


def bench_inventory(cluster: NamespaceCluster, path: Path, *, hosts: int = 3, **train: object) -> Path:
    """An inventory of the cluster's first ``hosts`` hosts, ``train`` its cluster.train."""
    # one thread per rank: the three "hosts" share this machine's cores, and OpenMP threads waiting
    # for each other on oversubscribed cores measure the machine's load, not the hosts
    train.setdefault("env", {"OMP_NUM_THREADS": "1"})
    # a workdir of each host's own under the test's directory: the hosts share this machine's
    # filesystem, and other tests use (and clean) the default ~/cluster-bootstrap meanwhile
    nodes = [
        {
            "name": h.name,
            "host": h.addr,
            "user": "root",
            "python": sys.executable,
            "workdir": str(path.parent / f"wd-{h.name}"),
        }
        for h in cluster.hosts[:hosts]
    ]
    return write_inventory(path, nodes, name="bench", master="node1", backend="gloo", port=PORT, train=train)


def run_bench(cluster: NamespaceCluster, home: Path, *args: str, cwd: Path, timeout: float = 600) -> CliRun:
    """`bootstrap bench ...` in the controller namespace."""
    env = {"HOME": str(home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = cluster.controller_argv([sys.executable, "-m", "orchestrator", *args], env=env)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return CliRun(["bootstrap", *args], proc.returncode, proc.stdout, proc.stderr)


def metrics(run: CliRun) -> list[dict[str, Any]]:
    """The CB_METRIC records of a launch's output, each with the node it came from."""
    records = []
    for node, text in re.findall(r"^\[(node\d):\d+\] CB_METRIC (\{.*\})$", run.stdout, re.M):
        record = json.loads(text)
        record["node"] = node
        records.append(record)
    return records


def summary(records: list[dict[str, Any]], node: str) -> dict[str, Any]:
    (found,) = [r for r in records if r["kind"] == "summary" and r["node"] == node]
    return found


def losses(records: list[dict[str, Any]]) -> dict[int, float]:
    return {
        r["step"]: r["loss"]
        for r in records
        if r["kind"] == "window" and r["rank"] == 0 and r["loss"] is not None
    }


def reference_losses(tmp_path: Path) -> dict[int, float]:
    """The example as one process over the same global batches (3 ranks x BATCH)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("CB_SHARES_FILE", None)
    args = [*TRAIN, "--global-batch", str(3 * BATCH), "--max-steps", str(STEPS)]
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(t) for t in re.findall(r"^CB_METRIC (\{.*\})$", proc.stdout, re.M)]
    return losses(records)


class Points(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.points: list[dict[str, str | None]] = []
        self.bars: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "circle" and found.get("class") == "point":
            self.points.append(found)
        if tag == "rect" and found.get("class") == "bar":
            self.bars.append(found)
