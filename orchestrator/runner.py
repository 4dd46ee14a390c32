"""The one runner of steps (orchestrator/steps/contract.py): reads, decisions, plans, verdicts.

For a step over the selected nodes:

1. **Reads**, ONE command per node for every read it needs that the session does not hold yet
   (:func:`gather_reads`; reads as root ride in it nested, facts/base.py ``read_script``). Each value
   is kept in the session under its read's key: the pipeline's first round trip (the reads of every
   step it will run, asked at once: orchestrator/pipeline.py), or another step, may have read it.
2. **Context**: the step decides for the whole cluster from every node's values.
3. **Plans**: one :class:`~orchestrator.plans.NodePlan` per node. ``dry_run`` stops here: the report
   carries the plans, which is what ``--dry-run`` prints.
4. **Apply**: in parallel, only on the nodes whose plan has actions (the others are not contacted
   again), in the waves the step asks for (the time master before its workers); what the step says
   a changed node's reads were (``Step.forgets``) is forgotten there, since it changed.
5. **Verdicts**: the step judges each node from its plan's results; a node whose read, plan, apply
   or verdict failed carries that error. One :class:`~orchestrator.steps.contract.Report` comes back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from orchestrator.errors import BootstrapError, CancelledError, ConnectError
from orchestrator.executor import GroupResult, NodeEvent, Outcome
from orchestrator.facts import CONNECTED
from orchestrator.facts.base import AS_ROOT, ReadScript, Sections, parse_reads, read_script, split_sections
from orchestrator.plans import NodePlan, apply
from orchestrator.records import new_nonce
from orchestrator.steps.contract import C, ClusterFacts, Read, Report, Step, V
from orchestrator.steps.root import sudo_error

if TYPE_CHECKING:
    from orchestrator.inventory import Node
    from orchestrator.session import Session
    from orchestrator.transports import Result, Transport

__all__ = ["NodeReads", "Reach", "Send", "converge", "gather_reads", "read_node", "run_step"]

R = TypeVar("R")

#: how a node's read script is sent: ``send(node, transport, script)`` returns the top-level sections
#: as they came and the round trip's result. The default runs the script and waits; the preflight's
#: round trip carries more after the reads (its listener: steps/preflight/early.py) and answers as
#: soon as the reads' sections are in, while its command goes on.
Send = Callable[["Node", "Transport", ReadScript], tuple[Sections, "Result"]]


@dataclass
class NodeReads:
    """What was read from one node: each read's value by key, and the first read that failed (the
    node's values from its other reads stay usable: the master's route, when its root read failed);
    ``connect_seconds``: how long connecting took when this read connected (None: it was connected)."""

    values: dict[str, Any] = field(default_factory=dict)
    error: BootstrapError | None = None
    connect_seconds: float | None = None


@dataclass
class Reach:
    """How a command reaches its nodes, given by the CLI: ``connect(nodes)`` is a session on them
    (the main pipeline's one session narrowed to them, or the command's own, closed after it) and
    ``progress(names, step)`` a display of the step's progress, yielding the executor's event
    callback. A Ctrl-C or SIGTERM is not caught here: it ends the command on the CLI's one exit path."""

    connect: Callable[[list[Node]], AbstractContextManager[Session]]
    progress: Callable[[list[str], str], AbstractContextManager[Callable[[NodeEvent], None]]]
    #: a line for the user while the work goes on: ``say(level, text)``, level one of "note", "info",
    #: "warn", "error" (nothing by default)
    say: Callable[[str, str], None] = field(default=lambda level, text: None)
    #: what shows node lines as they come (``lines(names)``: a sink with ``write(node, line)`` and
    #: ``write_rank(node, rank, line)``): the ranks of a launch; a build's or a worker's lines with
    #: ``-v``. None: they are only logged
    lines: Callable[[list[str]], Any] | None = None
    #: sync's per-node progress board (what each node is doing now: steps/sync.py ``Board``)
    board: Callable[[list[str], str], AbstractContextManager[Any]] | None = None
    #: a run's output handler per node: ``outputs(labels, log, on_block, sample_nonce)`` (each
    #: node's first global rank and rank count; the run's log here; the page's block callback), each
    #: writing the log and showing the node's ranks labelled. None: nothing to show them with
    outputs: Callable[..., Mapping[str, Any]] | None = None
    #: the live dashboard watching this work (orchestrator/dashboard/model.py ``LiveRun``), if any
    live: Any = None

    def within(self, nodes: list[Node], step: str, work: Callable[[Session], R]) -> R:
        """``work`` on a session over ``nodes``, the progress of ``step`` shown meanwhile: the session
        first (one of the command's own asks for passwords), then the display."""
        with self.connect(nodes) as on, self.progress([n.name for n in nodes], step) as on_event:
            on.executor.on_event = on_event
            return work(on)


