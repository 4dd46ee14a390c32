"""`bootstrap ntp`: time sync on every node (registered on import by orchestrator/cli/__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import (
    Settings,
    common_options,
    fail_lines,
    load_selection,
)
from orchestrator.cli.front import reach_for
from orchestrator.cli.report import json_doc, show_plans, with_plan
from orchestrator.errors import ExitCode

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.steps.contract import Report
    from orchestrator.steps.timesync import NodeTime


def _cell(value: float | None, error: float | None = None) -> str:
    if value is None:
        return "-"
    text = f"{value:+.3f}"
    return f"{text} ±{error:.3f}" if error is not None else text


def source_cell(value: NodeTime, *, dry_run: bool) -> str:
    """What the node follows: chrony's selected source (w32time: the peer it measured), a serving
    master's own clock, the configured sources only where nothing was awaited (a dry run); else
    ``none`` (configured but following nothing: its problem says why), never a source it does not have."""
    if value.selected:
        return value.selected
    if value.sources == ["local clock"]:
        return "local clock"
    if dry_run and value.sources:
        return ", ".join(value.sources) + " (planned)"
    return "none" if value.sources else "-"


def print_time_report(settings: Settings, report: Report[NodeTime]) -> ExitCode:
    """The summary table (or --json document) of the time step's report, after a dry run's plans
    (each beside its configuration diff); returns the exit code it deserves. Public so the main
    pipeline can show the step the same way."""
    ui = settings.ui
    code = report.exit_code()
    if settings.json_mode:
        _problems(settings, report)  # stderr: humans watching a --json run still see what failed
        top = {**report.data, "dry_run": report.dry_run, "warnings": report.warnings}
        fields, ok = with_plan(report), lambda o: o.ok and o.node not in report.failing
        return json_doc(ui, report.step, report.outcomes, code, fields, ok, **top)
    if report.dry_run:
        show_plans(ui, report, {o.node: o.value.diff for o in report.outcomes if o.value is not None})
    master, limit = report.data["master"], report.data["max_offset_ms"]
    title = f"time: master {master}, limit {limit:g} ms"
    table = Table(title=Text(title), title_justify="left")
    for column in (
        "node",
        "role",
        "daemon",
        "source",
        "offset ms (chrony)",
        "offset ms (from master)",
        "state",
    ):
        table.add_column(column)
    for o in report.outcomes:
        value = o.value
        if value is None:
            table.add_row(Text(o.node), "-", "-", "-", "-", "-", Text("failed", style="red"))
            continue
        source = source_cell(value, dry_run=report.dry_run)
        state = Text(value.state, style="red" if value.problem else "green")
        table.add_row(
            Text(o.node),
            value.role,
            value.daemon + ("" if value.clock_control is not False else " (-x)"),
            Text(source),
            _cell(value.chrony_offset_ms),
            _cell(value.offset_ms, value.offset_error_ms),
            state,
        )
    ui.print_table(table)
    for o in report.outcomes:
        if o.value is not None and o.value.clock_control is False and not report.dry_run:
            ui.note(
                f"{o.node}: chronyd runs with -x (measures, never adjusts the clock): the node shares its "
                "kernel clock with another namespace, or --no-clock-control was given"
            )
            break
    _problems(settings, report)
    return code


def _problems(settings: Settings, report: Report[NodeTime]) -> None:
    for warning in report.warnings:
        settings.ui.warn(warning)
    fail_lines(settings.ui, report.outcomes)
    for o in report.outcomes:
        if o.value is not None and o.value.problem:
            settings.ui.error(f"node {o.node!r}: {o.value.problem}")


@click.command(name="ntp")
@common_options
@click.option(
    "--restore", is_flag=True, help="Undo: put back the previous configuration, stop what we started."
)
@click.option(
    "--no-clock-control",
    is_flag=True,
    hidden=True,
    help="Start chronyd with -x everywhere (tests: namespaces share this machine's clock).",
)
@click.option(
    "--sync-timeout",
    type=click.FloatRange(min=1),
    default=60,
    show_default=True,
    help="Seconds each node gets to follow its source within the limit.",
)
@click.pass_context
def ntp(ctx: click.Context, restore: bool, no_clock_control: bool, sync_timeout: float) -> int:
    """Keep the nodes' clocks together (chrony; w32time on Windows), and measure it.

    Default: the master serves time to the workers (works without internet); cluster.time.servers
    makes every node follow those instead. Workers follow the master's own address (its host when that
    is an IP address, else what the master reports about itself): a worker resolving the master's name
    to another address is refused, named, and left unconfigured. Then waits until each node follows
    its source, measures every node's offset from the master (as `check` does) and fails above
    cluster.time.max_offset_ms.
    A second run changes nothing and says "unchanged". --dry-run reads the nodes (read-only) and shows
    each node's plan (the script it runs as root) below the configuration diff it writes. --restore
    puts back the files as they were (byte for byte) and stops the chronyd (or unit) this command
    started.
    """
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    return run_ntp(
        settings,
        inventory,
        nodes,
        restore=restore,
        no_clock_control=no_clock_control,
        sync_timeout=sync_timeout,
    )


def run_ntp(
    settings: Settings,
    inventory: Inventory,
    nodes: list[Node],
    *,
    restore: bool = False,
    no_clock_control: bool = False,
    sync_timeout: float = 60,
    session: Session | None = None,
) -> ExitCode:
    """The time phase (also a step of the main pipeline and of teardown), shown; its exit code."""
    from orchestrator.steps.timesync import time_report

    reach = reach_for(settings, inventory, session)
    report = time_report(
        reach,
        inventory,
        nodes,
        restore=restore,
        dry_run=settings.dry_run,
        no_clock_control=no_clock_control,
        sync_timeout=sync_timeout,
    )
    return print_time_report(settings, report)
