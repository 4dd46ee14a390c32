"""The ``bootstrap`` command: the only place that prints for humans and maps errors to exit codes."""

from __future__ import annotations

import getpass
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.table import Table
from rich.text import Text

from orchestrator import __version__
from orchestrator.cli.neutralise import neutralise
from orchestrator.cli.ui import UI, PrefixedOutput
from orchestrator.errors import (
    BootstrapError,
    CancelledError,
    CommandTimeoutError,
    ConnectError,
    ExitCode,
    HostKeyUnknownError,
    RunStoppedError,
    SecretMissingError,
    SudoPasswordRequiredError,
    Terminated,
    UsageError,
)
from orchestrator.executor import Outcome, exit_code_for
from orchestrator.inventory import Inventory, Node, PasswordResolver, load_inventory
from orchestrator.logs import RunLog, new_run_id, state_dir
from orchestrator.platforms import PosixShell, PowerShell, check_env_name, platform_for_node
from orchestrator.render import LaunchSpec
from orchestrator.resources import default_inventory
from orchestrator.safefiles import write_inside
from orchestrator.session import Session
from orchestrator.steps.inspect import NodeFacts, facts_plan, inspect, training_python
from orchestrator.transports import Result, SSHOptions, Transport
from orchestrator.transports.known_hosts import compare_command

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
log = logging.getLogger("orchestrator")


# -- options shared by the group and every subcommand ----------------------------------------------
# `bootstrap --json check` and `bootstrap check --json` both work: values given after the subcommand
# win over those given before it.


