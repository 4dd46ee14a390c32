"""`bootstrap sync`: the pinned Python environment, then the project code, on every node.

Registered on import by orchestrator/cli/__init__.py. The work is in orchestrator/steps/envsync
(environment) and orchestrator/steps/codesync (code); this module only runs them and reports.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import (
    Settings,
    common_options,
    fail_lines,
    interrupted,
    load_selection,
    node_docs,
    node_status,
    phase_session,
)
from orchestrator.errors import ExitCode, UsageError
from orchestrator.executor import Outcome, exit_code_for
from orchestrator.inventory import Inventory, Node
from orchestrator.pipeline import wants_code_sync
from orchestrator.redact import mask_url_credentials
from orchestrator.session import Session
from orchestrator.steps.envsync import (
    EnvInstallError,
    EnvSharedError,
    EnvSpec,
    NodeEnv,
    resolve_specs,
    summarize_outcomes,
    sync_env,
)
from orchestrator.steps.envsync.master import (
    Reference,
    freeze_texts,
    read_reference,
    recorded_nodes,
    remember,
    spec_from_master,
    write_freeze,
)
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
@click.option(
    "--from-master",
    is_flag=True,
    help="Without cluster.env: give every node a venv with the master's torch and its companions, "
    "at the master's exact versions (docs/sync.md).",
)
@click.option(
    "--freeze",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Write the master's torch and companions, pinned, to FILE (a requirements file to commit and "
    "name in cluster.env.requirements); with --from-master, sync too.",
)
@click.pass_context
def sync(
    ctx: click.Context, force: bool, only: str | None, from_master: bool, freeze: Path | None
) -> ExitCode:
    """Make every node's Python environment and code identical to what the inventory declares.

    Environment (cluster.env): a venv per node at env.path (default <workdir>/venv) with exactly the
    pinned requirements, installed by uv where the node has it, else pip. An unchanged node is
    skipped after one round trip (a stamp in the venv); a changed one gets a new venv built beside the
    active one, switched to only when the install succeeded. Offline mode pushes wheels from this
    machine. Afterwards every node's installed versions are compared: one line per distinct
    environment; any difference fails the command (exit 1), naming the packages.

    Without cluster.env, --from-master installs the master's training environment instead (torch,
    torchvision, torchaudio and numpy when the master has them, and what they require, at the master's
    versions, from the wheel index of its torch build); check, validate and launch then use it.
    --freeze FILE writes that set as a requirements file for cluster.env.

    Code (cluster.code): the project directory, only changed files moved. See docs/sync.md.
    """
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    if freeze is not None and not from_master:
        return run_freeze(settings, inventory, nodes, freeze)
    if from_master and inventory.cluster.env.declared:
        raise UsageError(
            f"{inventory.source}: cluster.env declares this cluster's environment: "
            "`bootstrap sync` installs it",
            hint="--from-master is for inventories without cluster.env (to pin the master's environment "
            "into a file for it: bootstrap sync --freeze requirements.txt)",
        )
    return run_sync(
        settings, inventory, nodes, force=force, only=only, from_master=from_master, freeze=freeze
    )


def run_sync(
    settings: Settings,
    inventory: Inventory,
    nodes: list[Node],
    *,
    force: bool = False,
    only: str | None = None,
    session: Session | None = None,
    from_master: bool = False,
    freeze: Path | None = None,
) -> ExitCode:
    """The sync phase (also a step of the main pipeline); its exit code. ``from_master``: without
    cluster.env, the master's training environment (orchestrator/steps/envsync/master.py)."""
    ui = settings.ui
    do_env = only in (None, "env")
    do_code = only in (None, "code")
    from_master = from_master and not inventory.cluster.env.declared
    if do_env and not inventory.cluster.env.declared and not from_master:
        if only == "env":
            ui.error(
                "cluster.env declares no requirements or packages: nothing to sync "
                "(`bootstrap sync --from-master` installs the master's torch on every node; docs/sync.md)"
            )
            return ExitCode.USAGE
        recorded = recorded_nodes(inventory)
        if recorded:
            ui.note(
                f"no cluster.env: environment sync skipped ({', '.join(recorded)} train in the master's "
                "environment from `bootstrap sync --from-master`: run that again to refresh it)"
            )
        else:
            ui.note(
                "no cluster.env in the inventory: environment sync skipped "
                "(`bootstrap sync --from-master` installs the master's torch on every node)"
            )
        do_env = False
    if only is None and not wants_code_sync(inventory):
        # as the pipeline does: the default source is the current directory, which may be a home;
        # pushing it takes a cluster.code section, or asking for it by name
        ui.note(
            "no cluster.code in the inventory: code sync skipped (`bootstrap sync --only code` pushes "
            "the current directory to <workdir>/code on every node; docs/sync.md)"
        )
        do_code = False
    if do_code:
        from orchestrator.steps.codesync import code_source

        source = code_source(inventory.cluster)
        try:
            is_dir = source.is_dir()
        except (OSError, ValueError):  # a name too long for this file system
            is_dir = False
        if not is_dir:  # before any node is contacted (and before the environment work)
            raise UsageError(
                f"code.source {source} is not a directory",
                hint="set cluster.code.source to your project directory (relative to the current one)",
            )
    if do_env and not from_master:
        specs = resolve_specs(inventory, nodes)  # a bad env section stops here, exit 2, nothing contacted
        for spec in specs.values():
            for warning in spec.warnings:
                ui.warn(warning)
    env_outcomes: list[Outcome[NodeEnv]] = []
    code_outcomes: list[Outcome[Any]] = []
    master_note: str | None = None
    try:
        if do_env or do_code:  # else nothing to sync: no node is contacted
            with phase_session(settings, inventory, nodes, session) as on:
                if do_env and from_master:
                    env_outcomes, master_note = _run_from_master(
                        settings, on, inventory, nodes, force=force, freeze=freeze
                    )
                elif do_env:
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
        doc: dict[str, Any] = {
            "command": "sync",
            "dry_run": settings.dry_run,
            "from_master": from_master,  # the environment is the master's (no cluster.env)
            "env": _env_json(env_outcomes, report) if do_env else None,
            "code": _code_json(code_outcomes) if do_code else None,
            "exit_code": int(code),
        }
        ui.print_json(doc)
        return code
    if do_env:
        if master_note:
            ui.note(master_note)
        if env_outcomes or not from_master:
            _env_human(settings, env_outcomes, report)
    if do_code:
        _code_human(settings, code_outcomes)
    return code


