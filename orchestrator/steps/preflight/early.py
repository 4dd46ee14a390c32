"""The main pipeline's first command on each Linux node: the reads of every step it will run, a clock
sample, and on the nodes it checks the beginning of the preflight's round trip.

`bootstrap check` sends each Linux node one round trip: its facts, a clock sample, its workdir marker,
then its reachability listener, which runs until every peer's connector reached it (rounds.py). In the
main pipeline the first command on each node is the runner's read (``runner.gather_reads`` over the
reads of the steps the pipeline runs, each under the key its step reads by; orchestrator/pipeline.py)
sent by :func:`first_round`: a clock sample first (the time step's offsets and the preflight's clock
check use it), the reads, then on a checked node the marker, listener, markers seen.
The listener waits through the sync, firewall and time phases (it listens on every address of the
node, so a firewall opened after it started lets the connectors in all the same), and the preflight
*adopts* it: its own round trip is then only the connectors'. One command per node fewer.

The preflight adopts a node's early round when it belongs to the mesh it plans (same nodes, master
and port), its listener still runs and has time left (:data:`MAX_AGE`). Otherwise (the pipeline took
long: an environment sync that installs torch), the early round is ended and the preflight starts its
own. A phase that changed the node's Python (the environment sync) made the session forget its facts:
the preflight then gathers them again, in a round trip of their own. A time step that changed the
node's clock made the session forget its clock sample: the early round's sample is not used then (the
connectors sample every clock again). Early rounds nobody adopted (the pipeline stopped before the
preflight) are ended by :func:`end_early_rounds`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.steps.preflight.reachability import (
    LISTEN_HOLD,
    RUN_SLACK,
    START_TIMEOUT,
    MeshPlan,
    in_threads,
)
from orchestrator.steps.preflight.rounds import (
    CLOCK,
    FACTS_TIMEOUT,
    MARK,
    MARKS,
    NodeRound,
    list_command,
    mark_command,
)

if TYPE_CHECKING:
    from orchestrator.facts.base import ReadScript, Sections
    from orchestrator.inventory import Inventory, Node
    from orchestrator.runner import Send
    from orchestrator.session import Session
    from orchestrator.transports import Transport

__all__ = [
    "EARLY",
    "MAX_AGE",
    "EarlyRound",
    "adopt",
    "end_early_rounds",
    "end_rounds",
    "first_round",
    "mesh_plan",
    "take",
]

#: ``Session.remember`` key of a node's :class:`EarlyRound`
EARLY = "preflight.early_round"
#: the oldest early round the preflight adopts (seconds since it was sent): its listener waits
#: ``FACTS_TIMEOUT + LISTEN_HOLD`` in all, and the mesh needs up to ``LISTEN_HOLD`` of that
MAX_AGE = FACTS_TIMEOUT


@dataclass(frozen=True)
class EarlyRound:
    """A node's preflight round trip, sent before the preflight: its plan, marker token and round."""

    plan: MeshPlan
    token: str
    round: NodeRound


def mesh_plan(inventory: Inventory, names: tuple[str, ...]) -> MeshPlan | None:
    """The reachability mesh over ``names`` (None without the master: nobody to measure against)."""
    master = inventory.master_node
    if master.name not in names:
        return None
    return MeshPlan(names, master.name, inventory.cluster.port, hold=FACTS_TIMEOUT + LISTEN_HOLD)


def node_round(
    node: Node, transport: Transport, script: ReadScript, plan: MeshPlan | None, token: str | None
) -> NodeRound:
    """The preflight's round trip on a Linux node, not started: a clock sample, the reads of
    ``script``, then with ``plan`` the workdir marker (``token``; None: no marker), the node's
    listener and the markers it sees. What `check` sends, and what its dry run shows."""
    from orchestrator.runs.layout import workdir_for
    from orchestrator.steps.node_facts import interpreter_for
    from orchestrator.steps.preflight.shared_fs import MARKER_DIR

    platform = transport.platform
    before, after = list(script.top), []
    listener = None
    posix = platform.as_posix()
    if plan is not None and posix is not None:
        listener = plan.listener(node.name, transport, interpreter_for(node))
        if token is not None:
            workdir = workdir_for(node)
            before.append((MARK, mark_command(posix, workdir, MARKER_DIR, node.name, token)))
            after = [(MARKS, list_command(posix, workdir, MARKER_DIR))]
    timeout = max([FACTS_TIMEOUT, *(r.timeout for r, _ in script.reads)])
    return NodeRound(node.name, transport, [], listener, before=before, after=after, facts_timeout=timeout)


