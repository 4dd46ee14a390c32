"""`bootstrap ntp`: time sync on every node (registered on import by orchestrator/cli/__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from orchestrator.cli.common import Settings, common_options, load_selection
from orchestrator.cli.front import reach_for
from orchestrator.cli.report import show_report
from orchestrator.errors import ExitCode
from orchestrator.view import node_view

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.steps.contract import Report
    from orchestrator.steps.timesync import NodeTime


#: why chronyd measures only (shown once, under the table of a real run)
X_WHY = "the node shares its kernel clock with another namespace, or --no-clock-control was given"


def print_time_report(settings: Settings, report: Report[NodeTime]) -> ExitCode:
    """The time step's report (the command's and the main pipeline's): a dry run's plans, each under
    its configuration diff, and the summary table, or --json; the exit code it deserves."""
    data, dry_run = report.data, report.dry_run
    title = f"time: master {data['master']}, limit {data['max_offset_ms']:g} ms"
    columns = ("node", "role", "daemon", "source", "offset ms (chrony)", "offset ms (from master)", "state")
    view = node_view(title, columns, report.outcomes, lambda v: v.row(dry_run=dry_run), status_column=6)
    measure_only = [o.node for o in report.outcomes if o.value and o.value.clock_control is False]
    notes = [f"{n}: chronyd runs with -x (measures, never adjusts the clock): {X_WHY}" for n in measure_only]
    ok = lambda o: o.ok and o.node not in report.failing  # noqa: E731
    above = {o.node: o.value.diff for o in report.outcomes if o.value is not None}
    return show_report(settings.ui, report, view, ok=ok, above=above, notes=notes[:1] if not dry_run else [])


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
