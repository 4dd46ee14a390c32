"""Where `bootstrap validate` puts its worker and where the rank scripts look for it.

The worker must land in the node's run directory and be run from there, with the default ``~`` workdir
as with an absolute one. POSIX: the real rank script runs on this machine (local transport, ``$HOME``
pointed into the test directory) with a stand-in interpreter that reports which file it was given.
Native Windows: no PowerShell runs here, so the uploads are recorded and the rendered launch.ps1 is
parsed (tree-sitter): its ``Set-Location`` directory joined with Python's first argument (split by
the C runtime rules python.exe uses) must be the file uploaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ntpath
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.inventory import load_inventory_text
from orchestrator.platforms import PosixShell, PowerShell, platform_for_node
from orchestrator.render import LaunchSpec, Renderer, plan_launch
from orchestrator.resources import package_file
from orchestrator.steps.launch import prepare_windows_node, run_dir_for, run_node
from orchestrator.steps.validate import TEMPLATE, WORKER, validation_specs
from orchestrator.transports import LocalTransport
from orchestrator.transports.base import OnLine, Result, Transport
from tests import pwsh
from tests.winrm_server import cmdline

RUN_ID = "validate-lab-20261202"
WORKER_FILE = package_file("steps/probes/" + WORKER)


def _specs(node: str, *, workdir: str | None, windows: bool = False) -> list[LaunchSpec]:
    lines = [f"  - name: {node}", "    host: 127.0.0.1", "    nproc: 2"]
    if workdir is not None:
        lines.append(f"    workdir: '{workdir}'")
    if windows:
        lines += [
            "    os: windows",
            "    user: bob",
            "    windows: {mode: native}",
            "    interface: Ethernet",
        ]
    text = (
        "cluster:\n  name: lab\n  master: " + node + "\n  backend: gloo\n"
        "  train: {script: examples/train_ddp.py}\nnodes:\n" + "\n".join(lines) + "\n"
    )
    inventory = load_inventory_text(text, "lab.yaml")
    specs = plan_launch(
        inventory,
        backend="gloo",
        master_addr="127.0.0.1",
        run_id=RUN_ID,
        interfaces={node: ("Ethernet" if windows else "lo", "127.0.0.1")},
        cpus={node: 4},
        pythons={node: "C:\\Python312\\python.exe" if windows else "python3"},
    )
    return validation_specs(specs, 5.0, (4096,))


def test_dry_run_and_validate_use_the_same_specs() -> None:
    from orchestrator.cli import validate as cli_validate

    specs = _specs("n1", workdir=None)
    assert cli_validate.validation_specs(specs, 5.0, (4096,)) == validation_specs(specs, 5.0, (4096,))


# -- Linux (and WSL: the same script and the same upload, inside the distribution) ------------------


@pytest.mark.parametrize("workdir", [None, "~/cb work", "ABS"], ids=["default-home", "home", "absolute"])
def test_posix_ranks_run_the_worker_uploaded_into_the_run_directory(
    workdir: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # `~` on the "node" (this machine)
    if workdir == "ABS":
        workdir = str(tmp_path / "abs dir")
    (spec,) = _specs("n1", workdir=workdir)
    # the interpreter the rank script starts: prints its rank, the file it was handed (resolved), its digest
    fake = tmp_path / "python"
    fake.write_text(
        f"#!{sys.executable}\nimport hashlib, os, sys\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "print('ran', os.environ['RANK'], os.path.realpath(sys.argv[1]), hashlib.sha256(data).hexdigest())\n"
    )
    fake.chmod(0o755)
    spec = dataclasses.replace(spec, python=str(fake))
    lines: list[str] = []
    run_node(
        spec.node,
        LocalTransport("n1", PosixShell()),
        spec,
        renderer=Renderer(),
        on_line=lambda node, line: lines.append(line),
        template=TEMPLATE,
        script_file=WORKER_FILE,
    )
    run_dir = Path(os.path.expanduser(run_dir_for(spec.node, RUN_ID)))
    uploaded = run_dir / WORKER
    assert uploaded.read_bytes() == WORKER_FILE.read_bytes()  # the worker sits in the run directory
    digest = hashlib.sha256(WORKER_FILE.read_bytes()).hexdigest()
    ran = sorted(line for line in lines if line.startswith("ran "))
    assert ran == [f"ran {rank} {os.path.realpath(uploaded)} {digest}" for rank in (0, 1)]
    # nothing uploaded under a literal "~" directory
    assert not [p for p in tmp_path.rglob("*") if p.name == "~"]


# -- native Windows ------------------------------------------------------------------------------------


class _Recorder(Transport):
    """Answers every command with success; keeps what would be uploaded (remote path -> bytes)."""

    kind = "winrm"

    def __init__(self, platform: PowerShell) -> None:
        super().__init__("win", platform)
        self.uploads: dict[str, bytes] = {}

    def connect(self) -> None:
        pass

    def run_raw(
        self,
        script: str,
        *,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
    ) -> Result:
        return Result("win", script, 0, "", "", 0.0)

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        self.uploads[remote] = local.read_bytes()

    def get(self, remote: str, local: Path) -> None:
        raise AssertionError("validate downloads nothing")

    def close(self) -> None:
        pass


def _unquote(literal: str) -> str:
    assert literal[0] == "'" and literal[-1] == "'", literal
    return re.sub(r"(['\u2018\u2019\u201a\u201b])\1", r"\1", literal[1:-1])


def _directory(word: str) -> str:
    """A path word as PowerShell evaluates it (``$HOME`` kept as ``~``)."""
    if word == "$HOME":
        return "~"
    match = re.fullmatch(r"\(\$HOME \+ ('.*')\)", word)
    return "~" + _unquote(match.group(1)) if match else _unquote(word)


def _assignments(tree: Any) -> dict[str, str]:
    found = {}
    for node in pwsh.walk(tree.root_node):
        if node.type == "assignment_expression":
            found[(node.children[0].text or b"").decode()] = (node.children[-1].text or b"").decode()
    return found


@pytest.mark.parametrize("workdir", [None, "~/cb work", "D:\\train", "D:/train"])
def test_windows_ranks_run_the_worker_uploaded_into_the_run_directory(workdir: str | None) -> None:
    (spec,) = _specs("win", workdir=workdir, windows=True)
    platform = platform_for_node(spec.node)
    assert isinstance(platform, PowerShell)
    transport = _Recorder(platform)
    prepare_windows_node(spec.node, transport, platform, spec, renderer=Renderer(), script_file=WORKER_FILE)
    run_dir = run_dir_for(spec.node, RUN_ID)
    (worker_at,) = [path for path, data in transport.uploads.items() if data == WORKER_FILE.read_bytes()]
    assert worker_at == f"{run_dir}/{WORKER}"  # into the run directory itself
    launch = transport.uploads[f"{run_dir}/launch.ps1"].decode("utf-8-sig")
    tree = pwsh.assert_parses(launch)
    (cd,) = [c for c in pwsh.commands(tree) if c.name == "Set-Location"]
    directory = _directory(cd.arguments[0])
    # ProcessStartInfo.WorkingDirectory is that location; python.exe opens argv[1] relative to it
    argv = cmdline.split("python.exe " + _unquote(_assignments(tree)["$cbArguments"]))
    assert argv[1:] == [WORKER, "--backend", "gloo", "--timeout", "5", "--sizes", "4096"]
    opened = ntpath.join(directory, argv[1])
    assert ntpath.normpath(opened) == ntpath.normpath(worker_at.replace("/", "\\"))
    # the transfer lands where python looks: both name the same file in the profile or on the drive
    assert platform.transfer_path(opened) == platform.transfer_path(worker_at)
