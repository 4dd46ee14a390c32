"""Which Python a node's facts (and probes) run under when nothing more specific is asked for."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

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
