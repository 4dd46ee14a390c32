"""`bootstrap clean` on the namespace cluster: after a run, `--dry-run` lists per node what bootstrap
put there with its size and changes nothing; `--yes` removes it, and a file the user put in the
workdir (and one a user added to the code directory) stays. A running run refuses the clean."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory
from tests.integration.test_env_sync import make_wheel

Bootstrap = Callable[..., CliRun]


def _tree(root: Path) -> dict[str, int]:
    """Every file and link under ``root`` with its size (what "changes nothing" compares)."""
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            path = Path(directory, name)
            out[str(path.relative_to(root))] = path.lstat().st_size
    return out


def test_clean_lists_then_removes_only_what_bootstrap_put_there(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    hosts = cluster.hosts[:2]
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "tinya", "1.0")
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "pkg" / "m.py").write_text("X = 1\n")
    (project / "train.py").write_text(
        "import os, pathlib, sys, time\n"
        "out = pathlib.Path(os.environ['CB_RUN_DIR'])\n"
        "(out / 'ckpt.pt').write_bytes(b'x' * 4096)\n"
        "flag = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else None\n"
        "while flag is not None and not flag.exists():\n"
        "    time.sleep(0.1)\n"
        "print('trained', flush=True)\n"
    )
    workdirs = tmp_path / "wd"
    nodes = [
        {
            "name": h.name,
            "host": h.addr,
            "user": "root",
            "python": sys.executable,
            "workdir": str(workdirs / "{node}"),
        }
        for h in hosts
    ]
    cluster_doc: dict[str, Any] = {
        "name": "cl",
        "master": hosts[0].name,
        "backend": "gloo",
        "code": {"source": str(project)},
        "train": {"script": "train.py"},
    }
    # training runs with the nodes' own Python (torch); the inventory with an environment is another
    plain = write_inventory(tmp_path / "plain.yaml", nodes, **cluster_doc)
    ran = bootstrap("-i", str(plain), "sync", "--only", "code", cwd=tmp_path)
    assert ran.returncode == 0, ran
    launched = bootstrap("-i", str(plain), "launch", cwd=tmp_path, timeout=300)
    assert launched.returncode == 0, launched
    # and an environment: a venv per node
    env = {"packages": ["tinya==1.0"], "find_links": [str(wheels)], "no_index": True}
    inv = write_inventory(tmp_path / "hosts.yaml", nodes, **cluster_doc, env=env)
    synced = bootstrap("-i", str(inv), "sync", "--only", "env", cwd=tmp_path, timeout=600)
    assert synced.returncode == 0, synced
    for host in hosts:  # what a user put there: never ours to remove
        (workdirs / host.name / "notes.txt").write_text("mine\n")
        (workdirs / host.name / "code" / "scratch.py").write_text("mine\n")
    before = _tree(workdirs)

    listed = bootstrap("-i", str(inv), "clean", "--dry-run", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed
    doc = json.loads(listed.stdout)
    assert _tree(workdirs) == before  # nothing changed
    for entry in doc["nodes"]:
        kinds = {item["kind"]: item for item in entry["items"]}
        assert {"env", "code", "runs"} <= set(kinds), entry
        assert kinds["runs"]["bytes"] >= 4096 and kinds["env"]["bytes"] > 0, kinds
        assert kinds["code"]["files"] >= 2 and entry["removed"] is False, kinds
    human = bootstrap("-i", str(inv), "clean", "--dry-run", cwd=tmp_path)
    assert "would be removed; nothing was changed" in human.stderr, human
    assert str(workdirs / hosts[0].name / "venv") in human.stdout, human

    unconfirmed = bootstrap("-i", str(inv), "clean", cwd=tmp_path)
    assert unconfirmed.returncode == 2 and "--yes" in unconfirmed.stderr, unconfirmed
    assert _tree(workdirs) == before

    # a run still running on a node refuses the whole clean, naming it
    flag = tmp_path / "go"
    run_id = f"busy-{os.getpid()}"
    started = bootstrap(
        "-i", str(plain), "launch", "--detach", "--run-id", run_id, "--", str(flag), cwd=tmp_path, timeout=300
    )
    assert started.returncode == 0, started
    refused = bootstrap("-i", str(inv), "clean", "--yes", cwd=tmp_path)
    assert refused.returncode == 1, refused
    assert f"run {run_id} is running there: nothing was removed" in refused.stderr, refused.stderr
    assert (workdirs / hosts[0].name / "venv").is_symlink()
    flag.write_text("")
    ended = bootstrap("-i", str(plain), "logs", "--run", run_id, "--follow", cwd=tmp_path)
    assert ended.returncode == 0 and "trained" in ended.stdout, ended

    removed = bootstrap("-i", str(inv), "clean", "--yes", "--json", cwd=tmp_path)
    assert removed.returncode == 0, removed
    assert all(n["removed"] for n in json.loads(removed.stdout)["nodes"])
    for host in hosts:
        left = _tree(workdirs / host.name)
        # what training wrote into each run's $CB_RUN_DIR stays without --outputs
        outputs = {k: v for k, v in left.items() if k.startswith("runs/")}
        assert outputs and all(
            k.endswith(
                tuple(f"/{host.name}/{kept}" for kept in ("out/ckpt.pt", "node.log", "node.log.rc", "pid"))
            )
            for k in outputs
        )
        assert any(k.endswith("/out/ckpt.pt") for k in outputs), left
        assert {k: v for k, v in left.items() if k not in outputs} == {"notes.txt": 5, "code/scratch.py": 5}
    # a kept run still says how it ended: status, and a follow that returns at once
    status = bootstrap("-i", str(plain), "--json", "status", "--run", run_id, cwd=tmp_path)
    assert status.returncode == 0, status
    assert {n["state"] for n in json.loads(status.stdout)["nodes"]} == {"exited"}, status.stdout
    followed = bootstrap("-i", str(plain), "logs", "--run", run_id, "--follow", cwd=tmp_path, timeout=60)
    assert followed.returncode == 0 and "trained" in followed.stdout, followed
    removed = bootstrap("-i", str(inv), "clean", "--yes", "--outputs", cwd=tmp_path)
    assert removed.returncode == 0, removed
    for host in hosts:
        left = _tree(workdirs / host.name)
        assert left == {"notes.txt": 5, "code/scratch.py": 5}, left
