"""The main pipeline's phases as the CLI runs and shows them (orchestrator/pipeline.py decides the
order and when to stop): each phase is its standalone command's work and report, on the pipeline's
one session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from orchestrator.cli.common import Settings
from orchestrator.errors import ExitCode
from orchestrator.inventory import Inventory, Node
from orchestrator.session import Session


@dataclass
class CliPhases:
    ctx: click.Context
    settings: Settings
    inventory: Inventory
    detach: bool = False
    templates_dir: Path | None = None
    always_validate: bool = False  # --validate: even when nothing it checks changed

    def sync(
        self, session: Session, nodes: list[Node], *, only: str | None, from_master: bool = False
    ) -> ExitCode:
        from orchestrator.cli.sync import run_sync

        self._header("sync")
        return run_sync(
            self.settings, self.inventory, nodes, only=only, session=session, from_master=from_master
        )

    def firewall(self, session: Session, nodes: list[Node]) -> ExitCode:
        from orchestrator.cli.firewall import run_firewall

        self._header("firewall")
        return run_firewall(self.settings, self.inventory, nodes, remove=False, session=session)

    def ntp(self, session: Session, nodes: list[Node]) -> ExitCode:
        from orchestrator.cli.timesync import run_ntp

        self._header("ntp")
        return run_ntp(self.settings, self.inventory, nodes, session=session)

    def check(self, session: Session, nodes: list[Node]) -> ExitCode:
        from orchestrator.cli.check import run_check

        self._header("check")
        return run_check(self.settings, self.inventory, nodes, session=session)

    def validate(self, session: Session) -> ExitCode:
        from orchestrator.cli.validate import run_validate

        self._header("validate")
        return run_validate(
            self.settings, self.inventory, session=session, unless_unchanged=not self.always_validate
        )

    def launch(self, session: Session) -> ExitCode:
        from orchestrator.cli.launch import run_launch

        self._header("launch")
        return run_launch(
            self.ctx,
            self.settings,
            self.inventory,
            run_id=None,
            templates_dir=self.templates_dir,
            detach=self.detach,
            session=session,
        )

    def _header(self, phase: str) -> None:
        """--dry-run of the whole pipeline: each phase's plan under a header of its own."""
        if self.settings.dry_run and not self.settings.json_mode:
            self.settings.ui.print_text(f"# ======== {phase} (dry run) ========")

    def say(self, level: str, text: str) -> None:
        ui = self.settings.ui
        {"error": ui.error, "warn": ui.warn}.get(level, ui.note)(text)
