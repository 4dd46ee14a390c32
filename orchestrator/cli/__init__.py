"""Command line interface (``bootstrap``).

``main.py`` holds the group, the common options and the main pipeline; each area's subcommands live in
their own module, which registers them on ``cli`` when imported here.
"""

# subcommand modules (import order = nothing; each decorates ``cli``)
from orchestrator.cli import firewall, runs, sync, teardown, timesync, validate  # noqa: F401
from orchestrator.cli.main import cli, main

__all__ = ["cli", "main"]
