"""Training on a real Slurm (tests/slurm.py): a login host, three compute nodes, the shared disk."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import BOOTSTRAP, CliRun
from tests.integration.test_env_sync import make_wheel
from tests.integration.test_runs import await_
from tests.slurm import ACCOUNT_PARTITION, SlurmCluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py"
Bootstrap = Callable[..., CliRun]


@pytest.fixture
def shared(slurm: SlurmCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The shared directory of cluster.slurm (every host sees this machine's disk). Whatever job the
    test left behind is cancelled after it, so that one failure never holds the nodes of the next.
    After a failed test, what the jobs and Slurm wrote is printed (the report's teardown section)."""
    path = tmp_path / "shared"
    path.mkdir()
    yield path
    if getattr(request.node, "failed_call", False):
        _print_evidence(slurm, path)
    slurm.cancel_every_job()
    # a job's process that outlived its job would hold the rendezvous port of the next test's job
    left = slurm.cluster.end_run_processes(grace=10, marker="CB_RUN_ID")
    if left:
        outlived = sorted(set(left.values()))
        pytest.fail(f"{len(left)} process(es) outlived their Slurm job (killed now): {outlived}")


def _print_evidence(slurm: SlurmCluster, shared: Path) -> None:
    print("--- jobs:", *slurm.squeue_all(), sep="\n")
    for path in sorted(shared.glob("runs/*/slurm-*.out")) + sorted(shared.glob("runs/*/*/node.log*")):
        print(f"--- {path.relative_to(shared)}:", path.read_text(errors="replace")[-3000:], sep="\n")
    for name in ("slurmctld", *(f"slurmd-{host.name}" for host in slurm.computes)):
        print(f"--- {name}.log (its end):", *slurm.log(name).splitlines()[-40:], sep="\n")


