"""The commands `launch --detach` prints next work as pasted, on the 3-node namespace cluster, for a
user whose host keys and ssh config are in files of their own (issue 15: the hints dropped
``--known-hosts`` and ``--ssh-config``, and pasting them failed on unknown host keys, exit 3)."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory
from tests.integration.test_runs import await_

Bootstrap = Callable[..., CliRun]


def _hints(stderr: str) -> dict[str, list[str]]:
    """``follow: bootstrap ...`` lines, split as a shell splits what is pasted."""
    return {m[1]: shlex.split(m[2]) for m in re.finditer(r"^\s+(follow|status|stop):\s+(.+)$", stderr, re.M)}


def test_the_commands_printed_after_a_detached_launch_work_as_pasted(
    bootstrap: Bootstrap, ctl_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    assert not (ctl_home / ".ssh" / "known_hosts").exists()  # only the user's own file knows the keys
    known = tmp_path / "lab known_hosts"  # a space: the hints must quote it
    known.write_text(cluster.known_hosts_text())
    config = tmp_path / "lab ssh_config"
    config.write_text("")
    script = tmp_path / "wait.py"
    script.write_text("import time\nprint('up', flush=True)\nwhile True:\n    time.sleep(0.2)\n")
    nodes = [  # two nodes: the hints name no node, and every command reaches them all
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts[:2]
    ]
    inv = write_inventory(
        tmp_path / "hosts.yaml",
        nodes,
        name="ns",
        master="node1",
        backend="gloo",
        train={"script": str(script)},
    )
    run_id = f"hint-{os.getpid()}-{time.monotonic_ns()}"
    reach = ("--known-hosts", str(known), "--ssh-config", str(config))
    started = bootstrap(
        "-i", str(inv), *reach, "launch", "--detach", "--run-id", run_id, cwd=tmp_path, timeout=300
    )
    assert started.returncode == 0, started
    hints = _hints(started.stderr)
    assert set(hints) == {"follow", "status", "stop"}, started.stderr
    for argv in hints.values():
        assert argv[0] == "bootstrap"
        assert argv[argv.index("--known-hosts") + 1] == str(known), argv
        assert argv[argv.index("--ssh-config") + 1] == str(config), argv
        assert argv[argv.index("--run") + 1] == run_id
    # the ranks print `up` once torch is imported: stopping before that would leave nothing to follow
    log = Path(f"/root/cluster-bootstrap/runs/{run_id}/{cluster.hosts[0].name}/node.log")

    def rank_up() -> bool:
        return log.exists() and any(line.rstrip().endswith(b"up") for line in log.read_bytes().splitlines())

    await_(rank_up, 120, "node1's rank up")
    try:
        status = bootstrap(*hints["status"][1:], "--json", cwd=tmp_path)
        assert status.returncode == 0, status
        assert {n["state"] for n in json.loads(status.stdout)["nodes"]} == {"running"}
        _follow_then_ctrl_c(cluster, ctl_home, hints["follow"], tmp_path)
        status = bootstrap(*hints["status"][1:], "--json", cwd=tmp_path)  # it did go on
        assert {n["state"] for n in json.loads(status.stdout)["nodes"]} == {"running"}, status
        # check's fix hints carry the same options: the nodes share /root/cluster-bootstrap here
        check = bootstrap("-i", str(inv), *reach, "check", cwd=tmp_path, timeout=120)
        (line,) = [x for x in check.stderr.splitlines() if x.startswith("node1 ") and " workdir: " in x]
        suggested = re.search(r"`(bootstrap [^`]*sync --from-master)`", line)
        assert suggested is not None, check.stderr
        argv = shlex.split(suggested[1])
        assert argv[argv.index("-i") + 1] == str(inv) and argv[argv.index("--known-hosts") + 1] == str(known)
        assert argv[argv.index("--ssh-config") + 1] == str(config), argv
    finally:
        stop = bootstrap(*hints["stop"][1:], cwd=tmp_path, timeout=120)
    assert stop.returncode == 0, stop
    assert "stopped" in stop.stdout
    # and the follow hint reads the (now ended) run's logs
    follow = bootstrap(*hints["follow"][1:], cwd=tmp_path, timeout=120)
    assert "[node1] up" in follow.stdout or "[node1:0] up" in follow.stdout, follow


def _follow_then_ctrl_c(cluster: NamespaceCluster, home: Path, follow: list[str], cwd: Path) -> None:
    """`logs -f` (the printed hint), Ctrl-C once a line arrived: it says only that the run goes on."""
    import signal
    import subprocess

    from tests.conftest import BOOTSTRAP

    env = {"HOME": str(home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = cluster.controller_argv([BOOTSTRAP, *follow[1:]], env=env)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and not line.rstrip().endswith(" up"):  # following: a rank's line arrived
            line = proc.stdout.readline()
        assert line, "logs -f ended before a rank's line"
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted: the run goes on; stop it with: bootstrap " in err and " stop --run " in err, err
    assert "were stopped" not in err, err
