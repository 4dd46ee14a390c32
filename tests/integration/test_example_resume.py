"""examples/train_ddp.py resumes with node-local checkpoints: two "nodes", two disks, no shared storage.

Each node runs one CPU rank (gloo on 127.0.0.1) with its own ``--checkpoint`` path, as two LAN
machines would each have their own disk: started by torchrun (``--nnodes 2 --node-rank R``), or, as
on native Windows, one process per rank with torchrun's environment. The runs are real: the example
trains, saves, and the next run resumes from what the nodes hold.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_cluster_support

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
SAMPLES, BATCH = 1024, 64  # per epoch: 512 samples per rank = 8 steps
STEPS_PER_EPOCH = SAMPLES // 2 // BATCH


#: master ports, one per run: the runs are in a network namespace of the test's own (``loopback``),
#: where nothing else listens (a port picked free on this machine's loopback could be taken by
#: another test between the pick and torchrun's bind, and the other node would wait on a stranger)
_PORTS = itertools.count(29500)


@pytest.fixture
def loopback() -> Iterator[list[str]]:
    """The command prefix that runs a process in a fresh network namespace with only ``lo`` (up)."""
    require_cluster_support()  # root and `ip netns`
    name = f"cbt-resume-{os.getpid()}-{time.monotonic_ns()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield ["ip", "netns", "exec", name]
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


def _torchrun(node_rank: int, port: int, args: list[str]) -> list[str]:
    return [
        str(TORCHRUN),
        "--nnodes", "2",
        "--nproc-per-node", "1",
        "--node-rank", str(node_rank),
        "--master-addr", "127.0.0.1",
        "--master-port", str(port),
        str(EXAMPLE),
        *args,
    ]  # fmt: skip


def _train(
    prefix: list[str],
    checkpoints: list[Path | None],
    epochs: int,
    *,
    torchrun: bool = True,
    run_dirs: list[Path] | None = None,
    extra: tuple[str, ...] = (),
) -> list[subprocess.CompletedProcess[str]]:
    """One run of the example on both nodes (run with ``prefix``: the ``loopback`` fixture); node R
    saves to and resumes from checkpoints[R] (None: no --checkpoint); ``run_dirs``: each node's
    $CB_RUN_DIR, as `bootstrap launch` sets it."""
    port = next(_PORTS)
    nodes = []
    for node_rank, checkpoint in enumerate(checkpoints):
        args = [
            "--epochs", str(epochs),
            *(["--checkpoint", str(checkpoint)] if checkpoint is not None else []),
            *extra,
            "--samples", str(SAMPLES),
            "--batch-size", str(BATCH),
            "--log-every", "0",
            "--timeout", "60",
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        env.pop("CB_RUN_DIR", None)
        if run_dirs is not None:
            env.update(CB_RUN_DIR=str(run_dirs[node_rank]), CB_RUN_ID=run_dirs[node_rank].parent.parent.name)
        if torchrun:
            command = _torchrun(node_rank, port, args)
        else:  # what bootstrap's native Windows launch does: the rank's environment, no torchrun
            command = [sys.executable, str(EXAMPLE), *args]
            rank_env = {"RANK": node_rank, "LOCAL_RANK": 0, "WORLD_SIZE": 2, "LOCAL_WORLD_SIZE": 1}
            env.update({k: str(v) for k, v in rank_env.items()})
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GROUP_RANK=str(node_rank))
        nodes.append(
            subprocess.Popen(
                [*prefix, *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    runs = []
    for node in nodes:
        out, _ = node.communicate(timeout=240)
        runs.append(subprocess.CompletedProcess(node.args, node.returncode, out, None))
    return runs


def _lines(run: subprocess.CompletedProcess[str], rank: int) -> list[str]:
    return re.findall(rf"^\[rank {rank}/2\] (.*)$", run.stdout, re.M)


def _load(path: Path) -> dict[str, Any]:
    import torch  # here, not at the top: collecting the tests must not cost every worker its import

    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def _optimizer_steps(state: dict[str, Any]) -> int:
    return int(state["optimizer"]["state"][0]["step"])


def _same_model(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a["model"].keys() == b["model"].keys() and all(
        torch.equal(a["model"][k], b["model"][k]) for k in a["model"]
    )


def test_resume_needs_no_shared_storage(loopback: list[str], tmp_path: Path) -> None:
    disks = [tmp_path / "node0" / "ckpt" / "last.pt", tmp_path / "node1" / "ckpt" / "last.pt"]

    first = _train(loopback, disks, epochs=1)
    for rank, run in enumerate(first):
        assert run.returncode == 0, run.stdout
        text = "\n".join(_lines(run, rank))
        assert "resumed" not in text, run.stdout
        assert re.search(r"^epoch 1/1 complete: .* samples in [0-9.]+s = \d+ samples/s$", text, re.M), text
    assert re.search(r"^done: 1 epochs, final loss [0-9.]+, \d+ samples/s total$", first[0].stdout, re.M)
    # each node wrote its own copy on its own disk (the directory made for it), the same state
    saved = [_load(path) for path in disks]
    assert [s["epoch"] for s in saved] == [0, 0]
    assert [_optimizer_steps(s) for s in saved] == [STEPS_PER_EPOCH] * 2
    assert _same_model(saved[0], saved[1])

    # rank 0's node lost its copy (a reinstalled machine, or an elastic restart gave rank 0 to a
    # new node): the only copy is on rank 1's disk, and both ranks resume from it at epoch 2
    disks[0].unlink()
    second = _train(loopback, disks, epochs=2)
    for rank, run in enumerate(second):
        assert run.returncode == 0, run.stdout
        lines = _lines(run, rank)
        assert "resumed from the checkpoint of rank 1: 1 of 2 epochs already done" in lines, run.stdout
        epochs_run = [line.split(" complete")[0] for line in lines if " complete:" in line]
        assert epochs_run == ["epoch 2/2"], run.stdout  # started at epoch 2 and trained only it
    (sent,) = [line for line in _lines(second[1], 1) if line.startswith("sending checkpoint")]
    assert sent.startswith(f"sending checkpoint {disks[1]} (epoch 1, "), second[1].stdout
    assert re.search(r"^done: 2 epochs, ", second[0].stdout, re.M)
    saved = [_load(path) for path in disks]
    assert [s["epoch"] for s in saved] == [1, 1]
    # the optimizer went on counting from the saved state on both nodes: node0 received it
    assert [_optimizer_steps(s) for s in saved] == [2 * STEPS_PER_EPOCH] * 2
    assert _same_model(saved[0], saved[1])
    assert sorted(p.name for p in disks[0].parent.iterdir()) == ["last.pt"]  # no temporary files left


def test_an_unreadable_checkpoint_stops_every_rank_naming_it(loopback: list[str], tmp_path: Path) -> None:
    disks = [tmp_path / "node0" / "last.pt", tmp_path / "node1" / "last.pt"]
    disks[1].parent.mkdir(parents=True)
    disks[1].write_bytes(b"not a checkpoint")
    runs = _train(loopback, disks, epochs=1, torchrun=False)
    for run in runs:  # both stop at once (neither waits for the other until a timeout), neither trains
        assert run.returncode != 0, run.stdout
        assert "RuntimeError: rank 1 cannot read its node's checkpoint (its log names the file and why)" in (
            run.stdout
        ), run.stdout
        assert " complete:" not in run.stdout
    assert any(line.startswith(f"cannot read checkpoint {disks[1]} on ") for line in _lines(runs[1], 1)), (
        runs[1].stdout
    )
    assert disks[1].read_bytes() == b"not a checkpoint" and not disks[0].exists()


def test_each_run_checkpoints_in_its_run_dir_and_resume_starts_from_the_last_one(
    loopback: list[str], tmp_path: Path
) -> None:
    """Under `bootstrap launch` ($CB_RUN_DIR = <workdir>/runs/<run-id>/<node>/out on each node) the
    example saves into its own run's directory; `--resume` starts the next run from the last
    checkpoint of the newest earlier run on each node, and the earlier run's files stay as they were."""

    def run_dirs(run_id: str) -> list[Path]:
        return [tmp_path / f"node{r}" / "runs" / run_id / f"node{r}" / "out" for r in range(2)]

    first = _train(loopback, [None, None], epochs=1, run_dirs=run_dirs("r1"))
    assert all(run.returncode == 0 for run in first), [run.stdout for run in first]
    saved = [d / "checkpoints" / "last.pt" for d in run_dirs("r1")]
    assert [_load(p)["epoch"] for p in saved] == [0, 0]
    before = [p.read_bytes() for p in saved]
    fresh = _train(loopback, [None, None], epochs=1, run_dirs=run_dirs("r2"))  # not asked: from scratch
    assert all(run.returncode == 0 and "resumed" not in run.stdout for run in fresh), fresh[0].stdout
    resumed = _train(loopback, [None, None], epochs=2, run_dirs=run_dirs("r3"), extra=("--resume",))
    for rank, run in enumerate(resumed):
        assert run.returncode == 0, run.stdout
        lines = _lines(run, rank)
        assert "resumed from the checkpoint of rank 0: 1 of 2 epochs already done" in lines, run.stdout
        assert [line.split(" complete")[0] for line in lines if " complete:" in line] == ["epoch 2/2"]
    (sent,) = [line for line in _lines(resumed[0], 0) if line.startswith("sending checkpoint")]
    newest = run_dirs("r2")[0] / "checkpoints" / "last.pt"  # r2 is newer than r1
    assert sent.startswith(f"sending checkpoint {newest} (epoch 1, "), resumed[0].stdout
    assert [_load(d / "checkpoints" / "last.pt")["epoch"] for d in run_dirs("r3")] == [1, 1]
    assert [p.read_bytes() for p in saved] == before  # the earlier run's checkpoint is untouched
    named = _train(loopback, [None, None], epochs=2, run_dirs=run_dirs("r4"), extra=("--resume", "r1"))
    (sent,) = [line for line in _lines(named[0], 0) if line.startswith("sending checkpoint")]
    assert sent.startswith(f"sending checkpoint {saved[0]} (epoch 1, "), named[0].stdout
