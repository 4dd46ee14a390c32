"""The main pipeline's front end (orchestrator/pipeline.py runs the phases; :class:`CliFront` shows
each one's report), for the main pipeline and the one on Slurm (orchestrator/slurm/pipeline.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.cli.common import Settings
from orchestrator.cli.front import reach_for, say
from orchestrator.errors import ExitCode
from orchestrator.inventory import Inventory, Node
from orchestrator.runner import Reach
from orchestrator.session import Session


@dataclass
class CliFront:
    """The main pipeline's front end: each phase reaches its nodes through the pipeline's session
    and shows itself here; its report is shown as the phase's own command shows it."""

    settings: Settings
    inventory: Inventory
    live: Any = None

    def reach(self, session: Session | None, phase: str, inventory: Inventory | None = None) -> Reach:
        lines = {"sync": "verbose-err", "validate": "verbose", "launch": "ranks"}.get(phase)
        return reach_for(self.settings, inventory or self.inventory, session, lines=lines, live=self.live)

    def begin(self, phase: str) -> None:
        """--dry-run of the whole pipeline: each phase's plan under a header of its own."""
        if self.settings.dry_run and not self.settings.json_mode:
            self.settings.ui.print_text(f"# ======== {phase} (dry run) ========")

    def show(
        self, phase: str, report: Any, nodes: list[Node], inventory: Inventory | None = None
    ) -> ExitCode:
        from orchestrator.cli.check import show_check
        from orchestrator.cli.firewall import show_firewall
        from orchestrator.cli.launch import show_launch
        from orchestrator.cli.slurm import show_slurm_launch
        from orchestrator.cli.sync import show_sync
        from orchestrator.cli.timesync import print_time_report
        from orchestrator.cli.validate import show_validation
        from orchestrator.slurm.run import SlurmLaunch

        settings, inventory = self.settings, inventory or self.inventory
        if phase == "sync":
            return show_sync(settings, report)
        if phase == "firewall":
            return show_firewall(settings, report, inventory.cluster.name, remove=False)
        if phase == "ntp":
            return print_time_report(settings, report)
        if phase == "check":
            return show_check(settings, inventory, nodes, report)
        if phase == "validate":
            return show_validation(settings, report)
        if isinstance(report, SlurmLaunch):
            return show_slurm_launch(settings, report)
        return show_launch(settings, inventory, report, own_session=False)

    def say(self, level: str, text: str) -> None:
        say(self.settings)(level, text)
