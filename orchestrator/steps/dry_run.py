"""``--dry-run`` of the commands that are not runner steps (check, facts, run, keys, logs, status,
stop, fetch; launch, validate, bench): each node's :class:`~orchestrator.plans.NodePlan`, built
connecting to nothing, with the exact text its shell would receive for each run. Returned as a
:class:`~orchestrator.steps.contract.Report`, which ``cli/report.py`` renders as it renders a runner
step's dry run: one printer for every command."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.executor import GroupResult, Outcome
from orchestrator.plans import NodePlan, Run
from orchestrator.steps.contract import Report

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.transports import SSHOptions, Transport


@dataclass
class Planned:
    """A node's dry run: how it is reached (``via``), the exact text its shell gets for each run of
    its plan, in order (``sent``), texts shown under an upload (``shown``: target -> text; launch's
    script, secrets masked) and what the command's ``--json`` adds about the node (``fields``)."""

    via: str
    sent: list[str]
    shown: dict[str, str] = field(default_factory=dict)
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "planned"

    def public_dict(self) -> dict[str, Any]:
        return {"via": self.via, "commands": self.sent, **self.fields}


@contextmanager
def unconnected(
    inventory: Inventory, nodes: list[Node], ssh: SSHOptions
) -> Iterator[Callable[[Node], Transport]]:
    """Each node's transport, created and never connected: what the dry run asks for its texts."""
    from orchestrator.inventory import PasswordResolver
    from orchestrator.session import Session

    session = Session(inventory, nodes, ssh=ssh, passwords=PasswordResolver(prompt=None), max_workers=1)
    with session:
        yield session.transport


def dry_run_report(
    step: str,
    nodes: list[Node],
    planned: Callable[[Node], tuple[NodePlan, Planned]],
    data: dict[str, Any] | None = None,
) -> Report[Planned]:
    """The dry run's report: per node its plan and what the printer shows of it, in ``nodes``' order."""
    plans: dict[str, NodePlan] = {}
    outcomes: GroupResult[Planned] = GroupResult()
    for node in nodes:
        plan, shown = planned(node)
        plans[node.name] = plan
        outcomes.append(Outcome(node.name, shown, None, 0.0))
    return Report(step, outcomes, plans, data=dict(data or {}), dry_run=True)


def planned_scripts(
    step: str,
    inventory: Inventory,
    nodes: list[Node],
    ssh: SSHOptions,
    scripts: Callable[[Node, Transport], list[str]],
    *,
    become: bool = False,
) -> Report[Planned]:
    """The commands that send one script per node: ``scripts(node, transport)`` (the scripts the real
    command sends, already in the node's dialect), each as the exact text the transport sends.
    ``become``: the scripts run as root (they say so themselves: ``sudo -n``)."""
    with unconnected(inventory, nodes, ssh) as transport_of:

        def one(node: Node) -> tuple[NodePlan, Planned]:
            transport = transport_of(node)
            texts = scripts(node, transport)
            plan = NodePlan(node.name, [Run(text, become=become) for text in texts])
            return plan, Planned(transport.describe(), [transport.plan(text) for text in texts])

        return dry_run_report(step, nodes, one)
