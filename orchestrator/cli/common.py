"""What every command shares: the common options and Settings, loading the inventory, opening the
session, and the few ways a failure is shown. Imports nothing else of cli/ but ui and report."""

from __future__ import annotations

import getpass
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from orchestrator.cli.report import show_dry_run
from orchestrator.cli.ui import UI
from orchestrator.errors import ExitCode, Terminated
from orchestrator.inventory import Inventory, Node, PasswordResolver, load_inventory
from orchestrator.neutralise import NeutralFormatter
from orchestrator.resources import default_inventory, default_inventory_note
from orchestrator.runs.run_inventory import selected
from orchestrator.session import Session
from orchestrator.transports import SSHOptions, Transport

F = TypeVar("F", bound=Callable[..., Any])


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
        if param.name in _common():
            param.callback = _store
            param.expose_value = False
    return fn


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
        from orchestrator.runs.next_command import with_user_options

        self.ui = UI(json_mode=self.json_mode, verbose=self.verbose, color=False if self.no_color else None)
        self.ui.commands = lambda text: with_user_options(self, text)

    @classmethod
    def from_context(cls, ctx: click.Context) -> Settings:
        obj = ctx.find_root().ensure_object(dict)
        known = {k: v for k, v in obj.items() if k in _common() and v not in (None, ())}
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


def _common() -> set[str]:
    """The common options' names: Settings' fields."""
    return {f.name for f in fields(Settings) if f.init}


def _configure_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(NeutralFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])
    # paramiko's own chatter only with -vv: it would bury our messages
    logging.getLogger("paramiko").setLevel(logging.DEBUG if verbose >= 2 else logging.CRITICAL)
    for noisy in ("invoke", "fabric"):  # configuration dumps, not what a user debugs
        logging.getLogger(noisy).setLevel(logging.WARNING)


def load_selection(settings: Settings) -> tuple[Inventory, list[Node]]:
    path = settings.inventory
    if path is None:
        path = default_inventory()
        if not settings.json_mode:
            settings.ui.note(default_inventory_note(path))
    inventory = load_inventory(path)
    for note in inventory.notes:
        settings.ui.note(f"note: {note}")
    return inventory, selected(settings, inventory)


def _passwords(settings: Settings, nodes: list[Node]) -> PasswordResolver:
    """Every needed password asked before parallel work starts (on a terminal, not for a dry run)."""
    interactive = sys.stdin.isatty() and not settings.dry_run
    resolver = PasswordResolver(prompt=getpass.getpass if interactive else None)
    if interactive:
        resolver.ask_now(nodes)
    return resolver


@contextmanager
def phase_session(
    settings: Settings, inventory: Inventory, nodes: list[Node], shared: Session | None
) -> Iterator[Session]:
    """The main pipeline's one session narrowed to ``nodes`` (left open: the next phase uses it); else
    a session of the command's own, closed when the command is done."""
    if shared is not None:
        yield shared.subset(nodes)
        return
    with open_session(settings, inventory, nodes) as own:
        yield own


def open_session(
    settings: Settings, inventory: Inventory, nodes: list[Node], on_event: Any = None
) -> Session:
    return Session(
        inventory,
        nodes,
        ssh=settings.ssh_options(),
        passwords=_passwords(settings, nodes),
        on_event=on_event,
        max_workers=settings.forks,
        on_wait=lambda _node, text: settings.ui.info(text),
    )


def print_plans(
    settings: Settings,
    inventory: Inventory,
    nodes: list[Node],
    plan: Callable[[Node, Transport], list[str]],
    *,
    command: str = "",
    become: bool = False,
) -> None:
    """``--dry-run`` of a command that sends one script per node, connecting nowhere: the scripts
    ``plan(node, transport)`` gives, shown by the one dry-run printer (cli/report.py)."""
    from orchestrator.steps.dry_run import planned_scripts

    report = planned_scripts(command, inventory, nodes, settings.ssh_options(), plan, become=become)
    show_dry_run(settings.ui, report, json_mode=settings.json_mode)


