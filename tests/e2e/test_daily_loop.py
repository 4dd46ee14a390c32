"""The runs after the first: re-run, arguments per run, what training wrote, fetch (docs/daily.md).

One small cluster (the namespace hosts), a training script of the user's own in a project synced as
code, every node's workdir one directory (as NFS homes are: the namespace hosts share a file system).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory
from tests.e2e.test_train import Bootstrap

TRAIN = """\
import os, socket, sys
import torch.distributed as dist

dist.init_process_group("gloo")
rank, host, run = dist.get_rank(), socket.gethostname(), os.environ["CB_RUN_ID"]
print("[rank %d] args: %s" % (rank, " ".join(sys.argv[1:])), flush=True)
if int(os.environ["LOCAL_RANK"]) == 0:  # what training leaves in the code directory, per node and run
    for rel in ("ckpt/%s-%s.pt", "outputs/%s-%s.json", "wandb/run-%s/%s.txt", "results-%s-%s.csv"):
        path = rel % ((host, run) if not rel.startswith("wandb") else (run, host))
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(os.urandom(2048))
    with open(os.path.join(os.environ["CB_RUN_DIR"], "last.txt"), "w") as fh:
        fh.write("%s %s %s\\n" % (run, host, " ".join(sys.argv[1:])))
dist.barrier()
dist.destroy_process_group()
"""


def _runs(cwd: Path) -> list[str]:
    """Run ids launched from ``cwd``, oldest first."""
    records = [json.loads(p.read_text()) for p in (cwd / "runs").glob("*/run.json")]
    return [r["run_id"] for r in sorted(records, key=lambda r: r["started"]) if "train" in r]


def _written(code: Path) -> dict[str, bytes]:
    return {
        p.relative_to(code).as_posix(): p.read_bytes()
        for p in code.rglob("*")
        if p.is_file() and re.match(r"(ckpt|outputs|wandb)/|results-", p.relative_to(code).as_posix())
    }


def _ok(run: CliRun) -> CliRun:
    assert run.returncode == 0, run
    return run


def test_rerun_keeps_what_training_wrote_takes_arguments_and_fetches_the_runs_outputs(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    (project / "helper.py").write_text("HELP = 1\n")
    shared = tmp_path / "nfs-home" / "cluster-bootstrap"  # every node's workdir: one directory
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable, "workdir": str(shared)}
        for h in cluster.hosts
    ]
    inv = write_inventory(
        tmp_path / "hosts.yaml", nodes, name="ns", master="node1", backend="gloo",
        train={"script": "train.py", "args": ["--lr", "0.5"]},
        code={"source": str(project)},
        firewall={"manage": False}, time={"manage": False},
    )  # fmt: skip
    code = shared / "code"
    names = ", ".join(h.name for h in cluster.hosts)

    first = _ok(bootstrap("-i", str(inv), "--skip-validate", "--", "--lr", "0.1", cwd=tmp_path, timeout=300))
    for rank in range(len(cluster.hosts)):  # each rank's own line shows the run's arguments
        assert re.search(rf"^\[node\d:{rank}\] \[rank {rank}\] args: --lr 0\.1$", first.stdout, re.M), first
    assert f"{code} is one directory on {names} (a shared file system): synced once, from node1" in (
        first.stderr
    ), first.stderr
    assert "args: --lr 0.1 (command line)" in first.stderr
    written = _written(code)
    assert len(written) == 4 * len(cluster.hosts), sorted(written)

    (project / "helper.py").unlink()  # a file we shipped, gone from the project: goes on the nodes
    second = _ok(bootstrap("-i", str(inv), "--skip-validate", cwd=tmp_path, timeout=300))
    for rank in range(len(cluster.hosts)):  # the inventory's arguments are back
        assert re.search(rf"^\[node\d:{rank}\] \[rank {rank}\] args: --lr 0\.5$", second.stdout, re.M), second
    assert not (code / "helper.py").exists() and (code / "train.py").exists()
    after = _written(code)
    assert {rel: after[rel] for rel in written} == written  # every byte the first run wrote
    assert len(after) == 2 * len(written)  # and the second run's own

    run1, run2 = _runs(tmp_path)
    status = _ok(bootstrap("-i", str(inv), "status", "--run", run1, cwd=tmp_path))
    assert "args: --lr 0.1 (command line)" in status.stderr, status
    _ok(bootstrap("-i", str(inv), "fetch", "--run", run1, "last.txt", cwd=tmp_path))
    for host in cluster.hosts:  # the run's own outputs ($CB_RUN_DIR), not a later run's
        fetched = (tmp_path / "runs" / run1 / host.name / "last.txt").read_text()
        assert fetched == f"{run1} {host.name} --lr 0.1\n"
    assert (shared / "runs" / run2 / "node1" / "out" / "last.txt").read_text().startswith(f"{run2} node1 ")


def test_one_node_down_the_other_two_train_with_nodes(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """A node of three is cut off: `launch --nodes` the other two sizes the job to them (--nnodes 2,
    world size 2) and trains; `status` of that run asks only its two nodes."""
    import subprocess

    script = tmp_path / "size.py"
    script.write_text(
        "import os\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "import sys\n"
        "print('world', dist.get_world_size(), 'rank', dist.get_rank(), flush=True)\n"
        "print('args', sys.argv[1:], os.environ.get('CB_TAG'), flush=True)\n"
        "dist.barrier()\ndist.destroy_process_group()\n"
    )
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts
    ]
    inv = write_inventory(
        tmp_path / "hosts.yaml",
        nodes,
        name="ns",
        master="node1",
        backend="gloo",
        train={"script": str(script)},
    )
    down = cluster.hosts[2]
    alive = ",".join(h.name for h in cluster.hosts[:2])
    subprocess.run(["ip", "-n", down.ns, "link", "set", "eth0", "down"], check=True)
    try:
        run = _ok(bootstrap("-i", str(inv), "launch", "--nodes", alive, cwd=tmp_path, timeout=300))
        shown = sorted(re.findall(r"^\[(node\d):\d+\] world (\d+) rank (\d+)$", run.stdout, re.M))
        assert shown == [("node1", "2", "0"), ("node2", "2", "1")], run
        (run_id,) = _runs(tmp_path)
        status = _ok(bootstrap("-i", str(inv), "--json", "status", "--run", run_id, cwd=tmp_path))
        assert [n["name"] for n in json.loads(status.stdout)["nodes"]] == ["node1", "node2"]
    finally:
        subprocess.run(["ip", "-n", down.ns, "link", "set", "eth0", "up"], check=True)
        cluster._probe_from_controller([down.addr], timeout=30)  # later tests use it again


def test_a_dead_node_is_announced_waited_for_once_and_the_others_train_with_the_hint(
    cluster: NamespaceCluster, trusted_home: Path, tmp_path: Path
) -> None:
    """One of three nodes is down before the run: a line names it within 11 s (announced as the
    wait starts, not after it), the run ends after one connect timeout (not one per phase), and the
    command it suggests (`--nodes` the other two) trains with the job sized to them."""
    import shlex
    import subprocess
    import time

    from tests.conftest import BOOTSTRAP

    project = tmp_path / "project"
    project.mkdir()
    (project / "size.py").write_text(
        "import os\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
        "import sys\n"
        "print('world', dist.get_world_size(), 'rank', dist.get_rank(), flush=True)\n"
        "print('args', sys.argv[1:], os.environ.get('CB_TAG'), flush=True)\n"
        "dist.barrier()\ndist.destroy_process_group()\n"
    )
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable,
         "workdir": str(tmp_path / "wd" / h.name)}
        for h in cluster.hosts
    ]  # fmt: skip
    inv = write_inventory(
        tmp_path / "hosts.yaml", nodes, name="ns", master="node1", backend="gloo",
        train={"script": "size.py"}, code={"source": str(project)},
    )  # fmt: skip
    env = {"HOME": str(trusted_home), "NO_COLOR": "1", "PATH": "/usr/bin:/bin"}
    down = cluster.hosts[2]
    subprocess.run(["ip", "-n", down.ns, "link", "set", "eth0", "down"], check=True)
    try:
        begin = time.monotonic()
        proc = subprocess.Popen(
            # this run's own -e and -- arguments: the suggested command repeats them, quoted
            cluster.controller_argv(
                [BOOTSTRAP, "-i", str(inv), "-e", "CB_TAG=x y", "--", "--note", "a b"], env=env
            ),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        )  # fmt: skip
        assert proc.stderr is not None
        named = None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if named is None and down.name in line:
                named = time.monotonic() - begin
        stdout = proc.stdout.read() if proc.stdout else ""
        took = time.monotonic() - begin
        stderr = "".join(lines)
        assert proc.wait() == 3, stdout + stderr
        assert named is not None and named < 11, (named, stderr)
        assert f"waiting for {down.name} ({down.addr}, up to 10 s)" in stderr
        # no answer within 10 s, or (when the controller's neighbour entry for it expired) no ARP
        # answer: either way the node is named once, for the whole run
        said = re.findall(rf"^error: node '{down.name}': (.*)$", stderr, re.M)
        cause = r"(connection to \S+ timed out after 10s|no route to )"
        assert len(said) == 1 and re.match(cause, said[0]), stderr
        assert took < 20, (took, stderr)  # one timeout, not one per phase
        # a repeat of the sync cannot help a node that does not answer: not suggested
        assert "not going on: sync could not reach every node" in stderr and "repeats just" not in stderr
        hints = re.findall(r"^to train without node3 until it is back: `(bootstrap [^`]*)`$", stderr, re.M)
        assert hints == [f"bootstrap -i {inv} --nodes node1,node2 -e 'CB_TAG=x y' -- --note 'a b'"], stderr
        words = shlex.split(hints[0])
        proc2 = subprocess.run(
            cluster.controller_argv([BOOTSTRAP, *words[1:]], env=env),
            capture_output=True, text=True, cwd=tmp_path, timeout=300,
        )  # fmt: skip
        assert proc2.returncode == 0, proc2.stdout + proc2.stderr
        shown = sorted(re.findall(r"^\[(node\d):\d+\] world (\d+) rank (\d+)$", proc2.stdout, re.M))
        assert shown == [("node1", "2", "0"), ("node2", "2", "1")], proc2.stdout
        assert proc2.stdout.count("args ['--note', 'a b'] x y") == 2, proc2.stdout
        (run_id,) = _runs(tmp_path)
        script = (tmp_path / "wd" / "node1" / "runs" / run_id / "node1" / "launch.sh").read_text()
        assert "--nnodes 2 " in script
    finally:
        subprocess.run(["ip", "-n", down.ns, "link", "set", "eth0", "up"], check=True)
        cluster._probe_from_controller([down.addr], timeout=30)  # later tests use it again


def test_validate_is_skipped_when_nothing_it_checks_changed_and_runs_on_another_node_set(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    script = tmp_path / "one.py"
    script.write_text(
        "import torch.distributed as dist\ndist.init_process_group('gloo')\nprint('trained', flush=True)\n"
    )
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable,
         "workdir": str(tmp_path / "wd" / h.name)}
        for h in cluster.hosts
    ]  # fmt: skip
    inv = write_inventory(
        tmp_path / "hosts.yaml", nodes, name="ns", master="node1", backend="gloo",
        train={"script": str(script)}, firewall={"manage": False}, time={"manage": False},
    )  # fmt: skip
    skipped = re.compile(
        r"^validate: skipped: nothing it checks changed since it passed on these (\d) node\(s\)", re.M
    )

    tables = "preflight: backend gloo"  # the checks table's title
    brief = "check: 3/3 nodes ready to train, every check ok (backend gloo)"

    first = _ok(bootstrap("-i", str(inv), cwd=tmp_path, timeout=300))
    assert "3 of 3 rank(s) joined" in first.stderr and not skipped.search(first.stderr), first
    assert tables in first.stdout and brief not in first.stderr, first  # a first run shows it all
    second = _ok(bootstrap("-i", str(inv), cwd=tmp_path, timeout=300))
    assert skipped.findall(second.stderr) == ["3"] and "rank(s) joined" not in second.stderr, second
    assert second.stdout.count("trained") == 3
    # nothing changed: the preflight is one line, its tables are left out
    assert brief in second.stderr.splitlines() and tables not in second.stdout, second
    other = _ok(bootstrap("-i", str(inv), "--nodes", "node1,node2", cwd=tmp_path, timeout=300))
    assert "2 of 2 rank(s) joined" in other.stderr and not skipped.search(other.stderr), other
    assert tables in other.stdout, other  # never validated on these two: shown whole
    forced = _ok(bootstrap("-i", str(inv), "-v", "--validate", cwd=tmp_path, timeout=300))
    assert "3 of 3 rank(s) joined" in forced.stderr and not skipped.search(forced.stderr), forced
    assert tables in forced.stdout and brief not in forced.stderr, forced  # -v: every table
