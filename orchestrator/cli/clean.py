"""`bootstrap clean`: remove what bootstrap put on the nodes (orchestrator/steps/clean.py)."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import (
    Settings,
    common_options,
    fail_lines,
    load_selection,
    node_docs,
    open_session,
)
from orchestrator.errors import ExitCode, UsageError
from orchestrator.executor import Outcome, exit_code_for
from orchestrator.steps.clean import NodeClean, clean_node
from orchestrator.steps.envsync.progress import human_size


@click.command()
@common_options
@click.option("--yes", "-y", is_flag=True, help="Remove without asking.")
@click.option(
    "--outputs",
    is_flag=True,
    help="Also remove each run's outputs ($CB_RUN_DIR: checkpoints and what training wrote there).",
)
@click.pass_context
def clean(ctx: click.Context, yes: bool, outputs: bool) -> int:
    """Remove what bootstrap put on the nodes: the environment (env.path and its builds, pushed
    wheels), the code files sync shipped (those still holding the shipped bytes) and the run
    directories (a run's outputs, $CB_RUN_DIR, stay unless --outputs). Each is found by bootstrap's
    own marker; anything else in the workdir stays. Refused on a node while a run is running there.
    --dry-run lists per node what would go and its size; otherwise the list is shown and confirmed
    (--yes: not asked).
    """
    settings = Settings.from_context(ctx)
    ui = settings.ui
    inventory, nodes = load_selection(settings)
    with open_session(settings, inventory, nodes) as session:
        found = session.map(
            lambda n, t: clean_node(n, t, inventory, remove=False, outputs=outputs), step="clean (read)"
        )
        busy = [o for o in found if o.value is not None and o.value.running]
        failed = [o for o in found if o.error is not None]
        if settings.dry_run or busy or failed or not any(o.value and o.value.items for o in found):
            code = exit_code_for(found)
            if busy and code == ExitCode.OK:
                code = ExitCode.NODES_FAILED
            _report(settings, found, removed=False)
            for o in busy:
                assert o.value is not None
                runs = ", ".join(o.value.running)
                ui.error(
                    f"{o.node}: run {runs} is running there: nothing was removed on any node "
                    f"(`bootstrap stop --run {o.value.running[0]}` ends it)"
                )
            return code
        if not yes:
            _report(settings, found, removed=False)
            if settings.json_mode or not sys.stdin.isatty():
                raise UsageError(
                    "clean removes files on the nodes: confirm with --yes (nothing was removed)",
                    hint="--dry-run lists what would go",
                )
            total = human_size(sum(o.value.bytes for o in found if o.value is not None))
            if not click.confirm(f"remove these ({total}) from {len(found)} node(s)?", err=True):
                ui.note("nothing was removed")
                return ExitCode.OK
        done = session.map(
            lambda n, t: clean_node(n, t, inventory, remove=True, outputs=outputs), step="clean"
        )
    code = exit_code_for(done)
    if any(o.value is not None and (o.value.errors or o.value.running) for o in done) and code == ExitCode.OK:
        code = ExitCode.NODES_FAILED
    _report(settings, done, removed=True)
    return code


def _report(settings: Settings, outcomes: list[Outcome[NodeClean]], *, removed: bool) -> None:
    ui = settings.ui
    if settings.json_mode:
        doc: dict[str, Any] = {
            "command": "clean",
            "dry_run": settings.dry_run,
            "removed": removed,
            "nodes": node_docs(outcomes),
            "bytes": sum(o.value.bytes for o in outcomes if o.value is not None),
        }
        if removed or settings.dry_run:
            ui.print_json(doc)
        return
    title = "removed" if removed else "would remove" if settings.dry_run else "to remove"
    table = Table(title=Text(title), title_justify="left")
    for column in ("node", "what", "path", "files", "size"):
        table.add_column(column, overflow="fold")
    for o in outcomes:
        if o.value is None:
            table.add_row(Text(o.node), Text("failed", style="red"), "-", "-", "-")
            continue
        if not o.value.items:
            table.add_row(Text(o.node), Text("nothing", style="dim"), "-", "-", "-")
        for item in o.value.items:
            table.add_row(
                Text(o.node), Text(item.kind), Text(item.path), str(item.files), human_size(item.bytes)
            )
    ui.print_table(table)
    fail_lines(ui, outcomes)
    for o in outcomes:
        for error in o.value.errors if o.value is not None else []:
            ui.error(f"{o.node}: could not remove {error}")
    total = human_size(sum(o.value.bytes for o in outcomes if o.value is not None))
    if removed:
        ui.info(f"clean: {total} removed from {len(outcomes)} node(s)")
    elif settings.dry_run:
        ui.info(f"clean --dry-run: {total} would be removed; nothing was changed")