def _run_env(
    settings: Settings,
    session: Session,
    inventory: Inventory,
    nodes: list[Node],
    *,
    force: bool,
    specs: dict[str, EnvSpec] | None = None,
) -> list[Outcome[NodeEnv]]:
    ui = settings.ui
    if settings.dry_run:
        return sync_env(session, inventory, nodes, dry_run=True, force=force, specs=specs)
    printer = ui.line_printer([n.name for n in nodes], stream=ui.err.file) if settings.verbose else None

    def on_line(node: str, line: str) -> None:
        if printer is not None and not settings.json_mode:
            printer.write(node, line)

    with ui.board([n.name for n in nodes], "env") as board:
        session.executor.on_event = board.on_event
        try:
            return sync_env(
                session,
                inventory,
                nodes,
                force=force,
                on_line=on_line,
                on_progress=board.update,
                specs=specs,
                on_notice=None if settings.json_mode else ui.note,
            )
        finally:
            session.executor.on_event = None


def _run_from_master(
    settings: Settings,
    session: Session,
    inventory: Inventory,
    nodes: list[Node],
    *,
    force: bool,
    freeze: Path | None,
) -> tuple[list[Outcome[NodeEnv]], str | None]:
    """The master's environment on ``nodes`` (the master itself left out when its own interpreter is
    the reference), then the record check, validate and launch read (master.py)."""
    ui = settings.ui
    reference = _read_reference(settings, session, inventory)
    env = reference.env
    targets = [
        n for n in nodes if not (reference.master_is_reference and n.name == inventory.master_node.name)
    ]
    torch_line = f"torch {env.torch} and {len(env.packages) - 1} companions from {env.where}"
    if freeze is not None and not settings.dry_run:
        for path in write_freeze(freeze, inventory, nodes, env):
            ui.note(f"wrote {path}: {torch_line}")
    if not targets:
        return (
            [],
            f"nothing to sync: {inventory.master_node.name} is the master, whose Python is the reference",
        )
    oses: set[str] = {n.python_os for n in targets}
    specs = {os_name: spec_from_master(inventory, env, os_name) for os_name in sorted(oses)}
    if not settings.json_mode:
        ui.note(f"the master's environment: {torch_line}")
    outcomes = _run_env(settings, session, inventory, targets, force=force, specs=specs)
    if settings.dry_run:
        return outcomes, None
    synced = {
        o.node: {"env_id": o.value.env_id, "torch": o.value.packages.get("torch"), "source": env.where}
        for o in outcomes
        if o.value is not None
    }
    if not synced:
        return outcomes, None
    record = remember(inventory, synced)
    envs = [o.value for o in outcomes if o.value is not None]
    return outcomes, (
        f"training on {', '.join(synced)} now uses {_where(envs)} (recorded in {record}); to make it "
        "part of the inventory: bootstrap sync --freeze requirements.txt, then "
        "cluster.env.requirements: requirements.txt"
    )