def _send(node: Node, transport: Transport, plan: ReadScript) -> tuple[Sections, Result]:
    token = new_nonce()
    timeout = max(r.timeout for r, _ in plan.reads)
    result = transport.run(plan.script(token), become=plan.become, timeout=timeout)
    return split_sections(result.stdout, token), result


def read_node(
    session: Session, node: Node, transport: Transport, reads: Sequence[Read], *, send: Send | None = None
) -> NodeReads:
    """The value of every read of ``node`` (by key): what the session holds, the rest read now in ONE
    command (the root reads nested in it) and kept in the session (a ``fresh`` read is always asked,
    and not kept). A node that cannot be reached raises; a read that fails is the result's ``error``
    (a refused sudo: one error naming the node and the fix). ``send``: see :data:`Send`."""
    out, missing = _held(session, node, reads)
    if not missing and send is None:
        return out
    start = time.monotonic()
    transport.connect()
    out.connect_seconds = seconds = time.monotonic() - start
    session.remember(node.name, CONNECTED, lambda: seconds)  # the first connection's, for `check`
    platform = transport.platform
    plan = read_script(platform, missing)
    found, result = (send or _send)(node, transport, plan)
    refused = _refused(node, plan, found, result)
    for read, value in parse_reads(plan, found, result):
        if read.become and refused is not None:
            out.error = out.error or refused
        elif isinstance(value, (ConnectError, CancelledError)):
            raise value
        elif isinstance(value, BootstrapError):
            value.node = value.node or node.name
            out.error = out.error or value
        elif isinstance(value, Exception):
            raise value
        else:
            if not read.fresh:
                _keep(session, node.name, read.key, value)
            out.values[read.key] = value
    return out


def _keep(session: Session, node: str, key: str, value: Any) -> None:
    """Hold ``value`` for ``node`` under ``key`` (the first value read stays)."""
    session.remember(node, key, lambda: value)


def _refused(node: Node, plan: ReadScript, found: Sections, result: Result) -> BootstrapError | None:
    """The error of a node whose sudo wanted a password, for its root reads (None: it did not)."""
    root = [r for r, _ in plan.reads if r.become]
    if not root:
        return None
    platform = plan.platform
    if plan.become:
        said = "" if result.ok else result.stderr
    else:
        output, code = found.get(AS_ROOT, ("", 0))
        said = output if code != 0 else ""
    if not said or not platform.sudo_refused(said):
        return None
    return sudo_error(node, result, root[0].what or "reading the node")


def gather_reads(
    session: Session,
    reads: Mapping[str, Sequence[Read]],
    *,
    step: str,
    send: Mapping[str, Send] | None = None,
) -> GroupResult[NodeReads]:
    """:func:`read_node` on every node named in ``reads``, in parallel (no round trip for a node
    whose values the session holds already, unless ``send`` names it: that round trip carries more).
    A node whose every value is held is not part of the fan-out at all: no progress line says it
    was read again."""
    nodes = [n for n in session.inventory.nodes if n.name in reads]
    if not nodes:
        return GroupResult()
    senders = send or {}
    dead = set(session.unreachable())  # its map says so, whatever the session holds of it
    held: dict[str, NodeReads] = {}
    for node in nodes:
        values, missing = _held(session, node, reads[node.name])
        if not missing and node.name not in senders and node.name not in dead:
            held[node.name] = values
    asked = [n for n in nodes if n.name not in held]
    mapped = (
        session.map(
            lambda n, t: read_node(session, n, t, reads[n.name], send=senders.get(n.name)),
            step=step,
            nodes=asked,
            connect=False,
        )
        if asked
        else []
    )
    answered = {o.node: o for o in mapped}
    return GroupResult(
        answered[n.name] if n.name in answered else Outcome(n.name, held[n.name], None, 0.0) for n in nodes
    )


