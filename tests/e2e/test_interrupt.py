"""Ctrl-C during a foreground `bootstrap launch`: every process of the run, on every node, is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.conftest import BOOTSTRAP, write_inventory
from tests.integration.test_runs import await_, namespace_run_pids


def test_sigint_stops_every_process_of_the_run_on_every_node(
    cluster: NamespaceCluster, trusted_home: Path, tmp_path: Path
) -> None:
    script = tmp_path / "spin.py"
    # a worker with a child of its own: the whole tree must go, not just the launcher
    script.write_text(
        "import subprocess, time\n"
        "child = subprocess.Popen(['sleep', '600'])\n"
        "print('training started', flush=True)\n"
        "while True:\n"
        "    time.sleep(0.2)\n"
    )
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts
    ]
    inv = write_inventory(
        tmp_path / "h.yaml", nodes, name="ns", master="node1", backend="gloo", train={"script": str(script)}
    )
    run_id = f"int-{os.getpid()}-{time.monotonic_ns()}"
    env = {"HOME": str(trusted_home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = cluster.controller_argv([BOOTSTRAP, "-i", str(inv), "launch", "--run-id", run_id], env=env)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
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
            return all(
                any(f"[{h.name}:" in x and "training started" in x for x in out) for h in cluster.hosts
            )

        try:
            await_(lambda: started() or proc.poll() is not None, 180, "every node's first training line")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- stdout\n{''.join(out)}--- stderr\n{''.join(err)}") from None
        assert proc.poll() is None, f"launch ended early ({proc.returncode}): {''.join(out)}{''.join(err)}"
        for host in cluster.hosts:  # the run really has processes on every node (so the check below can fail)
            assert len(namespace_run_pids(cluster, host, run_id)) >= 3, host.name
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for reader in readers:
        reader.join(5)
    assert "interrupted" in "".join(err)
    await_(
        lambda: not any(namespace_run_pids(cluster, h, run_id) for h in cluster.hosts),
        10,
        "every process of the run to be gone",
    )
