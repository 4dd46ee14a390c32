"""cluster.slurm in the inventory and the rendered job files (orchestrator/slurm/job.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import InventoryError
from orchestrator.inventory import load_inventory_text
from orchestrator.render import Renderer
from orchestrator.slurm.job import render_job

BASE = """\
cluster:
  name: hpc
  slurm:
    dir: /shared/cb
    nodes: 2
    gpus: 4
{extra}
  train:
    script: train.py
    args: ["--name", "x'; touch /tmp/owned #"]
nodes:
  - name: login
    host: login.example
"""


def test_ranks_per_node_default_to_the_gpus_and_the_backend_to_nccl() -> None:
    inventory = load_inventory_text(BASE.format(extra=""), "hpc.yaml")
    files = render_job(Renderer(), inventory, "r1")
    assert "#SBATCH --gpus-per-node=4" in files.batch
    assert "--nproc-per-node 4" in files.node
    assert "CLUSTER_BOOTSTRAP_BACKEND=nccl" in files.node
    # the user's argument is one quoted word of the script (sh -n: it parses; the word is whole)
    assert "'x'\"'\"'; touch /tmp/owned #'" in files.node
    subprocess.run(["sh", "-n"], input=files.node, text=True, check=True)
    subprocess.run(["sh", "-n"], input=files.batch, text=True, check=True)


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ("    time: 10 minutes", "time", "not a Slurm time limit"),
        ("    partition: 'debug; rm'", "partition", "pattern"),
        ("    sbatch: ['exclusive']", "sbatch", "sbatch option"),
    ],
)
def test_bad_request_fields_are_refused_by_name(extra: str, field: str, says: str) -> None:
    with pytest.raises(InventoryError) as caught:
        load_inventory_text(BASE.format(extra=extra), "hpc.yaml")
    text = str(caught.value)
    assert f"slurm.{field}" in text and says in text, text


def test_a_relative_or_spaced_directory_is_refused() -> None:
    for bad in ("shared/cb", "/shared/my runs"):
        with pytest.raises(InventoryError, match=r"slurm\.dir"):
            load_inventory_text(BASE.format(extra="").replace("/shared/cb", bad), "hpc.yaml")


@pytest.mark.parametrize("command", [["validate", "--dry-run"], ["check", "--dry-run"]])
def test_a_dry_run_that_needs_an_allocation_is_refused_before_connecting(
    tmp_path: Path, command: list[str]
) -> None:
    inv = tmp_path / "hpc.yaml"
    inv.write_text(BASE.format(extra=""))  # its login host does not exist: nothing may connect
    bootstrap = Path(sys.executable).parent / "bootstrap"
    run = subprocess.run(
        [str(bootstrap), "-i", str(inv), *command], capture_output=True, text=True, cwd=tmp_path
    )
    assert run.returncode == 2, run.stderr
    assert f"`{command[0]} --dry-run` on Slurm: it runs on the nodes Slurm allocates" in run.stderr
    assert "render --for slurm" in run.stderr, run.stderr


def test_status_shows_each_ranks_last_line_whichever_rank_wrote_last() -> None:
    """`status` of a Slurm run: a node's two ranks each show their own last line, in rank order, with
    the rank the line carries (not the node's first rank), whichever of them wrote the log's last line."""
    from orchestrator.slurm.run import RunStatus

    tails = {
        "node2": [
            "[default0]:line 98 of rank 0",
            "[default1]:line 99 of rank 1",
            "[default0]:line 99 of rank 0",
        ],
        "node3": ["[default1]:line 99 of rank 3", "[default0]:line 99 of rank 2"],
        "node4": ["torchrun: waiting"],
    }
    status = RunStatus("st", "6", "RUNNING", "", list(tails), "0:15", tails)
    assert status.labelled_last_lines(2) == [
        "[node2:0] line 99 of rank 0",
        "[node2:1] line 99 of rank 1",
        "[node3:2] line 99 of rank 2",
        "[node3:3] line 99 of rank 3",
        "[node4] torchrun: waiting",
    ]


def test_a_carriage_return_a_rank_printed_cannot_start_another_ranks_line_in_status() -> None:
    from orchestrator.slurm.run import RunStatus, log_lines

    tail = log_lines("[default0]:step 1\n[default0]:50%\r[default1]:forged by rank 0\n")
    status = RunStatus("st", "6", "RUNNING", "", ["node2"], "0:15", {"node2": tail})
    assert status.labelled_last_lines(2) == ["[node2:0] 50%\r[default1]:forged by rank 0"]


def test_a_node_without_the_training_script_says_so_in_one_line_of_its_log(tmp_path: Path) -> None:
    """A directory that is not shared with a compute node: its log says why in one line (exit 2, in
    its node.log.rc), not a traceback from every rank."""
    text = BASE.format(extra="").replace("/shared/cb", str(tmp_path))
    inventory = load_inventory_text(text, "hpc.yaml")
    files = render_job(Renderer(), inventory, "r1")
    (tmp_path / "code").mkdir()
    node_sh = tmp_path / "node.sh"
    node_sh.write_text(files.node)
    env = {"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "n1", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1"}
    done = subprocess.run(["sh", str(node_sh), "n0"], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 2
    node_dir = tmp_path / "runs" / "r1" / "n1"
    log = (node_dir / "node.log").read_text()
    assert log.count("\n") == 1
    assert f"training script train.py not found in {tmp_path / 'code'} on n1" in log
    assert (node_dir / "node.log.rc").read_text() == "2\n"
    # the code directory itself missing there: the same line (not set -e's silent exit 1)
    (tmp_path / "code").rmdir()
    env["SLURMD_NODENAME"] = "n2"
    done = subprocess.run(["sh", str(node_sh), "n0"], env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 2
    log = (tmp_path / "runs" / "r1" / "n2" / "node.log").read_text()
    assert f"training script train.py not found in {tmp_path / 'code'} on n2" in log
