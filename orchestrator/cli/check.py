"""`bootstrap check`, `facts` and `inventory`: what the nodes are, and whether they will train."""

from __future__ import annotations

from typing import Any

import click

from orchestrator.cli.common import (
    Settings,
    common_options,
    load_selection,
    print_plans,
)
from orchestrator.cli.front import reach_for
from orchestrator.cli.report import draw, fail_lines, json_doc, show_dry_run, tell
from orchestrator.errors import ExitCode
from orchestrator.executor import Outcome, exit_code_for
from orchestrator.inventory import Inventory, Node
from orchestrator.inventory.show import inventory_view
from orchestrator.session import Session
from orchestrator.slurm.pipeline import allocation
from orchestrator.steps.contract import Report
from orchestrator.steps.node_facts import facts_plan, facts_view, inspect_all
from orchestrator.steps.preflight import check_shown, preflight_report
from orchestrator.steps.preflight.checks import refuse_native_mix


@click.command()
@common_options
@click.pass_context
def check(ctx: click.Context) -> int:
    """Will this cluster train? Connect to every node, show what it is, and check it.

    Checks, each ok / warn / fail per node with the reason and the fix: versions (torch, Python,
    CUDA build identical; gloo really usable), backend (what auto picks and why), interface (the route
    to the master, the 127.0.1.1 trap, overrides), reachability (master port free and reachable, full
    mesh on ephemeral ports), clock (offset from the master), resources (GPUs, disk, Python).
    """
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    refuse_native_mix(inventory)  # exit 2 before connecting (the main pipeline refuses it once too)
    if inventory.cluster.slurm is not None:  # the nodes are Slurm's: checked inside an allocation
        return check_on_slurm(settings, inventory)
    return run_check(settings, inventory, nodes)


def run_check(
    settings: Settings, inventory: Inventory, nodes: list[Node], *, session: Session | None = None
) -> ExitCode:
    """`bootstrap check` (also the Slurm pipeline's, in its allocation): shown; its exit code."""
    dry_run = settings.ssh_options() if settings.dry_run else None
    report = preflight_report(reach_for(settings, inventory, session), inventory, nodes, dry_run=dry_run)
    return show_check(settings, inventory, nodes, report)


def show_check(settings: Settings, inventory: Inventory, nodes: list[Node], report: Report[Any]) -> ExitCode:
    """The preflight's report: the facts and checks tables (or ``--json``; a dry run's plans); the
    exit code it deserves."""
    ui = settings.ui
    if settings.dry_run:
        show_dry_run(ui, report, json_mode=settings.json_mode)
        return ExitCode.OK
    outcomes, code = report.outcomes, report.exit_code()
    if settings.json_mode:
        fail_lines(ui, outcomes)  # stderr: humans watching a --json run still see what failed
        top = {"inventory": inventory.public_dict(), **report.data}
        return json_doc(
            ui, "check", outcomes, code, _node_fields, lambda o: bool(o.value and not o.value.failed), **top
        )
    tell(ui, check_shown(inventory, nodes, report, verbose=bool(ui.verbose)))
    return code


@click.command()
@common_options
@click.pass_context
def facts(ctx: click.Context) -> int:
    """Connect to every node and show what it is, checking nothing (like `ansible -m setup`)."""
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    ui = settings.ui
    if settings.dry_run:
        print_plans(settings, inventory, nodes, lambda node, t: [facts_plan(node, t)])
        return ExitCode.OK
    outcomes = reach_for(settings, inventory).within(nodes, "facts", inspect_all)
    code = exit_code_for(outcomes)
    fail_lines(ui, outcomes)
    if settings.json_mode:
        return json_doc(ui, "facts", outcomes, code)
    draw(ui, facts_view(inventory, nodes, outcomes))
    ui.info(f"{sum(o.ok for o in outcomes)}/{len(outcomes)} nodes reachable")
    return code


def _node_fields(o: Outcome[Any]) -> dict[str, Any]:  # an unreachable node: no facts, no checks
    return o.value.public_dict() if o.value else {"transport_notes": [], "checks": {}}


@click.command(name="inventory")
@common_options
@click.pass_context
def show_inventory(ctx: click.Context) -> None:
    """Validate the inventory and show the nodes it defines (no connection is made)."""
    from orchestrator.steps.preflight.checks import native_mix_error
    from orchestrator.steps.script_check import check_env_files

    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    check_env_files(inventory)  # the files it names, read as sync reads them: the same verdict
    mix = native_mix_error(inventory)  # loads, but check, validate and launch refuse it (exit 2)
    if settings.json_mode:
        cannot = str(mix) if mix is not None else None
        settings.ui.print_json(
            {"command": "inventory", **inventory.public_dict(), "cannot_train": cannot, "exit_code": 0}
        )
        return
    draw(settings.ui, inventory_view(inventory, nodes))
    c = inventory.cluster
    settings.ui.print_text(f"master {c.master}, rendezvous port {c.port}, backend {c.backend}")
    if mix is not None:
        settings.ui.warn(f"this inventory cannot train as it is: {mix}")


def check_on_slurm(settings: Settings, inventory: Inventory) -> ExitCode:
    """`check` on Slurm: a job holds the request's nodes; the preflight's facts and probes run on
    each as a job step (orchestrator/slurm/relay.py) and are judged and shown as on any cluster;
    then the job is cancelled. Firewall and time sync are the cluster admins': not checked."""
    settings.ui.note("firewall: not checked on Slurm (the cluster's admins own the compute nodes' network)")
    settings.ui.note("time: not checked on Slurm (the cluster's admins keep the compute nodes' clocks)")
    with allocation(reach_for(settings, inventory), inventory, "check", dry_run=settings.dry_run) as (
        nodes,
        on,
    ):
        return run_check(settings, nodes, list(nodes.nodes), session=on)
