"""What a node is: small fact classes gathered in one round trip."""

from __future__ import annotations

from orchestrator.facts.base import Fact, FactParseError, FactSet, gather, split_sections
from orchestrator.facts.linux import linux_facts, public_value

__all__ = ["Fact", "FactParseError", "FactSet", "gather", "linux_facts", "public_value", "split_sections"]
