"""`bootstrap run` (a shell command on every node) and `bootstrap keys` (first contact, ssh-copy-id)."""

from __future__ import annotations

import getpass
import sys

import click

from orchestrator.cli.common import (
    Settings,
    common_options,
    interrupted,
    load_selection,
    open_session,
    print_plans,
)
from orchestrator.cli.report import draw, fail_lines, json_doc, tell
from orchestrator.errors import ExitCode
from orchestrator.inventory import PasswordResolver
from orchestrator.runs.run_inventory import parse_env_pairs
from orchestrator.steps.remote import command_script, result_fields, run_everywhere
from orchestrator.view import node_view

#: lines of each stream a node prints that `run` keeps in memory by default (at most 1 Mi characters
#: each: transports/base.py MAX_TAIL_CHARS); the controller's log file keeps everything
KEEP_LINES = 1000


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@common_options
@click.option("--timeout", type=click.FloatRange(min=0.1), help="Seconds before the command is cut off.")
@click.option("-b", "--become", is_flag=True, help="Run as root (sudo -n for other users).")
@click.option("--cwd", help="Working directory on the nodes.")
@click.option(
    "-e", "--env", "env_pairs", multiple=True, metavar="NAME=VALUE", help="Environment variable (repeatable)."
)
@click.option(
    "--keep-lines",
    type=click.IntRange(min=1, max=1_000_000),
    default=KEEP_LINES,
    show_default=True,
    help="Lines of each node's output kept in memory for the summary and --json (the log keeps all).",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context,
    timeout: float | None,
    keep_lines: int,
    become: bool,
    cwd: str | None,
    env_pairs: tuple[str, ...],
    command: tuple[str, ...],
) -> int:
    """Run a shell command on every node; output streams live as `[node] line`.

    Like `ssh host CMD`, the words are joined and read by the node's shell: quote what should not
    expand locally, e.g. bootstrap run -- 'echo $(hostname)'. Output is streamed and logged whole;
    only its last --keep-lines lines per node stay in memory (the summary and --json show those).
    """
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    ui = settings.ui
    env = parse_env_pairs(env_pairs)
    text = " ".join(command)
    if settings.dry_run:
        print_plans(
            settings,
            inventory,
            nodes,
            lambda node, t: [command_script(t.platform, text, env=env, cwd=cwd, become=become)],
            command="run",
            become=become,
        )
        return ExitCode.OK
    try:
        with open_session(settings, inventory, nodes) as session:
            printer = None if settings.json_mode else ui.line_printer([n.name for n in nodes])
            report = run_everywhere(
                session,
                text,
                env=env,
                cwd=cwd,
                timeout=timeout,
                become=become,
                keep_lines=keep_lines,
                printer=printer,
            )
    except KeyboardInterrupt:
        interrupted(ui)
    outcomes, code = report.outcomes, report.exit_code()
    if settings.json_mode:
        fail_lines(ui, outcomes)
        log_dir = str(report.log_dir)
        return json_doc(ui, "run", outcomes, code, result_fields, report.node_ok, shell=text, log_dir=log_dir)
    tell(ui, report.said())
    return code


@click.command()
@common_options
@click.option(
    "--key", "key_path", default="~/.ssh/id_ed25519", show_default=True, help="Controller key to install."
)
@click.pass_context
def keys(ctx: click.Context, key_path: str) -> int:
    """First contact: install your public key on nodes that accept only a password (ssh-copy-id).

    Creates the key when missing, installs it once, then proves that key login works with that key
    alone. Host keys are verified as everywhere: on first contact the run stops showing each new
    fingerprint; compare them with the nodes' and rerun with --accept-new-host-keys, before any
    password is sent. Passwords come from each node's password_env, or one prompt shared by all nodes.
    """
    from orchestrator.steps.keys import (
        KeyInstall,
        KeysPasswords,
        authorize_script,
        ensure_controller_key,
        install_all,
        key_nodes,
        keys_exit_code,
        needs_shared_password,
    )

    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    ui = settings.ui
    ssh_nodes, skipped = key_nodes(nodes)
    if skipped:
        ui.note(f"skipping nodes not reached over SSH: {', '.join(skipped)}")
    if not ssh_nodes:  # no key to make, none to install
        ui.info("keys: no node is reached over SSH: nothing to do")
        return ExitCode.OK
    if settings.dry_run:
        print_plans(
            settings, inventory, ssh_nodes, lambda node, t: [authorize_script(key_path)], command="keys"
        )
        return ExitCode.OK
    key = ensure_controller_key(key_path)
    if key.generated:
        ui.info(f"generated a new key pair: {key.private} (+ .pub)")
    interactive = sys.stdin.isatty()
    shared = None
    if needs_shared_password(ssh_nodes) and interactive:
        shared = getpass.getpass("SSH password for the nodes (used once, never stored): ")
    own = PasswordResolver(prompt=getpass.getpass if interactive else None)
    try:
        with ui.progress([n.name for n in ssh_nodes], "keys") as on_event:
            outcomes = install_all(
                inventory,
                ssh_nodes,
                key,
                settings.ssh_options(),
                KeysPasswords(own, shared),
                forks=settings.forks,
                on_event=on_event,
            )
    except KeyboardInterrupt:
        interrupted(ui)
    code = keys_exit_code(outcomes)
    if settings.json_mode:
        fail_lines(ui, outcomes)
        return json_doc(ui, "keys", outcomes, code, key=str(key.private))
    columns = ("node", "key", "key login", "host key recorded")
    draw(ui, node_view(f"key {key.private}", columns, outcomes, KeyInstall.row, failed=lambda o: "failed"))
    fail_lines(ui, outcomes)
    return code