@pytest.fixture
def home(slurm: SlurmCluster, tmp_path: Path) -> Path:
    """A HOME for the CLI: the cluster's key and the login host's key in known_hosts."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True, mode=0o700)
    shutil.copyfile(slurm.cluster.client_key, ssh / "id_ed25519")
    (ssh / "id_ed25519").chmod(0o600)
    (ssh / "known_hosts").write_text(slurm.cluster.known_hosts_text([slurm.controller]))
    return tmp_path / "home"


def env_of(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


@pytest.fixture
def bootstrap(slurm: SlurmCluster, home: Path) -> Bootstrap:
    def run(*args: str, cwd: Path, timeout: float = 240) -> CliRun:
        argv = slurm.cluster.controller_argv([BOOTSTRAP, *args], env=env_of(home))
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


def test_launch_submits_streams_every_rank_once_and_status_names_the_job(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    script = tmp_path / "count.py"
    # each rank numbers its lines: any loss, duplicate or reordering shows in the sequence
    script.write_text(
        "import os, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "r = dist.get_rank()\n"
        "for i in range(200):\n"
        "    print(f'line {i} of rank {r}')\n"
        "dist.barrier()\n"
        "if os.environ['LOCAL_RANK'] == '0':\n"
        "    open(os.path.join(os.environ['CB_RUN_DIR'], 'out.txt'), 'w').write(f'from rank {r}')\n"
        "print(f'rank {r} done in', os.environ['CB_RUN_DIR'])\n"
    )
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared)
    inv.write_text(inv.read_text().replace("examples/train_ddp.py", "count.py"))
    run = bootstrap("-i", str(inv), "launch", "--run-id", "fg", cwd=tmp_path)
    assert run.returncode == 0, run
    assert re.search(r"Slurm job \d+ submitted", run.stderr), run
    for rank, node in enumerate(("node2", "node2", "node3", "node3", "node4", "node4")):
        mine = re.findall(rf"^\[{node}:{rank}\] line (\d+) of rank {rank}$", run.stdout, re.M)
        assert mine == [str(i) for i in range(200)], run.stdout[-2000:]
        assert re.search(
            rf"^\[{node}:{rank}\] rank {rank} done in {shared}/runs/fg/{node}/out$", run.stdout, re.M
        )
        kept = (tmp_path / "runs" / "fg" / f"{node}.log").read_text()
        assert f"line 199 of rank {rank}\n" in kept
    for node in ("node2", "node3", "node4"):
        ranks = sorted(p.name for p in (shared / "runs" / "fg" / node / "ranks").iterdir())
        assert len(ranks) == 2, ranks

    status = bootstrap("-i", str(inv), "status", "--run", "fg", cwd=tmp_path)
    assert status.returncode == 0, status
    job = re.search(r"Slurm job (\d+) submitted", run.stderr).group(1)
    assert re.search(rf"run fg: Slurm job {job} (COMPLETED|ENDED)", status.stdout), status
    assert slurm.wait_no_job_active() == []
    # fetch --dry-run: what would be copied from each node, and where; nothing is
    planned = bootstrap("-i", str(inv), "fetch", "--dry-run", "--run", "fg", "out.txt", cwd=tmp_path)
    assert planned.returncode == 0, planned
    assert "--dry-run: nothing was copied" in planned.stderr, planned
    for node in ("node2", "node3", "node4"):
        assert re.search(rf"│ {node} +│ out\.txt +│ 1 +│ 11 B +│ runs/fg/{node}/out\.txt", planned.stdout), (
            planned
        )
        assert not (tmp_path / "runs" / "fg" / node / "out.txt").exists()
    # fetch: each node's outputs ($CB_RUN_DIR) from the shared file system, through the login host
    fetched = bootstrap("-i", str(inv), "fetch", "--run", "fg", "out.txt", cwd=tmp_path)
    assert fetched.returncode == 0, fetched
    for node, rank in (("node2", 0), ("node3", 2), ("node4", 4)):
        assert (tmp_path / "runs" / "fg" / node / "out.txt").read_text() == f"from rank {rank}", fetched
    missing = bootstrap("-i", str(inv), "fetch", "--run", "fg", "nothing.txt", cwd=tmp_path)
    assert missing.returncode == 1, missing
    # on no node: one line naming them all
    assert "nodes 'node2', 'node3', 'node4': nothing.txt not found" in missing.stderr, missing


def _running(pattern: str, slurm: SlurmCluster) -> list[str]:
    """Processes on the Slurm cluster's hosts whose command line holds ``pattern``: what a run left
    behind. Every namespace host shares this machine's PID space, so a process counts only when its
    network namespace is one of the cluster's (another test's workers, running in parallel in their
    own namespaces, are not this run's leftovers)."""
    hosts = {os.stat(f"/run/netns/{host.ns}").st_ino for host in [slurm.controller, *slurm.computes]}
    found = subprocess.run(["pgrep", "-af", pattern], capture_output=True, text=True)
    left = []
    for line in found.stdout.splitlines():
        pid = line.split(maxsplit=1)[0]
        try:
            ns = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:  # gone since pgrep listed it
            continue
        if ns in hosts and "pgrep" not in line:
            left.append(line)
    return left


def test_a_failing_rank_cancels_the_job_and_is_named_with_its_last_lines(
    slurm: SlurmCluster, home: Path, shared: Path, tmp_path: Path
) -> None:
    script = tmp_path / "cbt_slurm_fail.py"
    failed_at = tmp_path / "failed_at"
    script.write_text(
        "import sys, time, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "if dist.get_rank() == 3:\n"
        "    print('rank 3 gives up', flush=True)\n"
        f"    open({str(failed_at)!r}, 'w').write(str(time.time()))\n"
        "    sys.exit(3)\n"
        "time.sleep(300)\n"
    )
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared)
    inv.write_text(inv.read_text().replace("examples/train_ddp.py", script.name))
    proc = subprocess.Popen(
        slurm.cluster.controller_argv(
            [BOOTSTRAP, "-i", str(inv), "launch", "--run-id", "ff"], env=env_of(home)
        ),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ended_at = None  # when Slurm first shows the job ended (the test watches the queue meanwhile)
    while proc.poll() is None:
        states = [line.split()[1] for line in slurm.squeue_all()]
        if ended_at is None and failed_at.exists() and states and not {"RUNNING", "PENDING"} & set(states):
            ended_at = time.time()
        time.sleep(0.2)
    out, err = proc.communicate()
    run = CliRun(["launch"], proc.returncode, out, err)
    if ended_at is None:
        ended_at = time.time()
    assert run.returncode == 1, run
    assert ended_at - float(failed_at.read_text()) < 10, run
    # the node and the rank, with the rank's own code and its last line
    assert re.search(r"node3: rank 3 exited with code 3", run.stderr), run
    assert re.search(r"^\s+\[node3:3\] rank 3 gives up$", run.stderr, re.M), run
    assert slurm.wait_no_job_active() == []
    assert _running(script.name, slurm) == []


TICKING = (
    "import sys, time, torch.distributed as dist\n"
    "dist.init_process_group('gloo')\n"
    "r = dist.get_rank()\n"
    "for i in range(100):\n"
    "    print(f'line {i} of rank {r}', flush=True)\n"
    "if len(sys.argv) > 1:\n"
    "    time.sleep(300)\n"
)


def _ticking(slurm: SlurmCluster, tmp_path: Path, shared: Path, name: str, *, forever: bool) -> Path:
    script = tmp_path / name
    script.write_text(TICKING)
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared, args=["forever"] if forever else [])
    inv.write_text(inv.read_text().replace("examples/train_ddp.py", script.name))
    return inv


