"""``--dry-run`` of the commands that send one script per node (check, facts, run, keys, logs,
status, stop, fetch): each node's scripts as its shell would receive them, connecting to nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.transports import SSHOptions, Transport


def planned_scripts(
    inventory: Inventory,
    nodes: list[Node],
    ssh: SSHOptions,
    scripts: Callable[[Node, Transport], list[str]],
) -> list[dict[str, Any]]:
    """Per node ``{"name", "via", "commands"}``: ``scripts(node, transport)`` (the transport is
    created, never connected) as the exact texts the transport would send."""
    from orchestrator.inventory import PasswordResolver
    from orchestrator.session import Session

    session = Session(inventory, nodes, ssh=ssh, passwords=PasswordResolver(prompt=None), max_workers=1)
    planned = []
    for node in nodes:
        transport = session.transport(node)
        commands = [transport.plan(script) for script in scripts(node, transport)]
        planned.append({"name": node.name, "via": transport.describe(), "commands": commands})
    return planned
