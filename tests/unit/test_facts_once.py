"""Facts once per session: `check` then launch planning on one session ask each node once, and the
preflight's facts, clock sample and listener travel in one command per Linux node.

Pure logic: a fake transport answers the commands the way a node would (each fact's section from
canned output, the reachability probes from the protocol in steps/preflight/probes/reach.py) and
counts them. The real probes over real connections are in test_preflight_round_trip.py and
tests/integration/test_preflight*.py.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import threading
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.facts.linux import INTERPRETER_SECTION
from orchestrator.inventory import Inventory, Node, PasswordResolver, load_inventory_text
from orchestrator.platforms import PosixShell
from orchestrator.session import Session
from orchestrator.steps.contract import Report
from orchestrator.steps.launch import plan as launch_plan
from orchestrator.steps.preflight import NodeChecks, check_plan, run_preflight
from orchestrator.steps.preflight.model import Verdict
from orchestrator.transports import Result, SSHOptions, Transport
from orchestrator.transports.base import OnLine
from tests.noderecords import asks, sections_asked, sections_said

INVENTORY = """\
cluster: {name: lab, master: n1}
nodes:
  - {name: n1, host: 10.0.0.11, user: alice, python: /usr/bin/python3}
  - {name: n2, host: 10.0.0.12, user: alice, python: /usr/bin/python3}
  - {name: n3, host: 10.0.0.13, user: alice, python: /usr/bin/python3}
