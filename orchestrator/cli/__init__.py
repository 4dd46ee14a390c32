"""Command line interface (``bootstrap``)."""

from orchestrator.cli.main import cli, main

__all__ = ["cli", "main"]