def _held(session: Session, node: Node, reads: Sequence[Read]) -> tuple[NodeReads, list[Read]]:
    """The values of ``reads`` the session holds for ``node``, and the reads it must ask (the ones
    it does not hold, and every ``fresh`` one)."""
    out, missing = NodeReads(), []
    keys = set(session.keys(node.name))
    for read in reads:
        if read.key in keys and not read.fresh:
            out.values[read.key] = session.recall(node.name, read.key)
        else:
            missing.append(read)
    return out, missing


def run_step(
    session: Session,
    step: Step[C, V],
    selected: Sequence[Node] | None = None,
    *,
    dry_run: bool = False,
) -> Report[V]:
    """``step`` on ``selected`` (default: the session's nodes): see the module docstring."""
    chosen = list(session.nodes if selected is None else selected)
    scoped = step.scope(chosen)
    reads = {n.name: step.reads(n) for n in scoped}
    read = gather_reads(session, {k: v for k, v in reads.items() if v}, step=f"read {step.name}")
    found = ClusterFacts(
        values={n.name: {} for n in scoped},
        peers={n.name: session.peer_address(n.name) for n in session.inventory.nodes},
    )
    durations: dict[str, float] = {}
    for o in read:
        durations[o.node] = o.duration
        if o.value is not None:
            found.values[o.node] = o.value.values
        error = o.error or (o.value.error if o.value is not None else None)
        if error is not None:
            found.failed[o.node] = error
    context = step.context(found)
    outcomes: dict[str, Outcome[V]] = {}
    plans: dict[str, NodePlan] = {}
    for node in chosen:
        if node.name in found.failed:
            error = found.failed[node.name]
            outcomes[node.name] = Outcome(node.name, None, error, durations.get(node.name, 0.0))
            continue
        try:
            plans[node.name] = step.plan(node, found.values.get(node.name, {}), context)
        except BootstrapError as exc:
            exc.node = exc.node or node.name
            outcomes[node.name] = Outcome(node.name, None, exc, 0.0)
    busy = [n for n in chosen if n.name in plans and plans[n.name].actions and not dry_run]
    for node in chosen:
        if node.name in plans and node not in busy:
            outcomes[node.name] = _judged(step, node, plans[node.name], None if dry_run else [], context)

    def change(node: Node, transport: Transport) -> V:
        try:
            return converge(step, node, transport, plans[node.name], context)
        finally:  # what was read there is history now, also after a failed change
            keys = step.forgets(node)
            if keys:  # (no keys would forget everything the session holds of it)
                session.forget(node.name, *keys)

    for wave in step.waves(busy, context) if busy else []:  # each wave in parallel, in their order
        for done in session.map(change, step=step.name, nodes=wave):
            outcomes[done.node] = done
    for name, duration in durations.items():
        if name in outcomes:
            outcomes[name].duration += duration
    return Report(
        step=step.name,
        outcomes=GroupResult(outcomes[n.name] for n in chosen),
        plans=plans,
        warnings=step.warnings(context),
        data=step.data(context),
        dry_run=dry_run,
        context=context,
        failing=[n.name for n in chosen if (v := outcomes[n.name].value) is not None and step.failed(v)],
    )


def converge(step: Step[C, V], node: Node, transport: Transport, plan: NodePlan, context: C) -> V:
    """Apply one node's plan over its transport and judge the results: the runner's work on a node
    whose plan has actions."""
    return step.judge(node, plan, apply(plan, transport), context)


def _judged(
    step: Step[C, V], node: Node, plan: NodePlan, results: list[Any] | None, context: C
) -> Outcome[V]:
    """The verdict of a node that is not contacted (dry run, nothing to change)."""
    start = time.monotonic()
    try:
        value = step.judge(node, plan, results, context)
    except BootstrapError as exc:
        exc.node = exc.node or node.name
        return Outcome(node.name, None, exc, time.monotonic() - start, time.monotonic())
    return Outcome(node.name, value, None, time.monotonic() - start, time.monotonic())
