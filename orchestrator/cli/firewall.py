"""`bootstrap firewall`: open the training ports for the cluster's peers (or `--remove` ours).

Registered on import by orchestrator/cli/__init__.py. The work is in orchestrator/steps/firewall.
"""

from __future__ import annotations

import click

from orchestrator.cli.common import Settings, common_options, load_selection
from orchestrator.cli.front import reach_for
from orchestrator.cli.report import show_report
from orchestrator.errors import ExitCode
from orchestrator.inventory import Inventory, Node
from orchestrator.session import Session
from orchestrator.steps.contract import Report
from orchestrator.steps.firewall import FirewallResult, firewall_report
from orchestrator.view import node_view


@click.command()
@common_options
@click.option("--remove", is_flag=True, help="Delete every rule of this cluster (tagged ours), nothing else.")
@click.pass_context
def firewall(ctx: click.Context, remove: bool) -> int:
    """Let the cluster's nodes reach each other's training ports, and nobody else.

    On each node the firewall in charge is found (ufw, firewalld, nftables, iptables; none: nothing to do)
    and TCP is allowed from the other nodes' cluster addresses to the rendezvous port (master), the node's
    ephemeral port range (gloo and NCCL listen there; it cannot be pinned) and
    cluster.firewall.extra_ports; and, when the master serves the cluster's time (cluster.time: no
    servers, or serve_from_master), UDP 123 on the master from the workers, for `bootstrap ntp`. Every
    rule is tagged cluster-bootstrap:<name>:<digest of the exact cluster name>: a rerun adds nothing, a
    changed peer set changes only what changed, --remove deletes exactly ours (and rules of the earlier
    cluster-bootstrap:<name> tag, which a rerun replaces). Needs root (sudo -n for other users). --dry-run
    still reads each firewall (read-only) to print the exact commands.
    """
    settings = Settings.from_context(ctx)
    inventory, selected = load_selection(settings)
    return run_firewall(settings, inventory, selected, remove=remove)


def run_firewall(
    settings: Settings,
    inventory: Inventory,
    selected: list[Node],
    *,
    remove: bool,
    session: Session | None = None,
) -> ExitCode:
    """The firewall phase (also a step of the main pipeline and of teardown), shown; its exit code."""
    reach = reach_for(settings, inventory, session)
    report = firewall_report(reach, inventory, selected, remove=remove, dry_run=settings.dry_run)
    return show_firewall(settings, report, inventory.cluster.name, remove=remove)


def show_firewall(settings: Settings, run: Report[FirewallResult], cluster: str, *, remove: bool) -> ExitCode:
    """The firewall's report: its table (or ``--json``), the plans of a dry run; its exit code."""
    title = f"{'remove' if remove else 'firewall'}: cluster {cluster}" + (" (dry run)" if run.dry_run else "")
    columns = ("node", "firewall", "result", "ports", "from")
    view = node_view(
        title, columns, run.outcomes, lambda r: r.row(dry_run=run.dry_run), status_column=2, fold=True
    )
    addresses = ", ".join(f"{k}={v}" for k, v in run.data["addresses"].items())
    notes = [f"cluster addresses: {addresses}"] if addresses and settings.ui.verbose else []
    return show_report(settings.ui, run, view, top={"remove": remove}, notes=notes)
