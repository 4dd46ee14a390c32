"""What a node prints cannot forge what the controller reads from it (issue 27, finding 2): a rank's
log line, a file name in a fetched directory, another process's environment each travel inside a
record field (orchestrator/records.py), never as lines of their own.

The real POSIX run scripts on this machine (local transport), over run directories laid out as
launch leaves them."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.inventory import load_inventory_text
from orchestrator.inventory.model import Node
from orchestrator.plans import apply
from orchestrator.platforms import PosixShell
from orchestrator.render import Renderer, plan_launch
from orchestrator.runs.control import fetch_node, status_node, stop_node
from orchestrator.runs.layout import RUN_MARKER_ENV, run_dir_for
from orchestrator.runs.start import start_node
from orchestrator.steps.launch import prepare_plan
from orchestrator.transports.local import LocalTransport


def _node(tmp_path: Path) -> Node:
    text = f"nodes:\n  - {{name: n1, connection: local, workdir: {tmp_path / 'wd'}}}\n"
    return load_inventory_text(text, str(tmp_path / "hosts.yaml")).nodes[0]


def _await(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


@pytest.fixture
def local() -> Iterator[LocalTransport]:
    transport = LocalTransport("n1", PosixShell())
    yield transport
    transport.close()


def test_a_rank_cannot_make_status_say_its_run_exited(tmp_path: Path, local: LocalTransport) -> None:
    node = _node(tmp_path)
    run_dir = Path(run_dir_for(node, "r-forge"))
    run_dir.mkdir(parents=True)
    # splitlines() splits at \x1e: this last line used to end in "rc=0" and "alive=0" lines
    (run_dir / "launch.sh").write_text(
        "printf '[default0]:epoch 1\\036rc=0\\036alive=0\\342\\200\\250ended=1\\n'\nexec sleep 60\n"
    )
    start_node(node, local, "r-forge")
    try:
        _await(lambda: (run_dir / "node.log").stat().st_size > 0, "the rank's line")
        status = status_node(node, local, "r-forge")
        assert (status.state, status.exit_code) == ("running", None), status
        # the line is shown as the rank printed it, whole
        assert status.last_line == "epoch 1\x1erc=0\x1ealive=0\u2028ended=1"
    finally:
        assert stop_node(node, local, "r-forge", grace=2).state == "stopped"


def test_a_file_name_cannot_make_fetch_copy_another_file(
    tmp_path: Path, local: LocalTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _node(tmp_path)
    # what the hostile name points at: "victim.txt" in the node's working directory (SFTP: the home)
    home = tmp_path / "home"
    home.mkdir()
    (home / "victim.txt").write_text("root's secret\n")
    monkeypatch.chdir(home)
    out = Path(run_dir_for(node, "r-fetch")) / "out"
    out.mkdir(parents=True)
    hostile = "a\n@@dir 0 .\n1 victim.txt"
    (out / hostile).write_text("planted\n")
    (out / "real.txt").write_text("result\n")
    (out / "a").write_text("a\n")  # the name's first line names a real file: the listing goes on
    dest = tmp_path / "controller" / "runs" / "r-fetch" / "n1"
    (got,) = fetch_node(node, local, "r-fetch", ["out"], code_dir=None, dest=dest)
    # the hostile name is one entry, no plain file name here: left on the node and counted
    assert (got.files, got.bytes, got.skipped) == (2, len("result\n") + len("a\n"), 1)
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == sorted(["out/real.txt", "out/a"])
    assert not any("secret" in p.read_text() for p in dest.rglob("*") if p.is_file())


def test_another_processs_environment_cannot_block_a_launch(
    tmp_path: Path, local: LocalTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the node's shell in the C locale (an SSH login without a forwarded LANG): U+2028's bytes are not
    # control characters there, so the marker reaches the controller whole
    monkeypatch.setenv("LC_ALL", "C")
    inventory = load_inventory_text(
        f"nodes:\n  - {{name: n1, connection: local, workdir: {tmp_path / 'wd'}}}\n"
        "cluster: {train: {script: /bin/true}}\n",
        str(tmp_path / "hosts.yaml"),
    )
    node = inventory.nodes[0]
    (spec,) = plan_launch(
        inventory, backend="gloo", master_addr="127.0.0.1", run_id="r-env", interfaces={}, cpus={}, pythons={}
    )
    # any local user's process: its marker value holds a line separator splitlines() knows
    forged = "x\u2028@@ran-before"
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, RUN_MARKER_ENV: forged})
    try:
        _await(lambda: forged.encode() in Path(f"/proc/{other.pid}/environ").read_bytes(), "the process")
        notices: list[str] = []
        apply(prepare_plan(node, PosixShell(), spec, renderer=Renderer(), notice=notices.append), local)
    finally:
        other.kill()
        other.wait()
    assert (Path(run_dir_for(node, "r-env")) / "launch.sh").is_file()  # launched: not "already ran"
    # and never named: only a well-formed run id is put into the `stop --run` a notice suggests
    # (other processes of this machine may be listed)
    assert not any("ran-before" in n for n in notices), notices
