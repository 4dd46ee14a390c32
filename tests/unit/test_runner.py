"""The step runner (orchestrator/runner.py): what it asks the nodes, and when it asks nothing.

A toy step that keeps a file's content as wanted: it reads the file (one read, as the login user),
plans a write when the content differs, and judges from the write's exit code. The nodes are
recording transports answering from a dict, so each test sees exactly which commands went where.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.errors import CommandFailedError, ExitCode, SudoPasswordRequiredError
from orchestrator.inventory import Node, load_inventory_text
from orchestrator.plans import NodePlan, Run
from orchestrator.runner import run_step
from orchestrator.steps.contract import ClusterFacts, Read, Sections, Step
from orchestrator.transports import Result
from tests.noderecords import answer_sections, sections_asked
from tests.recording import Answer, RecordingNode, RecordingSession

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
    node: RecordingNode | None = None  # the recording transport answering for it

    @property
    def sent(self) -> list[tuple[str, bool]]:
        """Every command the node received, with whether it was sent as root."""
        return [(s.command, s.become) for s in self.node.sent] if self.node is not None else []


def _answer(held: Held, *, nested: bool) -> Answer:
    """The node's shell: the read's sections from ``held`` (``nested``: also the root reads nested in
    the login user's command, sudo -n's refusal being that section's output), ``write X`` sets it."""

    def answer(command: str) -> tuple[str, int]:
        if sections_asked(command):
            answers = {"file": (held.content, 0)}
            if nested:
                answers["owner"] = ("root", 0)
                answers.update({"as_root": ("sudo: a password is required", 1)} if held.sudo_password else {})
            return answer_sections(command, answers), 0
        if command.startswith("write "):
            held.content = command.removeprefix("write ")
            return "", 0
        return "unknown command", 1

    return answer


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


def session_of(nodes: dict[str, Held], *, nested: bool = False) -> RecordingSession:
    """Recording nodes answering from ``nodes``; ``nested``: root reads ride in the user's command."""
    refusing = [] if nested else [name for name, held in nodes.items() if held.sudo_password]
    answers = {name: _answer(held, nested=nested) for name, held in nodes.items()}
    session = RecordingSession(load_inventory_text(INVENTORY, "hosts.yaml"), answers, sudo_password=refusing)
    for name, held in nodes.items():
        held.node = session.fakes[name]
    return session


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


def test_a_node_read_as_the_login_user_and_as_root_is_asked_one_command() -> None:
    """The root reads ride nested in the login user's command (one `sudo -n` section): one command
    per node; a node whose sudo wants a password is named with the fix, its other reads kept."""
    nodes = states(a="x", b="x", c="x")
    nodes["c"].sudo_password = True
    session = session_of(nodes, nested=True)
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
    session = session_of(nodes, nested=True)
    run_step(session, Both("x"), dry_run=True)
    [(command, become)] = nodes["b"].sent
    assert not become and [name for _, name in sections_asked(command)] == ["file"]
    assert session.recall("b", "keep.root") == session.recall("b", "keep.file") == "y"
