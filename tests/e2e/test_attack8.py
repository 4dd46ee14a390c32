"""Hostile training scripts against the daily loop's commands (docs/daily.md): what a user sees in
`launch`, `logs` and `status` when the script misbehaves, on the namespace cluster."""

from __future__ import annotations

import itertools
import json
import os
import pwd
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import NamespaceCluster
from tests.conftest import other_local_user, write_inventory
from tests.e2e.test_train import Bootstrap
from tests.integration.test_runs import await_

#: this machine's users are shared by every test process: a name no other test file uses
ATTACKER = "cbtattack8"


@pytest.fixture(scope="module")
def attacker(cluster: NamespaceCluster) -> Iterator[str]:
    with other_local_user(cluster, ATTACKER) as name:
        yield name


def _inventory(cluster: NamespaceCluster, tmp_path: Path, script: Path) -> Path:
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable,
         "workdir": str(tmp_path / "wd" / h.name)}
        for h in cluster.hosts
    ]  # fmt: skip
    return write_inventory(
        tmp_path / "hosts.yaml",
        nodes,
        name="ns",
        master="node1",
        backend="gloo",
        train={"script": str(script)},
    )


def test_every_piece_of_a_ten_megabyte_line_is_labelled_with_the_rank_that_printed_it(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """A rank printing 10 MB without a newline is shown in pieces of 2 Mi characters: every piece says
    `[node:rank]`, as the rank's other lines do (earlier only the first: the other four read as
    `[node]`, torchrun's own lines), in `launch` and in `logs`, and the copy `logs` keeps here is the
    node's log byte for byte (earlier it had a newline added every 2 MiB of that line)."""
    script = tmp_path / "loud.py"
    script.write_text(
        "import sys\n"
        "sys.stdout.write('x' * (10 * 1024 * 1024)); sys.stdout.flush()\n"
        "print('\\nafter', flush=True)\n"
    )
    run = bootstrap("-i", str(_inventory(cluster, tmp_path, script)), "launch", cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    logs = bootstrap("-i", str(_inventory(cluster, tmp_path, script)), "logs", cwd=tmp_path, timeout=300)
    assert logs.returncode == 0, logs.stderr
    (run_id,) = [d.name for d in (tmp_path / "runs").iterdir()]
    for host in cluster.hosts:  # the copy `logs` keeps here is the node's log, byte for byte
        node_log = tmp_path / "wd" / host.name / "runs" / run_id / host.name / "node.log"
        assert (tmp_path / "runs" / run_id / f"{host.name}.log").read_bytes() == node_log.read_bytes()
    for (rank, host), out in itertools.product(enumerate(cluster.hosts), (run.stdout, logs.stdout)):
        shown = [line for line in out.split("\n") if line.startswith(f"[{host.name}")]
        pieces = [line for line in shown if "xxxxx" in line]
        assert len(pieces) >= 5, [p[:40] for p in shown]  # 10 MiB: in pieces of at most 2 Mi
        for piece in pieces:
            assert re.fullmatch(rf"\[{host.name}:{rank}\] x+", piece), piece[:40]
        assert sum(len(p) for p in pieces) - len(pieces) * len(f"[{host.name}:{rank}] ") == 10 * 1024 * 1024
        assert f"[{host.name}:{rank}] after" in shown


def test_a_run_that_deleted_its_own_run_directory_is_still_running_and_stop_ends_it(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """The training script removes its run directory (`$CB_RUN_DIR/..`) and goes on: `status` says
    `running` on every node (earlier: `no run`, exit 1, while its processes trained on), and
    `stop --run` ends every process of it."""
    script = tmp_path / "vanish.py"
    script.write_text(
        "import os, shutil, time\n"
        "shutil.rmtree(os.path.dirname(os.environ['CB_RUN_DIR']))\n"
        "print('gone', flush=True)\n"
        "time.sleep(300)\n"
    )
    inv = _inventory(cluster, tmp_path, script)
    started = bootstrap("-i", str(inv), "launch", "--detach", cwd=tmp_path, timeout=300)
    assert started.returncode == 0, started
    run_id = started.stdout.strip()
    dirs = [tmp_path / "wd" / h.name / "runs" / run_id / h.name for h in cluster.hosts]
    await_(lambda: not any(d.exists() for d in dirs), 60, "every node's run directory removed")
    try:
        status = bootstrap("-i", str(inv), "--json", "status", "--run", run_id, cwd=tmp_path)
        assert status.returncode == 0, status
        assert {n["name"]: n["state"] for n in json.loads(status.stdout)["nodes"]} == {
            h.name: "running" for h in cluster.hosts
        }
        # the same run id from another workdir (another project's inventory) is not this run: no run
        # there, and its stop stops nothing of this one
        other = tmp_path / "other.yaml"
        other.write_text(inv.read_text().replace(str(tmp_path / "wd"), str(tmp_path / "elsewhere")))
        elsewhere = bootstrap("-i", str(other), "--json", "status", "--run", run_id, cwd=tmp_path)
        assert elsewhere.returncode == 1, elsewhere
        assert {n["state"] for n in json.loads(elsewhere.stdout)["nodes"]} == {"no run"}, elsewhere.stdout
        refused = bootstrap("-i", str(other), "stop", "--run", run_id, cwd=tmp_path)
        assert "stopped " not in refused.stdout, refused
        still = bootstrap("-i", str(inv), "--json", "status", "--run", run_id, cwd=tmp_path)
        assert {n["state"] for n in json.loads(still.stdout)["nodes"]} == {"running"}, still.stdout
    finally:
        stop = bootstrap("-i", str(inv), "stop", "--run", run_id, cwd=tmp_path)
    assert stop.returncode == 0, stop
    assert stop.stdout.count("stopped ") == len(cluster.hosts), stop
    after = bootstrap("-i", str(inv), "status", "--run", run_id, cwd=tmp_path)
    assert after.returncode == 1 and after.stdout.count("no run") == len(cluster.hosts), after


def test_a_code_directory_another_user_planted_is_refused_before_the_script_runs(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path, attacker: str
) -> None:
    """`code.dest` in a scratch directory all can write to (sticky, as /tmp): another local user made
    that directory first, writable by all, with a `torch.py` in it. The training script runs from the
    code directory and imports what lies beside it first: earlier root's run imported the planted
    module (the attacker's code ran as root) while only the run directory's path was checked. Now
    the pipeline stops at the code sync, which writes nothing there (launch refuses it too), with one
    line naming the node and the directory, exit 2, and nothing of the attacker's runs."""
    scratch = Path(tempfile.mkdtemp(prefix="cbt-scratch8-", dir="/tmp"))
    scratch.chmod(0o1777)
    host = cluster.host("node1")
    code, ran = scratch / "code", scratch / "planted-ran"
    plant = f"""mkdir -m 777 {code} && printf '%s\\n' 'open("{ran}", "w")' > {code}/torch.py"""
    try:
        planted = cluster.host_run(
            host, ["runuser", "-u", attacker, "--", "/bin/sh", "-c", plant], capture_output=True, text=True
        )
        assert planted.returncode == 0, planted.stderr
        project = tmp_path / "project"
        project.mkdir()
        (project / "train.py").write_text("import torch\nprint('root trains', flush=True)\n")
        node = {"name": host.name, "host": host.addr, "user": "root", "python": sys.executable,
                "workdir": str(tmp_path / "wd")}  # fmt: skip
        inv = write_inventory(
            tmp_path / "h.yaml", [node], name="planted", master=host.name, backend="gloo",
            train={"script": "train.py"}, code={"source": str(project), "dest": str(code)},
            firewall={"manage": False}, time={"manage": False},
        )  # fmt: skip
        run = bootstrap("-i", str(inv), "--skip-validate", cwd=tmp_path, timeout=300)
        assert not ran.exists(), run
        assert run.returncode == 2 and "root trains" not in run.stdout, run
        assert sorted(os.listdir(code)) == ["torch.py"], run  # the project was not written there
        said = [line for line in run.stderr.splitlines() if "refusing " in line]
        assert len(said) == 1 and f"'{host.name}'" in said[0], run
        assert f"refusing {code}: it belongs to another user (owner {attacker}" in said[0], run
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_validate_in_a_workdir_another_user_made_names_the_refusal_alone_and_exits_2(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path, attacker: str
) -> None:
    """The workdir sits in a scratch directory and another local user made it first. Validate
    refuses it (nothing is written there) and says so in one line, exit 2 as launch does; earlier it
    led with `ranks never joined: node1 (rank 0)` and exited 1, as if the network were at fault."""
    scratch = Path(tempfile.mkdtemp(prefix="cbt-scratch8-", dir="/tmp"))
    scratch.chmod(0o1777)
    host = cluster.host("node1")
    try:
        made = cluster.host_run(
            host,
            ["runuser", "-u", attacker, "--", "mkdir", "-m", "777", str(scratch / "cb")],
            capture_output=True,
        )
        assert made.returncode == 0, made.stderr
        node = {"name": host.name, "host": host.addr, "user": "root", "python": sys.executable,
                "workdir": str(scratch / "cb")}  # fmt: skip
        inv = write_inventory(tmp_path / "h.yaml", [node], name="planted", master=host.name, backend="gloo")
        run = bootstrap("-i", str(inv), "validate", cwd=tmp_path, timeout=300)
        errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
        assert run.returncode == 2, run
        uid = pwd.getpwnam(attacker).pw_uid
        said = f"error: node '{host.name}': refusing {scratch / 'cb'}: it belongs to another user"
        assert len(errors) == 1 and errors[0].startswith(
            f"{said} (owner {attacker} (uid {uid}), mode 0777)"
        ), run
        assert list((scratch / "cb").iterdir()) == []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_fetch_of_an_empty_path_is_a_usage_error_not_a_copy_of_every_output(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """`fetch ""` (an unset shell variable: `fetch "$CKPT"`) named the run's whole `$CB_RUN_DIR` and
    copied all of it, checkpoints included, into `path0/`, exit 0. Now one line, exit 2, nothing copied."""
    script = tmp_path / "out.py"
    script.write_text("import os\nopen(os.path.join(os.environ['CB_RUN_DIR'], 'last.pt'), 'w').write('x')\n")
    inv = _inventory(cluster, tmp_path, script)
    assert bootstrap("-i", str(inv), "launch", cwd=tmp_path, timeout=300).returncode == 0
    fetched = bootstrap("-i", str(inv), "fetch", "", cwd=tmp_path)
    assert fetched.returncode == 2, fetched
    assert [line for line in fetched.stderr.splitlines() if line.startswith("error: ")] == [
        "error: fetch: an empty PATH names no file (name the file or directory to copy)"
    ], fetched
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not [p for p in run_dir.iterdir() if p.is_dir()]  # nothing fetched
