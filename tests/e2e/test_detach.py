"""Detached runs through the CLI on the namespace cluster: `launch --detach`, `logs --follow` through a
cut SSH connection (every line exactly once), `status`, `stop --run`. The master and a worker where a
third node would only repeat the worker."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.runs.layout import RUN_MARKER_ENV
from tests.cluster import NamespaceCluster
from tests.conftest import BOOTSTRAP, CliRun, write_inventory
from tests.integration.test_runs import await_, cut_ssh_sessions, namespace_run_pids

Bootstrap = Callable[..., CliRun]
LINES = 200


def _inventory(cluster: NamespaceCluster, path: Path, script: Path, *, hosts: int = 3) -> Path:
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable}
        for h in cluster.hosts[:hosts]
    ]
    return write_inventory(
        path, nodes, name="ns", master="node1", backend="gloo", train={"script": str(script)}
    )


def _counter(tmp_path: Path, flag: Path) -> Path:
    """Prints `n=0`..`n=LINES-1`; the second half only once ``flag`` exists (so the connection can
    be cut while the run is known to be mid-stream)."""
    script = tmp_path / "count.py"
    script.write_text(
        "import os, time\n"
        f"for i in range({LINES}):\n"
        f"    if i == {LINES // 2}:\n"
        f"        while not os.path.exists({str(flag)!r}):\n"
        "            time.sleep(0.05)\n"
        "    print(f'n={i}', flush=True)\n"
        "    time.sleep(0.002)\n"
    )
    return script


def _status(bootstrap: Bootstrap, inv: Path, run_id: str, cwd: Path) -> dict[str, dict[str, object]]:
    run = bootstrap("-i", str(inv), "status", "--run", run_id, "--json", cwd=cwd)
    assert run.returncode == 0, run
    return {n["name"]: n for n in json.loads(run.stdout)["nodes"]}


def test_detached_run_is_followed_through_a_cut_connection(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """The master and a worker; the worker's connection is cut mid-stream."""
    flag = tmp_path / "second-half"
    hosts = cluster.hosts[:2]
    inv = _inventory(cluster, tmp_path / "h.yaml", _counter(tmp_path, flag), hosts=2)
    run_id = f"det-{os.getpid()}-{time.monotonic_ns()}"
    started = bootstrap("-i", str(inv), "launch", "--detach", "--run-id", run_id, cwd=tmp_path, timeout=300)
    assert started.returncode == 0, started
    assert started.stdout.strip() == run_id
    assert f"logs --run {run_id} --follow" in started.stderr and f"stop --run {run_id}" in started.stderr
    # the launch command has ended: the run goes on without it
    assert all(s["state"] == "running" for s in _status(bootstrap, inv, run_id, tmp_path).values())

    env = {"HOME": str(trusted_home), "NO_COLOR": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    argv = cluster.controller_argv([BOOTSTRAP, "-i", str(inv), "logs", "--run", run_id, "--follow"], env=env)
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
        half = LINES // 2 - 1

        def first_half() -> bool:
            return all(any(x.startswith(f"[{h.name}:") and f"n={half}\n" in x for x in out) for h in hosts)

        try:
            await_(lambda: first_half() or proc.poll() is not None, 120, "the first half on every node")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- stdout\n{''.join(out)}--- stderr\n{''.join(err)}") from None
        assert proc.poll() is None, f"logs ended early: {''.join(out)}{''.join(err)}"
        assert cut_ssh_sessions(cluster, cluster.host("node2")) >= 1  # mid-stream: the run is still printing
        flag.touch()
        assert proc.wait(timeout=180) == 0, "".join(err)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for reader in readers:
        reader.join(5)
    assert "node2: connection lost" in "".join(err) and "reconnected" in "".join(err), "".join(err)
    expected = [f"n={i}" for i in range(LINES)]
    for rank, host in enumerate(hosts):
        shown = [
            m.group(1) for x in out if (m := re.match(rf"\[{host.name}:{rank}\] (n=\d+)$", x.rstrip("\n")))
        ]
        assert shown == expected, host.name
        kept = (tmp_path / "runs" / run_id / f"{host.name}.log").read_text().splitlines()
        numbered = [x.split(":", 1)[1] for x in kept if re.match(r"\[default0\]:n=\d+$", x)]
        assert numbered == expected, host.name  # every line exactly once, in order
    for host, state in _status(bootstrap, inv, run_id, tmp_path).items():
        assert (state["state"], state["exit_code"], state["last_line"]) == ("exited", 0, f"n={LINES - 1}"), (
            host
        )
    # --tail 3: each node's last three lines only (found on the node: its usage samples, records in
    # the log that are shown nowhere, are not among them); the copies here stay whole
    copies = {h.name: (tmp_path / "runs" / run_id / f"{h.name}.log").read_text() for h in hosts}
    tail = bootstrap("-i", str(inv), "logs", "--run", run_id, "--tail", "3", cwd=tmp_path)
    assert tail.returncode == 0, tail
    for rank, host in enumerate(hosts):
        last = [
            re.sub(r"^\[default0\]:", f"[{host.name}:{rank}] ", x)
            if x.startswith("[default0]:")
            else f"[{host.name}] {x}"
            for x in [x for x in copies[host.name].splitlines() if not x.startswith("@@")][-3:]
        ]
        assert len(last) == 3
        assert [x for x in tail.stdout.splitlines() if x.startswith(f"[{host.name}")] == last, tail.stdout
        # the rank's own last line; torchrun's agent may still log after it (its store, on the master,
        # gone first: "DistNetworkError: Failed to recv"), and then that is what --tail 3 shows
        ranks = [x for x in copies[host.name].splitlines() if x.startswith("[default0]:")]
        assert ranks[-1] == f"[default0]:n={LINES - 1}", copies[host.name]
        assert (tmp_path / "runs" / run_id / f"{host.name}.log").read_text() == copies[host.name]
    as_json = bootstrap("-i", str(inv), "logs", "--run", run_id, "--tail", "3", "--json", cwd=tmp_path)
    doc = json.loads(as_json.stdout)
    assert (doc["tail"], doc["log_dir"], doc["exit_code"]) == (3, None, 0), doc
    for node in doc["nodes"]:
        size = len(copies[node["name"]].encode())
        kept = copies[node["name"]].splitlines(keepends=True)
        third = [i for i, x in enumerate(kept) if not x.startswith("@@")][-3]  # samples after it: read
        last3 = len("".join(kept[third:]).encode())
        assert (node["start"], node["end"], node["bytes"], node["lines"]) == (size - last3, size, last3, 3)


def test_a_refused_run_id_never_stops_the_run_that_holds_it(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """A launch under the id of a run still going (started from another directory) is refused on
    the node that has it; stopping the other nodes afterwards (fail fast, then the sweep) must not
    stop that run, whose processes carry the same id."""
    script = tmp_path / "sleeper.py"
    script.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n")
    node1 = cluster.hosts[0]
    one = write_inventory(
        tmp_path / "one.yaml",
        [{"name": node1.name, "host": node1.addr, "user": "root", "python": sys.executable}],
        name="ns",
        master=node1.name,
        backend="gloo",
        train={"script": str(script)},
    )
    first_dir, second_dir = tmp_path / "one", tmp_path / "two"
    first_dir.mkdir()
    second_dir.mkdir()
    run_id = f"held-{os.getpid()}-{time.monotonic_ns()}"
    started = bootstrap("-i", str(one), "launch", "--detach", "--run-id", run_id, cwd=first_dir, timeout=300)
    assert started.returncode == 0, started
    try:
        # the run trains: its torchrun holds the cluster's port on node1 (the run id is what is named)
        log = Path.home() / "cluster-bootstrap" / "runs" / run_id / node1.name / "node.log"
        await_(lambda: log.exists() and "sleeping" in log.read_text(), 60, "the first run training")
        three = _inventory(cluster, tmp_path / "three.yaml", script)
        again = bootstrap("-i", str(three), "launch", "--run-id", run_id, cwd=second_dir, timeout=300)
        assert again.returncode == 1, again
        assert f"run {run_id} already ran on this node" in again.stderr
        assert "is in use on this node" not in again.stderr, again.stderr
        # the others were stopped because of it, or never started (not failed: nothing of theirs broke)
        for other in ("node2", "node3"):
            assert re.search(rf"{other}\W+(stopped|not started)\W", again.stderr), again
        # the earlier run goes on, every process of it
        assert _status(bootstrap, one, run_id, first_dir)[node1.name]["state"] == "running"
        assert len(namespace_run_pids(cluster, node1, run_id)) >= 3
    finally:
        bootstrap("-i", str(one), "stop", "--run", run_id, cwd=first_dir, timeout=120)


def test_status_says_running_while_any_process_of_the_run_lives_and_keeps_its_columns(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """Issue 17: the launcher killed while its ranks (ignoring TERM) live on made `status` say
    `stopped`; a 500-character last line collapsed every other column of the table."""
    script = tmp_path / "long.py"
    script.write_text(
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: None)\n"
        "print('x' * 500, flush=True)\n"
        "time.sleep(600)\n"
    )
    inv = _inventory(cluster, tmp_path / "h.yaml", script, hosts=1)  # what status says of one node
    run_id = f"alive-{os.getpid()}-{time.monotonic_ns()}"
    started = bootstrap("-i", str(inv), "launch", "--detach", "--run-id", run_id, cwd=tmp_path, timeout=300)
    assert started.returncode == 0, started
    host = cluster.hosts[0]
    run_dir = Path(f"/root/cluster-bootstrap/runs/{run_id}/{host.name}")
    await_(lambda: b"x" * 500 in (run_dir / "node.log").read_bytes(), 120, "the long line in the log")
    try:
        leader = int((run_dir / "pid").read_text().split()[0])
        os.kill(leader, 9)  # the launcher only: torchrun and the rank live on
        await_(lambda: not Path(f"/proc/{leader}").exists() or _zombie(leader), 10, "the launcher gone")
        assert namespace_run_pids(cluster, host, run_id), "the run's other processes are alive"
        assert _status(bootstrap, inv, run_id, tmp_path)[host.name]["state"] == "running"
        table = bootstrap("-i", str(inv), "status", "--run", run_id, cwd=tmp_path, env={"COLUMNS": "120"})
        assert table.returncode == 0, table
        (row,) = [line for line in table.stdout.splitlines() if host.name in line]
        cells = [cell.strip() for cell in row.split("│")[1:-1]]
        assert cells[:2] == [host.name, "running"] and cells[2] not in ("", "…"), row
        assert cells[4].startswith("xxxx") and len(row) <= 120, row
    finally:
        stopped = bootstrap("-i", str(inv), "stop", "--run", run_id, cwd=tmp_path, timeout=120)
        assert stopped.returncode == 0, stopped


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True


def test_a_new_launch_names_a_detached_run_which_stop_then_ends_everywhere(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """A new launch on nodes that still run another run's processes names that run (issue 17: it did
    not mention them). `stop --run` then ends it on every node (launcher, torchrun, worker and the
    worker's own child); a second stop changes nothing and says so; status says stopped."""
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(
        "import subprocess, time\n"
        "subprocess.Popen(['sleep', '600'])\n"
        "print('up', flush=True)\n"
        "time.sleep(600)\n"
    )
    quick = tmp_path / "quick.py"
    quick.write_text("print('quick done', flush=True)\n")
    hosts = cluster.hosts[:2]  # the master and a worker
    inv_a = _inventory(cluster, tmp_path / "a.yaml", sleeper, hosts=2)
    old = f"old-{os.getpid()}-{time.monotonic_ns()}"
    started = bootstrap("-i", str(inv_a), "launch", "--detach", "--run-id", old, cwd=tmp_path, timeout=300)
    assert started.returncode == 0, started
    stopped = None
    try:
        await_(
            lambda: all(len(namespace_run_pids(cluster, h, old)) >= 4 for h in hosts),
            120,
            "the run's processes on every node (launcher, torchrun, worker, its child)",
        )
        nodes = [{"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in hosts]
        inv = write_inventory(  # another port: the old run's torchrun holds the default one
            tmp_path / "b.yaml", nodes, name="ns", master="node1", port=29577, train={"script": str(quick)}
        )
        new = bootstrap("-i", str(inv), "launch", "--run-id", f"new-{old}", cwd=tmp_path, timeout=300)
        assert new.returncode == 0, new
        for host in hosts:
            assert re.search(
                rf"^\[{host.name}\] bootstrap: \d+ process\(es\) of run {re.escape(old)} still running",
                new.stdout + new.stderr,
                re.M,
            ), new.stdout + new.stderr
        assert not re.search(rf"of run new-{re.escape(old)} ", new.stdout + new.stderr)  # not itself

        stopped = bootstrap("-i", str(inv_a), "stop", "--run", old, cwd=tmp_path, timeout=120)
        assert stopped.returncode == 0, stopped
        for host in hosts:
            assert re.search(rf"{host.name}\s+\S*\s*stopped \d+ process", stopped.stdout), stopped.stdout
            assert not namespace_run_pids(cluster, host, old), host.name
    finally:
        if stopped is None:
            bootstrap("-i", str(inv_a), "stop", "--run", old, cwd=tmp_path, timeout=120)
    again = bootstrap("-i", str(inv_a), "stop", "--run", old, cwd=tmp_path)
    assert again.returncode == 0 and "nothing was running: nothing changed" in again.stderr, again
    states = _status(bootstrap, inv_a, old, tmp_path)
    assert all(s["state"] == "stopped" for s in states.values()), states


def test_a_busy_master_port_refuses_the_launch_naming_the_node_and_the_port(
    bootstrap: Bootstrap, trusted_home: Path, cluster: NamespaceCluster, tmp_path: Path
) -> None:
    """Something already listens on the cluster's port on the master (a run launched from another
    directory still holding it, another program): `launch` says so for that node and starts nothing
    (torchrun would fail there, and the other nodes could join whatever holds the port); once the
    port is free, the same command trains."""
    script = tmp_path / "t.py"
    script.write_text("print('trained', flush=True)\n")
    port = 29611
    nodes = [
        {"name": h.name, "host": h.addr, "user": "root", "python": sys.executable} for h in cluster.hosts[:2]
    ]
    inv = write_inventory(
        tmp_path / "hosts.yaml", nodes, name="ns", master="node1", port=port, train={"script": str(script)}
    )
    listen = (
        "import socket, time\ns = socket.socket(socket.AF_INET6)\n"
        f"s.bind(('::', {port}))\ns.listen()\nprint('up', flush=True)\ntime.sleep(600)\n"
    )
    held_by = f"ns-holder-{os.getpid()}"

    def launch_while_held(*as_user: str) -> CliRun:
        """A launch while ``listen`` holds the port on the master, carrying a run marker of ours."""
        holder = subprocess.Popen(
            ["ip", "netns", "exec", cluster.hosts[0].ns, *as_user, "-c", listen],
            stdout=subprocess.PIPE,
            env={**os.environ, RUN_MARKER_ENV: f"{held_by}/node1/1-2"},
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"up\n"
            return bootstrap("-i", str(inv), "launch", cwd=tmp_path, timeout=120)
        finally:
            holder.kill()
            holder.wait()

    # the holder is a run of bootstrap (its processes carry the run marker): named, with its stop
    refused = launch_while_held(sys.executable)
    assert refused.returncode == 1, refused
    said = refused.stdout + refused.stderr
    assert re.search(rf"node1\W.*port {port} is in use on this node, the master: run {held_by} ", said), said
    assert re.search(rf"`bootstrap -i \S+ stop --run {held_by}` ends it", said), said
    assert "cluster.port" in said and "trained" not in said, said
    # another user's process carrying one of our run ids: not named (its stop would end our run)
    theirs = launch_while_held(
        "setpriv", "--reuid=54321", "--regid=54321", "--clear-groups", "/usr/bin/python3"
    )
    assert theirs.returncode == 1 and "torchrun's rendezvous needs it free" in theirs.stderr, theirs
    assert f"stop --run {held_by}" not in theirs.stderr, theirs
    # the refused launch (node2 prepared, maybe started, then stopped at once) never trained: it is
    # not the run `--run latest` means (`stop --run latest` missed the run holding the port)
    refused_id = re.search(r"run (ns-\S+): 2 node", said)
    assert refused_id is not None, said
    record = json.loads((tmp_path / "runs" / refused_id.group(1) / "run.json").read_text())
    assert record.get("not_started") is True, record
    again = bootstrap("-i", str(inv), "launch", cwd=tmp_path, timeout=120)
    assert again.returncode == 0 and again.stdout.count("trained") == 2, again
