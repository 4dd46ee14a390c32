"""The main pipeline is one session (issue 13): a full `bootstrap -i hosts.yaml` with code sync, the
firewall and time sync managed, the preflight, validation and training logs in to each node exactly
once, as each node's own sshd records it."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from tests.cluster import NamespaceCluster
from tests.conftest import CliRun, write_inventory

Bootstrap = Callable[..., CliRun]


def _logins(cluster: NamespaceCluster) -> dict[str, int]:
    counts = {}
    for host in cluster.hosts:
        assert host.sshd_log is not None
        text = host.sshd_log.read_text(errors="replace") if host.sshd_log.exists() else ""
        counts[host.name] = text.count("Accepted publickey")
    return counts


#: the training: each rank says who it is (the logins are the subject here, not torch's training)
RANK_SCRIPT = "import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)\n"


def _inventory(
    cluster: NamespaceCluster, tmp_path: Path, name: str, python: str = sys.executable, **extra: object
) -> Path:
    """Every host as root with this Python (or ``python``), code synced from a one-file project into
    a directory of this test's own (the default one, under the workdir this pytest process shares
    with its earlier tests, may hold a training script an earlier launch put there, which the sync
    refuses to delete), firewall and time managed (the defaults)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("synced by the pipeline\n")
    (project / "rank.py").write_text(RANK_SCRIPT)
    nodes: list[dict[str, object]] = [
        {"name": h.name, "host": h.addr, "user": "root", "python": python} for h in cluster.hosts
    ]
    return write_inventory(
        tmp_path / "hosts.yaml",
        nodes,
        name=name,
        master="node1",
        backend="gloo",
        code={"source": str(project), "dest": str(tmp_path / "code")},
        **extra,
    )


def test_the_whole_pipeline_logs_in_to_each_node_once(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    inventory = _inventory(cluster, tmp_path, "one", train={"script": "rank.py"})  # synced with the code
    before = _logins(cluster)
    run = bootstrap("-i", str(inventory), "--json", cwd=tmp_path, timeout=400)
    after = _logins(cluster)
    assert run.returncode == 0, run
    doc = json.loads(run.stdout)
    # every phase ran, on one session
    assert {name: doc["phases"][name].get("exit_code") for name in doc["phases"]} == {
        "sync": 0,
        "firewall": 0,
        "ntp": 0,
        "check": 0,
        "validate": 0,
        "launch": 0,
    }, doc["phases"]
    ranks = sorted(
        line
        for node in (tmp_path / "runs").glob("one-*/node*.log")
        for line in node.read_text().splitlines()
        if " of 3" in line
    )
    assert [line.rsplit(":", 1)[-1] for line in ranks] == ["rank 0 of 3", "rank 1 of 3", "rank 2 of 3"], ranks
    assert {name: after[name] - before[name] for name in after} == {h.name: 1 for h in cluster.hosts}, (
        before,
        after,
    )


def test_with_nothing_to_change_the_setup_phases_read_in_the_first_round_trip(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """A second `bootstrap --until check` finds everything in place. The code scan, the firewall
    detection and the chrony probe travelled in the pipeline's first round trip with the root check
    (steps/setup_read.py) with a clock sample, and chronyd already followed the master: the sync,
    firewall and time steps send no command of their own, and nothing at all runs as root after that
    first command. The preflight's facts came in that first command too, once, and it went on as
    the preflight's round trip (its workdir marker and reachability listener): each node's torch
    probe ran once per pipeline, in the command that scanned its code (the nodes' Python here is a
    wrapper that notes the torch probe and the code scan with the session id of the command that ran
    them: one SSH command, one session)."""
    probes = tmp_path / "probes.log"
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        'sid=$(cut -d" " -f6 /proc/$$/stat)\n'
        'case "$*" in\n'
        f'  *"describing its torch install"*) echo "$(uname -n) torch $sid" >> {probes} ;;\n'
        f'  *\'"op": "scan"\'*) echo "$(uname -n) scan $sid" >> {probes} ;;\n'
        "esac\n"
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    inventory = _inventory(cluster, tmp_path, "again", python=str(wrapper))
    first = bootstrap("-i", str(inventory), "--until", "check", cwd=tmp_path, timeout=400)
    assert first.returncode == 0, first
    probes.write_text("")
    again = bootstrap("-v", "-i", str(inventory), "--until", "check", cwd=tmp_path, timeout=400)
    assert again.returncode == 0, again
    noted: dict[str, list[tuple[str, str]]] = {h.name: [] for h in cluster.hosts}
    for line in probes.read_text().splitlines():
        node, kind, sid = line.split()
        noted[node].append((kind, sid))
    for name, seen in noted.items():
        assert sorted(kind for kind, _ in seen) == ["scan", "torch"], (name, seen)
        assert len({sid for _, sid in seen}) == 1, (name, seen)  # one command read both
    sent: dict[str, list[str]] = {h.name: [] for h in cluster.hosts}
    for line in again.stderr.splitlines():  # -v logs every command: "INFO ...: node2: run <its first line>"
        found = re.search(r"orchestrator\.transports: (node\d+): run (.*)$", line)
        if found:
            sent[found[1]].append(found[2])
    for name, commands in sent.items():
        # the first round trip (which goes on as the check's: its marker and reachability listener,
        # steps/preflight/early.py) and the line that has that listener connect to its peers (into
        # its inbox, no interpreter of its own): nothing else
        assert len(commands) == 2 and commands[1].startswith("echo connect "), (name, commands)
        assert not [c for c in commands if c.endswith("(as root)")], (name, commands)
    assert re.search(r"│ node1 +│ unchanged \(2 files\)", again.stdout), again.stdout  # the code table
    for host in cluster.hosts:  # the time table: every node unchanged, following its source
        row = next(
            line
            for line in again.stdout.splitlines()
            if line.startswith(f"│ {host.name} ") and "chrony" in line
        )
        assert "unchanged" in row and ("local clock" in row or cluster.hosts[0].addr in row), row


#: the pids of the reachability listeners running in the calling host's network namespace (the
#: bracket keeps pgrep from matching this script's own command line)
LISTENERS = (
    'me=$(readlink /proc/self/ns/net); for p in $(pgrep -f "cbt-reac[h] listen"); do'
    ' [ "$(readlink /proc/$p/ns/net 2>/dev/null)" = "$me" ] && echo "$p"; done; true'
)


def test_a_pipeline_that_stops_before_the_check_leaves_no_listener_behind(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """The first command starts each node's reachability listener for the preflight
    (steps/preflight/early.py). A pipeline that stops before the preflight (here: the code cannot be
    synced, its destination lies under a file) ends them: nothing of the preflight keeps running on
    any node."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    inventory = _inventory(cluster, tmp_path, "stops")
    doc = json.loads(inventory.read_text())
    doc["cluster"]["code"]["dest"] = str(blocker / "code")
    inventory.write_text(json.dumps(doc))
    run = bootstrap("-i", str(inventory), cwd=tmp_path, timeout=400)
    assert run.returncode != 0, run
    assert "not going on: sync failed" in run.stderr, run.stderr
    for host in cluster.hosts:
        left = cluster.host_run(host, ["sh", "-c", LISTENERS], capture_output=True, text=True)
        assert left.stdout.strip() == "", (host.name, left.stdout)
