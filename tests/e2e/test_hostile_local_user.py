"""Another local user on a node attacks root's runs in a workdir all can write to (issue 27, finding
1): a shared scratch directory with the sticky bit, like /tmp. Run ids are predictable, so the
attacker prepares the run directory before root launches into it: a directory of its own with links
where bootstrap writes (``pid.part``, ``node.log.rc.part``) to root's files, and its own
``launch.sh`` (what it could swap in at any time, once it can write the directory). Then a planted
``pid`` file naming a root process that belongs to no run. The attacker is a throwaway unprivileged
user acting on node1 (its namespaces, this machine's disk); bootstrap connects as root.

What must hold: launch refuses with one line naming the node, the directory, its owner and mode, and
exits 2; no root file changes and the attacker's script never runs; status and stop read nothing the
attacker wrote and signal nothing; and a launch into the same scratch directory without an attacker
works, its run directory root's alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cluster import NamespaceCluster, TestHost
from tests.conftest import CliRun, other_local_user, write_inventory

Bootstrap = Callable[..., CliRun]

#: this machine's users are shared by every test process: a name no other test file uses
ATTACKER = "cbthostile"


@pytest.fixture(scope="module")
def attacker(cluster: NamespaceCluster) -> Iterator[str]:
    with other_local_user(cluster, ATTACKER) as name:
        yield name


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A shared scratch directory: root's, mode 1777 (under /tmp, which every user can reach)."""
    path = Path(tempfile.mkdtemp(prefix="cbt-scratch-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _as_attacker(cluster: NamespaceCluster, host: TestHost, script: str) -> None:
    done = cluster.host_run(
        host, ["runuser", "-u", ATTACKER, "--", "/bin/sh", "-c", script], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def _inventory(tmp_path: Path, host: TestHost, workdir: Path) -> Path:
    script = tmp_path / "hello.py"
    script.write_text("print('hello from root', flush=True)\n")
    node = {"name": host.name, "host": host.addr, "user": "root", "python": sys.executable}
    return write_inventory(
        tmp_path / "h.yaml",
        [{**node, "workdir": str(workdir)}],
        name="hostile",
        master=host.name,
        backend="gloo",
        train={"script": str(script)},
    )


def _refusal(run: CliRun, node: str) -> str:
    """The one line that says why: the node, the directory, its owner and mode."""
    assert run.returncode == 2, run
    lines = [x for x in run.stderr.splitlines() if "refusing " in x]
    assert len(lines) == 1, run
    assert f"{node!r}" in lines[0] or f"{node}:" in lines[0], run
    return lines[0]


def test_a_run_directory_planted_by_another_user_is_refused_and_nothing_it_holds_is_used(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    tmp_path: Path,
    attacker: str,
    scratch: Path,
) -> None:
    host = cluster.host("node1")
    inv = _inventory(tmp_path, host, scratch)
    victims = {name: tmp_path / f"victim-{name}" for name in ("rc", "pid")}
    for victim in victims.values():
        victim.write_text("root's own\n")
        victim.chmod(0o600)
    pwned = scratch / "pwned"
    run_id = f"hostile-{os.getpid()}"
    planted = scratch / "runs" / run_id / host.name
    # the attacker's launch.sh would leave a file of root's behind; its links point at root's files
    _as_attacker(
        cluster,
        host,
        f"umask 0; mkdir -p {planted} && chmod 777 {scratch}/runs {scratch}/runs/{run_id} {planted}"
        f" && ln -s {victims['rc']} {planted}/node.log.rc.part && ln -s {victims['pid']} {planted}/pid.part"
        f" && printf 'touch {pwned}\\n' > {planted}/launch.sh && chmod 777 {planted}/launch.sh",
    )
    launched = bootstrap("-i", str(inv), "launch", "--run-id", run_id, cwd=tmp_path, timeout=300)
    line = _refusal(launched, host.name)
    assert f"{scratch}/runs" in line and ATTACKER in line and "mode 0777" in line, line
    assert "hello from root" not in launched.stdout
    assert not pwned.exists()
    assert all(v.read_text() == "root's own\n" for v in victims.values())
    # the attacker's directory is left as it was: not taken over (chmod-ed, chown-ed) by root
    assert planted.stat().st_uid != 0 and (planted / "launch.sh").read_text() == f"touch {pwned}\n"

    # a planted pid file naming a root process that belongs to no run: believed by nothing
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        stat = Path(f"/proc/{bystander.pid}/stat").read_text().rsplit(") ", 1)[1].split()
        other = scratch / "runs" / "x" / host.name
        _as_attacker(
            cluster,
            host,
            f"umask 0; mkdir -p {other} && chmod 777 {other}"
            f" && printf '%s\\n' '{bystander.pid} {stat[3]} {stat[19]}' > {other}/pid",
        )
        status = bootstrap("-i", str(inv), "status", "--run", "x", cwd=tmp_path)
        assert "running" not in status.stdout, status
        assert "refusing " in status.stdout + status.stderr and status.returncode != 0, status
        stopped = bootstrap("-i", str(inv), "stop", "--run", "x", cwd=tmp_path, timeout=120)
        _refusal(stopped, host.name)
        # stop returns once what it signalled is gone: had it signalled, this would have ended
        assert bystander.poll() is None, "stop killed a process that belongs to no run"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_launch_in_a_scratch_directory_all_can_write_to_is_root_s_alone(
    bootstrap: Bootstrap,
    trusted_home: Path,
    cluster: NamespaceCluster,
    tmp_path: Path,
    attacker: str,
    scratch: Path,
) -> None:
    host = cluster.host("node1")
    inv = _inventory(tmp_path, host, scratch / "cb")
    run_id = f"fine-{os.getpid()}"
    launched = bootstrap("-i", str(inv), "launch", "--run-id", run_id, cwd=tmp_path, timeout=300)
    assert launched.returncode == 0, launched
    assert "hello from root" in launched.stdout
    run_dir = scratch / "cb" / "runs" / run_id / host.name
    assert (run_dir.stat().st_uid, run_dir.stat().st_mode & 0o7777) == (0, 0o700)
    for parent in (scratch / "cb", scratch / "cb" / "runs", run_dir.parent):
        assert parent.stat().st_uid == 0 and parent.stat().st_mode & 0o022 == 0, parent
    # the attacker can neither swap the launch script nor plant a pid file now
    swap = cluster.host_run(
        host,
        ["runuser", "-u", ATTACKER, "--", "/bin/sh", "-c", f"echo id > {run_dir}/launch.sh"],
        capture_output=True,
        text=True,
    )
    assert swap.returncode != 0
    # a run directory is always a new one: without its log (an earlier launch that failed before
    # starting) and forgotten here, the same id is still refused, by the node
    shutil.rmtree(tmp_path / "runs" / run_id)
    (run_dir / "node.log").unlink()
    again = bootstrap("-i", str(inv), "launch", "--run-id", run_id, cwd=tmp_path, timeout=300)
    line = _refusal(again, host.name)
    assert f"{run_dir}: the run directory exists already" in line and "mode 0700" in line, again
