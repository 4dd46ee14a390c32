"""The step runner (orchestrator/runner.py): what it asks the nodes, and when it asks nothing.

A toy step that keeps a file's content as wanted: it reads the file (one read, as the login user),
plans a write when the content differs, and judges from the write's exit code. The nodes are the
recording transports of tests/recording.py (those of the dry-run tests), so each test sees exactly
which commands went where.
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
from tests.recording import Answer, RecordingSession, Sent

INVENTORY = """\
cluster: {name: lab, master: a}
nodes:
  - {name: a, host: 198.18.7.11, user: root}
  - {name: b, host: 198.18.7.12, user: trainer}
  - {name: c, host: 198.18.7.13, user: trainer}
"""


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


class Nodes(RecordingSession):
    """The toy's nodes: each holds a file (``content``), answers the step's read with it and takes
    ``write TEXT`` as a change; every command is recorded (``sent``)."""

    def __init__(self, sudo_password: Sequence[str] = (), **content: str) -> None:
        self.content = dict(content)
        inventory = load_inventory_text(INVENTORY, "hosts.yaml")
        super().__init__(
            inventory, {name: self._answer(name) for name in content}, sudo_password=sudo_password
        )

    def _answer(self, name: str) -> Answer:
        def answer(command: str) -> tuple[str, int]:
            if sections_asked(command):
                return answer_sections(command, {"file": (self.content[name], 0)}), 0
            if command.startswith("write "):
                self.content[name] = command.removeprefix("write ")
                return "", 0
            return "", 1

        return answer

    def sent(self, name: str) -> list[Sent]:
        return self.fakes[name].sent

    def counts(self) -> list[int]:
        return [len(self.sent(name)) for name in self.content]


def test_a_dry_run_reads_once_per_node_and_shows_the_plans_the_real_run_applies() -> None:
    dry_nodes, real_nodes = Nodes(a="x", b="y", c="x"), Nodes(a="x", b="y", c="x")
    dry = run_step(dry_nodes, KeepFile("x"), dry_run=True)
    real = run_step(real_nodes, KeepFile("x"))
    assert dry_nodes.counts() == [1, 1, 1]  # the read, nothing else
    assert [o.value.status for o in dry.outcomes if o.value] == ["unchanged", "written (would)", "unchanged"]
    # only b had something to change: it alone is contacted again, with exactly the planned command
    assert real_nodes.counts() == [1, 2, 1]
    planned = [a.script for a in dry.plans["b"].runs]
    assert [s.command for s in real_nodes.sent("b")[1:]] == planned == ["write x"]
    assert real_nodes.content["b"] == "x" and real.exit_code() == ExitCode.OK


def test_a_read_the_session_holds_is_not_asked_again_until_the_node_changed() -> None:
    session = Nodes(a="x", b="y", c="x")
    run_step(session, KeepFile("x"), dry_run=True)
    run_step(session, KeepFile("x"), dry_run=True)
    assert session.counts() == [1, 1, 1]  # the second run read nothing
    run_step(session, KeepFile("x"))  # b changes: what was read there is forgotten
    run_step(session, KeepFile("x"))
    assert session.counts() == [1, 3, 1]  # b: read, write, read again


def test_a_node_that_fails_is_named_and_the_others_go_on() -> None:
    nodes = Nodes(a="y", b="y", c="y", sudo_password=["c"])
    report = run_step(nodes, KeepFile("x", become=True))
    assert [o.ok for o in report.outcomes] == [True, True, False]
    error = report.outcomes[2].error
    assert isinstance(error, SudoPasswordRequiredError) and error.node == "c"
    assert nodes.content == {"a": "x", "b": "x", "c": "y"}
    assert report.exit_code() == ExitCode.NODES_FAILED


@pytest.mark.parametrize("selected", [["a"], ["b", "c"]])
def test_only_the_selected_nodes_are_read_and_reported(selected: Sequence[str]) -> None:
    session = Nodes(a="y", b="y", c="y")
    chosen = [n for n in session.inventory.nodes if n.name in selected]
    report = run_step(session, KeepFile("x"), chosen)
    assert [o.node for o in report.outcomes] == list(selected)
    assert [name for name in session.content if session.sent(name)] == list(selected)
