"""`bootstrap bench` and `shares: measured` on the namespace cluster with one slow host.

node3 is made slow with a CPU quota on its processes: its sshd is put into a cgroup of its own
(cgroup v2 ``cpu.max``, or the v1 ``cpu`` controller's CFS quota where the machine mounts cpu as v1),
so every session it spawns for the test, and the ranks those start, get a quarter of one CPU (and a
quarter of the usual CPU weight, for when the machine is busy). Then:

- `bench` measures every rank and ranks node3 slowest;
- `bench --scaling` writes its table and page (1, 2, 3 nodes, equal and measured shares);
- the example trains with ``shares: equal`` and ``shares: measured`` in the same test: with measured
  shares node3's compute time per step drops and the cluster's steps/s rises, by a clear margin;
- its loss curve matches one process over the same global batches.

All hosts share this machine's cores (and other work on it): every assertion compares runs made
side by side (a direction and a margin), never an absolute time.
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
STEPS = 40


# -- the slow host ---------------------------------------------------------------------------------


def _cpu_cgroup_root() -> tuple[Path, str] | None:
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


def _sshd_pid(host: TestHost) -> int:
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
def throttled(host: TestHost) -> Iterator[Path]:
    """Every process the host's sshd starts from now on gets QUOTA/PERIOD of a CPU."""
    found = _cpu_cgroup_root()
    if found is None:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail("no cgroup hierarchy with the cpu controller: cannot make a host slow")
        pytest.skip("no cgroup hierarchy with the cpu controller here: cannot make a host slow")
    root, version = found
    group = root / f"cbt-slow-{os.getpid()}-{host.name}"
    enabled_cpu = False
    group.mkdir()
    try:
        if version == "v2":
            control = root / "cgroup.subtree_control"
            if "cpu" not in control.read_text().split():
                control.write_text("+cpu")
                enabled_cpu = True
            (group / "cpu.max").write_text(f"{QUOTA} {PERIOD}")
            (group / "cpu.weight").write_text(str(WEIGHT_V2))
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD))
            (group / "cpu.cfs_quota_us").write_text(str(QUOTA))
            (group / "cpu.shares").write_text(str(SHARES_V1))
        (group / "cgroup.procs").write_text(str(_sshd_pid(host)))
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
        if enabled_cpu:
            (root / "cgroup.subtree_control").write_text("-cpu")


# -- helpers ---------------------------------------------------------------------------------------


def _inventory(cluster: NamespaceCluster, path: Path, **train: object) -> Path:
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
        for h in cluster.hosts
    ]
    return write_inventory(path, nodes, name="bench", master="node1", backend="gloo", port=PORT, train=train)


