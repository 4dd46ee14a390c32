"""What a node is: small fact classes gathered in one round trip."""

from __future__ import annotations

from orchestrator.facts.base import Fact, FactParseError, FactSet, gather, split_sections
from orchestrator.facts.linux import linux_facts, public_value

#: how the session memo's keys of a node's facts start (steps/node_facts.py: facts_key): a step that
#: changed a node's environment forgets those, not what other steps read there
SESSION_KEY_PREFIX = "facts "
#: the session memo's key of how long a node's first connection took (the runner keeps it when its
#: read connects: `check` reports it with the facts)
CONNECTED = "connect_seconds"

__all__ = [
    "CONNECTED",
    "SESSION_KEY_PREFIX",
    "Fact",
    "FactParseError",
    "FactSet",
    "gather",
    "linux_facts",
    "public_value",
    "split_sections",
]
