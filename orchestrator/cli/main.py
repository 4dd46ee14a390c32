"""The ``bootstrap`` command: the only place that prints for humans and maps errors to exit codes."""

from __future__ import annotations

import signal
import sys
from typing import Any

import click

from orchestrator import __version__
from orchestrator.cli.common import (
    TYPED,
    CommandExit,
    Settings,
    after_dashes,
    common_options,
    interrupted,
    load_selection,
    master_option,
    open_session,
    train_env_option,
)
from orchestrator.cli.dashboard import dashboard_options, live_dashboard
from orchestrator.dashboard.model import observe
from orchestrator.errors import BootstrapError, ExitCode, Terminated, UsageError
from orchestrator.runs.next_command import train_without
from orchestrator.runs.run_inventory import for_run, inventory_as_command

#: ``ctx.meta`` key: the words after ``--`` of the main pipeline (``bootstrap -i x -- --lr 0.1``)
RUN_ARGS = "cluster_bootstrap.run_args"


class _Group(click.Group):
    """The one exit path: every command returns its exit code (or raises); only here does a code,
    an error or an interrupt become the process's exit status."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """The words after ``--`` belong to the training script when no command comes before them
        (the main pipeline); after a command (``launch -- ...``, ``run -- ...``) they are its own."""
        ctx.meta[TYPED] = tuple(args)  # every word typed after `bootstrap` (a suggested line repeats them)
        cut = args.index("--") if "--" in args else len(args)
        try:
            rest = super().parse_args(ctx, args[:cut])
        except click.NoSuchOption as exc:  # before any command: the main pipeline's options
            raise after_dashes(ctx, exc, "bootstrap", args[:cut]) from None
        if cut == len(args):
            return rest
        # the command's name, when one came before "--" (click keeps it apart from its arguments)
        command = getattr(ctx, "_protected_args", None)
        if not command:
            ctx.meta[RUN_ARGS] = tuple(args[cut + 1 :])
            return rest
        ctx.args = [*ctx.args, *args[cut:]]
        return ctx.args

    def resolve_command(self, ctx: click.Context, args: list[str]) -> Any:
        """An inventory file given where a command goes (``bootstrap hosts.yaml``): said so, with the
        line that does what was meant."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError:
            if meant := inventory_as_command(args):
                raise click.UsageError(meant, ctx) from None
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                code = super().invoke(ctx)
            except KeyboardInterrupt:  # at a prompt, or anywhere outside the node fan-out
                interrupted(Settings.from_context(ctx).ui)
        except CommandExit as stop:
            code = stop.code
        except BootstrapError as exc:
            settings = Settings.from_context(ctx)
            for line in str(exc).splitlines():
                settings.ui.error(line)
            code = exc.exit_code
        ctx.exit(int(code) if code is not None else 0)


@click.group(
    cls=_Group, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="bootstrap")