def _bench(cluster: NamespaceCluster, home: Path, *args: str, cwd: Path, timeout: float = 600) -> CliRun:
    """`bootstrap bench ...` in the controller namespace."""
    env = {"HOME": str(home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = cluster.controller_argv([sys.executable, "-m", "orchestrator", *args], env=env)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return CliRun(["bootstrap", *args], proc.returncode, proc.stdout, proc.stderr)


def _metrics(run: CliRun) -> list[dict[str, Any]]:
    """The CB_METRIC records of a launch's output, each with the node it came from."""
    records = []
    for node, text in re.findall(r"^\[(node\d):\d+\] CB_METRIC (\{.*\})$", run.stdout, re.M):
        record = json.loads(text)
        record["node"] = node
        records.append(record)
    return records


def _summary(records: list[dict[str, Any]], node: str) -> dict[str, Any]:
    (found,) = [r for r in records if r["kind"] == "summary" and r["node"] == node]
    return found


def _losses(records: list[dict[str, Any]]) -> dict[int, float]:
    return {
        r["step"]: r["loss"]
        for r in records
        if r["kind"] == "window" and r["rank"] == 0 and r["loss"] is not None
    }


def _reference_losses(tmp_path: Path) -> dict[int, float]:
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
    return _losses(records)


class _Points(HTMLParser):
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


# -- the test --------------------------------------------------------------------------------------


@pytest.mark.timeout(2400)  # 2 probes, a scaling report (5 training runs), 4 launches, on a shared machine
def test_a_slow_host_is_measured_and_measured_shares_train_faster_with_the_same_loss(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    slow = cluster.hosts[2]
    reference = _reference_losses(tmp_path)
    with throttled(slow):
        # 1. the probe: node3 is the slowest rank, clearly
        inv = _inventory(cluster, tmp_path / "h.yaml", args=TRAIN)
        run = _bench(cluster, trusted_home, "-i", str(inv), "bench", "--json", "--repeats", "5", cwd=tmp_path)
        assert run.returncode == 0, str(run)
        doc = json.loads(run.stdout)
        speeds = {r["node"]: r["samples_per_s"] for r in doc["probe"]["ranks"]}
        assert doc["probe"]["slowest"]["node"] == "node3", speeds
        assert speeds["node3"] < 0.6 * min(speeds["node1"], speeds["node2"]), speeds
        assert all(r["device"].startswith("CPU ") for r in doc["probe"]["ranks"]), doc["probe"]["ranks"]
        shares = doc["shares"]["shares"]
        assert sum(shares) == 3 * 64 and shares[2] == min(shares) and min(shares) >= 1, shares
        human = _bench(cluster, trusted_home, "-i", str(inv), "bench", "--repeats", "2", cwd=tmp_path)
        assert human.returncode == 0, str(human)
        assert "slowest: rank 2 on node3" in human.stderr, human.stderr
        print(human.stdout)  # the table, for the report (pytest -s)

        # 2. the scaling report: a table and its page, every point measured
        scaled = _bench(
            cluster, trusted_home, "-i", str(inv), "bench", "--scaling", "--steps", "10", "--repeats", "1",
            cwd=tmp_path,
        )  # fmt: skip
        assert scaled.returncode == 0, str(scaled)
        print(scaled.stdout)
        (page,) = (tmp_path / "runs").glob("bench-*/scaling.html")
        points = _Points()
        points.feed(page.read_text())
        series = {(p["data-series"], p["data-nodes"]) for p in points.points}
        assert series == {(m, str(n)) for m in ("equal", "measured") for n in (1, 2, 3)}, series
        assert {(b["data-mode"], b["data-rank"]) for b in points.bars} == {
            (m, str(r)) for m in ("equal", "measured") for r in (0, 1, 2)
        }

        # 3. training with equal and with measured shares, side by side: two rounds, alternating, so
        # that a burst of other work on this machine does not decide the comparison
        runs: dict[str, list[list[dict[str, Any]]]] = {"equal": [], "measured": []}
        for _round in range(2):
            for mode in ("equal", "measured"):
                inv = _inventory(
                    cluster, tmp_path / f"{mode}.yaml", args=[*TRAIN, "--max-steps", str(STEPS)], shares=mode
                )
                launched = bootstrap("-i", str(inv), "launch", cwd=tmp_path, timeout=600)
                assert launched.returncode == 0, str(launched)
                said = rf"^\[node1:0\] \[rank 0/3\] shares {mode} \(from .*\): \[(\d+), (\d+), (\d+)\] of"
                shown = re.search(said, launched.stdout, re.M)
                assert shown, launched.stdout
                runs[mode].append(_metrics(launched))
    steps_per_s = {
        mode: [1 / max(_summary(r, n)["step_time"] for n in ("node1", "node2", "node3")) for r in rounds]
        for mode, rounds in runs.items()
    }
    node3_compute = {
        mode: [_summary(r, "node3")["compute_time"] for r in rounds] for mode, rounds in runs.items()
    }
    print(f"steps/s {steps_per_s}; node3 compute s/step {node3_compute}")
    equal_shares = _summary(runs["equal"][0], "node3")["shares"]
    measured_shares = _summary(runs["measured"][0], "node3")["shares"]
    assert equal_shares == [BATCH] * 3 and measured_shares[2] < BATCH // 2, measured_shares
    # node3 spends much less of each step computing; the cluster makes more steps per second
    assert min(node3_compute["measured"]) < 0.7 * min(node3_compute["equal"]), node3_compute
    assert max(steps_per_s["measured"]) > 1.25 * max(steps_per_s["equal"]), steps_per_s
    # the same training either way: the loss curve of one process over the same global batches
    for mode, rounds in runs.items():
        for records in rounds:
            losses = _losses(records)
            assert sorted(losses) == sorted(reference) == [10, 20, 30, 40], (mode, losses)
            for step, value in reference.items():
                assert losses[step] == pytest.approx(value, abs=2e-4), (mode, step, losses, reference)
