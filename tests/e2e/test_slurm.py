"""Training on a real Slurm (tests/slurm.py): a login host, three compute nodes, the shared disk."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import BOOTSTRAP, CliRun
from tests.slurm import SlurmCluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
Bootstrap = Callable[..., CliRun]


@pytest.fixture
def shared(slurm: SlurmCluster, tmp_path: Path) -> Path:
    """The shared directory of cluster.slurm (every host sees this machine's disk)."""
    path = tmp_path / "shared"
    path.mkdir()
    return path


@pytest.fixture
def home(slurm: SlurmCluster, tmp_path: Path) -> Path:
    """A HOME for the CLI: the cluster's key and the login host's key in known_hosts."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    shutil.copyfile(slurm.cluster.client_key, ssh / "id_ed25519")
    (ssh / "id_ed25519").chmod(0o600)
    (ssh / "known_hosts").write_text(slurm.cluster.known_hosts_text([slurm.controller]))
    return tmp_path / "home"


@pytest.fixture
def bootstrap(slurm: SlurmCluster, home: Path) -> Bootstrap:
    def run(*args: str, cwd: Path, timeout: float = 240) -> CliRun:
        env = {"HOME": str(home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        argv = slurm.cluster.controller_argv([BOOTSTRAP, *args], env=env)
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        return CliRun([BOOTSTRAP, *args], proc.returncode, proc.stdout, proc.stderr)

    return run


def slurm_inventory(slurm: SlurmCluster, path: Path, shared: Path, **train: object) -> Path:
    doc = {
        "cluster": {
            "name": "hpc",
            "backend": "gloo",
            "slurm": {
                "dir": str(shared),
                "nodes": 3,
                "nproc": 2,
                "partition": "debug",
                "python": sys.executable,
            },
            "train": {"script": "examples/train_ddp.py", **train},
        },
        "nodes": [{"name": "login", "host": slurm.controller.addr, "user": "root"}],
    }
    path.write_text(json.dumps(doc, indent=2))
    return path


def test_rendered_batch_script_trains_when_submitted_by_hand(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    args = ["--epochs", "1", "--max-steps", "5"]
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared, args=args)
    job_dir = shared / "runs" / "by-hand"
    run = bootstrap(
        "-i", str(inv), "render", "--for", "slurm", "--run-id", "by-hand", "--out", str(job_dir), cwd=tmp_path
    )
    assert run.returncode == 0, run
    assert f"sbatch {job_dir}/job.sbatch" in run.stderr
    (shared / "code" / "examples").mkdir(parents=True)
    shutil.copyfile(EXAMPLE, shared / "code" / "examples" / "train_ddp.py")

    submitted = slurm.run(["sbatch", "--parsable", str(job_dir / "job.sbatch")])
    assert submitted.returncode == 0, submitted.stderr
    assert slurm.wait_queue_empty(180) == [], (job_dir / f"slurm-{submitted.stdout.strip()}.out").read_text()

    seen = {}
    for node_rank, node in enumerate(("node2", "node3", "node4")):
        log = (job_dir / node / "node.log").read_text()
        assert (job_dir / node / "node.log.rc").read_text().strip() == "0", log
        for local in (0, 1):
            rank = node_rank * 2 + local
            # every rank's own lines, whole, under its local label: the rank capture's protocol
            assert re.search(rf"^\[default{local}\]:\[rank {rank}/6\]", log, re.M), log
            seen[rank] = node
        assert (job_dir / node / "ranks").is_dir()
    assert sorted(seen) == list(range(6))