@common_options
@click.option("--force", is_flag=True, help="Main pipeline: launch even when a preflight check fails.")
@click.option(
    "--skip-validate", is_flag=True, help="Main pipeline: launch without the all_reduce validation first."
)
@click.option(
    "--validate",
    "always_validate",
    is_flag=True,
    help="Main pipeline: validate even when nothing it checks changed since it last passed on these nodes.",
)
@click.option("--detach", is_flag=True, help="Main pipeline: train detached (see `launch --detach`).")
@click.option(
    "--sync-from-master",
    is_flag=True,
    help="Main pipeline, without cluster.env: first give every node the master's torch and companions "
    "(`sync --from-master`).",
)
@click.option(
    "--until",
    type=click.Choice(["sync", "firewall", "ntp", "check", "validate"]),
    help="Main pipeline: stop after this phase (e.g. `--until check`: set the cluster up, train nothing).",
)
@train_env_option("Main pipeline: add NAME=VALUE to train.env for this run (repeatable).")
@master_option
@dashboard_options
@click.pass_context
def cli(
    ctx: click.Context,
    force: bool,
    skip_validate: bool,
    always_validate: bool,
    detach: bool,
    until: str | None,
    sync_from_master: bool,
    train_env: tuple[str, ...],
    train_script: str | None,
    master: str | None,
) -> int:
    """Turn the machines of an inventory into one PyTorch training cluster.

    Without a command: the main pipeline: environment and code sync (`sync`, when the inventory
    declares cluster.env / cluster.code), the firewall (`firewall`) and time sync (`ntp`) on clusters
    of 2+ nodes, the preflight (`check`), then, when every check passes (or with --force), every
    rank joins and all_reduce is checked (`validate`, unless --skip-validate), then training on
    every node (`launch`) with every rank's output streamed here.

    `bootstrap [OPTIONS] -- ARGS`: ARGS replace train.args for this run (the inventory is not
    changed); `-e NAME=VALUE` adds to train.env; `--script PATH` replaces train.script.
    """
    if ctx.invoked_subcommand is not None:
        return ExitCode.OK
    settings = Settings.from_context(ctx)
    if always_validate and skip_validate:
        raise UsageError("--validate and --skip-validate contradict each other: give one of them")
    inventory, _ = load_selection(settings)
    run_args = ctx.meta.get(RUN_ARGS)
    inventory = for_run(inventory, run_args or None, train_env, train_script)
    ui = settings.ui
    from orchestrator.cli.pipeline import CliFront
    from orchestrator.pipeline import PipelineOptions, pipeline_doc, pipeline_inventory, run_pipeline

    options = PipelineOptions(
        force=force,
        skip_validate=skip_validate,
        until=until,
        sync_from_master=sync_from_master,
        dry_run=settings.ssh_options() if settings.dry_run else None,
        detach=detach,
        always_validate=always_validate,
        brief=not (settings.json_mode or settings.verbose or settings.dry_run),
    )
    if settings.json_mode:
        ui.collected = []  # one document for the whole pipeline: {"check": ..., "launch": ...}
    if inventory.cluster.slurm is not None:  # the nodes are Slurm's: sync, then a job
        from orchestrator.slurm.pipeline import run_slurm_pipeline

        report = run_slurm_pipeline(inventory, options, CliFront(settings, inventory))
    else:
        # --nodes: the nodes this run uses, all phases; refused (exit 2) before anything changes
        inventory = pipeline_inventory(inventory, settings, master, dry_run=settings.dry_run)
        # ONE session for every phase: each node is connected once (passwords asked here, once per
        # node) and the facts the preflight gathers are handed to validate and launch
        everyone = list(inventory.nodes)
        with (
            open_session(settings, inventory, everyone) as session,
            live_dashboard(ctx, settings, inventory, [n.name for n in everyone], "bootstrap") as live,
        ):
            observe(live, session.executor)  # every phase's node states (sync, firewall, ntp, check...)
            report = run_pipeline(session, inventory, everyone, options, CliFront(settings, inventory, live))
        if report.exit_code != ExitCode.OK and (hint := train_without(settings, inventory, session.gone())):
            ui.info(hint)
    if ui.collected is not None:
        docs, ui.collected = ui.collected, None
        ui.print_json(pipeline_doc(docs, report))
    elif settings.dry_run:  # what a real run would leave out, and why (the --json document says it too)
        for phase, why in report.skipped.items():
            ui.note(f"--dry-run: {phase} would not run ({why})")
    return report.exit_code


def main() -> None:
    def terminate(signum: int, frame: object) -> None:
        raise Terminated()

    # SIGTERM behaves like Ctrl-C (issue 17): the nodes are stopped and swept, the summary printed
    signal.signal(signal.SIGTERM, terminate)
    try:
        cli(prog_name="bootstrap")
    except KeyboardInterrupt as again:
        # a Ctrl-C (or SIGTERM) while the first one's clean-up or the summary was being done: one
        # line, no traceback (what the first one started to stop is said above it)
        said = "terminated (SIGTERM)" if isinstance(again, Terminated) else "interrupted"
        sys.stderr.write(f"error: {said}: stopped at once\n")
        code = ExitCode.TERMINATED if isinstance(again, Terminated) else ExitCode.INTERRUPTED
        raise SystemExit(int(code)) from None
    finally:
        # what runs after the command (the interpreter joining worker threads at exit) is not the
        # command's: a Ctrl-C or SIGTERM then ends the process as the signal does, no traceback
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _register() -> None:
    """Every subcommand, each defined in its area's module (none of which imports this one)."""
    from orchestrator.cli.bench import bench
    from orchestrator.cli.check import check, facts, show_inventory
    from orchestrator.cli.clean import clean
    from orchestrator.cli.dashboard import dashboard
    from orchestrator.cli.firewall import firewall
    from orchestrator.cli.launch import launch, render
    from orchestrator.cli.remote import keys, run
    from orchestrator.cli.runs import fetch, logs, status, stop
    from orchestrator.cli.sync import sync
    from orchestrator.cli.teardown import teardown
    from orchestrator.cli.timesync import ntp
    from orchestrator.cli.validate import validate

    for command in (
        check,
        facts,
        show_inventory,
        run,
        keys,
        render,
        launch,
        validate,
        bench,
        sync,
        firewall,
        ntp,
        logs,
        status,
        stop,
        fetch,
        teardown,
        clean,
        dashboard,
    ):
        cli.add_command(command)


_register()
