"""The setup phases of the main pipeline, before the preflight: sync, firewall, time.

Order: sync (the environment the preflight then checks), firewall (the ports the preflight's
reachability mesh then tests), time (the clocks it then measures). A failed sync stops the pipeline
(training would run the wrong code or torch). A failed firewall or time step only warns: the preflight
that follows measures what they were for (reachability, clocks) and decides.
"""

from __future__ import annotations

from orchestrator.cli.common import Settings
from orchestrator.errors import ExitCode
from orchestrator.inventory import Inventory, Node


def wants_code_sync(inventory: Inventory) -> bool:
    """Code is pushed by the pipeline only when the inventory has a ``cluster.code`` section: the
    default source is the current directory, which must be a deliberate choice (it may be a home)."""
    return "code" in inventory.cluster.model_fields_set


def prepare(settings: Settings, inventory: Inventory, nodes: list[Node]) -> ExitCode:
    """Run sync (when declared), firewall and time sync (clusters of 2+ nodes, when managed)."""
    from orchestrator.cli.firewall import run_firewall
    from orchestrator.cli.sync import run_sync
    from orchestrator.cli.timesync import run_ntp

    ui = settings.ui
    cluster = inventory.cluster
    env, code = cluster.env.declared, wants_code_sync(inventory)
    if env or code:
        only = None if env and code else "env" if env else "code"
        synced = run_sync(settings, inventory, nodes, only=only)
        if synced != ExitCode.OK:
            ui.error("not going on: sync failed (see above); `bootstrap sync` repeats just that step")
            return synced
    if len(inventory.nodes) < 2:
        return ExitCode.OK  # one machine: no peers to let in, no clocks to align
    if cluster.firewall.manage and run_firewall(settings, inventory, nodes, remove=False) != ExitCode.OK:
        ui.warn(
            "the firewall step failed on some nodes (see above): the preflight's reachability "
            "check shows whether the nodes can still reach each other"
        )
    if cluster.time.manage and run_ntp(settings, inventory, nodes) != ExitCode.OK:
        ui.warn(
            "time sync failed on some nodes (see above): the preflight's clock check shows "
            "whether it matters for this run"
        )
    return ExitCode.OK
