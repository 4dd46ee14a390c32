"""`bootstrap sync`: the pinned Python environment, then the project code, on every node.

Registered on import by orchestrator/cli/__init__.py. The work is in orchestrator/steps/envsync
(environment) and orchestrator/steps/codesync (code); this module only runs them and reports.
"""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import (
    Settings,
    common_options,
    error_dict,
    fail_lines,
    interrupted,
    load_selection,
    node_status,
    phase_session,
)
from orchestrator.errors import ExitCode, UsageError
from orchestrator.executor import Outcome, exit_code_for
from orchestrator.inventory import Inventory, Node
from orchestrator.redact import mask_url_credentials
from orchestrator.session import Session
from orchestrator.steps.envsync import NodeEnv, resolve_specs, summarize_outcomes, sync_env
from orchestrator.steps.envsync.report import EnvReport

TAIL = 15
_ACTION_STYLE = {
    "unchanged": "green",
    "installed": "cyan",
    "updated": "cyan",
    "rebuilt": "cyan",
    "planned": "dim",
}


@click.command()
@common_options
@click.option("--force", is_flag=True, help="Rebuild every environment, even when its stamp matches.")
@click.option(
    "--only",
    type=click.Choice(["env", "code"]),
    help="Only the environment (cluster.env) or only the code (cluster.code).",
)
@click.pass_context
def sync(ctx: click.Context, force: bool, only: str | None) -> None:
    """Make every node's Python environment and code identical to what the inventory declares.

    Environment (cluster.env): a venv per node at env.path (default <workdir>/venv) with exactly the
    pinned requirements, installed by uv where the node has it, else pip. An unchanged node is
    skipped after one round trip (a stamp in the venv); a changed one gets a new venv built beside the
    active one, switched to only when the install succeeded. Offline mode pushes wheels from this
    machine. Afterwards every node's installed versions are compared: one line per distinct
    environment; any difference fails the command (exit 1), naming the packages.

    Code (cluster.code): the project directory, only changed files moved. See docs/sync.md.
    """
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    ctx.exit(int(run_sync(settings, inventory, nodes, force=force, only=only)))


def run_sync(
    settings: Settings,
    inventory: Inventory,
    nodes: list[Node],
    *,
    force: bool = False,
    only: str | None = None,
    session: Session | None = None,
) -> ExitCode:
    """The sync phase (also a step of the main pipeline); its exit code."""
    ui = settings.ui
    do_env = only in (None, "env")
    do_code = only in (None, "code")
    if do_env and not inventory.cluster.env.declared:
        if only == "env":
            ui.error("cluster.env declares no requirements or packages: nothing to sync (see docs/sync.md)")
            return ExitCode.USAGE
        ui.note("no cluster.env in the inventory: environment sync skipped")
        do_env = False
    if do_code:
        from orchestrator.steps.codesync import code_source

        source = code_source(inventory.cluster)
        if not source.is_dir():  # before any node is contacted (and before the environment work)
            raise UsageError(
                f"code.source {source} is not a directory",
                hint="set cluster.code.source to your project directory (relative to the current one)",
            )
    if do_env:
        specs = resolve_specs(inventory, nodes)  # a bad env section stops here, exit 2, nothing contacted
        for spec in specs.values():
            for warning in spec.warnings:
                ui.warn(warning)
    env_outcomes: list[Outcome[NodeEnv]] = []
    code_outcomes: list[Outcome[Any]] = []
    try:
        with phase_session(settings, inventory, nodes, session) as on:
            if do_env:
                env_outcomes = _run_env(settings, on, inventory, nodes, force=force)
            if do_code:
                code_outcomes = _run_code(settings, on, inventory, nodes)
    except KeyboardInterrupt:
        interrupted(ui)
    report = summarize_outcomes(env_outcomes)
    code = exit_code_for([*env_outcomes, *code_outcomes])
    if report.mismatch and code == ExitCode.OK:
        code = ExitCode.NODES_FAILED
    if settings.json_mode:
        fail_lines(ui, [*env_outcomes, *code_outcomes])
        ui.print_json(
            {
                "command": "sync",
                "dry_run": settings.dry_run,
                "env": _env_json(env_outcomes, report) if do_env else None,
                "code": _code_json(code_outcomes) if do_code else None,
                "exit_code": int(code),
            }
        )
        return code
    if do_env:
        _env_human(settings, env_outcomes, report)
    if do_code:
        _code_human(settings, code_outcomes)
    return code


def _run_env(
    settings: Settings, session: Session, inventory: Inventory, nodes: list[Node], *, force: bool
) -> list[Outcome[NodeEnv]]:
    ui = settings.ui
    if settings.dry_run:
        return sync_env(session, inventory, nodes, dry_run=True, force=force)
    printer = ui.line_printer([n.name for n in nodes], stream=ui.err.file) if settings.verbose else None

    def on_line(node: str, line: str) -> None:
        if printer is not None and not settings.json_mode:
            printer.write(node, line)

    with ui.progress([n.name for n in nodes], "env") as on_event:
        session.executor.on_event = on_event
        try:
            return sync_env(session, inventory, nodes, force=force, on_line=on_line)
        finally:
            session.executor.on_event = None


def _run_code(
    settings: Settings, session: Session, inventory: Inventory, nodes: list[Node]
) -> list[Outcome[Any]]:
    # The code half (orchestrator/steps/codesync, written alongside): same session, same nodes.
    from orchestrator.steps.codesync import sync_code

    with settings.ui.progress([n.name for n in nodes], "code") as on_event:
        session.executor.on_event = on_event
        try:
            outcomes: list[Outcome[Any]] = sync_code(session, inventory, nodes, dry_run=settings.dry_run)
        finally:
            session.executor.on_event = None
    return outcomes


