"""`bootstrap teardown`: undo what the main pipeline changed on the nodes (firewall rules, time config)."""

from __future__ import annotations

import click

from orchestrator.cli.common import Settings, common_options, load_selection
from orchestrator.errors import ExitCode


@click.command()
@common_options
@click.option("--keep-time", is_flag=True, help="Leave the time configuration in place.")
@click.option("--keep-firewall", is_flag=True, help="Leave the firewall rules in place.")
@click.pass_context
def teardown(ctx: click.Context, keep_time: bool, keep_firewall: bool) -> int:
    """Remove what bootstrap set up on the nodes: exactly the firewall rules tagged with this
    cluster's name (`firewall --remove`), and the time configuration restored byte for byte, with
    the chronyd it started stopped (`ntp --restore`). Environments, code and run logs stay (they are
    files under each node's workdir: `bootstrap clean` removes them). --dry-run shows what would be
    removed.
    """
    from orchestrator.cli.firewall import run_firewall
    from orchestrator.cli.timesync import run_ntp

    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    codes = []
    if not keep_firewall and inventory.cluster.firewall.manage:
        codes.append(run_firewall(settings, inventory, nodes, remove=True))
    if not keep_time and inventory.cluster.time.manage:
        codes.append(run_ntp(settings, inventory, nodes, restore=True))
    if not codes:
        settings.ui.note("nothing to tear down (firewall and time are not managed, or both kept)")
    return max(codes, default=ExitCode.OK)
