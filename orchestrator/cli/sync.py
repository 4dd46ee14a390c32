"""`bootstrap` subcommands of this area (registered on import by orchestrator/cli/__init__.py)."""

from __future__ import annotations
