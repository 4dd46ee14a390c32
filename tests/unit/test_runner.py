"""The step runner (orchestrator/runner.py): what it asks the nodes, and when it asks nothing.

A toy step that keeps a file's content as wanted: it reads the file (one read, as the login user),
plans a write when the content differs, and judges from the write's exit code. The nodes are
recording transports answering from a dict, so each test sees exactly which commands went where.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import CommandFailedError, ExitCode, SudoPasswordRequiredError
from orchestrator.inventory import Inventory, Node, PasswordResolver, load_inventory_text
from orchestrator.plans import NodePlan, Run
from orchestrator.platforms import Platform, platform_for_node
from orchestrator.runner import run_step
from orchestrator.session import Session
from orchestrator.steps.contract import ClusterFacts, Read, Sections, Step
from orchestrator.transports import Result, SSHOptions, Transport
from orchestrator.transports.base import OnLine
from tests.noderecords import answer_sections, sections_asked

INVENTORY = """\
cluster: {name: lab, master: a}
nodes:
  - {name: a, host: 198.18.7.11, user: root}
  - {name: b, host: 198.18.7.12, user: trainer}
  - {name: c, host: 198.18.7.13, user: trainer}
"""


@dataclass
class Held:  # what one fake node holds: the file's content, and whether sudo asks a password
    content: str
    sudo_password: bool = False
    sent: list[tuple[str, bool]] = field(default_factory=list)


class FakeNode(Transport):
    kind = "ssh"

    def __init__(self, name: str, state: Held, platform: Platform) -> None:
        super().__init__(name, platform)
        self.state = state

    def connect(self) -> None:
        pass

    def run(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        become: bool = False,
        keep_lines: int | None = None,
    ) -> Result:
        self.state.sent.append((command, become))
        if become and self.state.sudo_password:
            return Result(self.node_name, command, 1, "", "sudo: a password is required\n", 0.0)
        if sections_asked(command):
            return Result(
                self.node_name,
                command,
                0,
                answer_sections(command, {"file": (self.state.content, 0)}),
                "",
                0.0,
            )
        if command.startswith("write "):
            self.state.content = command.removeprefix("write ")
            return Result(self.node_name, command, 0, "", "", 0.0)
        return Result(self.node_name, command, 1, "", "unknown command", 0.0)

    def run_raw(self, script: str, **kwargs: Any) -> Result:
        raise AssertionError("the runner sends commands through Transport.run")

    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        raise AssertionError("the toy step uploads nothing")

    def get(self, remote: str, local: Path) -> None:
        raise AssertionError("the toy step downloads nothing")

    def close(self) -> None:
        pass


class FakeSession(Session):
    def __init__(self, inventory: Inventory, states: Mapping[str, Held]) -> None:
        super().__init__(
            inventory, list(inventory.nodes), ssh=SSHOptions(), passwords=PasswordResolver(prompt=None)
        )
        self.fakes = {n.name: FakeNode(n.name, states[n.name], platform_for_node(n)) for n in inventory.nodes}

    def transport(self, node: Node) -> Transport:
        return self.fakes[node.name]


@dataclass
class Kept:
    status: str

    def public_dict(self) -> dict[str, Any]:
        return {"status": self.status}


class KeepFile(Step[list[str], Kept]):
    """The file must hold ``wanted``; reads it as root when ``become``."""

    name = "keep"

    def __init__(self, wanted: str, *, become: bool = False) -> None:
        self.wanted, self.become = wanted, become

    def reads(self, node: Node) -> list[Read]:
        def parse(sections: Sections, ran: Result) -> str:
            if "file" not in sections:
                raise CommandFailedError("no answer", node=node.name)
            return sections["file"][0]

        return [Read("keep.file", lambda p: [("file", "cat file")], parse, become=self.become)]

    def context(self, found: ClusterFacts) -> list[str]:
        return sorted(found.values)

    def plan(self, node: Node, facts: Mapping[str, Any], context: list[str]) -> NodePlan:
        if facts["keep.file"] == self.wanted:
            return NodePlan(node.name, detail="unchanged")
        return NodePlan(node.name, [Run(f"write {self.wanted}", what="the file")], detail="written")

    def judge(self, node: Node, plan: NodePlan, results: list[Result] | None, context: list[str]) -> Kept:
        if results and not results[0].ok:
            raise CommandFailedError("the write failed", node=node.name)
        return Kept(plan.detail + (" (would)" if results is None and plan.actions else ""))


def states(**content: str) -> dict[str, Held]:
    return {name: Held(text) for name, text in content.items()}


def session_of(nodes: dict[str, Held]) -> FakeSession:
    return FakeSession(load_inventory_text(INVENTORY, "hosts.yaml"), nodes)


def test_a_dry_run_reads_once_per_node_and_shows_the_plans_the_real_run_applies() -> None:
    dry_nodes, real_nodes = states(a="x", b="y", c="x"), states(a="x", b="y", c="x")
    dry = run_step(session_of(dry_nodes), KeepFile("x"), dry_run=True)
    real = run_step(session_of(real_nodes), KeepFile("x"))
    assert [len(n.sent) for n in dry_nodes.values()] == [1, 1, 1]  # the read, nothing else
    assert [o.value.status for o in dry.outcomes if o.value] == ["unchanged", "written (would)", "unchanged"]
    # only b had something to change: it alone is contacted again, with exactly the planned command
    assert [len(n.sent) for n in real_nodes.values()] == [1, 2, 1]
    planned = [a.script for a in dry.plans["b"].runs]
    assert [cmd for cmd, _ in real_nodes["b"].sent[1:]] == planned == ["write x"]
    assert real_nodes["b"].content == "x" and real.exit_code() == ExitCode.OK


def test_a_read_the_session_holds_is_not_asked_again_until_the_node_changed() -> None:
    nodes = states(a="x", b="y", c="x")
    session = session_of(nodes)
    run_step(session, KeepFile("x"), dry_run=True)
    run_step(session, KeepFile("x"), dry_run=True)
    assert [len(n.sent) for n in nodes.values()] == [1, 1, 1]  # the second run read nothing
    run_step(session, KeepFile("x"))  # b changes: what was read there is forgotten
    run_step(session, KeepFile("x"))
    assert [len(n.sent) for n in nodes.values()] == [1, 3, 1]  # b: read, write, read again


def test_a_node_that_fails_is_named_and_the_others_go_on() -> None:
    nodes = states(a="y", b="y", c="y")
    nodes["c"].sudo_password = True
    report = run_step(session_of(nodes), KeepFile("x", become=True))
    assert [o.ok for o in report.outcomes] == [True, True, False]
    error = report.outcomes[2].error
    assert isinstance(error, SudoPasswordRequiredError) and error.node == "c"
    assert nodes["a"].content == nodes["b"].content == "x" and nodes["c"].content == "y"
    assert report.exit_code() == ExitCode.NODES_FAILED


@pytest.mark.parametrize("selected", [["a"], ["b", "c"]])
def test_only_the_selected_nodes_are_read_and_reported(selected: Sequence[str]) -> None:
    nodes = states(a="y", b="y", c="y")
    session = session_of(nodes)
    chosen = [n for n in session.inventory.nodes if n.name in selected]
    report = run_step(session, KeepFile("x"), chosen)
    assert [o.node for o in report.outcomes] == list(selected)
    assert [name for name, n in nodes.items() if n.sent] == list(selected)


class KeepTwo(KeepFile):
    """KeepFile that also reads the file's owner, as root (a step reading as both users)."""

    def reads(self, node: Node) -> list[Read]:
        def owner(sections: Sections, ran: Result) -> str:
            if "owner" not in sections:
                raise CommandFailedError("no owner", node=node.name)
            return sections["owner"][0]

        as_root = Read("keep.owner", lambda p: [("owner", "stat -c %U file")], owner, become=True, what="x")
        return [*super().reads(node), as_root]


