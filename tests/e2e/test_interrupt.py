"""Ctrl-C during a foreground `bootstrap launch`: every process of the run, on every node, is gone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import NamespaceCluster
from tests.conftest import BOOTSTRAP, free_port, write_inventory
from tests.integration.test_runs import MARKER_ENV, await_, namespace_run_pids

# A worker with a child of its own (the whole tree must go, not just the launcher) that ignores
# SIGTERM, as one busy saving a checkpoint would for a while. torchrun starts its workers in
# sessions of their own: stopping the launcher's process group alone leaves this one training.
STUBBORN = (
    "import signal, subprocess, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: print('TERM ignored', flush=True))\n"
    "child = subprocess.Popen(['sleep', '600'])\n"
    "print('training started', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.2)\n"
)


def _sigint(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGINT)
    return 130


def _interrupt(
    argv: list[str],
    cwd: Path,
    names: list[str],
    has_run: Callable[[str], int],
    stop: Callable[[subprocess.Popen[str]], int] = _sigint,
) -> str:
    """Start `bootstrap launch`, wait for every node's first training line, stop it as ``stop`` does
    (default: SIGINT), which returns the exit code the launch must end with; returns stderr."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    out: list[str] = []
    err: list[str] = []
    readers = [
        threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")), daemon=True),  # type: ignore[union-attr]
        threading.Thread(target=lambda: err.extend(iter(proc.stderr.readline, "")), daemon=True),  # type: ignore[union-attr]
    ]
    for reader in readers:
        reader.start()
    try:

        def started() -> bool:
            return all(any(f"[{n}:" in x and "training started" in x for x in out) for n in names)

        try:
            await_(lambda: started() or proc.poll() is not None, 180, "every node's first training line")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- stdout\n{''.join(out)}--- stderr\n{''.join(err)}") from None
        assert proc.poll() is None, f"launch ended early ({proc.returncode}): {''.join(out)}{''.join(err)}"
        for name in names:  # the run really has processes on every node (so the check after can fail)
            assert has_run(name) >= 3, name
        code = stop(proc)
        assert proc.wait(timeout=60) == code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for reader in readers:
        reader.join(5)
    stderr = "".join(err)
    assert stop is not _sigint or "interrupted" in stderr
    assert stop is not _sigint or re.search(r"^logs: runs/\S+/ \(and ", stderr, re.M), (
        stderr
    )  # kept, and where
    return stderr


def test_sigint_stops_every_process_of_the_run_on_every_node(
    cluster: NamespaceCluster, trusted_home: Path, tmp_path: Path
) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    used = cluster.hosts[:2]  # the master and a worker
    nodes = [{"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in used]
    inv = write_inventory(
        tmp_path / "h.yaml", nodes, name="ns", master="node1", backend="gloo", train={"script": str(script)}
    )
    run_id = f"int-{os.getpid()}-{time.monotonic_ns()}"
    env = {"HOME": str(trusted_home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = cluster.controller_argv([BOOTSTRAP, "-i", str(inv), "launch", "--run-id", run_id], env=env)
    hosts = {h.name: h for h in used}
    stderr = _interrupt(
        argv, tmp_path, list(hosts), lambda n: len(namespace_run_pids(cluster, hosts[n], run_id))
    )
    # bootstrap returned only after making sure: nothing of the run is left, at once
    assert not any(namespace_run_pids(cluster, h, run_id) for h in used), stderr
    # and status tells it as the interrupted launch did: stopped, not "exited (1)" (the watcher's
    # stop ended torchrun before the sweep could mark it)
    argv = cluster.controller_argv([BOOTSTRAP, "-i", str(inv), "--json", "status", "--run", run_id], env=env)
    status = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert [n["state"] for n in json.loads(status.stdout)["nodes"]] == ["stopped", "stopped"], status


def _local_run_pids(run_id: str) -> set[int]:
    """Live processes on this machine carrying the run's marker (a local node's run)."""
    prefix = MARKER_ENV + b"=" + run_id.encode() + b"/"
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        if state != b"Z" and any(e.startswith(prefix) for e in env):
            found.add(int(entry.name))
    return found


def _sigterm_twice(proc: subprocess.Popen[str]) -> int:
    """GNU `timeout` sends its signal to the child and again to its group; a user presses Ctrl-C
    twice: the second signal cuts the sweep short."""
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # the second signal while the first one's stop is under way (not a wait for a state)
    proc.send_signal(signal.SIGTERM)
    return 143


def _sigkill(proc: subprocess.Popen[str]) -> int:
    proc.kill()
    return -signal.SIGKILL


@pytest.mark.parametrize(
    "stop", [_sigint, _sigterm_twice, _sigkill], ids=["sigint", "sigterm-twice", "sigkill"]
)
def test_a_stopped_controller_leaves_nothing_of_a_run_on_a_local_node(tmp_path: Path, stop: Any) -> None:
    """`connection: local` (README command 1's inventory): its commands run under the watcher the
    nodes' commands run under, on a pipe from the controller. However the controller ends (Ctrl-C, a
    second signal cutting its sweep short, killed outright) every process of the run goes: the
    workers (in sessions of their own) and the one that ignores SIGTERM, within the watcher's 5 s."""
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    inv = write_inventory(
        tmp_path / "local.yaml",
        [{"name": "here", "connection": "local", "python": sys.executable, "nproc": 2}],
        name="loc",
        master="here",
        backend="gloo",
        port=free_port(),  # this machine's own network: test_cli_local.py trains on 29500 meanwhile
        train={"script": str(script)},
    )
    run_id = f"intl-{os.getpid()}-{time.monotonic_ns()}"
    argv = [BOOTSTRAP, "-i", str(inv), "launch", "--run-id", run_id]
    try:
        stderr = _interrupt(argv, tmp_path, ["here"], lambda _n: len(_local_run_pids(run_id)), stop)
        await_(lambda: not _local_run_pids(run_id), 20, f"the run's processes to end; stderr:\n{stderr}")
    finally:
        for pid in _local_run_pids(run_id):  # never leave a stubborn worker on this machine
            os.kill(pid, signal.SIGKILL)
