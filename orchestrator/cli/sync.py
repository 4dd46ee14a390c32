"""`bootstrap sync`: the pinned Python environment, then the project code, on every node.

Registered on import by orchestrator/cli/__init__.py. The work, and every decision, is in
orchestrator/steps/sync.py (and below it steps/envsync, steps/codesync); this module parses the
options and renders the report.
"""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.common import (
    Settings,
    common_options,
    load_selection,
)
from orchestrator.cli.front import reach_for
from orchestrator.cli.report import fail_lines, tell
from orchestrator.errors import ExitCode, UsageError
from orchestrator.inventory import Inventory, Node
from orchestrator.session import Session
from orchestrator.slurm.job import sync_target
from orchestrator.steps import sync as step
from orchestrator.steps.sync import SyncOptions, SyncReport


@click.command()
@common_options
@click.option("--force", is_flag=True, help="Rebuild every environment, even when its stamp matches.")
@click.option(
    "--only",
    type=click.Choice(["env", "code"]),
    help="Only the environment (cluster.env) or only the code (cluster.code).",
)
@click.option(
    "--from-master",
    is_flag=True,
    help="Without cluster.env: give every node a venv with the master's torch and its companions, "
    "at the master's exact versions (docs/sync.md).",
)
@click.option(
    "--freeze",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the master's torch and companions, pinned, to FILE (a requirements file to commit and "
    "name in cluster.env.requirements); with --from-master, sync too.",
)
@click.pass_context
def sync(
    ctx: click.Context, force: bool, only: str | None, from_master: bool, freeze: Path | None
) -> ExitCode:
    """Make every node's Python environment and code identical to what the inventory declares.

    Environment (cluster.env): a venv per node at env.path (default <workdir>/venv) with exactly the
    pinned requirements, installed by uv where the node has it, else pip. An unchanged node is
    skipped after one round trip (a stamp in the venv); a changed one gets a new venv built beside the
    active one, switched to only when the install succeeded. Offline mode pushes wheels from this
    machine. Afterwards every node's installed versions are compared: one line per distinct
    environment; any difference fails the command (exit 1), naming the packages.

    Without cluster.env, --from-master installs the master's training environment instead (torch,
    torchvision, torchaudio and numpy when the master has them, and what they require, at the master's
    versions, from the wheel index of its torch build); check, validate and launch then use it.
    --freeze FILE writes that set as a requirements file for cluster.env.

    Code (cluster.code): the project directory, only changed files moved. See docs/sync.md.
    """
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    if inventory.cluster.slurm is not None:  # once, through the login host, into the shared directory
        inventory, nodes = sync_target(inventory)
    if freeze is not None and not from_master:
        return _freeze(settings, inventory, nodes, freeze)
    if from_master and inventory.cluster.env.declared:
        raise UsageError(
            f"{inventory.source}: cluster.env declares this cluster's environment: "
            "`bootstrap sync` installs it",
            hint="--from-master is for inventories without cluster.env (to pin the master's environment "
            "into a file for it: bootstrap sync --freeze requirements.txt)",
        )
    return run_sync(
        settings, inventory, nodes, force=force, only=only, from_master=from_master, freeze=freeze
    )


def run_sync(
    settings: Settings,
    inventory: Inventory,
    nodes: list[Node],
    *,
    force: bool = False,
    only: str | None = None,
    session: Session | None = None,
    from_master: bool = False,
    freeze: Path | None = None,
) -> ExitCode:
    """`bootstrap sync` (also the Slurm pipeline's sync, on the login host): shown; its exit code."""
    options = SyncOptions(
        only=only, force=force, from_master=from_master, freeze=freeze, dry_run=settings.dry_run
    )
    reach = reach_for(settings, inventory, session, lines="verbose-err")
    return show_sync(settings, step.sync_report(reach, inventory, nodes, options))


def show_sync(settings: Settings, report: SyncReport) -> ExitCode:
    """The sync's report: its tables (or ``--json``); its exit code."""
    ui = settings.ui
    if settings.json_mode:
        fail_lines(ui, [*report.env, *report.code])
        ui.print_json(report.public_dict())
    else:
        tell(ui, report.shown())
    return report.exit_code


def _freeze(settings: Settings, inventory: Inventory, nodes: list[Node], path: Path) -> ExitCode:
    """``bootstrap sync --freeze FILE`` alone: read the master, write the file(s), sync nothing."""
    ui = settings.ui
    with reach_for(settings, inventory).connect(nodes) as on:
        report = step.freeze(on, inventory, nodes, path, dry_run=settings.dry_run)
    if settings.json_mode and not settings.dry_run:
        ui.print_json(report.public_dict())
    else:
        tell(ui, report.said(Path(str(inventory.source)).resolve().parent))
    return ExitCode.OK
