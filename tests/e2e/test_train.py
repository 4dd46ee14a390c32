"""The moment users wait for: `bootstrap -i hosts.yaml` trains on every node, logs streaming back."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory

Bootstrap = Callable[..., CliRun]


def _inventory(cluster: NamespaceCluster, path: Path, **train: object) -> Path:
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts
    ]
    return write_inventory(path, nodes, name="ns", master="node1", backend="gloo", train=train)


def test_three_nodes_train_with_gloo(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    inv = _inventory(cluster, tmp_path / "h.yaml", args=["--epochs", "1", "--max-steps", "15"])
    run = bootstrap("-i", str(inv), cwd=tmp_path, timeout=300)  # the main pipeline: check, then launch
    assert run.returncode == 0, run
    assert "ready to train" in run.stderr
    for node, rank in (("node1", 0), ("node2", 1), ("node3", 2)):
        assert re.search(rf"^\[{node}:{rank}\] \[rank {rank}/3\]", run.stdout, re.M), run.stdout
    assert re.search(r"^\[node1:0\] done: ", run.stdout, re.M)
    (run_dir,) = (d for d in (tmp_path / "runs").iterdir() if not d.name.startswith("validate-"))
    for host in cluster.hosts:
        controller_log = (run_dir / f"{host.name}.log").read_text()
        node_log = Path(f"/root/cluster-bootstrap/runs/{run_dir.name}/{host.name}/node.log")  # one filesystem
        assert controller_log and node_log.exists()


def test_a_failing_node_stops_the_others_and_is_named(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    marker = f"cbt-fail-{time.monotonic_ns()}"
    script = tmp_path / f"{marker}.py"
    script.write_text(
        "import socket, sys, time\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if socket.gethostname() == 'node2':\n"
        "    print('node2 gives up', flush=True)\n"
        "    sys.exit(3)\n"
        "time.sleep(300)\n"
    )
    inv = _inventory(cluster, tmp_path / "h.yaml", script=str(script))
    begin = time.monotonic()
    run = bootstrap("-i", str(inv), "launch", cwd=tmp_path, timeout=300)
    assert run.returncode == 1, run
    assert time.monotonic() - begin < 120
    # the rank's own code, not torchrun's 1, in the table and the headline
    assert re.search(r"node2\W+exit 3 \(rank 1\)", run.stderr), run.stderr
    assert "rank 1 exited with code 3 (torchrun exited 1)" in run.stderr, run.stderr
    assert "node2 gives up" in run.stderr  # the failing node's last lines
    assert re.search(r"node1\W+stopped", run.stderr) and re.search(r"node3\W+stopped", run.stderr), run
    # the summary's times: the others were stopped within 10 s of node2's failure
    times = {
        m[0]: float(m[2])
        for m in re.findall(r"(node\d)\W+(exit 3 \(rank 1\)|stopped)\W+([\d.]+)s", run.stderr)
    }
    assert set(times) == {"node1", "node2", "node3"}, run.stderr
    assert max(times["node1"], times["node3"]) - times["node2"] < 10, times
    for host in cluster.hosts:  # nothing of the run is left on any node: bootstrap made sure before it exited
        assert marker not in cluster.ns_run(host.ns, ["pgrep", "-af", marker]).stdout, host.name


def test_elastic_rendezvous_labels_each_line_with_its_global_rank(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """c10d rendezvous assigns the global ranks (not the inventory order): each line's [node:rank] is
    the rank that process really has (its RANK), every rank of the world once."""
    script = tmp_path / "whoami.py"
    script.write_text(
        "import os\nprint('I am rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)\n"
    )
    inv = _inventory(cluster, tmp_path / "h.yaml", elastic=True, script=str(script))
    run = bootstrap("-i", str(inv), "launch", cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run
    labelled = re.findall(r"^\[(node\d):(\d+)\] I am rank (\d+) of 3$", run.stdout, re.M)
    assert sorted(int(rank) for _n, _l, rank in labelled) == [0, 1, 2], run.stdout
    assert all(label == rank for _node, label, rank in labelled), labelled
    assert {node for node, _l, _r in labelled} == {"node1", "node2", "node3"}
