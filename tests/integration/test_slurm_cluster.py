"""The Slurm test fixture itself (tests/slurm.py): a real slurmctld and three slurmd in namespaces."""

import subprocess

from tests.slurm import SlurmCluster


def test_srun_runs_one_task_on_each_compute_host(slurm: SlurmCluster) -> None:
    res = slurm.run(["srun", "--nodes=3", "--ntasks-per-node=1", "hostname"])
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split()) == ["node2", "node3", "node4"]


def test_the_login_host_answers_over_ssh(slurm: SlurmCluster) -> None:
    """What the product does: sbatch and squeue in an SSH session on the login host."""
    cluster = slurm.cluster
    login = slurm.controller
    known_hosts = cluster.workdir / "known_hosts"
    known_hosts.write_text(cluster.known_hosts_text([login]))
    ssh = [
        "ssh",
        "-F",
        "/dev/null",
        "-i",
        str(cluster.client_key),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "LogLevel=ERROR",
        f"root@{login.addr}",
    ]
    out = slurm.cluster.workdir / "by-ssh.out"
    submit = subprocess.run(
        cluster.controller_argv([*ssh, f"sbatch --parsable --nodes=2 --output={out} --wrap='srun hostname'"]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip()
    assert job.isdigit(), submit.stdout
    assert slurm.wait_queue_empty(60) == []
    assert len(out.read_text().split()) == 2
