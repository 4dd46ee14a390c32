"""The one runner of steps (orchestrator/steps/contract.py): reads, decisions, plans, verdicts.

For a step over the selected nodes:

1. **Reads**, one round trip per node for every read it needs that the session does not hold yet
   (:func:`gather_reads`; a second one only when some reads run as root and others do not). Each value
   is kept in the session under its read's key: the pipeline's first round trip, or another step, may
   have read it already.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.errors import BootstrapError, CancelledError, ConnectError
from orchestrator.executor import GroupResult, Outcome
from orchestrator.facts.base import split_sections
from orchestrator.plans import NodePlan, apply
from orchestrator.records import new_nonce
from orchestrator.steps.contract import C, ClusterFacts, Read, Report, Step, V
from orchestrator.steps.root import sudo_error

if TYPE_CHECKING:
    from orchestrator.inventory import Node
    from orchestrator.session import Session
    from orchestrator.transports import Transport

__all__ = ["NodeReads", "converge", "gather_reads", "read_node", "run_step"]


@dataclass
class NodeReads:
    """What was read from one node: each read's value by key, and the first read that failed (the
    node's values from its other reads stay usable: the master's route, when its root read failed)."""

    values: dict[str, Any] = field(default_factory=dict)
    error: BootstrapError | None = None


def read_node(session: Session, node: Node, transport: Transport, reads: Sequence[Read]) -> NodeReads:
    """The value of every read of ``node`` (by key): what the session holds, the rest read now in one
    script (one as the login user, one as root where needed) and kept in the session (a ``fresh``
    read is always asked, and not kept). A node that cannot be reached raises; a read that fails is
    the result's ``error``."""
    out = NodeReads()
    missing: list[Read] = []
    held = set(session.keys(node.name))
    for read in reads:
        if read.key in held and not read.fresh:
            out.values[read.key] = session.recall(node.name, read.key)
        else:
            missing.append(read)
    for become in (False, True):
        group = [r for r in missing if r.become == become]
        if not group:
            continue
        transport.connect()
        try:
            _read_group(session, node, transport, group, become, out.values)
        except (ConnectError, CancelledError):
            raise
        except BootstrapError as exc:
            exc.node = exc.node or node.name
            out.error = out.error or exc
    return out


def _read_group(
    session: Session,
    node: Node,
    transport: Transport,
    group: list[Read],
    become: bool,
    values: dict[str, Any],
) -> None:
    platform = transport.platform
    asked = [(r, r.sections(platform)) for r in group]
    names = [name for _, sections in asked for name, _ in sections]
    assert len(names) == len(set(names)), f"two reads of one round trip share a section name: {names}"
    token = new_nonce()
    script = platform.sectioned([s for _, sections in asked for s in sections], token)
    result = transport.run(script, become=become, timeout=max(r.timeout for r in group))
    if become and not result.ok and platform.sudo_refused(result.stderr):
        raise sudo_error(node, result, group[0].what or "reading the node")
    found = split_sections(result.stdout, token)
    for read, sections in asked:
        own = {name: found[name] for name, _ in sections if name in found}
        value = read.parse(own, result)
        if not read.fresh:
            session.seed(node.name, read.key, value)
        values[read.key] = value


def gather_reads(
    session: Session, reads: Mapping[str, Sequence[Read]], *, step: str
) -> GroupResult[NodeReads]:
    """:func:`read_node` on every node named in ``reads``, in parallel (no round trip for a node
    whose values the session holds already)."""
    nodes = [n for n in session.inventory.nodes if n.name in reads]
    if not nodes:
        return GroupResult()
    return session.map(
        lambda n, t: read_node(session, n, t, reads[n.name]), step=step, nodes=nodes, connect=False
    )


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
