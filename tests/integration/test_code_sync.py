"""Code sync (`sync_code`) over real SSH/SFTP to the namespace cluster.

The namespace hosts share this machine's file system, so each node gets its own workdir (the default
dest is ``<workdir>/code``) and what a node holds can be read directly. Every call runs in-process,
inside the controller's network namespace (worker threads inherit it from the thread that makes them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import InventoryError
from orchestrator.executor import Outcome
from orchestrator.inventory import Inventory, Node, PasswordResolver, load_inventory
from orchestrator.plans import apply
from orchestrator.render import Renderer, plan_launch
from orchestrator.session import Session
from orchestrator.steps.codesync import CodeDestRefused, CodeSyncResult, sync_code
from orchestrator.steps.launch import prepare_plan
from orchestrator.transports import SSHOptions, Transport
from tests import netns
from tests.cluster import NamespaceCluster

WEIRD = "we ird/naïve 'quoted' \"double\" $HOME; `x`.txt"


def _project(root: Path, *, git: bool) -> Path:
    """A small project: code, an executable script, ignored and excluded files, an awkward name."""
    src = root / "project"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "model.py").write_text("WIDTH = 3\n")
    (src / "train.py").write_text("import pkg.model\n")
    (src / "run.sh").write_text("#!/bin/sh\necho run\n")
    (src / "run.sh").chmod(0o755)
    (src / "we ird").mkdir()
    (src / WEIRD).write_text("unicode and quotes\n")
    (src / ".gitignore").write_text("*.ckpt\noutputs/\n!keep.ckpt\n")
    (src / "model.ckpt").write_text("big weights\n")
    (src / "keep.ckpt").write_text("small, re-included\n")
    (src / "outputs").mkdir()
    (src / "outputs" / "log.txt").write_text("old output\n")
    (src / "data").mkdir()
    (src / "data" / "train.bin").write_text("excluded by the inventory\n")
    (src / "pkg" / "__pycache__").mkdir()
    (src / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0bytecode")
    (src / ".venv").mkdir()
    (src / ".venv" / "pyvenv.cfg").write_text("home = /usr\n")
    if git:
        subprocess.run(["git", "init", "-q", str(src)], check=True)
    return src


class Harness:
    """An inventory over the cluster's hosts (root, per-node workdir) and a way to sync it."""

    def __init__(self, cluster: NamespaceCluster, home: Path, root: Path, source: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.source = source
        self.known_hosts = home / ".ssh" / "known_hosts"
        self.known_hosts.write_text(cluster.known_hosts_text())
        self.ssh_config = home / ".ssh" / "config"
        self.ssh_config.write_text("")
        self.cache = root / "xdg-cache"
        self.code: dict[str, Any] = {"source": str(source), "excludes": ["data/"]}
        self.node_extra: dict[str, Any] = {}

    def dest(self, name: str) -> Path:
        return self.root / "nodes" / name / "code"

    def inventory(self) -> Inventory:
        nodes = [
            {
                "name": h.name,
                "host": h.addr,
                "user": "root",
                "key_file": str(self.cluster.client_key),
                "python": "/usr/bin/python3",
                "workdir": str(self.root / "nodes" / h.name),
                **self.node_extra,
            }
            for h in self.cluster.hosts
        ]
        path = self.root / "hosts.yaml"
        path.write_text(json.dumps({"cluster": {"master": "node1", "code": self.code}, "nodes": nodes}))
        return load_inventory(path)

    def sync(self, *, dry_run: bool = False) -> dict[str, Outcome[CodeSyncResult]]:
        inventory = self.inventory()
        options = SSHOptions(known_hosts=self.known_hosts, ssh_config=self.ssh_config)
        old = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = str(self.cache)  # the controller's hash cache stays in the test
        try:
            with (
                netns.inside(self.cluster.controller_ns),
                Session(inventory, inventory.nodes, ssh=options, passwords=PasswordResolver(None)) as session,
            ):
                outcomes = sync_code(session, inventory, inventory.nodes, dry_run=dry_run)
        finally:
            if old is None:
                os.environ.pop("XDG_CACHE_HOME", None)
            else:
                os.environ["XDG_CACHE_HOME"] = old
        return {o.node: o for o in outcomes}

    def ok(self, *, dry_run: bool = False) -> dict[str, CodeSyncResult]:
        outcomes = self.sync(dry_run=dry_run)
        for outcome in outcomes.values():
            assert outcome.error is None, str(outcome.error)
        return {name: o.value for name, o in outcomes.items() if o.value is not None}


def _tree(directory: Path) -> dict[str, tuple[int, int, int]]:
    """Every file below ``directory`` (bookkeeping included) -> (inode, mtime_ns, mode)."""
    out = {}
    for path in directory.rglob("*"):
        if path.is_file() or path.is_symlink():
            st = path.lstat()
            out[path.relative_to(directory).as_posix()] = (st.st_ino, st.st_mtime_ns, st.st_mode)
    return out


@pytest.fixture(params=["git", "plain"])
def harness(
    request: pytest.FixtureRequest, cluster: NamespaceCluster, ctl_home: Path, tmp_path: Path
) -> Iterator[Harness]:
    source = _project(tmp_path, git=request.param == "git")
    yield Harness(cluster, ctl_home, tmp_path, source)


EXPECTED = {".gitignore", "keep.ckpt", "pkg/__init__.py", "pkg/model.py", "run.sh", "train.py", WEIRD}


def test_first_sync_sends_the_project_and_nothing_ignored(harness: Harness) -> None:
    results = harness.ok()
    for host in harness.cluster.hosts:
        result = results[host.name]
        assert sorted(result.added) == sorted(EXPECTED) and not result.changed and not result.deleted
        dest = harness.dest(host.name)
        assert result.dest == str(dest)
        on_node = {p for p in _tree(dest) if not p.startswith(".bootstrap-code")}
        assert on_node == EXPECTED  # no .ckpt, outputs/, data/, __pycache__, .venv, .git
        assert (dest / WEIRD).read_text() == "unicode and quotes\n"
        assert (dest / "pkg" / "model.py").read_text() == "WIDTH = 3\n"
        assert os.access(dest / "run.sh", os.X_OK) and (dest / "run.sh").stat().st_mode & 0o777 == 0o755
        assert (dest / "train.py").stat().st_mode & 0o777 == 0o644
        assert not list(dest.glob(".bootstrap-code-upload-*"))  # the bundle is gone


def test_unchanged_tree_transfers_nothing(harness: Harness) -> None:
    harness.ok()
    before = {h.name: _tree(harness.dest(h.name)) for h in harness.cluster.hosts}
    results = harness.ok()
    for host in harness.cluster.hosts:
        assert results[host.name].unchanged and results[host.name].bytes_sent == 0
        assert results[host.name].summary() == f"unchanged ({len(EXPECTED)} files)"
        # not one file rewritten (same inode, same mtime), the node's cache included
        assert _tree(harness.dest(host.name)) == before[host.name]


def test_one_changed_file_is_the_only_one_sent(harness: Harness) -> None:
    harness.ok()
    before = {h.name: _tree(harness.dest(h.name)) for h in harness.cluster.hosts}
    (harness.source / "pkg" / "model.py").write_text("WIDTH = 4\n")
    results = harness.ok()
    for host in harness.cluster.hosts:
        result = results[host.name]
        assert result.changed == ["pkg/model.py"] and not result.added and not result.deleted
        assert result.bytes_sent == len("WIDTH = 4\n")
        after = _tree(harness.dest(host.name))
        moved = {p for p in EXPECTED if after[p] != before[host.name][p]}
        assert moved == {"pkg/model.py"}
        assert (harness.dest(host.name) / "pkg" / "model.py").read_text() == "WIDTH = 4\n"


def test_executable_bit_change_is_synced(harness: Harness) -> None:
    harness.ok()
    (harness.source / "train.py").chmod(0o755)
    results = harness.ok()
    assert all(r.changed == ["train.py"] for r in results.values())
    for host in harness.cluster.hosts:
        assert (harness.dest(host.name) / "train.py").stat().st_mode & 0o777 == 0o755


def test_deleted_file_is_deleted_on_nodes_but_node_files_stay(harness: Harness) -> None:
    harness.ok()
    for host in harness.cluster.hosts:  # what training leaves in the code directory on a node
        dest = harness.dest(host.name)
        (dest / "pkg" / "__pycache__").mkdir()
        (dest / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"node bytecode")
        (dest / "outputs").mkdir()
        (dest / "outputs" / "metrics.json").write_text("{}")
        (dest / "epoch3.ckpt").write_text("weights")
        (dest / "stray.py").write_text("not in the project")  # not ignored, but the node's: stays
        (dest / "run.sh").write_text("#!/bin/sh\necho edited on the node\n")  # ours, then the node's
    (harness.source / "pkg" / "model.py").unlink()
    (harness.source / WEIRD).unlink()
    (harness.source / "run.sh").unlink()
    results = harness.ok()
    for host in harness.cluster.hosts:
        dest = harness.dest(host.name)
        assert sorted(results[host.name].deleted) == sorted(["pkg/model.py", WEIRD])
        assert not (dest / "pkg" / "model.py").exists()
        assert not (dest / "we ird").exists()  # emptied by the deletion, removed
        assert (dest / "pkg" / "__pycache__" / "model.cpython-311.pyc").read_bytes() == b"node bytecode"
        assert (dest / "outputs" / "metrics.json").exists() and (dest / "epoch3.ckpt").exists()
        assert (dest / "stray.py").read_text() == "not in the project"
        assert (dest / "run.sh").read_text() == "#!/bin/sh\necho edited on the node\n"
    assert all(r.unchanged for r in harness.ok().values())  # the node's files do not make it differ


def test_training_outputs_in_the_code_directory_survive_every_sync_byte_for_byte(harness: Harness) -> None:
    """A run writes checkpoints, outputs, wandb files and a file beside the script into the code
    directory; the next syncs (unchanged project, then an edit and a removal) keep every byte."""
    harness.ok()
    written: dict[str, bytes] = {
        "ckpt/epoch1.pt": os.urandom(4096),
        "ckpt/last.pt": os.urandom(4096),
        "outputs/metrics.json": b'{"loss": 0.25}\n',
        "wandb/run-1/files/config.yaml": b"lr: 0.1\n",
        "results.csv": b"epoch,loss\n1,0.25\n",  # beside the script, not ignored by anything
    }
    for host in harness.cluster.hosts:
        for rel, data in written.items():
            path = harness.dest(host.name) / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    assert all(r.unchanged for r in harness.ok().values())
    (harness.source / "train.py").write_text("import pkg.model  # edited\n")
    (harness.source / "pkg" / "model.py").unlink()
    results = harness.ok()
    for host in harness.cluster.hosts:
        dest = harness.dest(host.name)
        assert results[host.name].changed == ["train.py"] and results[host.name].deleted == ["pkg/model.py"]
        assert not (dest / "pkg" / "model.py").exists()
        assert {rel: (dest / rel).read_bytes() for rel in written} == written


def test_a_file_training_wrote_where_the_project_now_has_one_is_kept_byte_for_byte(harness: Harness) -> None:
    """Training wrote ckpt/node-latest.pt into the code directory; then the project got a file at that
    path (a quick local run of the same script). The sync replaced the node's checkpoint with the
    project's file, saying only "1 changed". A file no sync put there as it is (written there, or
    edited on the node) is kept now, and said; once moved away, the project's file is shipped."""
    harness.ok()
    weights = os.urandom(4096)
    for host in harness.cluster.hosts:
        (harness.dest(host.name) / "ckpt").mkdir()
        (harness.dest(host.name) / "ckpt" / "node-latest.pt").write_bytes(weights)
        (harness.dest(host.name) / "run.sh").write_text("echo edited on the node\n")  # shipped, then edited
    (harness.source / "ckpt").mkdir()
    (harness.source / "ckpt" / "node-latest.pt").write_bytes(b"a local run's weights")
    (harness.source / "run.sh").write_text("echo the project's new one\n")
    for _ in range(2):  # and again: still the node's own, still said
        results = harness.ok()
        for host in harness.cluster.hosts:
            dest, result = harness.dest(host.name), results[host.name]
            assert result.kept == ["ckpt/node-latest.pt", "run.sh"] and result.changed == [], result
            assert (dest / "ckpt" / "node-latest.pt").read_bytes() == weights
            assert (dest / "run.sh").read_text() == "echo edited on the node\n"
            assert "kept" in result.summary() and "ckpt/node-latest.pt, run.sh" in result.kept_warning()
    (harness.source / "run.sh").unlink()  # the project drops it: the node's edit is not ours to delete
    for host in harness.cluster.hosts:
        (harness.dest(host.name) / "ckpt" / "node-latest.pt").rename(harness.dest(host.name) / "mine.pt")
    results = harness.ok()
    for host in harness.cluster.hosts:
        dest, result = harness.dest(host.name), results[host.name]
        assert result.added == ["ckpt/node-latest.pt"] and result.deleted == [] and result.kept == [], result
        assert (dest / "ckpt" / "node-latest.pt").read_bytes() == b"a local run's weights"
        assert (dest / "run.sh").read_text() == "echo edited on the node\n"


def test_a_directory_of_an_older_version_deletes_nothing_it_does_not_know(harness: Harness) -> None:
    """A code directory synced before the record of shipped files existed (only the scan cache marks
    it): no file there is known to be ours, so the first sync deletes nothing; from then on, what
    that sync shipped and the project drops is deleted."""
    harness.ok()
    for host in harness.cluster.hosts:
        dest = harness.dest(host.name)
        (dest / ".bootstrap-code-shipped.json").unlink()  # as an older version left it
        (dest / "ckpt").mkdir()
        (dest / "ckpt" / "last.pt").write_bytes(b"weights")
        (dest / "old_train.py").write_text("shipped by an older version, maybe\n")
    first = harness.ok()
    for host in harness.cluster.hosts:
        dest = harness.dest(host.name)
        assert first[host.name].deleted == []
        assert (dest / "old_train.py").exists() and (dest / "ckpt" / "last.pt").read_bytes() == b"weights"
    (harness.source / "train.py").unlink()
    second = harness.ok()
    for host in harness.cluster.hosts:
        dest = harness.dest(host.name)
        assert second[host.name].deleted == ["train.py"] and not (dest / "train.py").exists()
        assert (dest / "old_train.py").exists() and (dest / "ckpt" / "last.pt").read_bytes() == b"weights"


def test_one_code_directory_shared_by_every_node_is_synced_once(
    cluster: NamespaceCluster, ctl_home: Path, tmp_path: Path
) -> None:
    """Every node's code destination is one directory (NFS homes; here one file system): found
    before anything is written, written from one node, the others say which one."""
    h = Harness(cluster, ctl_home, tmp_path, _project(tmp_path, git=False))
    shared = tmp_path / "nfs" / "code"
    h.code["dest"] = str(shared)
    names = [host.name for host in cluster.hosts]
    for _ in range(3):  # a race shows up as "File exists" on some node, now and then
        results = h.ok()
        writers = [n for n in names if results[n].synced_by is None and not results[n].unchanged]
        assert len(writers) <= 1, {n: r.summary() for n, r in results.items()}
        for name in names:
            if results[name].synced_by is not None:
                assert results[name].synced_by == names[0] and results[name].summary() == (
                    f"synced from {names[0]} (the same directory)"
                )
        (h.source / "train.py").write_text(f"import pkg.model  # {_}\n")
    first = h.ok()
    assert first[names[0]].changed == ["train.py"] and first[names[0]].shared_with == names[1:]
    assert all(first[n].synced_by == names[0] for n in names[1:])
    assert (shared / "train.py").read_text() == "import pkg.model  # 2\n"
    assert {p for p in _tree(shared) if not p.startswith(".bootstrap-code")} == EXPECTED


def test_dry_run_reports_and_changes_nothing(harness: Harness) -> None:
    results = harness.ok(dry_run=True)
    for host in harness.cluster.hosts:
        assert results[host.name].dry_run and sorted(results[host.name].added) == sorted(EXPECTED)
        assert not harness.dest(host.name).exists()
    harness.ok()
    (harness.source / "train.py").write_text("changed\n")
    before = {h.name: _tree(harness.dest(h.name)) for h in harness.cluster.hosts}
    results = harness.ok(dry_run=True)
    assert all(r.changed == ["train.py"] for r in results.values())
    assert {h.name: _tree(harness.dest(h.name)) for h in harness.cluster.hosts} == before


def test_a_file_replaces_a_directory_and_a_directory_a_file(harness: Harness) -> None:
    harness.ok()
    (harness.source / "run.sh").unlink()
    (harness.source / "run.sh").mkdir()
    (harness.source / "run.sh" / "inner.txt").write_text("now a directory\n")
    (harness.source / "pkg" / "__init__.py").unlink()
    (harness.source / "pkg" / "model.py").unlink()
    (harness.source / "pkg" / "__pycache__" / "model.cpython-311.pyc").unlink()
    (harness.source / "pkg" / "__pycache__").rmdir()
    (harness.source / "pkg").rmdir()
    (harness.source / "pkg").write_text("now a file\n")
    harness.ok()
    for host in harness.cluster.hosts:
        dest = harness.dest(host.name)
        assert (dest / "run.sh" / "inner.txt").read_text() == "now a directory\n"
        assert (dest / "pkg").read_text() == "now a file\n"
    assert all(r.unchanged for r in harness.ok().values())


def test_symlinks_on_the_node_are_never_followed(
    cluster: NamespaceCluster, ctl_home: Path, tmp_path: Path
) -> None:
    h = Harness(cluster, ctl_home, tmp_path, _project(tmp_path, git=False))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.py").write_text("precious\n")
    (outside / "other.py").write_text("precious too\n")
    h.ok()
    for host in cluster.hosts:  # a node whose pkg/ now points out of dest (say, a user's shortcut)
        dest = h.dest(host.name)
        shutil.rmtree(dest / "pkg")
        (dest / "pkg").symlink_to(outside)
    results = h.ok()
    assert sorted(outside.iterdir()) == [outside / "model.py", outside / "other.py"]
    assert (outside / "model.py").read_text() == "precious\n"
    for host in cluster.hosts:
        dest = h.dest(host.name)
        assert "pkg" in results[host.name].deleted  # the link itself, not what it points to
        assert not (dest / "pkg").is_symlink() and (dest / "pkg" / "model.py").read_text() == "WIDTH = 3\n"


def test_a_foreign_directory_keeps_its_files(
    cluster: NamespaceCluster, ctl_home: Path, tmp_path: Path
) -> None:
    h = Harness(cluster, ctl_home, tmp_path, _project(tmp_path, git=False))
    for host in cluster.hosts:
        dest = h.dest(host.name)
        dest.mkdir(parents=True)
        (dest / "thesis.tex").write_text("years of work\n")
    results = h.ok()
    (h.source / "run.sh").unlink()
    again = h.ok()
    for host in cluster.hosts:
        assert results[host.name].deleted == [] and again[host.name].deleted == ["run.sh"]
        assert (h.dest(host.name) / "thesis.tex").read_text() == "years of work\n"
        assert (h.dest(host.name) / "train.py").exists()


def test_refuses_home_and_root_destinations(
    cluster: NamespaceCluster, ctl_home: Path, tmp_path: Path
) -> None:
    h = Harness(cluster, ctl_home, tmp_path, _project(tmp_path, git=False))
    home = Path(os.path.expanduser("~root"))
    # the inventory refuses these spellings at once; these slip past a text check: the node refuses
    for dest, what in ((str(home), "is the home directory"), ("//./", "is the root of a file system")):
        h.code["dest"] = dest
        outcomes = h.sync()
        for host in cluster.hosts:
            error = outcomes[host.name].error
            assert isinstance(error, CodeDestRefused) and what in str(error), error
    for dest in ("~", "~/", "/", "C:\\"):
        h.code["dest"] = dest
        with pytest.raises(InventoryError, match="home or root directory"):
            h.inventory()


def test_local_node_syncs_and_refuses_a_dest_inside_the_project(tmp_path: Path) -> None:
    from orchestrator.steps.codesync import CodeDestRefused

    source = _project(tmp_path, git=False)

    def run(dest: str) -> Outcome[CodeSyncResult]:
        path = tmp_path / "local.yaml"
        code = {"source": str(source), "dest": dest, "excludes": ["data/"]}
        path.write_text(
            json.dumps({"cluster": {"code": code}, "nodes": [{"name": "here", "connection": "local"}]})
        )
        inventory = load_inventory(path)
        with Session(
            inventory, inventory.nodes, ssh=SSHOptions(), passwords=PasswordResolver(None)
        ) as session:
            return sync_code(session, inventory, inventory.nodes)[0]

    inside = run(str(source / "deploy"))
    assert isinstance(inside.error, CodeDestRefused) and "overlaps the project" in str(inside.error)
    assert not (source / "deploy").exists()
    done = run(str(tmp_path / "deployed"))
    assert done.error is None and done.value is not None and len(done.value.added) == len(EXPECTED)
    assert (tmp_path / "deployed" / "pkg" / "model.py").read_text() == "WIDTH = 3\n"


def test_cli_sync_only_code(
    cluster: NamespaceCluster, trusted_home: Path, tmp_path: Path, bootstrap: Any
) -> None:
    source = _project(tmp_path, git=True)
    nodes = [
        {
            "name": h.name,
            "host": h.addr,
            "user": "root",
            "python": "/usr/bin/python3",
            "workdir": str(tmp_path / h.name),
        }
        for h in cluster.hosts
    ]
    inv = tmp_path / "hosts.yaml"
    code = {"source": str(source), "excludes": ["data/"]}
    inv.write_text(json.dumps({"cluster": {"master": "node1", "code": code}, "nodes": nodes}))
    dry = bootstrap("-i", str(inv), "--json", "--dry-run", "sync", "--only", "code")
    assert dry.returncode == 0, dry
    assert all(sorted(n["added"]) == sorted(EXPECTED) for n in json.loads(dry.stdout)["code"]["nodes"])
    assert not (tmp_path / "node1" / "code").exists()
    first = bootstrap("-i", str(inv), "sync", "--only", "code")
    assert first.returncode == 0 and "7 added" in first.stdout + first.stderr, first
    again = bootstrap("-i", str(inv), "--json", "sync", "--only", "code")
    assert again.returncode == 0, again
    assert all(n["unchanged"] for n in json.loads(again.stdout)["code"]["nodes"])
    human = bootstrap("-i", str(inv), "sync", "--only", "code")
    assert "unchanged (7 files)" in human.stdout + human.stderr, human
    # a dry run lists what would move, a file a line (as rsync -n), not only how many
    (source / "train.py").write_text("changed\n")
    (source / "run.sh").unlink()
    listed = bootstrap("-i", str(inv), "--dry-run", "sync", "--only", "code")
    assert listed.returncode == 0, listed
    assert len(re.findall(r"^# node\d: ~ train.py$", listed.stdout, re.M)) == 3, listed
    assert len(re.findall(r"^# node\d: - run.sh$", listed.stdout, re.M)) == 3, listed
    assert listed.stdout.rstrip().endswith("# node3: - run.sh")  # after the plans, not amid them


def test_plain_sync_pushes_no_code_without_a_code_section(tmp_path: Path) -> None:
    """`bootstrap sync` run from a directory (a home, say) with an inventory that has no
    cluster.code: nothing of that directory goes anywhere (as in the main pipeline); the note says how
    to push it. `sync --only code` asks for it by name and pushes it."""
    from tests.conftest import BOOTSTRAP

    cwd = tmp_path / "home"
    cwd.mkdir()
    (cwd / "private.txt").write_text("not for the cluster\n")
    workdir = tmp_path / "wd"
    inv = tmp_path / "local.yaml"
    inv.write_text(json.dumps({"nodes": [{"name": "here", "connection": "local", "workdir": str(workdir)}]}))
    env = {**os.environ, "NO_COLOR": "1"}
    plain = subprocess.run(
        [BOOTSTRAP, "-i", str(inv), "sync"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert plain.returncode == 0, plain.stderr
    assert "no cluster.code in the inventory: code sync skipped" in plain.stderr
    assert f"`bootstrap -i {inv} sync --only code`" in plain.stderr  # on this inventory, pasted
    assert not (workdir / "code").exists()
    as_json = subprocess.run(
        [BOOTSTRAP, "-i", str(inv), "--json", "sync"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert (doc["command"], doc["env"], doc["code"], doc["exit_code"]) == ("sync", None, None, 0), doc
    assert not (workdir / "code").exists()
    asked = subprocess.run(
        [BOOTSTRAP, "-i", str(inv), "sync", "--only", "code"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert asked.returncode == 0, asked.stderr
    assert (workdir / "code" / "private.txt").read_text() == "not for the cluster\n"


def test_a_code_directory_launch_created_is_synced_into(
    cluster: NamespaceCluster, ctl_home: Path, tmp_path: Path
) -> None:
    """`launch` with no cluster.code uploads its training script into <workdir>/code, creating the
    directory. A later code sync there (the project has no such script) syncs into it and keeps
    launch's file: only what a sync shipped is ever deleted."""
    h = Harness(cluster, ctl_home, tmp_path, _project(tmp_path, git=False))
    script = tmp_path / "first_try.py"
    script.write_text("print('a script launch uploaded')\n")
    inventory = h.inventory()
    specs = {
        s.node.name: s
        for s in plan_launch(
            inventory, backend="gloo", master_addr="10.0.0.1", run_id="r1", interfaces={}, cpus={}, pythons={}
        )
    }
    options = SSHOptions(known_hosts=h.known_hosts, ssh_config=h.ssh_config)

    def prepare(node: Node, transport: Transport) -> None:  # launch's plan up to its launcher
        spec = dataclasses.replace(specs[node.name], script="first_try.py")
        apply(
            prepare_plan(node, transport.platform, spec, renderer=Renderer(), script_file=script), transport
        )

    with (
        netns.inside(cluster.controller_ns),
        Session(inventory, inventory.nodes, ssh=options, passwords=PasswordResolver(None)) as session,
    ):
        assert all(o.ok for o in session.map(prepare, step="prepare")), "launch's uploads failed"
    for host in cluster.hosts:
        assert (h.dest(host.name) / "first_try.py").exists()
    results = h.ok()
    for host in cluster.hosts:  # not shipped by a sync: kept (it may be all the user has of it)
        assert results[host.name].deleted == [], results[host.name]
        assert (h.dest(host.name) / "first_try.py").exists()
        assert (h.dest(host.name) / "train.py").read_text() == "import pkg.model\n"
