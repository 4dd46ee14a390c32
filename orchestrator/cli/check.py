"""`bootstrap check`, `facts` and `inventory`: what the nodes are, and whether they will train."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import (
    Settings,
    common_options,
    fail_lines,
    load_selection,
    node_status,
    print_plans,
)
from orchestrator.cli.front import reach_for
from orchestrator.cli.report import json_doc, show_dry_run
from orchestrator.cli.slurm import allocated
from orchestrator.errors import ExitCode
from orchestrator.executor import Outcome, exit_code_for
from orchestrator.inventory import Inventory, Node
from orchestrator.runs.layout import workdir_for
from orchestrator.runs.next_command import with_user_options
from orchestrator.session import Session
from orchestrator.steps.contract import Report
from orchestrator.steps.node_facts import InspectedNode, facts_plan, inspect_all
from orchestrator.steps.preflight import preflight_report
from orchestrator.steps.preflight.checks import refuse_native_mix
from orchestrator.steps.preflight.model import Verdict


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
    ui.print_table(_facts_table(inventory, nodes, outcomes))
    for o in outcomes:
        if o.value is not None:
            for key in o.value.inspected.recorded_host_keys:
                ui.note(f"{o.node}: recorded host key {key}")
            for note in o.value.notes:
                ui.note(f"{o.node}: {note}")
            for fact, why in o.value.inspected.facts.errors.items():
                ui.warn(f"node {o.node!r}: fact {fact!r} unavailable: {why}")
    if checks := {o.node: o.value.checks for o in outcomes if o.value is not None}:
        ui.print_table(_checks_table(nodes, report.data["backend"], checks))
        if len({tuple(v.values()) for v in report.data["versions"].values()}) > 1:
            ui.print_table(_versions_table(report.data["versions"]))
        _check_details(settings, nodes, report.data["backend_reason"], checks)
    fail_lines(ui, outcomes)
    verdict = "ready to train" if code == ExitCode.OK else "NOT ready to train"
    failing = f"{len(report.failing)} failing a check: {verdict}"
    ui.info(f"{sum(o.ok for o in outcomes)}/{len(outcomes)} nodes reachable, {failing}")
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
    ui.print_table(_facts_table(inventory, nodes, outcomes))
    ui.info(f"{sum(o.ok for o in outcomes)}/{len(outcomes)} nodes reachable")
    return code


def _node_fields(o: Outcome[Any]) -> dict[str, Any]:  # an unreachable node: no facts, no checks
    return o.value.public_dict() if o.value else {"transport_notes": [], "checks": {}}


_LEVEL_STYLE = {"ok": ("ok", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "red bold")}


def _checks_table(nodes: list[Node], backend: str, verdicts: dict[str, dict[str, Verdict]]) -> Table:
    from orchestrator.steps.preflight.model import CHECKS

    table = Table(title=Text(f"preflight: backend {backend}"), title_justify="left")
    table.add_column("node")
    for check_name in CHECKS:
        table.add_column(check_name)
    for node in nodes:  # an unreachable node: "-" everywhere
        checks = verdicts.get(node.name, {})
        cells = []
        for check_name in CHECKS:
            verdict = checks.get(check_name)
            label, style = _LEVEL_STYLE[verdict.level] if verdict else ("-", "dim")
            cells.append(Text(label, style=style))
        table.add_row(Text(node.name), *cells)
    return table


def _versions_table(versions: dict[str, dict[str, str | None]]) -> Table:
    """Versions side by side when they differ: the first thing to fix."""
    table = Table(title=Text("versions differ"), title_justify="left")
    for column in ("node", "python", "torch", "cuda"):
        table.add_column(column)
    for node, v in versions.items():
        table.add_row(Text(node), *(Text(v.get(k) or "-") for k in ("python", "torch", "cuda")))
    return table


def _check_details(
    settings: Settings, nodes: list[Node], backend_reason: str, verdicts: dict[str, dict[str, Verdict]]
) -> None:
    """Every verdict on one line under the table; problems first, with their fix (the commands it
    suggests given this command's own -i, --known-hosts, --ssh-config)."""
    ui = settings.ui
    ui.info(f"backend: {backend_reason}")
    for level in ("fail", "warn", "ok") if ui.verbose else ("fail", "warn"):
        for node in nodes:
            for name, verdict in verdicts.get(node.name, {}).items():
                if verdict.level != level:
                    continue
                label, style = _LEVEL_STYLE[level]
                reason = with_user_options(settings, verdict.reason)
                line = Text(f"{node.name} ") + Text(label, style=style) + Text(f" {name}: {reason}")
                if verdict.fix:
                    fix = with_user_options(settings, verdict.fix)
                    line += Text(f" -> {fix}", style="dim" if level == "ok" else "")
                ui.err.print(line) if level != "ok" else ui.err.print(line, style="dim")


def _gib(value: int | None) -> str:
    return f"{value / 2**30:.1f} GiB" if value else "-"


def _facts_table(inventory: Inventory, nodes: list[Node], outcomes: list[Outcome[Any]]) -> Table:
    """The nodes' facts (``outcomes``: of `facts`, InspectedNode; of `check`, NodeChecks)."""
    table = Table(title=Text(f"cluster {inventory.cluster.name}: {len(nodes)} node(s)"), title_justify="left")
    for column in ("node", "status", "via", "hostname", "os", "cpus", "memory", "python", "torch", "gpus"):
        table.add_column(column, overflow="fold")
    for node, outcome in zip(nodes, outcomes, strict=True):
        master = " (master)" if node.name == inventory.cluster.master else ""
        if outcome.value is None:
            status = node_status(outcome.error) if outcome.error else "failed"
            table.add_row(Text(node.name + master), Text(status, style="red"), *["-"] * 8)
            continue
        seen = outcome.value if isinstance(outcome.value, InspectedNode) else outcome.value.inspected
        facts = seen.facts
        os_info, kernel = facts.get("os"), facts.get("kernel")
        python, torch, gpus = facts.get("python"), facts.get("torch"), facts.get("gpus")
        os_text = os_info.pretty_name if os_info else "?"
        if kernel:
            os_text += f" ({kernel.machine})"
        windows, modes = facts.get("windows"), facts.get("modes")
        if windows is not None:  # native: Windows itself; WSL mode: the distribution on it
            build = f"{windows.build}" + (f".{windows.ubr}" if windows.ubr is not None else "")
            shown = f"{windows.caption} (build {build})"
            os_text = f"{os_text} in WSL on {shown}" if os_info else shown
        if modes is not None:
            os_text += "; modes: " + (", ".join(modes.modes) or "none")
        torch_text = "-"
        if python is None:
            py_text = Text(f"{node.python or 'python3'} not found", style="yellow")
        else:
            py_text = Text(python.version)
        if torch is not None:
            if not torch.installed:
                torch_text = "not installed"
            elif torch.error:
                torch_text = f"broken: {torch.error}"
            else:
                backends = ", ".join(b for b in ("gloo", "nccl") if getattr(torch, b)) or "no distributed"
                cuda = f" cuda {torch.cuda_build}" if torch.cuda_build else ""
                torch_text = f"{torch.version}{cuda} ({backends})"
        gpu_text = "-"
        if gpus is not None:
            if gpus.error:
                gpu_text = f"nvidia-smi failed: {gpus.error}"
            elif gpus.gpus:
                names = sorted({g.name for g in gpus.gpus})
                gpu_text = f"{len(gpus.gpus)}x " + ", ".join(names)
            else:
                gpu_text = "none"
        memory = facts.get("memory")
        # data from nodes goes in as Text: rich would read "[gloo]" in a plain string as markup
        table.add_row(
            Text(node.name + master),
            Text("ok", style="green"),
            Text(seen.via),
            Text(str(facts.get("hostname") or "?")),
            Text(os_text),
            Text(str(facts.get("cpus") or "?")),
            Text(_gib(memory.total_bytes if memory else None)),
            py_text,
            Text(torch_text),
            Text(gpu_text),
        )
    return table


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
        settings.ui.print_json(
            {**inventory.public_dict(), "cannot_train": str(mix) if mix is not None else None}
        )
        return
    table = Table(
        title=Text(f"cluster {inventory.cluster.name} ({inventory.format} inventory {inventory.source})")
    )
    for column in ("node", "connection", "address", "user", "os", "gpus", "nproc", "workdir", "tags"):
        table.add_column(column)
    for node in nodes:
        master = " (master)" if node.name == inventory.cluster.master else ""
        cells = (
            node.connection,
            node.address,
            node.user or "-",
            node.os if node.os != "windows" else f"windows ({_windows_mode(node)})",
            node.gpus,
            node.nproc,
            workdir_for(node),  # {node} replaced: where its runs, code and venv go
            ",".join(node.tags),
        )
        table.add_row(Text(node.name + master), *(Text(str(c)) for c in cells))
    settings.ui.print_table(table)
    c = inventory.cluster
    settings.ui.print_text(f"master {c.master}, rendezvous port {c.port}, backend {c.backend}")
    if mix is not None:
        settings.ui.warn(f"this inventory cannot train as it is: {mix}")


def _windows_mode(node: Node) -> str:
    """``wsl:Ubuntu-22.04``, ``wsl`` (the user's default distribution) or ``native``."""
    if node.windows.mode == "native":
        return "native"
    return f"wsl:{node.windows.distro}" if node.windows.distro else "wsl"


def check_on_slurm(settings: Settings, inventory: Inventory) -> ExitCode:
    """`check` on Slurm: a job holds the request's nodes; the preflight's facts and probes run on
    each as a job step (orchestrator/slurm/relay.py) and are judged and shown as on any cluster;
    then the job is cancelled. Firewall and time sync are the cluster admins': not checked."""
    settings.ui.note("firewall: not checked on Slurm (the cluster's admins own the compute nodes' network)")
    settings.ui.note("time: not checked on Slurm (the cluster's admins keep the compute nodes' clocks)")
    with allocated(settings, inventory, "check") as (nodes, on):
        return run_check(settings, nodes, list(nodes.nodes), session=on)
