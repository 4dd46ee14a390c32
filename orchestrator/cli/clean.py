"""`bootstrap clean`: remove what bootstrap put on the nodes (orchestrator/steps/clean.py)."""

from __future__ import annotations

import sys
from typing import Any

import click

from orchestrator.cli.common import (
    Settings,
    common_options,
    load_selection,
    open_session,
)
from orchestrator.cli.report import json_doc, tell
from orchestrator.errors import ExitCode, UsageError
from orchestrator.steps.clean import CleanReport, clean_nodes
from orchestrator.view import human_bytes


@click.command()
@common_options
@click.option("--yes", "-y", is_flag=True, help="Remove without asking.")
@click.option(
    "--outputs",
    is_flag=True,
    help="Also remove each run's outputs ($CB_RUN_DIR: checkpoints and what training wrote there).",
)
@click.option(
    "--run", "run_ids", multiple=True, metavar="RUN", help="Only this run's directories (repeatable)."
)
@click.option(
    "--older-than",
    metavar="AGE",
    help="Only runs that last wrote their log before AGE ago (90s, 30m, 12h, 7d, 2w).",
)
@click.option(
    "--keep", type=click.IntRange(min=0), metavar="N", help="Only runs other than each node's newest N."
)
@click.pass_context
def clean(
    ctx: click.Context,
    yes: bool,
    outputs: bool,
    run_ids: tuple[str, ...],
    older_than: str | None,
    keep: int | None,
) -> int:
    """Remove what bootstrap put on the nodes: the environment (env.path and its builds, pushed
    wheels), the code files sync shipped (those still holding the shipped bytes) and the run
    directories (a run's outputs, $CB_RUN_DIR, stay unless --outputs). Each is found by bootstrap's
    own marker; anything else in the workdir stays. Refused on a node while a run is running there.
    --dry-run lists per node what would go and its size; otherwise the list is shown and confirmed
    (--yes: not asked).

    --run, --older-than and --keep clean old runs only: the chosen run directories (each rule given
    must hold), nothing else; a run running elsewhere does not stop it.
    """
    from orchestrator.steps.clean import RunChoice

    settings = Settings.from_context(ctx)
    ui = settings.ui
    runs = RunChoice.chosen(run_ids, older_than, keep)  # None: a whole clean
    inventory, nodes = load_selection(settings)

    def ask(found: CleanReport) -> bool:
        _report(settings, found)
        if settings.json_mode or not sys.stdin.isatty():
            raise UsageError(
                "clean removes files on the nodes: confirm with --yes (nothing was removed)",
                hint="--dry-run lists what would go",
            )
        total = human_bytes(found.bytes)
        return click.confirm(f"remove these ({total}) from {len(found.outcomes)} node(s)?", err=True)

    with open_session(settings, inventory, nodes) as session:
        report = clean_nodes(
            session, inventory, outputs=outputs, dry_run=settings.dry_run, ask=None if yes else ask, runs=runs
        )
    if report.declined:
        ui.note("nothing was removed")
        return ExitCode.OK
    _report(settings, report)
    for line in report.refusals(dry_run=settings.dry_run):
        ui.error(line)
    return report.exit_code()


def _report(settings: Settings, report: CleanReport) -> None:
    ui, outcomes, removed = settings.ui, report.outcomes, report.removed
    if settings.json_mode:
        if removed or settings.dry_run:
            top: dict[str, Any] = {"dry_run": settings.dry_run, "removed": removed, "bytes": report.bytes}
            json_doc(ui, "clean", outcomes, report.exit_code(), **top)
        return
    tell(ui, report.said(dry_run=settings.dry_run))