def _await_lines(shared: Path, run_id: str, timeout: float = 120) -> None:
    """Until every node's log has its ranks' last line: the job runs, the ranks sleep."""
    deadline = time.monotonic() + timeout
    logs = [shared / "runs" / run_id / n / "node.log" for n in ("node2", "node3", "node4")]
    while time.monotonic() < deadline:
        if all(p.exists() and p.read_text().count("line 99 of rank") == 2 for p in logs):
            return
        time.sleep(0.2)
    raise AssertionError(f"no lines in {logs}")


def test_ctrl_c_cancels_the_job(slurm: SlurmCluster, home: Path, shared: Path, tmp_path: Path) -> None:
    inv = _ticking(slurm, tmp_path, shared, "cbt_slurm_ctrlc.py", forever=True)
    argv = slurm.cluster.controller_argv(
        [BOOTSTRAP, "-i", str(inv), "launch", "--run-id", "cc"], env=env_of(home)
    )
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _await_lines(shared, "cc")
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert re.search(r"interrupted: Slurm job \d+ cancelled \(CANCELLED\)", err), err
    assert slurm.wait_no_job_active() == []
    assert _running("cbt_slurm_ctrlc.py", slurm) == []


def test_detach_then_logs_follow_shows_every_line_once(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    inv = _ticking(slurm, tmp_path, shared, "cbt_slurm_detach.py", forever=False)
    started = bootstrap("-i", str(inv), "launch", "--detach", "--run-id", "dt", cwd=tmp_path)
    assert started.returncode == 0, started
    assert "logs --run dt --follow" in started.stderr, started
    followed = bootstrap("-i", str(inv), "logs", "--run", "dt", "--follow", cwd=tmp_path)
    assert followed.returncode == 0, followed
    for rank, node in enumerate(("node2", "node2", "node3", "node3", "node4", "node4")):
        mine = re.findall(rf"^\[{node}:{rank}\] line (\d+) of rank {rank}$", followed.stdout, re.M)
        assert mine == [str(i) for i in range(100)], followed.stdout[-2000:]


def test_stop_cancels_a_detached_run(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    inv = _ticking(slurm, tmp_path, shared, "cbt_slurm_stop.py", forever=True)
    started = bootstrap("-i", str(inv), "launch", "--detach", "--run-id", "st", cwd=tmp_path)
    assert started.returncode == 0, started
    _await_lines(shared, "st")
    status = bootstrap("-i", str(inv), "status", "--run", "st", cwd=tmp_path)
    assert re.search(r"run st: Slurm job \d+ RUNNING", status.stdout), status
    assert re.search(r"^runtime \d+:\d+ on node2, node3, node4$", status.stdout, re.M), status
    assert "[node3:3] line 99 of rank 3" in status.stdout, status
    # `logs` without --follow on the running job: the lines so far, at once (the ranks sleep 300 s)
    sofar = bootstrap("-i", str(inv), "logs", "--run", "st", cwd=tmp_path, timeout=60)
    assert sofar.returncode == 0, sofar
    for rank, node in enumerate(("node2", "node2", "node3", "node3", "node4", "node4")):
        mine = re.findall(rf"^\[{node}:{rank}\] line (\d+) of rank {rank}$", sofar.stdout, re.M)
        assert mine == [str(i) for i in range(100)], sofar.stdout[-2000:]
    stopped = bootstrap("-i", str(inv), "stop", "--run", "st", cwd=tmp_path)
    assert stopped.returncode == 0, stopped
    assert re.search(r"Slurm job \d+ cancelled \(CANCELLED\)", stopped.stderr), stopped
    assert slurm.wait_no_job_active() == []
    assert _running("cbt_slurm_stop.py", slurm) == []
    # the logs of a stopped run end: every node's log is known complete
    followed = bootstrap("-i", str(inv), "logs", "--run", "st", "--follow", cwd=tmp_path, timeout=60)
    assert "[node4:5] line 99 of rank 5" in followed.stdout, followed


def _launch_with(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path, **request: object
) -> CliRun:
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared)
    doc = json.loads(inv.read_text())
    doc["cluster"]["slurm"].update(request)
    inv.write_text(json.dumps(doc))
    return bootstrap("-i", str(inv), "launch", cwd=tmp_path, timeout=120)


def test_an_unknown_partition_is_slurms_own_line_and_names_the_field(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    run = _launch_with(slurm, bootstrap, shared, tmp_path, partition="gpu-nope")
    assert run.returncode == 2, run
    assert "sbatch refused the job: invalid partition specified: gpu-nope" in run.stderr, run
    assert "cluster.slurm.partition" in run.stderr, run


def test_an_account_the_partition_does_not_allow_is_cancelled_naming_the_account(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    # without accounting Slurm takes the job and keeps it pending with a description of the reason
    # (with slurmdbd, sbatch refuses it: "Invalid account or account/partition combination")
    run = _launch_with(slurm, bootstrap, shared, tmp_path, partition=ACCOUNT_PARTITION, account="nope")
    assert run.returncode == 2, run
    assert re.search(
        r"job \d+ cannot start: pending with reason InvalidAccount \(Job's account not known[^\n]*\); "
        "cancelled",
        run.stderr,
    ), run
    assert "check cluster.slurm.account" in run.stderr, run
    assert slurm.wait_no_job_active() == []


@pytest.mark.parametrize("command", ["launch", "check"])
def test_a_login_host_without_sbatch_says_so_in_one_line(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path, command: str
) -> None:
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared)
    known = slurm.squeue_all()  # jobs of earlier tests Slurm still shows (MinJobAge)
    with slurm.login_path_without_slurm():
        run = bootstrap("-i", str(inv), command, cwd=tmp_path, timeout=120)
    assert run.returncode == 2, run
    assert "no sbatch on the login host: Slurm's commands are not installed or not on its PATH" in run.stderr
    assert "not found" not in run.stderr, run
    assert [job for job in slurm.squeue_all() if job not in known] == []


def test_a_code_directory_another_user_made_is_refused_before_any_job(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    """The Slurm launch never walked train.code_dir: another user of the shared disk who made it
    first had their torch.py run as root on every compute node (the run "exited 0"), and root's
    training script written through their link. Refused as launch on SSH nodes refuses it."""
    planted = shared / "planted-code"
    planted.mkdir()
    (planted / "torch.py").write_text(f"open({str(tmp_path / 'PWNED')!r}, 'w').write('ran')\n")
    os.chown(planted, 54321, 54321)  # a uid no account here has: another local user
    (tmp_path / "train.py").write_text("import torch\n")
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared, script="train.py", code_dir=str(planted))
    known = slurm.squeue_all()
    run = bootstrap("-i", str(inv), "launch", cwd=tmp_path, timeout=120)
    assert run.returncode == 2, run
    assert f"refusing {planted}: it belongs to another user" in run.stderr, run
    assert [job for job in slurm.squeue_all() if job not in known] == []
    assert not (planted / "train.py").exists() and not (tmp_path / "PWNED").exists()


def test_a_request_larger_than_the_partition_is_cancelled_not_left_pending(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    run = _launch_with(slurm, bootstrap, shared, tmp_path, nodes=4)
    assert run.returncode == 2, run
    assert re.search(
        r"job \d+ cannot start: pending with reason Partition(NodeLimit|Config); cancelled", run.stderr
    ), run
    assert "cluster.slurm.nodes" in run.stderr, run
    assert slurm.wait_no_job_active() == []


def test_a_job_waiting_for_drained_nodes_says_reqnodenotavail(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    drain = ["scontrol", "update", "nodename=node3", "state=drain", "reason=cbt-maintenance"]
    assert slurm.run(drain).returncode == 0
    try:
        run = _launch_with(slurm, bootstrap, shared, tmp_path)
    finally:  # the next tests need node3: back in service, and seen so by slurmctld
        slurm.run(["scontrol", "update", "nodename=node3", "state=resume"])
        await_(
            lambda: (
                slurm.run(["sinfo", "-h", "-n", "node3", "-o", "%t"]).stdout.strip()
                in ("idle", "mix", "alloc")
            ),
            60,
            "node3 back in service after the drain",
        )
    assert run.returncode == 1, run
    assert re.search(
        r"job \d+ cannot start: ReqNodeNotAvail[^;]*(node3|DRAINED)[^;]*; cancelled", run.stderr
    ), run
    assert "sinfo -R" in run.stderr, run
    assert slurm.wait_no_job_active() == []


def test_the_time_limit_is_a_clean_stop_named_as_the_time_limit(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    # one minute, the shortest limit Slurm has: --signal=TERM@60 stops the ranks as soon as slurmctld
    # looks (every 30 s), the limit itself is never reached
    inv = _ticking(slurm, tmp_path, shared, "cbt_slurm_limit.py", forever=True)
    doc = json.loads(inv.read_text())
    doc["cluster"]["slurm"]["time"] = "1"
    inv.write_text(json.dumps(doc))
    run = bootstrap("-i", str(inv), "launch", "--run-id", "tl", cwd=tmp_path, timeout=180)
    assert run.returncode == 1, run
    assert re.search(
        r"job \d+ reached its time limit \(1:00\): Slurm stopped every rank before it", run.stderr
    ), run
    assert "exited with code" not in run.stderr, run  # stopped, not failed: no node is blamed
    # every line the ranks wrote before the stop arrived (the stop may come before they print all,
    # or before a node's task starts at all: slurmctld looks at time limits every 30 s, from the job's
    # start, and the TERM is due from the first second)
    for rank, node in enumerate(("node2", "node2", "node3", "node3", "node4", "node4")):
        log = shared / "runs" / "tl" / node / "node.log"
        written = re.findall(rf"line \d+ of rank {rank}$", log.read_text() if log.exists() else "", re.M)
        shown = re.findall(rf"^\[{node}:{rank}\] (line \d+ of rank {rank})$", run.stdout, re.M)
        assert shown == written, run.stdout[-2000:]
        assert (shared / "runs" / "tl" / node / "node.log.rc").read_text().strip() == "none"
    assert slurm.wait_no_job_active() == []
    assert _running("cbt_slurm_limit.py", slurm) == []


def test_bootstrap_syncs_the_code_once_and_trains_the_example_on_three_slurm_nodes(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / "examples").mkdir(parents=True)
    shutil.copyfile(EXAMPLE, project / "examples" / "train_ddp.py")
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared, args=["--epochs", "1", "--max-steps", "10"])
    doc = json.loads(inv.read_text())
    doc["cluster"]["code"] = {"source": str(project)}
    inv.write_text(json.dumps(doc))
    run = bootstrap("-i", str(inv), cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run
    assert (shared / "code" / "examples" / "train_ddp.py").read_bytes() == EXAMPLE.read_bytes()
    assert "firewall: skipped on Slurm" in run.stderr and "ntp: skipped on Slurm" in run.stderr, run
    # the preflight ran on the allocated nodes before the training job was submitted
    assert re.search(r"check: job \d+ on node2, node3, node4", run.stderr), run
    assert "ready to train" in run.stderr, run
    # then validate, in the same job: every rank joined and all-reduced before training
    assert "6 of 6 rank(s) joined (backend gloo" in run.stderr, run
    assert len(re.findall(r"job \d+ holds the nodes", run.stderr)) == 1, run
    for rank, node in enumerate(("node2", "node2", "node3", "node3", "node4", "node4")):
        assert re.search(rf"^\[{node}:{rank}\] \[rank {rank}/6\]", run.stdout, re.M), run.stdout[-3000:]
    assert re.search(r"^\[node2:0\] done: ", run.stdout, re.M), run.stdout[-3000:]
    (run_id,) = [d.name for d in (tmp_path / "runs").iterdir() if not d.name.startswith("validate-")]
    for node in ("node2", "node3", "node4"):
        assert len(list((shared / "runs" / run_id / node / "ranks").iterdir())) == 2
        assert (tmp_path / "runs" / run_id / f"{node}.log").read_text()
    status = bootstrap("-i", str(inv), "status", cwd=tmp_path)
    job = re.search(r"Slurm job (\d+) submitted", run.stderr).group(1)
    assert re.search(rf"run {run_id}: Slurm job {job} (COMPLETED|ENDED)", status.stdout), status


def _node3_with_old_torch(slurm: SlurmCluster, shared: Path, tmp_path: Path) -> Path:
    """An inventory whose interpreter finds another torch first on node3 (its own PYTHONPATH): what a
    node with a stale install shows."""
    fake = shared / "oldtorch" / "torch"
    (fake / "distributed").mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "__version__ = '2.1.0'\n"
        "class version:\n    cuda = None\n"
        "class cuda:\n"
        "    is_available = staticmethod(lambda: False)\n"
        "    device_count = staticmethod(lambda: 0)\n"
    )
    (fake / "distributed" / "__init__.py").write_text("def is_available():\n    return False\n")
    python = shared / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'if [ "$(hostname)" = node3 ]; then export PYTHONPATH={shared / "oldtorch"}; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared)
    doc = json.loads(inv.read_text())
    doc["cluster"]["slurm"]["python"] = str(python)
    inv.write_text(json.dumps(doc))
    return inv


def test_check_runs_inside_an_allocation_and_names_the_node_whose_torch_differs(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    inv = _node3_with_old_torch(slurm, shared, tmp_path)
    run = bootstrap("-i", str(inv), "check", cwd=tmp_path, timeout=180)
    assert run.returncode == 1, run
    assert "firewall: not checked on Slurm" in run.stderr, run
    assert re.search(r"check: job \d+ on node2, node3, node4", run.stderr), run
    # the existing preflight, run on each allocated node: the node named with both versions
    assert re.search(
        r"^node3 FAIL versions: torch 2\.1\.0 here, 2\.13\.0\S* on the master", run.stderr, re.M
    ), run
    assert not re.search(r"^node[24] FAIL", run.stderr, re.M), run
    # the fix is Slurm's (one interpreter on the shared file system), not a sync per node
    assert "set cluster.slurm.python to one with torch==2.13.0" in run.stderr, run
    assert "--from-master" not in run.stderr, run
    assert re.search(r"^│ node3 +│ FAIL", run.stdout, re.M), run
    assert slurm.wait_no_job_active() == []


def test_validate_joins_every_rank_of_the_allocation_and_times_all_reduce(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared)
    # twice: the ranks' files of the three nodes go up through the login host's one connection at
    # once, which hung one run in a few before its transfers took turns
    for _ in range(2):
        run = bootstrap("-i", str(inv), "validate", "--sizes", "4K,1M", cwd=tmp_path, timeout=240)
        assert run.returncode == 0, run
        assert re.search(r"validate: job \d+ on node2, node3, node4", run.stderr), run
        assert "6 of 6 rank(s) joined (backend gloo" in run.stderr, run
        assert "all_reduce result correct" in run.stderr, run
        assert "all_reduce, 6 ranks" in run.stdout, run
        for size in ("4 KiB", "1 MiB"):
            assert re.search(rf"│ +{size} │ +\d+ │ +[\d.]+ ms │", run.stdout), run
        assert slurm.wait_no_job_active() == []
        assert _running("validate_worker.py", slurm) == []


def test_the_pipeline_until_validate_is_one_json_document_and_submits_no_job(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    """`bootstrap --until validate --json` on Slurm: check and validate in one allocation, then it
    stops (no training job); stdout is ONE document, each phase's own under its name, the phases
    Slurm's admins own skipped with the reason."""
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared)
    run = bootstrap("-i", str(inv), "--until", "validate", "--json", cwd=tmp_path, timeout=240)
    assert run.returncode == 0, run
    doc = json.loads(run.stdout)
    assert doc["command"] == "bootstrap" and doc["exit_code"] == 0, doc
    assert doc["check"]["command"] == "check" and doc["validate"]["command"] == "validate", doc
    assert doc["launch"] is None and doc["phases"]["launch"] == {"skipped": "--until validate"}, doc
    assert doc["phases"]["firewall"]["skipped"].startswith("Slurm: "), doc
    assert len(re.findall(r"job \d+ holds the nodes", run.stderr)) == 1, run
    assert "submitted" not in run.stderr, run
    assert not (tmp_path / "runs").exists() or all(
        d.name.startswith("validate-") for d in (tmp_path / "runs").iterdir()
    ), run
    assert slurm.wait_no_job_active() == []


def test_validate_names_the_allocated_node_whose_ranks_cannot_join(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    inv = _node3_with_old_torch(slurm, shared, tmp_path)
    run = bootstrap("-i", str(inv), "validate", "--timeout", "20", cwd=tmp_path, timeout=240)
    assert run.returncode == 1, run
    assert "ranks never joined: node3 (ranks 2, 3) (4 of 6 joined)" in run.stderr, run
    assert not re.search(r"^error: .*node[24]", run.stderr, re.M), run
    assert slurm.wait_no_job_active() == []
    assert _running("validate_worker.py", slurm) == []


def test_bootstrap_builds_the_environment_once_in_the_shared_directory_for_every_node(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    # the environment: one tiny wheel from a local directory (no network), whose .pth file lends the
    # test's own torch to the environment built from it
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "cbttorch", "1.0", extra={"cbttorch.pth": sysconfig.get_paths()["purelib"] + "\n"})
    project = tmp_path / "project"
    project.mkdir()
    (project / "where.py").write_text(
        "import os, sys, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "print('interpreter', os.path.realpath(sys.prefix), flush=True)\n"
        "dist.barrier()\n"
    )
    inv = slurm_inventory(slurm, tmp_path / "hpc.yaml", shared)
    doc = json.loads(inv.read_text())
    del doc["cluster"]["slurm"]["python"]  # the compute nodes run the environment bootstrap builds
    doc["cluster"]["train"]["script"] = "where.py"
    doc["cluster"]["code"] = {"source": str(project)}
    doc["cluster"]["env"] = {"packages": ["cbttorch==1.0"], "find_links": [str(wheels)], "no_index": True}
    doc["nodes"][0]["python"] = sys.executable  # the login host builds it with this interpreter
    inv.write_text(json.dumps(doc))

    run = bootstrap("-i", str(inv), "--skip-validate", cwd=tmp_path, timeout=420)
    assert run.returncode == 0, run
    assert f"sync: the environment and code to {shared} through login, once for every node" in run.stderr
    venv = os.path.realpath(shared / "venv")
    assert Path(venv, "bin", "python").exists(), run
    for rank, node in enumerate(("node2", "node2", "node3", "node3", "node4", "node4")):
        assert re.search(rf"^\[{node}:{rank}\] interpreter {venv}$", run.stdout, re.M), run.stdout[-3000:]
    assert slurm.wait_no_job_active() == []

    # a second sync finds it up to date: nothing is built, the environment is the same one
    again = bootstrap("-i", str(inv), "sync", cwd=tmp_path, timeout=240)
    assert again.returncode == 0, again
    assert "1/1 nodes synced (1 unchanged)" in again.stderr, again
    assert os.path.realpath(shared / "venv") == venv


def test_a_job_waiting_for_resources_shows_its_state_and_reason_then_runs(
    slurm: SlurmCluster, bootstrap: Bootstrap, shared: Path, tmp_path: Path
) -> None:
    # another job holds every CPU of the three nodes for a while: ours waits for Resources
    blocker = slurm.run(
        ["sbatch", "--parsable", "--nodes=3", "--exclusive", "--output=/dev/null", "--wrap", "sleep 15"]
    )
    assert blocker.returncode == 0, blocker.stderr
    inv = _ticking(slurm, tmp_path, shared, "cbt_slurm_wait.py", forever=False)
    run = bootstrap("-i", str(inv), "launch", "--run-id", "wr", cwd=tmp_path, timeout=240)
    assert run.returncode == 0, run
    job = re.search(r"Slurm job (\d+) submitted", run.stderr).group(1)
    assert re.search(rf"^job {job}: PENDING \((Resources|Priority)\)$", run.stderr, re.M), run
    assert re.search(rf"^job {job}: RUNNING$", run.stderr, re.M), run
    assert "[node4:5] line 99 of rank 5" in run.stdout, run
    assert slurm.wait_no_job_active() == []
