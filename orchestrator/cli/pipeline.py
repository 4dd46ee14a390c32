"""The main pipeline's front end (orchestrator/pipeline.py runs the phases; :class:`CliFront` shows
each one's report), and the main pipeline on Slurm."""

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

    def reach(self, session: Session, phase: str) -> Reach:
        lines = {"sync": "verbose-err", "validate": "verbose", "launch": "ranks"}.get(phase)
        return reach_for(self.settings, self.inventory, session, lines=lines, live=self.live)

    def begin(self, phase: str) -> None:
        """--dry-run of the whole pipeline: each phase's plan under a header of its own."""
        if self.settings.dry_run and not self.settings.json_mode:
            self.settings.ui.print_text(f"# ======== {phase} (dry run) ========")

    def show(self, phase: str, report: Any, nodes: list[Node]) -> ExitCode:
        from orchestrator.cli.check import show_check
        from orchestrator.cli.firewall import show_firewall
        from orchestrator.cli.launch import show_launch
        from orchestrator.cli.sync import show_sync
        from orchestrator.cli.timesync import print_time_report
        from orchestrator.cli.validate import show_validation

        settings, inventory = self.settings, self.inventory
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
        return show_launch(settings, inventory, report, own_session=False)

    def say(self, level: str, text: str) -> None:
        say(self.settings)(level, text)


def pipeline_on_slurm(
    settings: Settings, inventory: Inventory, *, detach: bool, until: str | None, force: bool, skip: bool
) -> ExitCode:
    """The main pipeline on Slurm: sync (cluster.env / cluster.code) once, to the shared directory
    through the login host; firewall and time sync skipped (the cluster's admins own them); `check`,
    then `validate` (unless ``skip``), in one allocation (a failure stops here, unless ``force``);
    then the job (`launch`)."""
    from orchestrator.cli.slurm import allocated, launch_on_slurm
    from orchestrator.cli.sync import run_sync
    from orchestrator.slurm.job import shared_sync, slurm_settings, sync_target

    ui = settings.ui
    shared, (login,) = sync_target(inventory)
    sync = shared_sync(inventory, inventory.cluster.code_declared)
    if sync is not None:
        where = slurm_settings(inventory).dir
        ui.note(
            f"sync: the {sync[0]} to {where} through {login.name}, once for every node (shared file system)"
        )
        synced = run_sync(settings, shared, [login], only=sync[1])
        if synced != ExitCode.OK:
            ui.error("not going on: sync failed (see above); `bootstrap sync` repeats just that step")
            return synced
    ui.note("firewall: skipped on Slurm (the cluster's admins own the compute nodes' network)")
    ui.note("ntp: skipped on Slurm (the cluster's admins keep the compute nodes' clocks)")
    if until in ("sync", "firewall", "ntp"):
        return ExitCode.OK
    from orchestrator.cli.check import run_check
    from orchestrator.cli.validate import run_validate

    with allocated(settings, inventory, "check") as (nodes, on):  # one job: check, then validate
        code = run_check(settings, nodes, list(nodes.nodes), session=on)
        if until != "check" and not skip and (code == ExitCode.OK or force):
            code = run_validate(settings, nodes, session=on) or code
    if code != ExitCode.OK and not force:
        ui.error("not launching: check or validate failed on an allocated node (see above); --force goes on")
        return code
    if until == "check":
        return code
    return launch_on_slurm(settings, inventory, run_id=None, templates_dir=None, detach=detach)
