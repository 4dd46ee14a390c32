"""Connect and learn what each node is (the facts behind `bootstrap check`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.facts import Fact, FactSet, gather, linux_facts, public_value
from orchestrator.transports import Transport

if TYPE_CHECKING:
    from orchestrator.inventory import Node

#: interpreter used on remote nodes when the inventory names none
DEFAULT_PYTHON = "python3"


def interpreter_for(node: Node) -> str:
    """The node's Python: the inventory's, else (local node) the controller's own, else python3."""
    if node.python:
        return node.python
    if node.connection == "local":
        return sys.executable
    return DEFAULT_PYTHON


@dataclass
class NodeFacts:
    """A node's facts plus how we reached it."""

    via: str
    facts: FactSet
    connect_seconds: float
    recorded_host_keys: list[str] = field(default_factory=list)

    def public_dict(self) -> dict[str, Any]:
        return {
            "via": self.via,
            "connect_seconds": round(self.connect_seconds, 4),
            "recorded_host_keys": self.recorded_host_keys,
            "facts": {k: public_value(v) for k, v in self.facts.values.items()},
            "fact_errors": self.facts.errors,
        }


def facts_plan(node: Node, transport: Transport, extra: Sequence[Fact[Any]] = ()) -> str:
    """The exact script `facts`/`check` run on the node (for --dry-run); markers carry a random
    token per run where this shows TOKEN."""
    platform = transport.platform
    facts = [*linux_facts(interpreter_for(node)), *extra]
    return platform.wrap(platform.sectioned([(f.name, f.command(platform)) for f in facts], "TOKEN"))


def inspect(node: Node, transport: Transport, extra: Sequence[Fact[Any]] = ()) -> NodeFacts:
    """Connect, then gather the standard facts plus ``extra`` ones in the same round trip."""
    start = time.monotonic()
    transport.connect()
    connected = time.monotonic() - start
    facts = gather(transport, [*linux_facts(interpreter_for(node)), *extra])
    return NodeFacts(
        via=transport.describe(),
        facts=facts,
        connect_seconds=connected,
        recorded_host_keys=list(transport.recorded_host_keys),
    )
