"""Command line interface (``bootstrap``).

``main.py`` holds the group and the main pipeline's presentation; each area's subcommands live in their
own module and are registered by ``main.py``; what they share is in ``common.py``.
"""

from orchestrator.cli.main import cli, main

__all__ = ["cli", "main"]