def _where(envs: list[NodeEnv]) -> str:
    """The interpreter launch runs: one path, or each node's (``{node}`` in workdir)."""
    paths = {e.python_path for e in envs}
    if len(paths) == 1:
        return paths.pop()
    shown = "; ".join(f"{e.node}: {e.python_path}" for e in envs[:3])
    return f"each node's own venv ({shown}{'; ...' if len(envs) > 3 else ''})"


def _read_reference(settings: Settings, session: Session, inventory: Inventory) -> Reference:
    master = inventory.master_node
    found = session.map(lambda node, t: read_reference(inventory, t), step="master", nodes=[master])[0]
    if found.error is not None:
        raise found.error
    assert found.value is not None
    return found.value


def run_freeze(settings: Settings, inventory: Inventory, nodes: list[Node], path: Path) -> ExitCode:
    """``bootstrap sync --freeze FILE`` alone: read the master, write the file(s), sync nothing."""
    ui = settings.ui
    with phase_session(settings, inventory, nodes, None) as on:
        reference = _read_reference(settings, on, inventory)
    env = reference.env
    if settings.dry_run:  # what would be written, written nowhere
        for target, text in freeze_texts(path, inventory, nodes, env).items():
            ui.print_text(f"# would write {target}:")
            ui.print_text(text.rstrip("\n"))
        return ExitCode.OK
    files = write_freeze(path, inventory, nodes, env)
    if settings.json_mode:
        ui.print_json(
            {
                "command": "sync",
                "freeze": {
                    "files": [str(f) for f in files],
                    "master": env.where,
                    "torch": env.torch,
                    "packages": env.packages,
                },
                "exit_code": 0,
            }
        )
        return ExitCode.OK
    base = Path(str(inventory.source)).resolve().parent
    for written in files:
        try:
            shown = written.resolve().relative_to(base)
        except ValueError:
            shown = written.resolve()
        ui.info(f"wrote {written}: torch {env.torch} and {len(env.packages) - 1} companions from {env.where}")
        ui.note(
            f"declare it in the inventory: cluster: {{env: {{requirements: {shown}}}}} (then bootstrap sync)"
        )
    return ExitCode.OK


