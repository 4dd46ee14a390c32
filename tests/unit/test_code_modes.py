"""Code sync keeps files as private on the nodes as they are here: the mode policy (pure logic), the
manifest built from a real tree, and the node script applying modes (run locally with this Python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.steps.codesync import build_tree
from orchestrator.steps.codesync.manifest import node_mode
from orchestrator.steps.codesync.sync import probe_script

PROBE = probe_script()  # as a node runs it


@pytest.mark.parametrize(
    ("here", "there"),
    [
        (0o600, 0o600),  # a .env: nobody else reads it there either
        (0o640, 0o640),
        (0o644, 0o644),
        (0o755, 0o755),
        (0o750, 0o750),
        (0o700, 0o700),
        (0o744, 0o744),  # run bits: only who may run it here
        (0o664, 0o644),  # group write is never given on a node
        (0o777, 0o755),
        (0o400, 0o600),  # the owner always reads and writes (sync replaces the file)
        (0o500, 0o700),
        (0o4755, 0o755),  # set-id bits never travel
    ],
)
def test_node_mode_never_widens_group_or_other_bits(here: int, there: int) -> None:
    assert node_mode(0o100000 | here) == there


def test_a_file_in_a_private_directory_is_private_on_the_node(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "secrets" / "deep").mkdir(parents=True)
    (src / "shared").mkdir()
    (src / "secrets" / "key.pem").write_text("k")
    (src / "secrets" / "deep" / "run.sh").write_text("#!/bin/sh\n")
    (src / "shared" / "notes.txt").write_text("n")
    (src / ".env").write_text("TOKEN=x\n")
    os.chmod(src / "secrets" / "key.pem", 0o644)
    os.chmod(src / "secrets" / "deep" / "run.sh", 0o755)
    os.chmod(src / "shared" / "notes.txt", 0o644)
    os.chmod(src / ".env", 0o600)
    os.chmod(src / "secrets", 0o700)  # nobody else can enter it here
    os.chmod(src / "shared", 0o741)  # others may pass, the group may not (no x)
    os.chmod(src, 0o700)  # the project directory itself does not count: a home is often 0700
    modes = {rel: e.mode for rel, e in build_tree(src, gitignore=False).files.items()}
    assert modes == {
        ".env": 0o600,
        "secrets/key.pem": 0o600,
        "secrets/deep/run.sh": 0o700,
        "shared/notes.txt": 0o604,
    }


def _probe(args: dict[str, Any], home: Path, umask: int = 0o022) -> dict[str, Any]:
    env = {**os.environ, "HOME": str(home)}
    run_with_umask = f"import os; os.umask({umask}); exec(compile(open(0).read(), 'p', 'exec'))"
    proc = subprocess.run(
        [sys.executable, "-c", run_with_umask, json.dumps(args)],
        input=PROBE,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_the_node_script_applies_and_reports_exact_modes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    dest = home / "code"
    dest.mkdir(parents=True)
    files = [
        (".env", b"TOKEN=x\n", 0o600),
        ("conf.yaml", b"a: 1\n", 0o640),
        ("run.sh", b"#!/bin/sh\n", 0o750),
    ]
    header = {"delete": [], "files": [[rel, len(data), mode, None, "0" * 64] for rel, data, mode in files]}
    (dest / ".bootstrap-code-upload-t").write_bytes(
        json.dumps(header).encode() + b"\n" + b"".join(data for _, data, _ in files)
    )
    # a permissive umask on the node must not widen anything
    out = _probe({"op": "apply", "dest": "~/code", "bundle": ".bootstrap-code-upload-t"}, home, umask=0)
    assert out["errors"] == [] and out["written"] == 3
    for rel, data, mode in files:
        assert (dest / rel).read_bytes() == data
        assert (dest / rel).stat().st_mode & 0o7777 == mode, rel
    scan = _probe({"op": "scan", "dest": "~/code", "rules": []}, home)
    assert {rel: entry[2] for rel, entry in scan["files"].items()} == {r: m for r, _, m in files}


def test_the_node_script_refuses_a_file_without_a_mode(tmp_path: Path) -> None:
    home = tmp_path / "home"
    dest = home / "code"
    dest.mkdir(parents=True)
    header = {
        "delete": [],
        "files": [["a.txt", 1, None, None, "0" * 64], ["b.txt", 1, 0o644, None, "0" * 64]],
    }
    (dest / ".bootstrap-code-upload-t").write_bytes(json.dumps(header).encode() + b"\nab")
    out = _probe({"op": "apply", "dest": "~/code", "bundle": ".bootstrap-code-upload-t"}, home)
    assert out["written"] == 1 and len(out["errors"]) == 1 and "a.txt" in out["errors"][0]
    assert not (dest / "a.txt").exists() and (dest / "b.txt").read_bytes() == b"b"
