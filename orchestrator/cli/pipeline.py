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


def pipeline_on_slurm(
    settings: Settings, inventory: Inventory, *, detach: bool, until: str | None, force: bool, skip: bool
) -> ExitCode:
    """The main pipeline on Slurm: sync (cluster.env / cluster.code) once, to the shared directory
    through the login host; firewall and time sync skipped (the cluster's admins own them); `check`,
    then `validate` (unless ``skip``), in one allocation (a failure stops here, unless ``force``);
    then the job (`launch`)."""
    from orchestrator.cli.slurm import allocated, launch_on_slurm
    from orchestrator.cli.sync import run_sync
    from orchestrator.pipeline import wants_code_sync
    from orchestrator.slurm.job import shared_sync, slurm_settings, sync_target

    ui = settings.ui
    shared, (login,) = sync_target(inventory)
    sync = shared_sync(inventory, wants_code_sync(inventory))
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
