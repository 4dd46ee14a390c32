"""The preflight's one round trip per Linux node, with the real probe on this machine.

Three nodes on loopback addresses (127.0.0.x) through the local transport: each sends its clock,
its facts and then its listener in one command, whose facts are parsed while the listener still
runs; the connectors are the second and last command (the listeners end by themselves).
"""

from __future__ import annotations

import re
import sys
import threading
import time

from orchestrator.facts import linux
from orchestrator.facts.linux import INTERPRETER_SECTION
from orchestrator.inventory import load_inventory_text
from orchestrator.platforms import PosixShell
from orchestrator.steps.preflight import check_plan
from orchestrator.steps.preflight.reachability import (
    MeshPlan,
    ReachNode,
    check_reachability,
    parse_clock_line,
)
from orchestrator.steps.preflight.rounds import NodeRound
from orchestrator.transports import LocalTransport, Result
from tests.noderecords import ask_at, asks
from tests.unit.test_reachability import free_port


class Counting(LocalTransport):
    def __init__(self, name: str) -> None:
        super().__init__(name, PosixShell())
        self.commands: list[str] = []
        self.lock = threading.Lock()

    def run_raw(self, script: str, **kw: object) -> Result:  # type: ignore[override]
        with self.lock:
            self.commands.append(script)
        return super().run_raw(script, **kw)  # type: ignore[arg-type]


def test_facts_clock_and_listener_share_one_command_per_node() -> None:
    names = ["n1", "n2", "n3"]
    port = free_port()
    plan = MeshPlan(tuple(names), "n1", port, hold=30)
    transports = {name: Counting(name) for name in names}
    rounds = {
        name: NodeRound(
            name,
            transports[name],
            [linux.CpuCount(), linux.Python(sys.executable)],
            plan.listener(name, transports[name], sys.executable),
        ).start()
        for name in names
    }
    for node_round in rounds.values():
        facts = node_round.gathered()  # before the listener ends: its peers have not connected yet
        assert facts.errors == {}
        assert facts.values["cpus"] >= 1 and facts.values["python"].path
        assert not node_round.ended.is_set()
        sample = node_round.clock()
        assert sample is not None and abs(sample.offset) < sample.rtt + 0.5

    clocks: dict = {}
    nodes = [
        ReachNode(name, transports[name], sys.executable, f"127.0.0.{i}", listener=rounds[name].listener)
        for i, name in enumerate(names, start=1)
    ]
    verdicts = check_reachability(nodes, "n1", port, plan=plan, clocks=clocks)
    assert {v.level for v in verdicts.values()} == {"ok"}, [v.reason for v in verdicts.values()]
    assert len(verdicts["n1"].data["pairs"]) == 3 + 4  # rendezvous from all, mesh both ways
    assert set(clocks) == set(names)  # each connector sampled its node's clock too
    for name in names:
        assert rounds[name].ended.wait(10)
        assert rounds[name].listener is not None and rounds[name].listener.done == "complete"
        commands = transports[name].commands
        assert len(commands) == 2, commands  # no separate clock samples, no listener of its own, no kill
        assert asks(commands[0], "clock") and " cbt-reach listen " in commands[0]
        # its connections: one line into the listener's inbox, no interpreter of their own
        assert re.fullmatch(r"echo connect .* 1<>/\S+/cbt-reach-[0-9a-f]+/inbox", commands[1]), commands[1]


def test_listeners_waiting_for_a_node_that_never_answered_are_stopped() -> None:
    names = ["n1", "n2", "gone"]  # "gone" was in the plan, then did not answer
    port = free_port()
    plan = MeshPlan(tuple(names), "n1", port, hold=60)
    transports = {name: Counting(name) for name in names[:2]}
    rounds = {
        name: NodeRound(
            name, transports[name], [], plan.listener(name, transports[name], sys.executable)
        ).start()
        for name in names[:2]
    }
    nodes = [
        ReachNode(name, transports[name], sys.executable, f"127.0.0.{i}", listener=rounds[name].listener)
        for i, name in enumerate(names[:2], start=1)
    ]
    started = time.monotonic()
    verdicts = check_reachability(nodes, "n1", port, plan=plan)
    assert time.monotonic() - started < 20  # not the listeners' own deadline (60 s)
    assert {v.level for v in verdicts.values()} == {"ok"}, [v.reason for v in verdicts.values()]
    for name in names[:2]:
        assert rounds[name].ended.wait(10)
        assert rounds[name].listener is not None and rounds[name].listener.done == "stopped"
        assert any(c.startswith("kill -TERM") for c in transports[name].commands), transports[name].commands


def test_the_connectors_clock_line() -> None:
    clock = parse_clock_line("clock 1796300000.250000")
    assert clock is not None and clock.unix_time == 1796300000.25
    assert parse_clock_line("clock soon") is None
    assert parse_clock_line("result 0 ok 0.1 1.2.3.4:5 -") is None


def test_the_dry_run_shows_the_round_trip_and_the_connector() -> None:
    inventory = load_inventory_text(
        "cluster: {name: lab, master: n1}\n"
        "nodes:\n  - {name: n1, host: 10.0.0.11}\n  - {name: n2, host: 10.0.0.12}\n",
        "hosts.yaml",
    )
    node = inventory.nodes[1]
    first, connector = check_plan(node, LocalTransport("n2", PosixShell()), inventory)
    order = ["clock", INTERPRETER_SECTION, "route", "root_access", "workdir_mark", " cbt-reach listen "]
    order.append("workdir_marks")
    positions = [first.index(m) if m.startswith(" ") else ask_at(first, m) for m in order]
    assert positions == sorted(positions), positions
    # the connections: one line into the listener's inbox (its path is the listener's to choose)
    assert connector.startswith("echo connect ADDRESS 2 ") and connector.endswith(
        " 10.0.0.11:PORT 10.0.0.11:29500 1<>/tmp/cbt-reach-RANDOM/inbox"
    )
