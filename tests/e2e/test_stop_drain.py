"""`stop --run` from another terminal, during a foreground launch and a `logs --follow` (issue 17 items 2, 6).

Before: the follow ended without the last 0-9 lines per rank and without torchrun's shutdown output
(a later `logs` showed them), `status` did not always say stopped, and the foreground launch exited 1
blaming a node ("exit 143 ... failed first"). Now the follow delivers every byte the node's log holds
once the run has ended, `status` says stopped everywhere, and the launch reports the operator's stop.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.conftest import BOOTSTRAP, write_inventory
from tests.integration.test_runs import await_, namespace_run_pids

# prints numbered lines until stopped; on TERM says goodbye in several lines, then exits
PRINTER = """\
import os, signal, sys, time
rank = int(os.environ["RANK"])
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
i = 0
while not stop:
    print("SEQ %d %d" % (rank, i))
    i += 1
    time.sleep(0.001)
for k in range(5):
    print("BYE %d %d after %d lines" % (rank, k, i))
sys.exit(0)
"""


def _seqs(text: str, rank_re: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        match = re.match(rank_re, line)
        if match is not None:
            out.setdefault(int(match.group(1)), []).append(line[match.end() :])
    return out


class Spawned:
    """A CLI process whose stdout and stderr are collected line by line while it runs."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
        self.out: list[str] = []
        self.err: list[str] = []
        #: when each line of stderr arrived (time.monotonic()), beside self.err
        self.err_times: list[float] = []
        self.readers = [
            threading.Thread(target=self._read, args=(stream, sink), daemon=True)
            for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self.readers:
            reader.start()

    def _read(self, stream, sink: list[str]) -> None:
        for line in iter(stream.readline, ""):
            if sink is self.err:
                self.err_times.append(time.monotonic())
            sink.append(line)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        for reader in self.readers:  # everything it printed, read to the end
            reader.join(timeout)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_stop_during_follow_delivers_every_line_and_is_reported_as_a_stop(
    cluster: NamespaceCluster, trusted_home: Path, tmp_path: Path
) -> None:
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable, "nproc": 2}
        for h in cluster.hosts
    ]
    inv = write_inventory(
        tmp_path / "h.yaml", nodes, name="ns", master="node1", backend="gloo", train={"script": str(script)}
    )
    run_id = f"drain-{os.getpid()}-{time.monotonic_ns()}"
    env = {"HOME": str(trusted_home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def argv(*args: str) -> list[str]:
        return cluster.controller_argv([BOOTSTRAP, "-i", str(inv), *args], env=env)

    launch = Spawned(argv("launch", "--run-id", run_id), tmp_path)
    follow = None
    try:
        await_(
            lambda: launch.proc.poll() is not None or sum("SEQ" in x for x in launch.out) > 300,
            180,
            "training lines from the foreground launch",
        )
        assert launch.proc.poll() is None, "".join(launch.out + launch.err)
        follow = Spawned(argv("logs", "--run", run_id, "--follow"), tmp_path)
        await_(lambda: sum("SEQ" in x for x in follow.out) > 300, 120, "lines through logs --follow")  # type: ignore[union-attr]
        stop = subprocess.run(argv("stop", "--run", run_id), capture_output=True, text=True, cwd=tmp_path)
        assert stop.returncode == 0, stop
        # stopped, as the launch says it: 130 (docs/cli.md), and "training was stopped" per node
        assert follow.wait(timeout=120) == 130, "".join(follow.err)
        assert all(f"{h.name}: training was stopped" in "".join(follow.err) for h in cluster.hosts)
        assert launch.wait(timeout=120) == 130, "".join(launch.err)
    finally:
        launch.kill()
        if follow is not None:
            follow.kill()
    followed = "".join(follow.out)
    # every rank's numbered lines, then its goodbye, all of them: what the node's log holds, exactly
    for host in cluster.hosts:
        node_log = Path(f"/root/cluster-bootstrap/runs/{run_id}/{host.name}/node.log").read_text()
        on_node = _seqs(node_log, r"\[default(\d+)\]:")
        assert sorted(on_node) == [0, 1], host.name
        shown = _seqs(followed, rf"\[{host.name}:(\d+)\] ")
        first = min(shown)
        for local, lines in on_node.items():
            assert shown[first + local] == lines, f"{host.name} rank {local}: follow and node log differ"
            assert [x.split()[0] for x in lines[-5:]] == ["BYE"] * 5, f"{host.name}:{local} {lines[-6:]}"
            seq = [int(x.split()[2]) for x in lines if x.startswith("SEQ")]
            assert seq == list(range(len(seq))), f"{host.name}:{local}: lines lost or repeated"
        assert not namespace_run_pids(cluster, host, run_id), host.name
    stderr = "".join(launch.err)
    for host in cluster.hosts:
        assert re.search(rf"{host.name}\W+stopped by stop --run", stderr), stderr
    assert "failed first" not in stderr and "exit 143" not in stderr, stderr
    status = subprocess.run(argv("status", "--run", run_id, "--json"), capture_output=True, text=True)
    assert status.returncode == 0, status
    states = {n["name"]: n["state"] for n in json.loads(status.stdout)["nodes"]}
    assert states == {h.name: "stopped" for h in cluster.hosts}, states