def _store(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    obj = ctx.find_root().ensure_object(dict)
    sources = obj.setdefault("_sources", {})
    if value is None or value is False or value == () or value == 0:
        obj.setdefault(param.name, value)
        return
    assert param.name is not None
    source = ctx.get_parameter_source(param.name)
    # a value typed on the command line (before or after the subcommand) beats one that came from
    # an environment variable such as $BOOTSTRAP_INVENTORY, wherever click read that from
    if source != click.core.ParameterSource.COMMANDLINE and sources.get(param.name) == "cli":
        return
    sources[param.name] = "cli" if source == click.core.ParameterSource.COMMANDLINE else "env"
    if param.name == "nodes":
        obj["nodes"] = tuple(obj.get("nodes") or ()) + tuple(value)
    else:
        obj[param.name] = value


def common_options(fn: F) -> F:
    options = [
        click.option(
            "-i",
            "--inventory",
            type=click.Path(dir_okay=False, path_type=Path),
            envvar="BOOTSTRAP_INVENTORY",
            help="Inventory file: our own YAML format or an Ansible YAML inventory. "
            "Default: $BOOTSTRAP_INVENTORY, else the embedded inventory/local.yaml (this machine only).",
        ),
        click.option(
            "--nodes",
            "-n",
            multiple=True,
            help="Only these nodes: names, globs (gpu-*), tag:NAME; comma-separated or repeated.",
        ),
        click.option(
            "--json", "json_mode", is_flag=True, default=None, help="Print one JSON document on stdout."
        ),
        click.option("--dry-run", is_flag=True, default=None, help="Show every command, run nothing."),
        click.option("-v", "--verbose", count=True, help="More detail (-vv: SSH protocol debug)."),
        click.option(
            "--accept-new-host-keys",
            is_flag=True,
            default=None,
            help="Trust and record host keys seen for the first time. Changed keys are always refused.",
        ),
        click.option(
            "--known-hosts",
            type=click.Path(dir_okay=False, path_type=Path),
            help="known_hosts file to verify against (default: ssh config, else ~/.ssh/known_hosts).",
        ),
        click.option(
            "--ssh-config",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            help="OpenSSH client config to honour (default: ~/.ssh/config).",
        ),
        click.option(
            "--connect-timeout", type=click.FloatRange(min=0.1), help="Seconds to wait for a connection (10)."
        ),
        click.option("--forks", type=click.IntRange(min=1), help="Nodes worked on at once (64)."),
        click.option("--no-color", is_flag=True, default=None, help="No colours (also: NO_COLOR=1)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    # every option is collected by _store; none reaches the function as an argument
    for param in getattr(fn, "__click_params__", []):
        if param.name in _COMMON:
            param.callback = _store
            param.expose_value = False
    return fn


_COMMON = {
    "inventory",
    "nodes",
    "json_mode",
    "dry_run",
    "verbose",
    "accept_new_host_keys",
    "known_hosts",
    "ssh_config",
    "connect_timeout",
    "forks",
    "no_color",
}


@dataclass
class Settings:
    inventory: Path | None = None
    nodes: tuple[str, ...] = ()
    json_mode: bool = False
    dry_run: bool = False
    verbose: int = 0
    accept_new_host_keys: bool = False
    known_hosts: Path | None = None
    ssh_config: Path | None = None
    connect_timeout: float | None = None  # None: ssh config ConnectTimeout, else 10 s
    forks: int = 64
    no_color: bool = False
    ui: UI = field(init=False)

    def __post_init__(self) -> None:
        self.ui = UI(json_mode=self.json_mode, verbose=self.verbose, color=False if self.no_color else None)

    @classmethod
    def from_context(cls, ctx: click.Context) -> Settings:
        obj = ctx.find_root().ensure_object(dict)
        known = {k: v for k, v in obj.items() if k in _COMMON and v not in (None, ())}
        settings = cls(**known)
        _configure_logging(settings.verbose)
        return settings

    def ssh_options(self, *, accept_new: bool | None = None) -> SSHOptions:
        return SSHOptions(
            known_hosts=self.known_hosts,
            accept_new_host_keys=self.accept_new_host_keys if accept_new is None else accept_new,
            connect_timeout=self.connect_timeout,
            ssh_config=self.ssh_config,
        )


class _NeutralFormatter(logging.Formatter):
    """Log lines quote what nodes sent (errors, a server's banner at -vv): neutralised like every
    other node text shown (cli/neutralise.py); newlines of tracebacks kept."""

    def format(self, record: logging.LogRecord) -> str:
        return neutralise(super().format(record))


def _configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_NeutralFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    # paramiko's own chatter only with -vv: it would bury our messages
    logging.getLogger("paramiko").setLevel(logging.DEBUG if verbose >= 2 else logging.CRITICAL)
    for noisy in ("invoke", "fabric"):  # configuration dumps, not what a user debugs
        logging.getLogger(noisy).setLevel(logging.WARNING)


# -- loading -----------------------------------------------------------------------------------------


def _load(settings: Settings) -> tuple[Inventory, list[Node]]:
    path = settings.inventory
    if path is None:
        path = default_inventory()
        if not settings.json_mode:
            settings.ui.note(
                f"using the embedded default inventory ({path.name}: this machine only); "
                "pass --inventory FILE for a cluster"
            )
    inventory = load_inventory(path)
    for note in inventory.notes:
        settings.ui.note(f"note: {note}")
    nodes = inventory.select(settings.nodes) if settings.nodes else list(inventory.nodes)
    return inventory, nodes


def _prompt(text: str) -> str:
    return getpass.getpass(text)


def _passwords(settings: Settings, nodes: list[Node]) -> PasswordResolver:
    """Ask for every needed password before parallel work starts (one prompt per distinct secret)."""
    interactive = sys.stdin.isatty() and not settings.dry_run
    resolver = PasswordResolver(prompt=_prompt if interactive else None)
    if interactive:
        for node in nodes:
            try:
                resolver.password_for(node)
            except SecretMissingError:
                pass  # the node fails with this error when it connects; the others go on
    return resolver


def _session(settings: Settings, inventory: Inventory, nodes: list[Node], on_event: Any = None) -> Session:
    return Session(
        inventory,
        nodes,
        ssh=settings.ssh_options(),
        passwords=_passwords(settings, nodes),
        on_event=on_event,
        max_workers=settings.forks,
    )


_STATUS = {
    "UnreachableError": "unreachable",
    "AuthenticationError": "auth failed",
    "HostKeyUnknownError": "unknown host key",
    "HostKeyChangedError": "HOST KEY CHANGED",
    "HostKeyRevokedError": "HOST KEY REVOKED",
    "SecretMissingError": "no password",
    "CancelledError": "cancelled",
    "CommandTimeoutError": "timeout",
    "SudoPasswordRequiredError": "sudo refused",
    "ConnectError": "connection failed",
}


def _status(error: BootstrapError) -> str:
    """A few words for a summary table cell; the full message follows the table."""
    return _STATUS.get(type(error).__name__, "failed")


def _fail_lines(ui: UI, outcomes: list[Outcome[Any]]) -> None:
    """One line per failed node; unknown host keys as one block, since they need one decision."""
    unknown: list[HostKeyUnknownError] = []
    for outcome in outcomes:
        if isinstance(outcome.error, HostKeyUnknownError) and outcome.error.host:
            unknown.append(outcome.error)
        elif outcome.error is not None:
            ui.error(str(outcome.error))
    if not unknown:
        return
    files = sorted({e.known_hosts for e in unknown})
    ui.error(f"{len(unknown)} node(s) offered a host key that is not in {', '.join(files)}:")
    width = max(len(e.node or "") for e in unknown)
    for e in unknown:
        ui.info(f"  {(e.node or '').ljust(width)}  {e.host}  {e.key_type} {e.fingerprint}")
    # the command for the key type each node actually offered
    commands = {e.key_type: compare_command(e.key_type) for e in unknown}
    how = " or ".join(f"{command} (for {kind})" for kind, command in sorted(commands.items()))
    ui.info(
        f"Compare each fingerprint with {how} run on that node, "
        "then rerun with --accept-new-host-keys to record them."
    )


def _error_dict(error: BootstrapError | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {"type": type(error).__name__, "message": error.message, "hint": error.hint}


def _result_dict(outcome: Outcome[Any]) -> dict[str, Any]:
    """A command's output for --json, also when it failed after producing some (timeout, sudo)."""
    result = outcome.value if outcome.value is not None else getattr(outcome.error, "result", None)
    if isinstance(result, Result):
        return result.public_dict()
    return {"exit_code": None, "duration": round(outcome.duration, 4)}


# -- commands ----------------------------------------------------------------------------------------


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BootstrapError as exc:
            settings = Settings.from_context(ctx)
            for line in str(exc).splitlines():
                settings.ui.error(line)
            ctx.exit(int(exc.exit_code))
        except KeyboardInterrupt:  # at a prompt, or anywhere outside the node fan-out
            _interrupted(Settings.from_context(ctx).ui)


@click.group(
    cls=_Group, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="bootstrap")
@common_options
@click.option("--force", is_flag=True, help="Main pipeline: launch even when a preflight check fails.")
@click.option(
    "--skip-validate", is_flag=True, help="Main pipeline: launch without the all_reduce validation first."
)
@click.option("--detach", is_flag=True, help="Main pipeline: train detached (see `launch --detach`).")
@click.pass_context
def cli(ctx: click.Context, force: bool, skip_validate: bool, detach: bool) -> None:
    """Turn the machines of an inventory into one PyTorch training cluster.

    Without a command: the main pipeline: environment and code sync (`sync`, when the inventory
    declares cluster.env / cluster.code), the firewall (`firewall`) and time sync (`ntp`) on clusters
    of 2+ nodes, the preflight (`check`), then, when every check passes (or with --force), every
    rank joins and all_reduce is checked (`validate`, unless --skip-validate), then training on
    every node (`launch`) with every rank's output streamed here.
    """
    if ctx.invoked_subcommand is not None:
        return
    settings = Settings.from_context(ctx)
    inventory, nodes = _load(settings)
    ui = settings.ui
    _refuse_native_mix(inventory)  # exit 2 before sync, firewall or time sync change anything
    if not settings.dry_run:
        from orchestrator.render import require_secrets, templates_dir_for

        require_secrets(inventory)  # train.env from_env: before sync/firewall/ntp change anything
        templates_dir_for(inventory, None)  # train.templates missing: the same, before anything
    if settings.json_mode:
        ui.collected = []  # one document for the whole pipeline: {"check": ..., "launch": ...}
    from orchestrator.cli.pipeline import prepare

    prepared = prepare(settings, inventory, nodes)
    code = _check(settings, inventory, nodes) if prepared == ExitCode.OK else prepared
    launched = False
    if settings.dry_run or prepared != ExitCode.OK:
        pass
    elif code == ExitCode.NODES_FAILED and force:
        ui.warn("--force: launching although a check failed")
        launched = True
    elif code != ExitCode.OK:
        ui.error("not launching: fix what failed above (or pass --force to launch anyway)")
    else:
        launched = True
    if launched and not skip_validate:
        from orchestrator.cli.validate import run_validate

        validated = run_validate(settings, inventory)
        if validated != ExitCode.OK:
            code = validated
            launched = False
            ui.error("not launching: validation failed (see above; --skip-validate launches anyway)")
    if launched:
        try:
            _launch(ctx, settings, inventory, run_id=None, templates_dir=None, detach=detach)
        except click.exceptions.Exit as done:
            code = ExitCode(done.exit_code)
    if ui.collected is not None:
        docs = ui.collected
        ui.collected = None
        ui.print_json(
            {
                "command": "bootstrap",
                **_pipeline_docs(docs),
                "exit_code": int(code),
            }
        )
    ctx.exit(int(code))


def _pipeline_docs(docs: list[Any]) -> dict[str, Any]:
    """The phases' JSON documents keyed by phase (each says its own "command")."""
    out: dict[str, Any] = {k: None for k in ("sync", "firewall", "ntp", "check", "validate", "launch")}
    for doc in docs:
        name = doc.get("command", "check") if isinstance(doc, dict) else "check"
        out[name] = doc
    return out


@cli.command()
@common_options
@click.pass_context
def check(ctx: click.Context) -> None:
    """Will this cluster train? Connect to every node, show what it is, and check it.

    Checks, each ok / warn / fail per node with the reason and the fix: versions (torch, Python,
    CUDA build identical; gloo really usable), backend (what auto picks and why), interface (the route
    to the master, the 127.0.1.1 trap, overrides), reachability (master port free and reachable, full
    mesh on ephemeral ports), clock (offset from the master), resources (GPUs, disk, Python).
    """
    settings = Settings.from_context(ctx)
    inventory, nodes = _load(settings)
    ctx.exit(int(_check(settings, inventory, nodes)))


def _refuse_native_mix(inventory: Inventory) -> None:
    """Native Windows nodes beside Linux or WSL ones cannot train together: a UsageError (exit 2),
    decided from the inventory (not from --nodes or who answers), before connecting."""
    from orchestrator.steps.preflight.checks import refuse_native_mix

    refuse_native_mix(inventory)


def _check(settings: Settings, inventory: Inventory, nodes: list[Node]) -> ExitCode:
    """The preflight with its report; returns the exit code it deserves."""
    ui = settings.ui
    _refuse_native_mix(inventory)
    from orchestrator.steps.preflight import preflight_facts, run_preflight

    if settings.dry_run:
        # the facts round trip; then `date` samples and the reachability probes (listeners, connects)
        master = inventory.master_node
        _dry_run(
            settings,
            inventory,
            nodes,
            lambda node, t: [
                facts_plan(node, t, preflight_facts(node, master), python=training_python(node, inventory))
            ],
        )
        return ExitCode.OK

    names = [n.name for n in nodes]
    session = _session(settings, inventory, nodes)  # asks for passwords before the live display starts
    try:
        with ui.progress(names, "check") as on_event, session:
            session.executor.on_event = on_event
            report = run_preflight(session, inventory)
    except KeyboardInterrupt:
        _interrupted(ui)
    outcomes = report.inspected
    code = exit_code_for(outcomes)
    if code == ExitCode.OK and report.failed:
        code = ExitCode.NODES_FAILED
    if settings.json_mode:
        _fail_lines(ui, outcomes)  # stderr: humans watching a --json run still see what failed
        ui.print_json(
            {
                "command": "check",
                "inventory": inventory.public_dict(),
                "backend": report.backend,
                "backend_reason": report.backend_reason,
                "versions": report.versions,
                "nodes": [
                    {
                        "name": o.node,
                        "ok": o.ok and report.level(o.node) != "fail",
                        "duration": round(o.duration, 4),
                        "error": _error_dict(o.error),
                        **(o.value.public_dict() if o.value else {}),
                        "checks": {
                            name: v.public_dict() for name, v in report.verdicts.get(o.node, {}).items()
                        },
                    }
                    for o in outcomes
                ],
                "exit_code": int(code),
            }
        )
        return code
    ui.print_table(_facts_table(inventory, nodes, outcomes))
    for o in outcomes:
        if o.value is not None:
            for key in o.value.recorded_host_keys:
                ui.note(f"{o.node}: recorded host key {key}")
            for fact, why in o.value.facts.errors.items():
                ui.warn(f"node {o.node!r}: fact {fact!r} unavailable: {why}")
    if report.verdicts:
        ui.print_table(_checks_table(nodes, report))
        if len({tuple(v.values()) for v in report.versions.values()}) > 1:
            ui.print_table(_versions_table(report.versions))
        _check_details(ui, nodes, report)
    _fail_lines(ui, outcomes)
    reachable = sum(o.ok for o in outcomes)
    failing = sum(1 for n in nodes if n.name in report.verdicts and report.level(n.name) == "fail")
    verdict = "ready to train" if code == ExitCode.OK else "NOT ready to train"
    ui.info(f"{reachable}/{len(outcomes)} nodes reachable, {failing} failing a check: {verdict}")
    return code


@cli.command()
@common_options
@click.pass_context
def facts(ctx: click.Context) -> None:
    """Connect to every node and show what it is, checking nothing (like `ansible -m setup`)."""
    settings = Settings.from_context(ctx)
    inventory, nodes = _load(settings)
    ui = settings.ui
    if settings.dry_run:
        _dry_run(settings, inventory, nodes, lambda node, t: [facts_plan(node, t)])
        return
    session = _session(settings, inventory, nodes)
    try:
        with ui.progress([n.name for n in nodes], "facts") as on_event, session:
            session.executor.on_event = on_event
            outcomes = session.map(inspect, step="facts", connect=False)
    except KeyboardInterrupt:
        _interrupted(ui)
    code = exit_code_for(outcomes)
    _fail_lines(ui, outcomes)
    if settings.json_mode:
        nodes_json = [
            {
                "name": o.node,
                "ok": o.ok,
                "duration": round(o.duration, 4),
                "error": _error_dict(o.error),
                **(o.value.public_dict() if o.value else {}),
            }
            for o in outcomes
        ]
        ui.print_json({"command": "facts", "nodes": nodes_json, "exit_code": int(code)})
        ctx.exit(int(code))
    ui.print_table(_facts_table(inventory, nodes, outcomes))
    ui.info(f"{sum(o.ok for o in outcomes)}/{len(outcomes)} nodes reachable")
    ctx.exit(int(code))


_LEVEL_STYLE = {"ok": ("ok", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "red bold")}


def _checks_table(nodes: list[Node], report: Any) -> Table:
    from orchestrator.steps.preflight.model import CHECKS

    table = Table(title=Text(f"preflight: backend {report.backend}"), title_justify="left")
    table.add_column("node")
    for check_name in CHECKS:
        table.add_column(check_name)
    for node in nodes:
        checks = report.verdicts.get(node.name)
        if checks is None:
            table.add_row(Text(node.name), *[Text("-", style="dim")] * len(CHECKS))
            continue
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


def _check_details(ui: UI, nodes: list[Node], report: Any) -> None:
    """Every verdict on one line under the table; problems first, with their fix."""
    ui.info(f"backend: {report.backend_reason}")
    for level in ("fail", "warn", "ok") if ui.verbose else ("fail", "warn"):
        for node in nodes:
            for name, verdict in report.verdicts.get(node.name, {}).items():
                if verdict.level != level:
                    continue
                label, style = _LEVEL_STYLE[level]
                line = Text(f"{node.name} ") + Text(label, style=style) + Text(f" {name}: {verdict.reason}")
                if verdict.fix:
                    line += Text(f" -> {verdict.fix}", style="dim" if level == "ok" else "")
                ui.err.print(line) if level != "ok" else ui.err.print(line, style="dim")


def _gib(value: int | None) -> str:
    return f"{value / 2**30:.1f} GiB" if value else "-"


def _facts_table(inventory: Inventory, nodes: list[Node], outcomes: list[Outcome[NodeFacts]]) -> Table:
    table = Table(title=Text(f"cluster {inventory.cluster.name}: {len(nodes)} node(s)"), title_justify="left")
    for column in ("node", "status", "via", "hostname", "os", "cpus", "memory", "python", "torch", "gpus"):
        table.add_column(column, overflow="fold")
    for node, outcome in zip(nodes, outcomes, strict=True):
        master = " (master)" if node.name == inventory.cluster.master else ""
        if outcome.value is None:
            status = _status(outcome.error) if outcome.error else "failed"
            table.add_row(Text(node.name + master), Text(status, style="red"), *["-"] * 8)
            continue
        facts = outcome.value.facts
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
            Text(outcome.value.via),
            Text(str(facts.get("hostname") or "?")),
            Text(os_text),
            Text(str(facts.get("cpus") or "?")),
            Text(_gib(memory.total_bytes if memory else None)),
            py_text,
            Text(torch_text),
            Text(gpu_text),
        )
    return table


def _dry_run(
    settings: Settings,
    inventory: Inventory,
    nodes: list[Node],
    plan: Callable[[Node, Transport], list[str]],
) -> None:
    """Print what would run on each node without connecting anywhere."""
    session = Session(
        inventory, nodes, ssh=settings.ssh_options(), passwords=PasswordResolver(prompt=None), max_workers=1
    )
    planned = []
    for node in nodes:
        transport = session.transport(node)
        commands = [transport.plan(script) for script in plan(node, transport)]
        planned.append({"name": node.name, "via": transport.describe(), "commands": commands})
    if settings.json_mode:
        settings.ui.print_json({"dry_run": True, "nodes": planned})
        return
    for entry in planned:
        how = (
            " (each script reaches /bin/sh base64-encoded through the login shell)"
            if entry["via"] != "local"
            else ""
        )
        settings.ui.print_text(f"# {entry['name']} ({entry['via']}): would run{how}")
        for command in entry["commands"]:
            settings.ui.print_text(command)
        settings.ui.print_text("")


def _launch_dry_run(
    settings: Settings, inventory: Inventory, run_id: str, renderer: Any, *, detach: bool
) -> None:
    """Per node: what would be uploaded where, the launch script (secrets masked) and the exact text
    its shell would get. Connects to nothing: interfaces only as the inventory names them (`launch`
    finds them on the nodes, as `render` without --offline shows)."""
    from orchestrator.cli.validate import dry_run_nodes, print_dry_run

    backend, specs = _offline_specs(settings.ui, inventory, run_id)
    # detached: the start script, which starts launch.sh in a session of its own and returns
    planned = dry_run_nodes(settings, inventory, specs, renderer, detach=detach)
    how = "detached (outliving the connection)" if detach else "in the foreground"
    print_dry_run(settings, "launch", run_id, backend, planned, how=how)


def failed_first(outcomes: list[Outcome[T]]) -> tuple[list[Outcome[T]], list[Outcome[T]]]:
    """(nodes that failed, the first to fail first; nodes stopped because of them). In DDP the
    others often fail moments after the first ("Connection closed by peer"), before the stop
    reaches them: the cause is the earliest, whatever its place in the inventory."""
    failed = sorted(
        (o for o in outcomes if o.error is not None and not isinstance(o.error, CancelledError)),
        key=lambda o: o.finished,
    )
    return failed, [o for o in outcomes if isinstance(o.error, CancelledError)]


def again(settings: Settings, command: str, run_id: str) -> str:
    """The command line a user types next for this run (same inventory)."""
    inventory = f" -i {shlex.quote(str(settings.inventory))}" if settings.inventory else ""
    return f"bootstrap{inventory} {command} --run {shlex.quote(run_id)}"


def _sweep_run(settings: Settings, session: Session, run_id: str, started: set[str]) -> None:
    """After a foreground run was cut short (Ctrl-C, or fail fast stopping the others): stop every
    process of the run still on a node, found by the run's marker as `bootstrap stop` does.

    Closing a node's connection stops the launcher's process group (TERM, KILL 5 s later) but
    torchrun starts its workers in sessions of their own: a worker that takes longer than that to
    handle TERM, or whose torchrun was killed before it could pass TERM on (a local node's group
    is killed at once), would be left training. The sweep runs on new connections, in parallel,
    with the same 5 s grace, on the nodes in ``started`` only: a node that refused the run id (it
    ran before there) holds another run's processes under that id."""
    from orchestrator.steps.runs import stop_node

    ui = settings.ui
    nodes = [n for n in session.nodes if n.name in started]
    if not nodes:
        return
    stop = again(settings, "stop", run_id)
    try:
        with session.reopened() as fresh:
            outcomes = fresh.map(
                lambda node, t: stop_node(node, t, run_id, grace=5.0), step="sweep", nodes=nodes
            )
    except KeyboardInterrupt:
        ui.warn(f"not checked for processes left running: run `{stop}`")
        return
    for o in outcomes:
        if o.error is not None:
            ui.warn(
                f"{o.node}: not checked for processes of the run left running ({o.error}): "
                f"run `{stop}` when it is reachable"
            )
        elif o.value is not None and o.value.state == "stopped":
            ui.note(f"{o.node}: processes of the run were still running: {o.value.describe()}")


def _interrupted(ui: UI) -> None:
    """Called while a KeyboardInterrupt (Ctrl-C) or Terminated (SIGTERM) is being handled."""
    terminated = isinstance(sys.exc_info()[1], Terminated)
    what = "terminated (SIGTERM)" if terminated else "interrupted"
    ui.error(f"{what}: connections closed, commands still running on the nodes were stopped")
    raise SystemExit(int(ExitCode.TERMINATED if terminated else ExitCode.INTERRUPTED))


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@common_options
@click.option("--timeout", type=click.FloatRange(min=0.1), help="Seconds before the command is cut off.")
@click.option("-b", "--become", is_flag=True, help="Run as root (sudo -n for other users).")
@click.option("--cwd", help="Working directory on the nodes.")
@click.option(
    "-e", "--env", "env_pairs", multiple=True, metavar="NAME=VALUE", help="Environment variable (repeatable)."
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context,
    timeout: float | None,
    become: bool,
    cwd: str | None,
    env_pairs: tuple[str, ...],
    command: tuple[str, ...],
) -> None:
    """Run a shell command on every node; output streams live as `[node] line`.

    Like `ssh host CMD`, the words are joined and read by the node's shell: quote what should not
    expand locally, e.g. bootstrap run -- 'echo $HOSTNAME'.
    """
    settings = Settings.from_context(ctx)
    inventory, nodes = _load(settings)
    ui = settings.ui
    env = _parse_env(env_pairs)
    text = " ".join(command)
    if settings.dry_run:
        _dry_run(
            settings,
            inventory,
            nodes,
            lambda node, t: [t.platform.wrap(text, env=env, cwd=cwd, become=become)],
        )
        return
    run_log = RunLog(state_dir() / "runs" / new_run_id("run"))
    printer = ui.line_printer([n.name for n in nodes])

    def one(node: Node, transport: Transport) -> Result:
        output = PrefixedOutput(node.name, run_log, None if settings.json_mode else printer)
        result = transport.run(text, env=env, cwd=cwd, timeout=timeout, on_line=output, become=become)
        platform = transport.platform
        if (
            become
            and not result.ok
            and isinstance(platform, PosixShell)
            and platform.sudo_refused(result.stderr)
        ):
            raise SudoPasswordRequiredError(
                "sudo needs a password here, and bootstrap never types one",
                node=node.name,
                hint="allow passwordless sudo for this user (a line `USER ALL=(ALL) NOPASSWD: ALL` "
                "in /etc/sudoers.d/cluster-bootstrap, edited with visudo) or connect as root",
                result=result,
            )
        if result.timed_out:
            raise CommandTimeoutError(
                f"timed out after {timeout:g}s; the command was stopped", node=node.name, result=result
            )
        return result

    try:
        with _session(settings, inventory, nodes) as session:
            outcomes = session.map(one, step="run")
    except KeyboardInterrupt:
        _interrupted(ui)
    finally:
        run_log.close()

    def failed(o: Outcome[Any]) -> bool:
        return o.value is not None and not o.value.ok

    code = exit_code_for(outcomes, failed)
    if settings.json_mode:
        _fail_lines(ui, outcomes)
        ui.print_json(
            {
                "command": "run",
                "shell": text,
                "nodes": [
                    {
                        "name": o.node,
                        "ok": o.ok and not failed(o),
                        "error": _error_dict(o.error),
                        **_result_dict(o),
                    }
                    for o in outcomes
                ],
                "log_dir": str(run_log.directory),
                "exit_code": int(code),
            }
        )
        ctx.exit(int(code))
    table = Table(title="run summary", title_justify="left")
    for column in ("node", "result", "time"):
        table.add_column(column)
    for o in outcomes:
        if o.error is not None:
            label = Text(_status(o.error), style="red")
        elif o.value is not None and o.value.ok:
            label = Text("ok", style="green")
        else:
            label = Text(f"exit {o.value.exit_code if o.value else '?'}", style="red")
        table.add_row(Text(o.node), label, f"{o.duration:.2f}s")
    ui.err.print(table)
    _fail_lines(ui, outcomes)
    if any(o.value is not None and o.value.stdout + o.value.stderr for o in outcomes):
        ui.note(f"output kept in {run_log.directory}")
    ctx.exit(int(code))


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise UsageError(f"--env {pair!r}: expected NAME=VALUE")
        try:
            env[check_env_name(name)] = value
        except ValueError as exc:
            raise UsageError(f"--env {pair!r}: {exc}") from None
    return env


@cli.command()
@common_options
@click.option(
    "--key", "key_path", default="~/.ssh/id_ed25519", show_default=True, help="Controller key to install."
)
@click.pass_context
def keys(ctx: click.Context, key_path: str) -> None:
    """First contact: install your public key on nodes that accept only a password (ssh-copy-id).

    Creates the key when missing, installs it once, then proves that key login works with that key
    alone. Host keys are verified as everywhere: on first contact the run stops showing each new
    fingerprint; compare them with the nodes' and rerun with --accept-new-host-keys, before any
    password is sent. Passwords come from each node's password_env, or one prompt shared by all nodes.
    """
    from orchestrator.steps.keys import KeyInstall, ensure_controller_key, install_key

    settings = Settings.from_context(ctx)
    inventory, nodes = _load(settings)
    ui = settings.ui
    ssh_nodes = [n for n in nodes if n.connection == "ssh"]
    skipped = [n.name for n in nodes if n.connection != "ssh"]
    if skipped:
        ui.note(f"skipping nodes not reached over SSH: {', '.join(skipped)}")
    if settings.dry_run:
        public = os.path.expanduser(key_path) + ".pub"
        _dry_run(
            settings,
            inventory,
            ssh_nodes,
            lambda node, t: [t.platform.wrap(PosixShell().ensure_authorized_key(f"<contents of {public}>"))],
        )
        return
    key = ensure_controller_key(key_path)
    if key.generated:
        ui.info(f"generated a new key pair: {key.private} (+ .pub)")
    interactive = sys.stdin.isatty()
    shared: dict[str, str] = {}

    def prompt(text: str) -> str:
        return getpass.getpass(text)

    resolver = PasswordResolver(prompt=prompt if interactive else None)
    # Nodes with no password setting share one prompt, like ssh-copy-id run in a loop.
    fallback_needed = [n for n in ssh_nodes if not n.password_env and not n.password_prompt]
    if fallback_needed and interactive:
        shared["password"] = getpass.getpass("SSH password for the nodes (used once, never stored): ")

    class _KeysResolver(PasswordResolver):
        def password_for(self, node: Node) -> str | None:
            if node.password_env or node.password_prompt:
                return resolver.password_for(node)
            if "password" not in shared:
                raise SecretMissingError(
                    "`bootstrap keys` logs in with the node's password, and none is available",
                    node=node.name,
                    hint="set password_env: VAR on the node (and export VAR), "
                    "or run from a terminal to be asked",
                )
            return shared["password"]

    # host keys are checked before the password is sent: unknown ones only with --accept-new-host-keys
    session = Session(
        inventory,
        ssh_nodes,
        ssh=settings.ssh_options(),
        passwords=_KeysResolver(prompt=None),
        max_workers=settings.forks,
    )
    check_options = settings.ssh_options(accept_new=False)
    try:
        with ui.progress([n.name for n in ssh_nodes], "keys") as on_event:
            session.executor.on_event = on_event
            with session:
                outcomes = session.map(lambda n, t: install_key(n, t, key, check_options), step="keys")
    except KeyboardInterrupt:
        _interrupted(ui)
    code = exit_code_for(outcomes, lambda o: o.value is not None and not o.value.verified)
    if settings.json_mode:
        _fail_lines(ui, outcomes)
        ui.print_json(
            {
                "command": "keys",
                "key": str(key.private),
                "nodes": [
                    {
                        "name": o.node,
                        "ok": o.ok,
                        "error": _error_dict(o.error),
                        **(o.value.public_dict() if o.value else {}),
                    }
                    for o in outcomes
                ],
                "exit_code": int(code),
            }
        )
        ctx.exit(int(code))
    table = Table(title=Text(f"key {key.private}"), title_justify="left")
    for column in ("node", "key", "key login", "host key recorded"):
        table.add_column(column)
    for o in outcomes:
        value: KeyInstall | None = o.value
        if value is None:
            table.add_row(Text(o.node), Text("failed", style="red"), "-", "-")
            continue
        table.add_row(
            Text(o.node),
            Text(value.status),
            Text("verified", style="green") if value.verified else Text("FAILED", style="red"),
            Text("\n".join(value.recorded_host_keys) or "already known"),
        )
    ui.print_table(table)
    _fail_lines(ui, outcomes)
    ctx.exit(int(code))


def templates_option(which: str = "searched before the shipped templates") -> Callable[[F], F]:
    """``--templates DIR`` of render, launch and validate."""
    return click.option(
        "--templates",
        "templates_dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help=f"Your template directory, {which} (default: the inventory's cluster.train.templates).",
    )


def _offline_specs(ui: UI, inventory: Inventory, run_id: str) -> tuple[str, list[LaunchSpec]]:
    """Every node's launch plan from the inventory alone (render --offline, --dry-run): interfaces
    only as the inventory names them; backend auto taken as gloo."""
    from orchestrator.render import plan_launch

    all_nodes = list(inventory.nodes)
    backend: str = inventory.cluster.backend
    if backend == "auto":
        backend = "gloo"
        ui.note("offline: backend auto rendered as gloo (check decides with the nodes' facts)")
    pythons = {n.name: training_python(n, inventory) for n in all_nodes}
    for n in all_nodes:  # native Windows: `python` (python3 is usually the Store's stub there)
        if n.os == "windows" and n.windows.mode == "native" and not n.python:
            pythons[n.name] = "python" if not inventory.cluster.env.declared else pythons[n.name]
    master_addr = "127.0.0.1" if len(all_nodes) == 1 else inventory.master_node.host
    specs = plan_launch(
        inventory,
        backend=backend,
        master_addr=master_addr,
        run_id=run_id,
        interfaces={},
        cpus={},
        pythons=pythons,
    )
    return backend, list(specs)


@cli.command()
@common_options
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), help="Write <node>.sh files here."
)
@templates_option()
@click.option("--offline", is_flag=True, help="Connect to nothing: interfaces only from the inventory.")
@click.option("--run-id", help="Rendezvous id / run name (default: <cluster>-<time>).")
@click.pass_context
def render(
    ctx: click.Context, out_dir: Path | None, templates_dir: Path | None, offline: bool, run_id: str | None
) -> None:
    """Show each node's exact launch script (torchrun with its rendezvous, interface and environment).

    The interface and the address peers reach each node at come from the route to the master, found
    on the nodes (like `check`); --offline uses only the inventory. Printed scripts mask values of
    secret-looking variables; files written with --out are complete and run by hand on each node.
    """
    import time as _time

    from orchestrator.render import Renderer, render_all, templates_dir_for
    from orchestrator.steps.launch import RANK_CAPTURE, plan, rank_capture_file

    settings = Settings.from_context(ctx)
    inventory, selected = _load(settings)
    ui = settings.ui
    run_id = run_id or f"{inventory.cluster.name}-{_time.strftime('%Y%m%d-%H%M%S')}"
    renderer = Renderer(templates_dir_for(inventory, templates_dir))
    all_nodes = list(inventory.nodes)  # a job spans the whole cluster: every rank needs its place
    if offline or settings.dry_run:
        backend, specs = _offline_specs(ui, inventory, run_id)
    else:
        session = _session(settings, inventory, all_nodes)
        with ui.progress([n.name for n in all_nodes], "facts") as on_event, session:
            session.executor.on_event = on_event
            launch_plan = plan(session, inventory, run_id)
        failed = [o for o in launch_plan.inspected if not o.ok]
        if failed:
            _fail_lines(ui, failed)
            ctx.exit(int(exit_code_for(launch_plan.inspected)))
        for warning in launch_plan.warnings:
            ui.warn(warning)
        backend = launch_plan.backend
        ui.note(f"backend: {launch_plan.backend_reason}")
        specs = launch_plan.specs
    # WSL-mode Windows nodes render the Linux torchrun script (it runs inside the distribution)
    platforms = {n.name: platform_for_node(n) for n in all_nodes}
    shown = {n.name for n in selected}
    specs = [s for s in specs if s.node.name in shown]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, text in render_all(renderer, specs, platforms, mask=False).items():
            platform = platforms[name]
            if isinstance(platform, PowerShell):  # UTF-8 with BOM: Windows PowerShell 5.1 needs it
                data, file_name = platform.script_file(text), f"{name}.ps1"
            else:
                data, file_name = text.encode("utf-8"), f"{name}.sh"
            # may hold the run's environment: owner only; inside out_dir whatever the name, no link followed
            path = write_inside(out_dir, file_name, data, mode=0o700)
            ui.info(f"wrote {path}")
        if any(not isinstance(platforms[s.node.name], PowerShell) for s in specs):
            # the POSIX scripts start every rank through it, from their own directory
            path = write_inside(out_dir, RANK_CAPTURE, rank_capture_file().read_bytes(), mode=0o600)
            ui.info(f"wrote {path} (copy it beside each .sh script on the node)")
    scripts = render_all(renderer, specs, platforms, mask=True)
    if settings.json_mode:
        ui.print_json({"command": "render", "run_id": run_id, "backend": backend, "scripts": scripts})
        return
    if out_dir is None:
        for name, text in scripts.items():
            ui.print_text(f"# ---- {name} ----")
            ui.print_text(text)


@cli.command()
@common_options
@click.option("--run-id", help="Run name (default: <cluster>-<time>); also the elastic rendezvous id.")
@templates_option()
@click.option(
    "--detach",
    is_flag=True,
    help="Start every node's launcher in the background (it survives this command and the "
    "connection), print the run id and exit; follow with `logs --run RUN --follow`.",
)
@click.pass_context
def launch(ctx: click.Context, run_id: str | None, templates_dir: Path | None, detach: bool) -> None:
    """Start training on every node and stream every rank's output as `[node:rank] line`.

    Renders each node's torchrun script (see `render`), uploads it with the training script, runs all
    nodes at once. When one node fails, the others are stopped; the summary names it first with its
    exit code and last lines. Output is kept in runs/<run-id>/<node>.log here and beside the script
    on each node. Exit code 0 only when every node succeeded.
    """
    settings = Settings.from_context(ctx)
    inventory, _ = _load(settings)
    _launch(ctx, settings, inventory, run_id=run_id, templates_dir=templates_dir, detach=detach)


def _launch(
    ctx: click.Context,
    settings: Settings,
    inventory: Inventory,
    *,
    run_id: str | None,
    templates_dir: Path | None,
    detach: bool = False,
) -> None:
    from orchestrator.cli.ui import RankedOutput
    from orchestrator.render import Renderer, require_secrets, templates_dir_for
    from orchestrator.steps.launch import failure_tail, plan, root_cause, run_node

    ui = settings.ui
    _refuse_native_mix(inventory)
    if settings.nodes:
        ui.note("launch runs every node of the inventory: a training job spans the whole cluster")
    nodes = list(inventory.nodes)
    renderer = Renderer(templates_dir_for(inventory, templates_dir))
    if settings.dry_run:
        _launch_dry_run(
            settings, inventory, run_id or f"{inventory.cluster.name}-<time>", renderer, detach=detach
        )
        return
    require_secrets(inventory)  # train.env from_env: exit 2 before connecting
    from orchestrator.steps.runs import claim_run_id, pick_run_id

    # a run id names one run: a new one unless the user named it (then refused when it exists)
    run_id = claim_run_id(run_id) if run_id else pick_run_id(inventory.cluster.name)
    session = _session(settings, inventory, nodes)
    with session:
        with ui.progress([n.name for n in nodes], "plan") as on_event:
            session.executor.on_event = on_event
            launch_plan = plan(session, inventory, run_id)
        session.executor.on_event = None
        unreachable = [o for o in launch_plan.inspected if not o.ok]
        if unreachable:
            _fail_lines(ui, unreachable)
            ui.error("not launching: every node must be reachable")
            ctx.exit(int(exit_code_for(launch_plan.inspected)))
        for warning in launch_plan.warnings:
            ui.warn(warning)
        backend = f"backend {launch_plan.backend} ({launch_plan.backend_reason})"
        ui.info(f"run {run_id}: {len(nodes)} node(s), {backend}")
        specs = {s.node.name: s for s in launch_plan.specs}
        from orchestrator.steps.runs import rank_labels, write_record

        write_record(Path("runs") / run_id, run_id, launch_plan.specs, detached=detach)
        if detach:
            from orchestrator.cli.runs import start_detached

            start_detached(ctx, settings, session, launch_plan.specs, renderer, run_id)  # exits
        log = RunLog(Path("runs") / run_id)
        printer = ui.line_printer([n.name for n in nodes])

        # every line: into runs/<run-id>/<node>.log as received, onto the terminal as [node:rank]
        labels = rank_labels(inventory)
        outputs = {
            node.name: RankedOutput(
                node.name,
                log,
                None if settings.json_mode else printer,
                first_rank=labels[node.name][0],
                nproc=labels[node.name][1],
            )
            for node in nodes
        }

        started: set[str] = set()  # nodes whose launcher was started: where the run can have processes
        try:
            outcomes = session.map(
                lambda node, t: run_node(
                    node, t, specs[node.name], renderer=renderer, output=outputs[node.name], started=started
                ),
                step="train",
                fail_fast=True,
            )
        except KeyboardInterrupt:
            log.close()
            _sweep_run(settings, session, run_id, started)
            _interrupted(ui)
        finally:
            log.close()
    failed, stopped = failed_first(outcomes)
    if stopped:
        # a node whose connection was lost stops its own run when our heartbeats stop (15 s): the
        # sweep would only wait for its connect timeout
        lost = {o.node for o in outcomes if isinstance(o.error, ConnectError)}
        for name in sorted(lost & started):
            settings.ui.note(
                f"{name}: unreachable; it stops its part of the run by itself within 15 s of losing "
                f"this controller (`{again(settings, 'status', run_id)}` once it is back)"
            )
        _sweep_run(settings, session, run_id, started - lost)
    code = exit_code_for(outcomes)
    if settings.json_mode:
        ui.print_json(
            {
                "command": "launch",
                "run_id": run_id,
                "backend": launch_plan.backend,
                "nodes": [
                    {"name": o.node, "ok": o.ok, "error": _error_dict(o.error), **_result_dict(o)}
                    for o in outcomes
                ],
                "log_dir": str(log.directory),
                "exit_code": int(code),
            }
        )
        ctx.exit(int(code))
    table = Table(title=Text(f"run {run_id}"), title_justify="left")
    for column in ("node", "result", "time"):
        table.add_column(column)
    ordered = failed + [o for o in outcomes if o not in failed]
    for o in ordered:
        if o.error is None:
            label = Text("ok", style="green")
        elif o in failed:
            result = getattr(o.error, "result", None)
            exit_text = "failed"
            if isinstance(result, Result) and result.exit_code is not None:
                cause = root_cause(result)  # torchrun exits 1 whatever the rank did: show the rank's code
                exit_text = f"exit {cause[1]} (rank {cause[0]})" if cause else f"exit {result.exit_code}"
            label = Text(exit_text, style="red bold")
        elif isinstance(o.error, RunStoppedError):
            label = Text("stopped by stop --run", style="yellow")
        else:
            label = Text("stopped", style="yellow")
        table.add_row(Text(o.node), label, f"{o.duration:.1f}s")
    ui.err.print(table)
    for o in failed:
        ui.error(str(o.error))
        result = getattr(o.error, "result", None)
        if isinstance(result, Result):
            for line in failure_tail(result):
                ui.info(f"  {o.node} | {line}")
    if stopped and failed:
        ui.note(f"stopped because {failed[0].node} failed first: {', '.join(o.node for o in stopped)}")
    ui.note(f"logs: {log.directory}/ (and runs/{run_id}/<node>/node.log under each node's workdir)")
    ctx.exit(int(code))


@cli.command(name="inventory")
@common_options
@click.pass_context
def show_inventory(ctx: click.Context) -> None:
    """Validate the inventory and show the nodes it defines (no connection is made)."""
    settings = Settings.from_context(ctx)
    inventory, nodes = _load(settings)
    if settings.json_mode:
        settings.ui.print_json(inventory.public_dict())
        return
    table = Table(
        title=Text(f"cluster {inventory.cluster.name} ({inventory.format} inventory {inventory.source})")
    )
    for column in ("node", "connection", "address", "user", "os", "gpus", "nproc", "tags"):
        table.add_column(column)
    for node in nodes:
        master = " (master)" if node.name == inventory.cluster.master else ""
        cells = (
            node.connection,
            node.address,
            node.user or "-",
            node.os,
            node.gpus,
            node.nproc,
            ",".join(node.tags),
        )
        table.add_row(Text(node.name + master), *(Text(str(c)) for c in cells))
    settings.ui.print_table(table)
    c = inventory.cluster
    settings.ui.print_text(f"master {c.master}, rendezvous port {c.port}, backend {c.backend}")


def main() -> None:
    def terminate(signum: int, frame: object) -> None:
        raise Terminated()

    # SIGTERM behaves like Ctrl-C (issue 17): the nodes are stopped and swept, the summary printed
    signal.signal(signal.SIGTERM, terminate)
    cli(prog_name="bootstrap")


if __name__ == "__main__":
    main()