class CommandExit(Exception):
    """Ends a command with ``code`` from deep inside it (an interrupt while nodes work); turned into
    the exit status by the group's one exit path (cli/main.py), like a command's returned code."""

    def __init__(self, code: ExitCode) -> None:
        super().__init__(int(code))
        self.code = code


def interrupted(
    ui: UI,
    detail: str = "connections closed, commands still running on the nodes were stopped",
    *,
    stop: BaseException | None = None,
) -> NoReturn:
    """Called while a KeyboardInterrupt (Ctrl-C) or Terminated (SIGTERM) is being handled, or with
    the one a step caught (``stop``); ``detail``: what that did (a command that only reads, as
    `logs -f`, stopped nothing)."""
    terminated = isinstance(stop or sys.exc_info()[1], Terminated)
    what = "terminated (SIGTERM)" if terminated else "interrupted"
    ui.error(f"{what}: {detail}")
    raise CommandExit(ExitCode.TERMINATED if terminated else ExitCode.INTERRUPTED)


def templates_option(which: str = "searched before the shipped templates") -> Callable[[F], F]:
    """``--templates DIR`` of render, launch and validate."""
    return click.option(
        "--templates",
        "templates_dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help=f"Your template directory, {which} (default: the inventory's cluster.train.templates).",
    )


# -- a run's own arguments and environment (`bootstrap ... -- ARGS`, `launch ... -- ARGS`, -e) ---------


def train_env_option(help_text: str) -> Callable[[F], F]:
    """``-e/--env NAME=VALUE`` (repeatable) added to train.env for this run, and ``--script PATH``."""
    env = click.option("-e", "--env", "train_env", multiple=True, metavar="NAME=VALUE", help=help_text)
    script = click.option(
        "--script",
        "train_script",
        metavar="PATH",
        help="The training script for this run instead of train.script (relative: to the project, as "
        "train.script is).",
    )
    return lambda fn: script(env(fn))


#: the options that say which inventory and how to reach its nodes (a suggested command keeps them)
REACH = {
    "-i": "inventory",
    "--inventory": "inventory",
    "--known-hosts": "known_hosts",
    "--ssh-config": "ssh_config",
}


def after_dashes(
    ctx: click.Context, exc: click.NoSuchOption, command: str, args: list[str]
) -> click.UsageError:
    """An unknown option where the training script's arguments could go: says they go after ``--``
    (``command``: how the line starts, ``bootstrap launch``), with click's own suggestions but
    ``--help``, and the options of ``args`` (or read already) that say which inventory."""
    from orchestrator.runs.next_command import with_user_options

    others = [p for p in exc.possibilities or () if p != "--help"]
    near = f" Did you mean {' or '.join(others)}?" if others else ""
    given = {k: v for k, v in (ctx.find_root().obj or {}).items() if k in REACH.values() and v}
    for at, word in enumerate(args[:-1]):  # not read yet: an error in the same words as they are
        if word in REACH:
            given.setdefault(REACH[word], Path(args[at + 1]))
    suggested = with_user_options(Settings(**given), f"`{command} -- {exc.option_name} ...`")
    where = f"Arguments for the training script go after `--`: {suggested}"
    return click.UsageError(f"No such option: {exc.option_name}.{near} {where}", ctx)


#: ``ctx.meta`` key: every word typed after ``bootstrap`` (cli/main.py; after ``--``: the script's)
TYPED = "cluster_bootstrap.typed"


class TrainArgsCommand(click.Command):
    """A command taking the training script's arguments after ``--``: an unknown option says so."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        typed = list(args)  # click consumes ``args`` as it parses
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            raise after_dashes(ctx, exc, f"bootstrap {ctx.info_name}", typed) from None


def master_option(fn: F) -> F:
    """``--master NODE``: the run's master when the inventory's is not among ``--nodes``."""
    return click.option(
        "--master",
        "master",
        metavar="NODE",
        help="The master for this run (rank 0, the rendezvous): needed when --nodes leaves out the "
        "inventory's master.",
    )(fn)
