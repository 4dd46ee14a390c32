"""The reachability check's logic: probe output parsing and verdicts from a matrix of pair results.

The last tests run the real probe through the local transport on loopback addresses (127.0.0.x):
no root, no namespaces, well under a second.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import random
import re
import shlex
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from orchestrator.platforms import PosixShell
from orchestrator.steps.preflight.model import Verdict
from orchestrator.steps.preflight.reachability import (
    PROBE_TAG,
    Busy,
    Connected,
    ConnectResult,
    Done,
    InboxAt,
    Listening,
    Outcome,
    Pair,
    PortRange,
    ProbeError,
    ProbeFailure,
    ReachNode,
    Ready,
    Role,
    build_verdicts,
    check_reachability,
    parse_clock_line,
    parse_connect_line,
    parse_listener_line,
    probe_command,
    probe_source,
)
from orchestrator.transports import LocalTransport, Result

NAMES = ["node1", "node2", "node3"]
ADDR = {"node1": "198.18.1.11", "node2": "198.18.1.12", "node3": "198.18.1.13"}
MESH_PORT = {"node1": 41001, "node2": 41002, "node3": 41003}
PORT = 29500
RANGES = {name: (32768, 60999) for name in NAMES}
DROP = "timed out: a firewall dropping packets?"
ALLOW_NODE3 = (
    "node3's firewall probably blocks incoming TCP from node1, node2: allow TCP from the cluster's "
    "addresses (198.18.1.11, 198.18.1.12, 198.18.1.13) to ephemeral ports (32768-60999) on node3; "
    "opening only the rendezvous port is not enough: gloo and NCCL listen on random ports. "
    "`bootstrap firewall` adds exactly these rules (the main pipeline runs it on clusters of 2+ nodes; "
    "docs/firewall.md)"
)


def matrix(
    broken: Mapping[tuple[str, str, Role], Outcome] | None = None,
    *,
    names: list[str] = NAMES,
    rendezvous: bool = True,
) -> list[Pair]:
    """Every pair a full run measures (master node1), ok unless ``broken`` says otherwise."""
    broken = broken or {}
    pairs = []
    for source in names:
        targets: list[tuple[str, Role, int]] = [(t, "mesh", MESH_PORT[t]) for t in names if t != source]
        if rendezvous:
            targets.insert(0, ("node1", "rendezvous", PORT))
        for target, role, port in targets:
            outcome = broken.get((source, target, role), "ok")
            ms = 2000.0 if outcome == "timed out" else 0.4
            pairs.append(Pair(source, target, role, ADDR[target], port, outcome, ms))
    return pairs


def verdicts_for(
    pairs: list[Pair],
    *,
    busy: Busy | None = None,
    failures: Mapping[str, ProbeFailure] | None = None,
    seconds: float | None = None,
    from_default: bool = False,
) -> dict[str, Verdict]:
    return build_verdicts(
        NAMES,
        ADDR,
        "node1",
        PORT,
        pairs,
        busy=busy,
        failures=failures,
        ranges=RANGES,
        seconds=seconds,
        from_default=from_default,
    )


# -- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "event"),
    [
        ("listening on 198.18.1.11 41231 mesh", Listening("198.18.1.11", 41231, "mesh")),
        ("listening on 198.18.1.11 29500 rendezvous", Listening("198.18.1.11", 29500, "rendezvous")),
        ("busy 29500 - python3 (pid 812)", Busy(29500, "python3 (pid 812)")),
        ("busy 29500 - ", Busy(29500, "")),
        # the runs holding it are a field of their own, each a run id `--run-id` takes, never
        # "latest" (it would stop the newest run): what the holder text says is not parsed for them
        (
            "busy 29500 lab-1,x;rm,latest,-a pt_elastic (pid 812, run lab-1), (pid 1, run prod)",
            Busy(29500, "pt_elastic (pid 812, run lab-1), (pid 1, run prod)", ("lab-1",)),
        ),
        ("range 32768 60999", PortRange(32768, 60999)),
        ("ready 4242", Ready(4242)),
        ("done stopped", Done("stopped")),
        ("inbox /tmp/cbt-reach-0a1b/inbox", InboxAt("/tmp/cbt-reach-0a1b/inbox")),
        ("connected", Connected()),
        (
            "error cannot listen on 198.18.1.99: Cannot assign requested address",
            ProbeError("cannot listen on 198.18.1.99: Cannot assign requested address"),
        ),
    ],
)
def test_listener_lines_parse(line: str, event: object) -> None:
    assert parse_listener_line(line) == event


@pytest.mark.parametrize(
    "line",
    [
        "",
        "Welcome to Ubuntu",
        "listening on 1.2.3.4 x mesh",
        "listening on 1.2.3.4 5 other",
        "ready",
        "range 1",
    ],
)
def test_other_lines_are_ignored(line: str) -> None:
    assert parse_listener_line(line) is None
    assert parse_connect_line(line) is None


def test_connect_lines_parse() -> None:
    assert parse_connect_line("result 0 ok 0.6 198.18.1.11:29500 -") == ConnectResult(
        0, "ok", 0.6, "198.18.1.11:29500", ""
    )
    assert parse_connect_line("result 3 timeout 2001.3 198.18.1.13:41231 -") == ConnectResult(
        3, "timed out", 2001.3, "198.18.1.13:41231", ""
    )
    assert parse_connect_line("result 1 refused 0.3 [fd00::1]:41231 ECONNREFUSED") == ConnectResult(
        1, "refused", 0.3, "[fd00::1]:41231", "ECONNREFUSED"
    )
    assert parse_connect_line("result 2 unreachable 1.0 10.9.9.9:1 EHOSTUNREACH") is not None
    assert parse_connect_line("result 2 exploded 1.0 10.9.9.9:1 -") is None
    assert parse_connect_line("result x ok 1.0 10.9.9.9:1 -") is None


def test_the_probe_stays_python36_and_is_run_isolated() -> None:
    source = probe_source()
    ast.parse(source, feature_version=(3, 6))  # no walrus, no f"{x=}", no positional-only params
    assert "from __future__ import annotations" not in source  # Python 3.7+
    words = probe_command(PosixShell(), "/usr/bin/python3", ["connect", "-", "2", "1.2.3.4:5"])
    assert words.startswith("/usr/bin/python3 -I -S -c ")
    assert words.endswith(" cbt-reach connect - 2 1.2.3.4:5")


# -- verdicts ---------------------------------------------------------------------------------------


def test_all_ok() -> None:
    verdicts = verdicts_for(matrix(), seconds=1.234)
    for name in NAMES:
        v = verdicts[name]
        assert (v.check, v.level, v.fix) == ("reachability", "ok", None)
        assert v.reason == (
            "master port 29500 free and reachable from all; full mesh on ephemeral ports ok (6 pairs)"
        )
    data = verdicts["node2"].data
    assert data["seconds"] == 1.234 and data["ephemeral_range"] == [32768, 60999]
    assert {
        "from": "node2",
        "to": "node1",
        "role": "rendezvous",
        "address": "198.18.1.11",
        "port": 29500,
        "result": "ok",
        "ms": 0.4,
        "detail": None,
    } in data["pairs"]
    assert len(data["pairs"]) == 1 + 4  # its rendezvous pair and its mesh pairs, both ways
    assert len(verdicts["node1"].data["pairs"]) == 3 + 4


def test_a_node_dropping_incoming_fails_and_the_others_name_it() -> None:
    broken: dict[tuple[str, str, Role], Outcome] = {
        ("node1", "node3", "mesh"): "timed out",
        ("node2", "node3", "mesh"): "timed out",
    }
    verdicts = verdicts_for(matrix(broken))
    v3 = verdicts["node3"]
    assert v3.level == "fail"
    assert v3.reason == f"not reachable from node1, node2 ({DROP})"
    assert v3.fix == ALLOW_NODE3
    v1 = verdicts["node1"]
    assert v1.level == "fail"
    assert v1.reason == f"cannot reach node3 198.18.1.13:41003 ({DROP})"
    assert v1.fix == "the likely cause is on node3: see its fix"
    failed = [p for p in v1.data["pairs"] if p["result"] != "ok"]
    assert failed == [
        {
            "from": "node1",
            "to": "node3",
            "role": "mesh",
            "address": "198.18.1.13",
            "port": 41003,
            "result": "timed out",
            "ms": 2000.0,
            "detail": None,
        }
    ]


def test_a_node_dropping_replies_too_is_blamed_for_its_own_connections() -> None:
    # without "ct state established accept" its own connections die too: everyone else is fine
    broken: dict[tuple[str, str, Role], Outcome] = {
        ("node1", "node3", "mesh"): "timed out",
        ("node2", "node3", "mesh"): "timed out",
        ("node3", "node1", "rendezvous"): "timed out",
        ("node3", "node1", "mesh"): "timed out",
        ("node3", "node2", "mesh"): "timed out",
    }
    verdicts = verdicts_for(matrix(broken))
    v3 = verdicts["node3"]
    assert v3.reason == (
        f"cannot reach master node1 198.18.1.11:29500 ({DROP}); cannot reach node1 198.18.1.11:41001 "
        f"({DROP}); cannot reach node2 198.18.1.12:41002 ({DROP}); not reachable from node1, node2 ({DROP})"
    )
    assert (v3.fix or "").startswith(ALLOW_NODE3 + "; node3 reaches none of its peers")
    assert "`ct state established,related accept`" in (v3.fix or "")
    for name, port_text in (("node1", f"port 29500 not reachable from node3 ({DROP}); "), ("node2", "")):
        v = verdicts[name]
        assert v.level == "fail"
        assert v.reason.endswith(f"{port_text}not reachable from node3 ({DROP})")
        assert v.fix == "the likely cause is on node3: see its fix"


def test_a_master_refusing_the_rendezvous_port_is_told_to_open_it() -> None:
    verdicts = verdicts_for(matrix({("node2", "node1", "rendezvous"): "refused"}))
    v1 = verdicts["node1"]
    assert v1.reason == "port 29500 not reachable from node2 (refused)"
    assert (v1.fix or "").startswith(
        "node1's firewall probably blocks incoming TCP from node2: allow TCP from the cluster's addresses "
        "(198.18.1.11, 198.18.1.12, 198.18.1.13) to port 29500 and to ephemeral ports (32768-60999) on "
        "node1; opening only the rendezvous port is not enough"
    )
    assert verdicts["node2"].reason == "cannot reach master node1 198.18.1.11:29500 (refused)"
    assert verdicts["node3"].level == "ok"


def test_a_master_that_cannot_reach_itself() -> None:
    verdicts = verdicts_for(matrix({("node1", "node1", "rendezvous"): "timed out"}))
    v1 = verdicts["node1"]
    assert v1.reason == f"cannot reach its own rendezvous port 198.18.1.11:29500 ({DROP})"
    assert "`iif lo accept`" in (v1.fix or "")
    assert verdicts["node2"].level == "ok"


def test_no_route_and_errors_are_named() -> None:
    pairs = matrix({("node2", "node3", "mesh"): "no route"})
    pairs = [p if p.ok else dataclasses.replace(p, detail="EHOSTUNREACH") for p in pairs]
    assert verdicts_for(pairs)["node2"].reason == "cannot reach node3 198.18.1.13:41003 (no route)"
    odd = Pair("node2", "node3", "mesh", "198.18.1.13", 41003, "error", 0.1, "EINVAL")
    assert odd.explain() == "error EINVAL"


def test_a_name_a_node_cannot_resolve_is_said_as_that_not_as_a_firewall() -> None:
    """host: an ~/.ssh/config alias: the controller reaches the nodes, the nodes cannot resolve each
    other's names (getaddrinfo's error -3). The verdicts blamed the targets' firewalls and suggested
    `bootstrap firewall`; they name the names the source cannot resolve and the fix."""
    names = {"node1": "ws1", "node2": "ws2", "node3": "ws3"}
    pairs = [
        dataclasses.replace(p, address=names[p.target], outcome="error", detail="-3")
        if p.source == "node2"
        else p
        for p in matrix()
    ]
    verdicts = verdicts_for(pairs)
    v2 = verdicts["node2"]
    assert (
        v2.level == "fail" and v2.reason == "cannot resolve ws1, ws3 on this node (a name it does not know)"
    )
    assert "write the nodes' IP addresses as their host:" in (v2.fix or "") and "firewall" not in (
        v2.fix or ""
    )
    assert verdicts["node1"].level == verdicts["node3"].level == "ok"  # no firewall of theirs is to blame


def test_busy_master_port() -> None:
    verdicts = verdicts_for(matrix(rendezvous=False), busy=Busy(PORT, "python3 (pid 812)"))
    v1 = verdicts["node1"]
    assert v1.level == "fail"
    assert v1.reason == "port 29500 is already in use on the master (by python3 (pid 812))"
    assert (v1.fix or "").startswith("stop that program or choose another cluster port:")
    assert v1.data["port_busy"] is True and v1.data["port_holder"] == "python3 (pid 812)"
    for name in ("node2", "node3"):
        assert verdicts[name].level == "warn"
        assert verdicts[name].reason == "master port busy: skipped"

    unknown = verdicts_for(matrix(rendezvous=False), busy=Busy(PORT, ""))
    assert unknown["node1"].reason == "port 29500 is already in use on the master"
    # the copy of the default inventory is suggested only to a run of the default inventory: pasted
    # after `-i hosts.yaml`, it would replace the user's own file
    assert "cp " not in (v1.fix or "")
    from_default = verdicts_for(matrix(rendezvous=False), busy=Busy(PORT, ""), from_default=True)
    assert "copy it first, `cp " in (from_default["node1"].fix or "")


def test_a_master_port_held_by_a_run_of_ours_names_the_stop_that_ends_it() -> None:
    """The daily loop's usual case: the last run (detached, or still ending) holds the port. The fix
    is that run's `stop --run`; a run id the node's process forged (not one `--run-id` accepts) is
    never put into a command the user is told to type."""
    holder = "pt_elastic (pid 812, run lab-1)"
    held = verdicts_for(matrix(rendezvous=False), busy=Busy(PORT, holder, ("lab-1",)))["node1"]
    assert held.reason == "port 29500 is already in use on the master (by pt_elastic (pid 812, run lab-1))"
    assert (held.fix or "").startswith("a run of bootstrap holds it: `bootstrap stop --run lab-1` ends it"), (
        held
    )
    named_only = Busy(PORT, "(pid 1, run a) (pid 812)")  # a process may call itself anything
    assert "stop --run" not in (verdicts_for(matrix(rendezvous=False), busy=named_only)["node1"].fix or "")


def test_busy_master_port_and_a_broken_mesh() -> None:
    broken: dict[tuple[str, str, Role], Outcome] = {("node2", "node3", "mesh"): "refused"}
    verdicts = verdicts_for(matrix(broken, rendezvous=False), busy=Busy(PORT, ""))
    assert verdicts["node2"].level == "fail"
    assert verdicts["node2"].reason == (
        "cannot reach node3 198.18.1.13:41003 (refused); master port busy: skipped"
    )
    assert verdicts["node3"].reason.startswith("not reachable from node2 (refused)")


def test_a_node_whose_probe_did_not_run() -> None:
    failure = ProbeFailure("the reachability probe failed (exit code 127): sh: 1: python3: not found", "x")
    pairs = matrix(names=["node1", "node2"])
    verdicts = verdicts_for(pairs, failures={"node3": failure})
    assert (verdicts["node3"].level, verdicts["node3"].reason) == ("fail", failure.reason)
    for name in ("node1", "node2"):
        assert verdicts[name].level == "warn"
        assert verdicts[name].reason.endswith("(2 pairs); node3 not tested (probe failed)")

    master_down = verdicts_for(
        matrix(names=["node2", "node3"], rendezvous=False), failures={"node1": failure}
    )
    assert master_down["node2"].level == "warn"
    assert master_down["node2"].reason == "master node1's probe failed: master port not tested"


# -- the real probe on loopback addresses (local transport) ----------------------------------------


def free_port() -> int:
    """A rendezvous port nothing listens on, below Linux's ephemeral range (32768-60999), as 29500
    is: a port the kernel hands out itself could go to a probe's own mesh listener or connection
    before the rendezvous listener binds it (then "already in use", 2 in 200 checks here)."""
    for _ in range(100):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


class CountingTransport(LocalTransport):
    """The local transport, keeping every script it ran."""

    def __init__(self, name: str) -> None:
        super().__init__(name, PosixShell())
        self.scripts: list[str] = []

    def run_raw(self, script: str, **kwargs: Any) -> Result:
        self.scripts.append(script)
        return super().run_raw(script, **kwargs)


def local_nodes(pythons: list[str]) -> list[ReachNode]:
    return [
        ReachNode(f"n{i}", CountingTransport(f"n{i}"), python, f"127.0.0.{i}")
        for i, python in enumerate(pythons, start=1)
    ]


def test_probe_on_loopback_all_ok_and_busy() -> None:
    port = free_port()
    nodes = local_nodes([sys.executable] * 3)
    verdicts = check_reachability(nodes, "n1", port)
    assert {v.level for v in verdicts.values()} == {"ok"}, [v.reason for v in verdicts.values()]
    assert len(verdicts["n1"].data["pairs"]) == 3 + 4
    for node in nodes:  # one interpreter per node: its listener connected too, told through its inbox
        assert isinstance(node.transport, CountingTransport)
        scripts = node.transport.scripts
        assert [f"{PROBE_TAG} listen " in s for s in scripts] == [True, False], scripts
        assert re.fullmatch(r"echo connect .* 1<>/\S+/cbt-reach-[0-9a-f]+/inbox", scripts[1]), scripts

    with socket.socket() as holder:  # something else listening on the port, on another address
        holder.bind(("127.0.0.9", port))
        holder.listen()
        verdicts = check_reachability(nodes, "n1", port)
    assert verdicts["n1"].level == "fail"
    assert verdicts["n1"].reason.startswith(f"port {port} is already in use on the master")
    assert [verdicts[n].reason for n in ("n2", "n3")] == ["master port busy: skipped"] * 2


def test_probe_on_loopback_with_a_missing_interpreter() -> None:
    nodes = local_nodes([sys.executable, sys.executable, "/nonexistent/python3"])
    verdicts = check_reachability(nodes, "n1", free_port())
    assert verdicts["n3"].level == "fail" and "/nonexistent/python3" in verdicts["n3"].reason
    assert verdicts["n1"].level == "warn" and "n3 not tested" in verdicts["n1"].reason


def test_master_must_be_a_node() -> None:
    with pytest.raises(ValueError, match="master"):
        check_reachability(local_nodes([sys.executable]), "elsewhere", 29500)


def test_probe_on_loopback_without_poll_as_on_windows(tmp_path: Path) -> None:
    """Windows' select module has no poll(): the probe then waits with select(), where a refused
    connection shows among the exceptional sockets. Its interpreter here: this one, poll removed."""
    no_poll = tmp_path / "python-without-poll"
    inner = (
        "import select, sys; del select.poll; source = sys.argv[4]; sys.argv = ['-c'] + sys.argv[5:]; "
        "exec(compile(source, '<probe>', 'exec'), {'__name__': '__main__'})"
    )
    no_poll.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(inner)} "$@"\n')
    no_poll.chmod(0o755)
    port = free_port()
    verdicts = check_reachability(local_nodes([str(no_poll)] * 3), "n1", port)
    assert {v.level for v in verdicts.values()} == {"ok"}, [v.reason for v in verdicts.values()]
    assert len(verdicts["n1"].data["pairs"]) == 3 + 4

    with socket.socket() as closed:  # a port nothing listens on: refused, named
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
    out = subprocess.run(
        [
            str(no_poll),
            "-I",
            "-S",
            "-c",
            probe_source(),
            "cbt-reach",
            "connect",
            "-",
            "3",
            "t",
            f"127.0.0.1:{dead}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert re.search(rf"^result 0 refused [\d.]+ 127\.0\.0\.1:{dead} ECONNREFUSED$", out.stdout, re.M), (
        out.stdout
    )


def test_a_listener_with_an_inbox_connects_when_told_and_only_then_is_complete() -> None:
    """A POSIX listener has an inbox (a FIFO in a directory only its user can enter): it is complete
    once every peer came AND its own connect line did, which it then carries out itself."""
    argv = [sys.executable, "-I", "-S", "-c", probe_source(), PROBE_TAG, "listen", "20", "tok", "1"]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as listener:
        assert listener.stdout is not None
        lines = []
        while not lines or not lines[-1].startswith("ready"):
            lines.append(listener.stdout.readline().strip())
        mesh = next(e for e in map(parse_listener_line, lines) if isinstance(e, Listening))
        inbox = next(e for e in map(parse_listener_line, lines) if isinstance(e, InboxAt)).path
        directory = Path(inbox).parent
        assert directory.stat().st_mode & 0o777 == 0o700 and stat.S_ISFIFO(Path(inbox).stat().st_mode)
        # its one expected peer comes first: the listener goes on, waiting for its connect line
        with socket.create_connection(("127.0.0.1", mesh.port)) as peer:
            peer.sendall(b"tok")
        Path(inbox).write_text(f"connect 127.0.0.1 5 tok 127.0.0.1:{mesh.port} 127.0.0.1:{free_port()}\n")
        rest = [line.strip() for line in listener.stdout]
    assert listener.returncode == 0
    assert len(rest) == 5 and parse_clock_line(rest[0]) is not None, rest
    first, second = parse_connect_line(rest[1]), parse_connect_line(rest[2])
    assert first is not None and (first.index, first.outcome, first.target) == (
        0,
        "ok",
        f"127.0.0.1:{mesh.port}",
    )
    assert second is not None and (second.index, second.outcome) == (1, "refused")
    assert rest[3:] == ["connected", "done complete"]  # complete after its own connections only
    assert not directory.exists()  # removed once the line came


def test_a_listener_removes_the_inboxes_killed_listeners_left_and_nothing_else(tmp_path: Path) -> None:
    """A listener killed outright leaves its inbox directory; the next one on the node removes it
    (its process is gone), and leaves a live listener's, another name, and a directory holding more."""
    from orchestrator.steps.preflight.probes.reach import sweep_inboxes

    dead = subprocess.Popen(["true"])
    dead.wait()

    def inbox(pid: int, fill: str) -> Path:
        directory = tmp_path / f"cbt-reach-{pid:08x}{fill * 16}"
        directory.mkdir(mode=0o700)
        os.mkfifo(directory / "inbox", 0o600)
        return directory

    left, alive, busy = inbox(dead.pid, "0"), inbox(os.getpid(), "0"), inbox(dead.pid, "1")
    (busy / "other").write_text("x")
    for directory in (left, alive, busy):  # two hours old: a listener lives minutes at most
        os.utime(directory, (time.time() - 7200, time.time() - 7200))
    recent = inbox(dead.pid, "2")  # its pid may mean another machine's process (a shared TMPDIR)
    other = tmp_path / "cbt-reach-not-ours"
    other.mkdir()
    sweep_inboxes(str(tmp_path))
    assert not left.exists()
    assert alive.exists() and (alive / "inbox").exists()
    assert busy.exists() and other.exists() and recent.exists()