def _run_code(
    settings: Settings, session: Session, inventory: Inventory, nodes: list[Node]
) -> list[Outcome[Any]]:
    # The code half (orchestrator/steps/codesync, written alongside): same session, same nodes.
    from orchestrator.steps.codesync import sync_code

    with settings.ui.board([n.name for n in nodes], "code") as board:
        session.executor.on_event = board.on_event
        try:
            outcomes: list[Outcome[Any]] = sync_code(
                session, inventory, nodes, dry_run=settings.dry_run, on_progress=board.update
            )
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
            if o.value is not None:
                for line in _plan_lines(o.value):
                    ui.print_text(line)
                ui.print_text("")
        fail_lines(ui, outcomes)
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
        if isinstance(o.error, EnvInstallError):
            for line in o.error.lines:  # may repeat an index URL
                ui.info(f"  {o.node} | {mask_url_credentials(line)}")
    if report.mismatch:
        ui.error("the nodes' environments differ (torch and Python must be identical on every rank):")
        for line in report.describe_mismatch():
            ui.info(f"  {line}")
    unchanged = sum(1 for o in outcomes if o.value is not None and o.value.action == "unchanged")
    done = sum(1 for o in outcomes if o.value is not None)
    failed = len(outcomes) - done
    parts = []
    if report.mismatch:
        parts.append("environments DIFFER")
    elif done > 1:
        parts.append("identical")
    elif done == 1 and not failed:
        parts.append("ok")
    if failed:
        parts.append(f"{failed} failed")
    shared = _shared_headline(outcomes)
    if shared:
        parts.append(shared)
    counted = f" ({unchanged} unchanged)" if done else ""
    ui.info(f"environment: {done}/{len(outcomes)} nodes synced{counted}, {', '.join(parts)}")
    if done:
        envs = [o.value for o in outcomes if o.value is not None]
        ui.note(f"launch with {_where(envs)} (the stable path; each build is switched in atomically)")


def _plan_lines(env: NodeEnv) -> list[str]:
    """A dry run's view of one node: unchanged, or its plan (uploads, then each command as the node's
    shell receives it)."""
    head = f"# {env.node}: environment at {env.path} (python: {env.python_path})"
    if env.plan is None:
        return [f"{head}: {env.action}, build {env.env_id or '-'}: nothing to send"]
    lines = [f"{head}: build {env.env_id} with {env.installer}, Python {env.python}"]
    for action in env.plan["actions"]:
        if "put" in action:
            private = " (owner-only)" if action["mode"] == "0600" else ""
            lines.append(
                f"# upload{private}: {action['what']} -> {action['put']} "
                f"({action['bytes']} bytes, sha256 {action['sha256']})"
            )
        else:
            lines.append(f"# {action['what']}{' (as root)' if action['as_root'] else ''}:")
            lines.append(action["sent"])
    return lines


def _shared_headline(outcomes: list[Outcome[NodeEnv]]) -> str | None:
    """When nodes were refused because they share a directory: that is the cause, said once."""
    by_dir: dict[str, set[str]] = {}
    for o in outcomes:
        if isinstance(o.error, EnvSharedError):
            by_dir.setdefault(o.error.directory, set()).update([o.node, *o.error.shared_with])
    if not by_dir:
        return None
    groups = [f"{', '.join(sorted(names))} share {where}" for where, names in sorted(by_dir.items())]
    return (
        "; ".join(groups)
        + " (one filesystem: nothing was installed; not a pip or index problem): give each node its own "
        "directory with {node} in workdir (docs/quickstart.md)"
    )


def _env_json(outcomes: list[Outcome[NodeEnv]], report: EnvReport) -> dict[str, Any]:
    return {
        "nodes": node_docs(
            outcomes,
            lambda o: {
                "kept_previous": getattr(o.error, "kept", None),
                **(o.value.public_dict() if o.value else {}),
            },
        ),
        "environments": [
            {"nodes": g.nodes, "os": g.os, "python": g.python, "packages": g.packages} for g in report.groups
        ],
        "identical": not report.mismatch,
        "differing": report.differing,
    }


def _code_json(outcomes: list[Outcome[Any]]) -> dict[str, Any]:
    return {"nodes": node_docs(outcomes)}


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
    for line in shared_lines(outcomes):
        ui.note(line)
    fail_lines(ui, [o for o in outcomes if o.error is not None])


def shared_lines(outcomes: list[Outcome[Any]]) -> list[str]:
    """One line per code directory several nodes share: which nodes, and the one that wrote it."""
    lines = []
    for o in outcomes:
        value = o.value
        if (
            value is None
            or getattr(value, "synced_by", None) is not None
            or not getattr(value, "shared_with", None)
        ):
            continue
        nodes = ", ".join([o.node, *value.shared_with])
        lines.append(
            f"{value.dest} is one directory on {nodes} (a shared file system): synced once, from {o.node}"
        )
    return lines