"""
LISTEN = re.compile(r"cbt-reach listen (\S+) (\S+) (\d+)(?: (\d+) (\d+))?")
MARK = re.compile(r"printf %s (\S+) > \"\$t\" && mv -f \"\$t\" (\S+);")


def probe_args(script: str) -> str:
    """``cbt-reach listen|connect ...`` of a command running the reachability probe, else "" (the
    probe's own text mentions both commands: its arguments are the last mention)."""
    return script[script.rfind("cbt-reach ") :] if "cbt-reach " in script else ""


def canned(index: int) -> dict[str, Callable[[], tuple[str, int]]]:
    """What node ``n<index>`` prints for each fact (the master n1 holds 10.0.0.11)."""
    own = f"10.0.0.{10 + index}"
    route = "local 10.0.0.11 dev lo src 10.0.0.11" if index == 1 else f"10.0.0.11 dev eth0 src {own}"
    answers = {
        "clock": f"{time.time():.6f}",
        "hostname": f"n{index}",
        "os": 'ID=debian\nVERSION_ID="12"\nPRETTY_NAME="Debian GNU/Linux 12 (bookworm)"',
        "kernel": "Linux\n6.1.0-18-amd64\nx86_64",
        "cpus": "4",
        "memory": "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB",
        # one interpreter start answers the Python and torch facts
        INTERPRETER_SECTION: '/usr/bin/python3\n3.11.2\n{"installed": true, "version": "2.5.1", '
        '"distributed": true, "gloo": true, "gloo_works": true}',
        "route": f"resolved 10.0.0.11\n{route} uid 1000",
        "addresses": f"1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet {own}/24 scope global eth0",
        "interfaces": "1: lo: <LOOPBACK,UP> mtu 65536\n2: eth0@if7: <BROADCAST,UP> mtu 1500",
        "hostname_address": own,
        "disk": "/home/alice\nFilesystem 1024-blocks Used Available Capacity Mounted on\n"
        "/dev/sda1 100000000 1000 90000000 1% /",
        "root_access": "alice\nsudo-ok",
    }
    found: dict[str, Callable[[], tuple[str, int]]] = {
        name: (lambda text=text: (text, 0)) for name, text in answers.items()
    }
    found["clock"] = lambda: (f"{time.time():.6f}", 0)
    found["gpus"] = lambda: ("", 127)  # no nvidia-smi
    return found


class Mesh:
    """The listeners of every fake node: connectors count against them, as real ones would."""

    def __init__(self) -> None:
        self.ports = itertools.count(41000)
        self.lock = threading.Lock()
        self.owner: dict[int, str] = {}  # port -> node
        self.left: dict[str, int] = {}  # node -> connections it still waits for
        self.done: dict[str, threading.Event] = {}

    def listen(self, node: str, expected: int, rendezvous: int | None) -> list[str]:
        with self.lock:
            port = next(self.ports)
            self.owner[port] = node
            if rendezvous is not None:
                self.owner[rendezvous] = node
            self.left[node] = expected
            self.done[node] = event = threading.Event()
            if expected == 0:
                event.set()
        lines = [f"listening on :: {port} mesh"]
        if rendezvous is not None:
            lines.append(f"listening on :: {rendezvous} rendezvous")
        return [*lines, "range 32768 60999", "ready 4242"]

    def arrived(self, port: int) -> None:
        with self.lock:
            node = self.owner[port]
            self.left[node] -= 1
            if self.left[node] == 0:
                self.done[node].set()


class FakeNode(Transport):
    kind = "fake"

    def __init__(self, node: Node, index: int, mesh: Mesh) -> None:
        super().__init__(node.name, PosixShell())
        self.answers = canned(index)
        self.mesh = mesh
        self.commands: list[str] = []
        self.connects = 0
        self.markers: dict[str, str] = {}

    def connect(self) -> None:
        self.connects += 1

    def run_raw(
        self,
        script: str,
        *,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
    ) -> Result:
        self.commands.append(script)
        out: list[str] = []
        if script.startswith("kill -TERM "):
            self.mesh.done[self.node_name].set()
            return Result(self.node_name, script, 0, "", "", 0.01)

        def say(line: str) -> None:
            out.append(line)
            if on_line is not None:
                on_line("stdout", line)

        def sections(text: str) -> None:
            for token, name in sections_asked(text):
                for line in sections_said(token, {name: self.section(name, text)}).split("\n")[:-1]:
                    say(line)

        tail = probe_args(script)
        listen = LISTEN.match(tail)
        # a listener runs after the sections before it and before those after it
        sections(script[: script.rfind("cbt-reach ")] if listen else script)
        if listen is not None:
            _, _, mesh_count, port, port_count = listen.groups()
            rendezvous = int(port) if port else None
            expected = int(mesh_count) + (int(port_count) if port_count else 0)
            for line in self.mesh.listen(self.node_name, expected, rendezvous):
                say(line)
            stopped = not self.mesh.done[self.node_name].wait(10)
            say("done stopped" if stopped else "done complete")
            sections(tail)
        elif tail.startswith("cbt-reach connect "):
            args = shlex.split(tail)[2:]
            say(f"clock {time.time():.6f}")
            for index, target in enumerate(args[3:]):
                self.mesh.arrived(int(target.rpartition(":")[2]))
                say(f"result {index} ok 0.2 {target} -")
            say("done complete")
        elif "cluster-bootstrap-nodes" in script:  # the workdir markers' own round trips (shared_fs.py)
            request = json.loads(shlex.split(script)[-1])
            say(json.dumps({d: {"path": "/home/alice/x", "seen": {}} for d in request["dirs"]}))
        return Result(self.node_name, script, 0, "\n".join(out) + "\n", "", 0.01)

    def section(self, name: str, script: str) -> tuple[str, int]:
        if name == "workdir_mark":  # each node has a disk of its own here
            token, marker = MARK.findall(script)[-1]
            self.markers[marker] = token
            return "", 0
        if name == "workdir_marks":
            return "".join(f"{marker} {token}\n" for marker, token in self.markers.items()), 0
        return self.answers[name]()

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        raise AssertionError("no uploads while planning")

    def get(self, remote: str, local: Path) -> None:
        raise AssertionError("no downloads while planning")

    def close(self) -> None:
        pass


class FakeSession(Session):
    def __init__(self, inventory: Inventory) -> None:
        super().__init__(
            inventory, list(inventory.nodes), ssh=SSHOptions(), passwords=PasswordResolver(prompt=None)
        )
        mesh = Mesh()
        self.fakes = {node.name: FakeNode(node, i, mesh) for i, node in enumerate(inventory.nodes, start=1)}

    def transport(self, node: Node) -> Transport:
        return self.fakes[node.name]


def facts_asked(session: FakeSession) -> dict[str, int]:
    """How many commands asked each node for its facts (the torch probe is one of them)."""
    return {
        name: sum(asks(c, INTERPRETER_SECTION) for c in fake.commands) for name, fake in session.fakes.items()
    }


def verdicts_of(report: Report[NodeChecks]) -> dict[str, dict[str, Verdict]]:
    """Each reached node's check verdicts from the preflight's report."""
    return {o.node: o.value.checks for o in report.outcomes if o.value is not None}


def test_check_then_launch_planning_gathers_each_nodes_facts_once() -> None:
    inventory = load_inventory_text(INVENTORY, "hosts.yaml")
    session = FakeSession(inventory)

    report = run_preflight(session, inventory)
    assert facts_asked(session) == {"n1": 1, "n2": 1, "n3": 1}
    for name in ("n1", "n2", "n3"):
        checks = verdicts_of(report)[name]
        assert checks["reachability"].level == "ok", checks["reachability"].reason
        assert checks["clock"].level == "ok", checks["clock"].reason
        assert checks["interface"].level == "ok", checks["interface"].reason
        assert checks["sudo"].level == "ok", checks["sudo"].reason
        assert checks["workdir"].level == "ok", checks["workdir"].reason
        # facts, clock, workdir markers and listener in one command; the connector is the second
        # and last
        commands = session.fakes[name].commands
        assert len(commands) == 2, commands
        assert asks(commands[0], "workdir_mark") and asks(commands[0], "workdir_marks")
        assert asks(commands[0], "clock") and probe_args(commands[0]).startswith("cbt-reach listen ")
        assert probe_args(commands[1]).startswith("cbt-reach connect ")

    planned = launch_plan(session, inventory, "run-1")
    assert facts_asked(session) == {"n1": 1, "n2": 1, "n3": 1}  # handed on, not asked again
    assert all(len(fake.commands) == 2 for fake in session.fakes.values())  # not a single command
    # ... and used: the routes to the master the preflight found give each node's address
    assert {s.node.name: (s.local_addr, s.master_addr) for s in planned.specs} == {
        "n1": ("10.0.0.11", "10.0.0.11"),
        "n2": ("10.0.0.12", "10.0.0.11"),
        "n3": ("10.0.0.13", "10.0.0.11"),
    }
    assert {o.node: o.value.facts.get("cpus") for o in planned.inspected if o.value} == {
        "n1": 4,
        "n2": 4,
        "n3": 4,
    }


def test_a_changed_node_is_asked_again_the_others_are_not() -> None:
    inventory = load_inventory_text(INVENTORY, "hosts.yaml")
    session = FakeSession(inventory)
    launch_plan(session, inventory, "run-1")
    assert facts_asked(session) == {"n1": 1, "n2": 1, "n3": 1}

    session.forget("n2")  # what `sync` does for a node whose environment it changed
    run_preflight(session, inventory)
    assert facts_asked(session) == {"n1": 1, "n2": 2, "n3": 1}
    # remembered facts leave the clock sample and the listener in the check's one command
    (first,) = [c for c in session.fakes["n1"].commands if probe_args(c).startswith("cbt-reach listen ")]
    assert asks(first, "clock") and not asks(first, INTERPRETER_SECTION)


def test_a_failed_gathering_is_not_remembered() -> None:
    inventory = load_inventory_text(INVENTORY, "hosts.yaml")
    session = FakeSession(inventory)
    broken = session.fakes["n3"]
    real_run = broken.run_raw

    def unreachable(script: str, **kw: object) -> Result:
        raise ConnectionError("no route to host")

    broken.run_raw = unreachable  # type: ignore[method-assign, assignment]
    first = launch_plan(session, inventory, "run-1")
    assert [o.node for o in first.inspected if o.error is not None] == ["n3"]

    broken.run_raw = real_run  # type: ignore[method-assign]
    launch_plan(session, inventory, "run-2")
    assert facts_asked(session) == {"n1": 1, "n2": 1, "n3": 1}


def test_listeners_are_stopped_when_the_master_never_answers() -> None:
    inventory = load_inventory_text(INVENTORY, "hosts.yaml")
    session = FakeSession(inventory)

    def unreachable(script: str, **kw: object) -> Result:
        raise ConnectionError("no route to host")

    session.fakes["n1"].run_raw = unreachable  # type: ignore[method-assign, assignment]
    started = time.monotonic()
    report = run_preflight(session, inventory)
    assert time.monotonic() - started < 5  # not the listeners' own deadline
    for name in ("n2", "n3"):
        assert verdicts_of(report)[name]["reachability"].reason.startswith("not checked: the master n1")
        assert session.fakes[name].commands[-1].startswith("kill -TERM 4242")


def test_a_step_forgets_only_what_it_changed() -> None:
    """The firewall step forgets a node's firewall reading after changing it, not that node's
    facts nor another step's reading; a seeded answer is what the step then reads."""
    inventory = load_inventory_text(INVENTORY, "hosts.yaml")
    session = FakeSession(inventory)
    asked: list[str] = []

    def compute(what: str) -> Callable[[], str]:
        return lambda: asked.append(what) or f"{what} read"

    session.remember("n1", "firewall.detection", lambda: "from the first round trip")
    session.remember("n1", "firewall.detection", lambda: "a second answer changes nothing")
    assert session.remember("n1", "firewall.detection", compute("fw")) == "from the first round trip"
    session.remember("n1", "timesync.probe", compute("chrony"))
    session.forget("n1", "firewall.detection")
    assert session.remember("n1", "firewall.detection", compute("fw")) == "fw read"
    assert session.remember("n1", "timesync.probe", compute("chrony")) == "chrony read"
    assert asked == ["chrony", "fw"]


def _unique(script: str) -> str:
    """``script`` without what is drawn anew for every run: record nonces, the mesh's token, the
    workdir marker's token (the dry run shows TOKEN)."""
    script = re.sub(r"cb-[0-9a-f]{12}", "cb-NONCE", script)
    script = re.sub(r"printf %s \S+ > \"\$t\"", 'printf %s TOKEN > "$t"', script)
    return re.sub(r"(cbt-reach listen \S+) \S+", r"\1 MESH", script)


def test_check_sends_each_node_exactly_the_round_trip_its_dry_run_shows() -> None:
    """`check --dry-run` prints each Linux node's round trip (clock, facts, marker, listener, markers
    seen) from the very code that sends it: what a recording transport receives is that script."""
    inventory = load_inventory_text(INVENTORY, "hosts.yaml")
    session = FakeSession(inventory)
    run_preflight(session, inventory)
    for node in inventory.nodes:
        fake = session.fakes[node.name]
        shown = check_plan(node, fake, inventory)[0]
        assert _unique(fake.commands[0]) == _unique(fake.platform.wrap(shown)), node.name