def first_round(session: Session, plan: MeshPlan | None, checked: set[str], *, markers: bool = True) -> Send:
    """How the preflight's round trip is sent to a Linux node (``runner.Send``; the main pipeline's
    first command, or `check`'s own): a clock sample (kept under ``CLOCK``, replacing an older one),
    the reads, and on a node in ``checked`` (with ``plan``) the workdir marker (``markers``), its
    listener, then the markers it sees (an :class:`EarlyRound` the preflight adopts). Answers once the
    reads' sections are in; the listener goes on."""
    from orchestrator.steps.preflight.shared_fs import new_token
    from orchestrator.transports import Result

    def send(node: Node, transport: Transport, script: ReadScript) -> tuple[Sections, Result]:
        meshed = plan if node.name in checked else None
        token = new_token() if meshed is not None and markers else None
        done = node_round(node, transport, script, meshed, token)
        if plan is not None and done.listener is not None:
            done.start()
            early = EarlyRound(plan, token or "", done)
            session.remember(node.name, EARLY, lambda: early)
        else:
            done.run()
        done.gathered()  # raises what the transport raised: the node is unreachable
        clock = done.clock()
        if clock is not None:  # the newest sample stands for the node's clock
            session.forget(node.name, CLOCK)
            session.remember(node.name, CLOCK, lambda: clock)
        found = {name: answer for name, _ in script.top if (answer := done.section(name)) is not None}
        # a command still running (the listener) has no result yet: the reads answered already
        result = done.result or Result(node.name, "", 0, "", "", 0.0)
        return found, result

    return send


def _usable(early: EarlyRound) -> bool:
    listener = early.round.listener
    started = early.round.started_at
    return (
        listener is not None
        and not early.round.ended.is_set()
        and started is not None
        and time.time() - started < MAX_AGE
    )


def adopt(session: Session, names: tuple[str, ...], master: str, port: int) -> MeshPlan | None:
    """The plan of the early rounds of this session's nodes when they belong to the mesh over
    ``names`` (None: there are none, or they were planned for another mesh: those are ended)."""
    found = {
        node.name: early
        for node in session.nodes
        if isinstance(early := session.recall(node.name, EARLY), EarlyRound)
    }
    plans = {id(e.plan): e.plan for e in found.values()}
    if len(plans) == 1:
        plan = next(iter(plans.values()))
        if (plan.names, plan.master, plan.port) == (names, master, port):
            return plan
    if found:
        end_early_rounds(session)
    return None


def take(session: Session, name: str, plan: MeshPlan) -> EarlyRound | None:
    """Node ``name``'s early round for ``plan`` when the preflight can use it (the session forgets
    it either way); an early round that is too old or ended is ended here."""
    early = session.recall(name, EARLY)
    session.forget(name, EARLY)
    if not isinstance(early, EarlyRound) or early.plan is not plan:
        return None
    if _usable(early):
        return early
    end_rounds({name: early.round})
    return None


def end_rounds(rounds: dict[str, NodeRound]) -> None:
    """Every round over: their listeners ended by themselves or were stopped by the reachability
    check; those nobody connected to (the master never answered) are stopped here."""
    left = [r.listener for r in rounds.values() if r.listener is not None and not r.ended.is_set()]
    deadline = time.monotonic() + START_TIMEOUT
    for listener in left:  # a listener is stopped by its pid, which "ready" tells
        listener.reported.wait(max(0.0, deadline - time.monotonic()))
    in_threads([listener.stop for listener in left if not listener.ended.is_set()], RUN_SLACK)
    deadline = time.monotonic() + RUN_SLACK
    for node_round in rounds.values():
        node_round.ended.wait(max(0.0, deadline - time.monotonic()))


def end_early_rounds(session: Session) -> None:
    """End the early rounds of the session's nodes that no preflight adopted."""
    left: dict[str, NodeRound] = {}
    for node in session.nodes:
        early = session.recall(node.name, EARLY)
        session.forget(node.name, EARLY)
        if isinstance(early, EarlyRound):
            left[node.name] = early.round
    if left:
        end_rounds(left)