# -- reporting ----------------------------------------------------------------------------------------


def _changes_text(env: NodeEnv) -> str:
    if env.action == "unchanged":
        return "-"
    if not env.changes:
        return "no version changed"
    parts = []
    for name, (old, new) in env.changes.items():
        if old is None:
            parts.append(f"+{name} {new}")
        elif new is None:
            parts.append(f"-{name} {old}")
        else:
            parts.append(f"{name} {old} -> {new}")
    shown = parts[:4]
    if len(parts) > 4:
        shown.append(f"+{len(parts) - 4} more")
    return ", ".join(shown)


def _env_human(settings: Settings, outcomes: list[Outcome[NodeEnv]], report: EnvReport) -> None:
    ui = settings.ui
    if settings.dry_run:
        for o in outcomes:
            if o.value is None:
                continue
            ui.print_text(f"# {o.node}: environment at {o.value.path} (python: {o.value.python_path})")
            for command in o.value.commands:
                ui.print_text(command)
            ui.print_text("")
        return
    table = Table(title=Text("environment"), title_justify="left")
    for column in ("node", "result", "installer", "python", "env", "changes", "time"):
        table.add_column(column, overflow="fold")
    for o in outcomes:
        env = o.value
        if env is None:
            status = "install failed" if type(o.error).__name__ == "EnvInstallError" else "failed"
            label = (
                node_status(o.error) if o.error is not None and node_status(o.error) != "failed" else status
            )
            table.add_row(Text(o.node), Text(label, style="red"), "-", "-", "-", "-", f"{o.duration:.2f}s")
            continue
        table.add_row(
            Text(o.node),
            Text(env.action, style=_ACTION_STYLE.get(env.action, "")),
            Text(env.installer or "-"),
            Text(env.python),
            Text(env.env_id or "-"),
            Text(_changes_text(env)),
            f"{o.duration:.2f}s",
        )
    ui.print_table(table)
    if report.groups:
        title = "environments" if len(report.groups) > 1 else "environment"
        groups = Table(title=Text(f"{len(report.groups)} distinct {title}"), title_justify="left")
        for column in ("", "nodes", "versions"):
            groups.add_column(column, overflow="fold")
        for index, group in enumerate(report.groups):
            style = "red" if report.mismatch else "green"
            groups.add_row(
                Text(chr(ord("A") + index) if index < 26 else str(index), style=style),
                Text(", ".join(group.nodes)),
                Text(group.describe()),
            )
        ui.print_table(groups)
    fail_lines(ui, outcomes)
    for o in outcomes:
        result = getattr(o.error, "result", None)
        if result is not None and hasattr(result, "tail") and type(o.error).__name__ == "EnvInstallError":
            for line in result.tail(TAIL):  # the installer's words: may repeat an index URL
                ui.info(f"  {o.node} | {mask_url_credentials(line)}")
    if report.mismatch:
        ui.error("the nodes' environments differ (torch and Python must be identical on every rank):")
        for line in report.describe_mismatch():
            ui.info(f"  {line}")
    unchanged = sum(1 for o in outcomes if o.value is not None and o.value.action == "unchanged")
    done = sum(1 for o in outcomes if o.value is not None)
    failed = len(outcomes) - done
    verdict = "environments DIFFER" if report.mismatch else "identical" if done > 1 else "ok"
    if failed:
        verdict += f", {failed} failed"
    ui.info(f"environment: {done}/{len(outcomes)} nodes synced ({unchanged} unchanged), {verdict}")
    if done:
        first = next(o.value for o in outcomes if o.value is not None)
        ui.note(f"launch with {first.python_path} (the stable path; each build is switched in atomically)")


def _env_json(outcomes: list[Outcome[NodeEnv]], report: EnvReport) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "name": o.node,
                "ok": o.ok,
                "duration": round(o.duration, 4),
                "error": error_dict(o.error),
                "kept_previous": getattr(o.error, "kept", None),
                **(o.value.public_dict() if o.value else {}),
            }
            for o in outcomes
        ],
        "environments": [
            {"nodes": g.nodes, "os": g.os, "python": g.python, "packages": g.packages} for g in report.groups
        ],
        "identical": not report.mismatch,
        "differing": report.differing,
    }


def _code_json(outcomes: list[Outcome[Any]]) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "name": o.node,
                "ok": o.ok,
                "duration": round(o.duration, 4),
                "error": error_dict(o.error),
                **(o.value.public_dict() if o.value is not None and hasattr(o.value, "public_dict") else {}),
            }
            for o in outcomes
        ]
    }


def _code_human(settings: Settings, outcomes: list[Outcome[Any]]) -> None:
    ui = settings.ui
    table = Table(title=Text("code"), title_justify="left")
    for column in ("node", "result", "time"):
        table.add_column(column, overflow="fold")
    for o in outcomes:
        if o.value is None:
            label = Text(node_status(o.error) if o.error is not None else "failed", style="red")
        else:
            summary = o.value.summary() if hasattr(o.value, "summary") else "ok"
            label = Text(str(summary), style="green" if getattr(o.value, "unchanged", False) else "cyan")
        table.add_row(Text(o.node), label, f"{o.duration:.2f}s")
    ui.print_table(table)
    fail_lines(ui, [o for o in outcomes if o.error is not None])
