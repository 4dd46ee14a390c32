"""Training on every node in the foreground, below the CLI: every node's plan applied at once
(``steps.launch.run_node``), fail fast, and a run cut short made to leave nothing behind.

The CLI gives each node's output handler and shows the report; this module decides what happened:
which node failed first (the cause), which were stopped because of it, which lost their connection
(they stop themselves when the controller's heartbeats stop), and what the sweep found still running.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.errors import ConnectError
from orchestrator.executor import GroupResult
from orchestrator.steps.launch import run_node

if TYPE_CHECKING:
    from orchestrator.executor import Outcome
    from orchestrator.render import LaunchSpec, Renderer
    from orchestrator.session import Session
    from orchestrator.steps.launch import NodeRunResult
    from orchestrator.transports.base import OnLine

T = TypeVar("T")

#: seconds a process of a stopped run gets between TERM and KILL in the sweep
SWEEP_GRACE = 5.0


def failed_first(outcomes: list[Outcome[T]]) -> tuple[list[Outcome[T]], list[Outcome[T]]]:
    """(nodes that failed, the first to fail first; nodes stopped because of them). In DDP the
    others often fail moments after the first ("Connection closed by peer"), before the stop
    reaches them: the cause is the earliest, whatever its place in the inventory."""
    group = GroupResult(outcomes)
    return group.failed, group.cancelled


def sweep(session: Session, run_id: str, names: set[str]) -> list[Outcome[Any]]:
    """After a foreground run was cut short (Ctrl-C, or fail fast stopping the others): stop every
    process of the run still on a node, found by the run's marker as `bootstrap stop` does.

    Closing a node's connection stops the launcher's process group (TERM, KILL 5 s later) but
    torchrun starts its workers in sessions of their own: a worker that takes longer than that to
    handle TERM, or whose torchrun was killed before it could pass TERM on (a local node's group
    is killed at once), would be left training. The sweep runs on new connections, in parallel,
    with the same 5 s grace, on the nodes in ``names`` only: a node that refused the run id (it
    ran before there) holds another run's processes under that id."""
    from orchestrator.runs.control import stop_node

    nodes = [n for n in session.nodes if n.name in names]
    if not nodes:
        return []
    with session.reopened() as fresh:
        return fresh.map(
            lambda node, t: stop_node(node, t, run_id, grace=SWEEP_GRACE), step="sweep", nodes=nodes
        )


@dataclass
class TrainReport:
    run_id: str
    outcomes: list[Outcome[NodeRunResult]]
    started: set[str]  # nodes whose launcher was started: where the run can have processes
    failed: list[Outcome[NodeRunResult]] = field(default_factory=list)  # the first to fail first
    stopped: list[Outcome[NodeRunResult]] = field(default_factory=list)  # stopped because of them
    lost: set[str] = field(default_factory=set)  # started, then unreachable: they stop by themselves
    swept: list[Outcome[Any]] = field(default_factory=list)  # what the sweep found and stopped


def train(
    session: Session,
    specs: list[LaunchSpec],
    renderer: Renderer,
    outputs: Mapping[str, OnLine],
    started: set[str],
) -> TrainReport:
    """Every node's part of the run at once, fail fast; then, when some were stopped, the sweep.

    ``started`` is filled while the run goes (the caller keeps it: after a KeyboardInterrupt it
    calls ``sweep`` on those nodes itself)."""
    by_name = {s.node.name: s for s in specs}
    outcomes = session.map(
        lambda node, t: run_node(
            node, t, by_name[node.name], renderer=renderer, output=outputs[node.name], started=started
        ),
        step="train",
        fail_fast=True,
        nodes=[n for n in session.nodes if n.name in by_name],
    )
    failed, stopped = failed_first(outcomes)
    report = TrainReport(specs[0].run_id if specs else "", outcomes, started, failed, stopped)
    if stopped:
        # a node whose connection was lost stops its own run when our heartbeats stop (15 s): the
        # sweep would only wait for its connect timeout
        report.lost = {o.node for o in outcomes if isinstance(o.error, ConnectError)} & started
        report.swept = sweep(session, report.run_id, started - report.lost)
    else:
        report.swept = leftovers(session, report.run_id, outcomes, started)
    return report


def leftovers(
    session: Session, run_id: str, outcomes: list[Outcome[NodeRunResult]], started: set[str]
) -> list[Outcome[Any]]:
    """After a run that ended by itself: what its ranks started and did not wait for (a server, a
    process in a session of its own) still carries the run's marker and would hold GPUs and ports
    without anyone knowing: stopped as `bootstrap stop` does, on the session's own connections (no
    new login). The run keeps its exit code (the stop writes ``stopped`` only before one exists)."""
    from orchestrator.runs.control import stop_node

    ended = {o.node for o in outcomes if not isinstance(o.error, ConnectError)} & started
    nodes = [n for n in session.nodes if n.name in ended]
    if not nodes:
        return []
    return session.map(
        lambda node, t: stop_node(node, t, run_id, grace=SWEEP_GRACE), step="leftovers", nodes=nodes
    )