class NestedNode(FakeNode):
    """Answers the root sections nested in the login user's command: sudo -n's refusal is that
    section's output (its stderr joined to it)."""

    def run(self, command: str, **kwargs: Any) -> Result:  # type: ignore[override]
        self.state.sent.append((command, bool(kwargs.get("become"))))
        refused = {"as_root": ("sudo: a password is required", 1)} if self.state.sudo_password else {}
        answers = {"file": (self.state.content, 0), "owner": ("root", 0), **refused}
        return Result(self.node_name, command, 0, answer_sections(command, answers), "", 0.0)


def test_a_node_read_as_the_login_user_and_as_root_is_asked_one_command() -> None:
    """The root reads ride nested in the login user's command (one `sudo -n` section): one command
    per node; a node whose sudo wants a password is named with the fix, its other reads kept."""
    nodes = states(a="x", b="x", c="x")
    nodes["c"].sudo_password = True
    session = session_of(nodes)
    session.fakes = {
        n.name: NestedNode(n.name, nodes[n.name], platform_for_node(n)) for n in session.inventory.nodes
    }
    report = run_step(session, KeepTwo("x"), dry_run=True)
    assert [len(n.sent) for n in nodes.values()] == [1, 1, 1]
    assert not any(become for n in nodes.values() for _, become in n.sent)
    assert [o.ok for o in report.outcomes] == [True, True, False]
    error = report.outcomes[2].error
    assert isinstance(error, SudoPasswordRequiredError) and error.node == "c"
    assert session.recall("c", "keep.file") == "x" and session.recall("a", "keep.owner") == "root"


def test_a_section_two_reads_ask_alike_is_sent_once() -> None:
    class Twice(KeepFile):
        def reads(self, node: Node) -> list[Read]:
            [first] = super().reads(node)
            return [first, Read("keep.again", first.sections, first.parse)]

    nodes = states(a="x", b="y", c="x")
    session = session_of(nodes)
    run_step(session, Twice("x"), dry_run=True)
    [(command, _)] = nodes["b"].sent
    assert [name for _, name in sections_asked(command)] == ["file"]
    assert session.recall("b", "keep.again") == session.recall("b", "keep.file") == "y"


def test_a_section_asked_as_root_and_as_the_login_user_alike_is_asked_once_as_the_user() -> None:
    class Both(KeepFile):
        def reads(self, node: Node) -> list[Read]:
            [first] = super().reads(node)
            return [first, Read("keep.root", first.sections, first.parse, become=True)]

    nodes = states(a="x", b="y", c="x")
    session = session_of(nodes)
    session.fakes = {
        n.name: NestedNode(n.name, nodes[n.name], platform_for_node(n)) for n in session.inventory.nodes
    }
    run_step(session, Both("x"), dry_run=True)
    [(command, become)] = nodes["b"].sent
    assert not become and [name for _, name in sections_asked(command)] == ["file"]
    assert session.recall("b", "keep.root") == session.recall("b", "keep.file") == "y"
