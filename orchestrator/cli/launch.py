"""`bootstrap render` and `bootstrap launch`: each node's launch script, and training on every node."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.common import (
    TYPED,
    Settings,
    TrainArgsCommand,
    common_options,
    interrupted,
    load_selection,
    master_option,
    templates_option,
    train_env_option,
)
from orchestrator.cli.dashboard import dashboard_options, live_dashboard
from orchestrator.cli.front import reach_for
from orchestrator.cli.report import fail_doc, json_doc, tell
from orchestrator.errors import ExitCode, UnreachableError, UsageError
from orchestrator.executor import exit_code_for
from orchestrator.inventory import Inventory
from orchestrator.pipeline import pipeline_inventory
from orchestrator.runs.layout import logs_where
from orchestrator.runs.next_command import again, train_without
from orchestrator.runs.run_inventory import for_run, refuse_stray_args, run_nodes
from orchestrator.steps.remote import result_fields
from orchestrator.steps.train import sweep_said

if TYPE_CHECKING:
    from orchestrator.steps.train import LaunchRun


@click.command()
@common_options
@click.option(
    "--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), help="Write <node>.sh files here."
)
@templates_option()
@click.option("--offline", is_flag=True, help="Connect to nothing: interfaces only from the inventory.")
@click.option("--run-id", help="Rendezvous id / run name (default: <cluster>-<time>).")
@click.option(
    "--for",
    "target",
    type=click.Choice(["nodes", "slurm"]),
    default="nodes",
    show_default=True,
    help="slurm: the sbatch script and the node part of cluster.slurm (docs/slurm.md).",
)
@master_option
@click.pass_context
def render(
    ctx: click.Context,
    out_dir: Path | None,
    templates_dir: Path | None,
    offline: bool,
    run_id: str | None,
    target: str,
    master: str | None,
) -> int:
    """Show each node's exact launch script (torchrun with its rendezvous, interface and environment).

    The interface and the address peers reach each node at come from the route to the master, found
    on the nodes (like `check`); --offline uses only the inventory. Printed scripts mask values of
    secret-looking variables; files written with --out are complete and run by hand on each node.
    --nodes (and --master) as for launch: the job those nodes make, sized to them; the others are
    not contacted.
    """
    from orchestrator.steps.render_out import render_phase

    settings = Settings.from_context(ctx)
    inventory, _ = load_selection(settings)
    if target != "slurm":
        inventory = run_nodes(settings, inventory, master)  # --nodes: the job is sized to them
    selected = list(inventory.nodes)
    ui = settings.ui
    done = render_phase(
        reach_for(settings, inventory),
        inventory,
        selected,
        run_id=run_id,
        templates_dir=templates_dir,
        offline=offline or settings.dry_run,
        out_dir=out_dir,
        slurm=target == "slurm",
    )
    if done.unreachable:
        return fail_doc(ui, "render", done.unreachable, settings.json_mode)
    tell(ui, done.said(printed=out_dir is None and not settings.json_mode))
    if settings.json_mode:
        ui.print_json(done.public_dict(slurm=target == "slurm"))
    return ExitCode.OK


@click.command(cls=TrainArgsCommand)
@common_options
@click.option("--run-id", help="Run name (default: <cluster>-<time>); also the elastic rendezvous id.")
@templates_option()
@click.option(
    "--detach",
    is_flag=True,
    help="Start every node's launcher in the background (it survives this command and the "
    "connection), print the run id and exit; follow with `logs --run RUN --follow`.",
)
@train_env_option("Add NAME=VALUE to train.env for this run (repeatable).")
@master_option
@dashboard_options
@click.argument("train_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS...]")
@click.pass_context
def launch(
    ctx: click.Context,
    run_id: str | None,
    templates_dir: Path | None,
    detach: bool,
    train_env: tuple[str, ...],
    train_script: str | None,
    master: str | None,
    train_args: tuple[str, ...],
) -> int:
    """Start training on every node and stream every rank's output as `[node:rank] line`.

    Renders each node's torchrun script (see `render`), uploads it with the training script, runs all
    nodes at once. When one node fails, the others are stopped; the summary names it first with its
    exit code and last lines. Output is kept in runs/<run-id>/<node>.log here and beside the script
    on each node. Exit code 0 only when every node succeeded.

    `launch -- ARGS`: ARGS replace train.args for this run (the inventory is not changed);
    `-e NAME=VALUE` adds to train.env; `--script PATH` replaces train.script.
    """
    settings = Settings.from_context(ctx)
    refuse_stray_args(settings, train_args, ctx.meta.get(TYPED, ()))  # words before `--`
    inventory, _ = load_selection(settings)
    inventory = for_run(inventory, train_args or None, train_env, train_script)
    if inventory.cluster.slurm is not None:  # the nodes are Slurm's: a job, not a fan-out
        from orchestrator.cli.slurm import launch_on_slurm

        return launch_on_slurm(settings, inventory, run_id=run_id, templates_dir=templates_dir, detach=detach)
    # --nodes: the job sized to them; refused (exit 2) before anything connects when it cannot train
    inventory = pipeline_inventory(
        inventory, settings, master, dry_run=settings.dry_run, syncs=False, templates=templates_dir
    )
    return run_launch(ctx, settings, inventory, run_id=run_id, templates_dir=templates_dir, detach=detach)


def run_launch(
    ctx: click.Context,
    settings: Settings,
    inventory: Inventory,
    *,
    run_id: str | None,
    templates_dir: Path | None,
    detach: bool = False,
) -> ExitCode:
    """`bootstrap launch` (``steps.train.launch_phase``), shown; its exit code."""
    from orchestrator.steps.train import launch_phase

    if detach and not settings.dry_run and ctx.meta.get("dashboard.options", {}).get("dashboard"):
        raise UsageError(
            "--dashboard watches a run in the foreground: with --detach, watch it with "
            "`bootstrap logs --run RUN --follow --dashboard`"
        )
    names = [n.name for n in inventory.nodes]
    with live_dashboard(ctx, settings, inventory, names, "launch") as live:
        run = launch_phase(
            reach_for(settings, inventory, lines="ranks", live=live),
            inventory,
            run_id=run_id,
            templates_dir=templates_dir,
            detach=detach,
            dry_run=settings.ssh_options() if settings.dry_run else None,
        )
    return show_launch(settings, inventory, run, own_session=True)


def show_launch(settings: Settings, inventory: Inventory, run: LaunchRun, *, own_session: bool) -> ExitCode:
    """What a launch did: the dry run's plans; why it did not launch; the detached start; or the run's
    summary (who failed first, with their last lines; who was stopped; where the logs are); its exit
    code. ``own_session``: a command of its own (the main pipeline says how to go on without the
    unreachable nodes once, at its end)."""
    from orchestrator.cli.report import OFFLINE_NOTE, show_dry_run

    ui = settings.ui
    run_id = run.run_id
    if run.planned is not None:
        show_dry_run(ui, run.planned, json_mode=settings.json_mode, note=OFFLINE_NOTE)
        return ExitCode.OK
    if run.unreachable and run.plan is not None:
        code = fail_doc(ui, "launch", run.plan.inspected, settings.json_mode)  # with --json, its document
        ui.error("not launching: every node must be reachable")
        # without the nodes that did not answer (one refused at login is fixed, not left out)
        down = [o.node for o in run.plan.inspected if isinstance(o.error, UnreachableError)]
        hint = train_without(settings, inventory, down, "launch")
        if hint and own_session:
            ui.info(hint)
        return code
    if run.detached is not None:
        from orchestrator.cli.runs import show_detached

        return show_detached(settings, run.detached)
    report = run.report
    assert report is not None and run.plan is not None
    if report.interrupted is not None:
        tell(ui, sweep_said(run_id, report.swept))
        ui.note(f"logs: {run.log_dir}/ (and {logs_where(inventory.nodes, run_id)})")
        if not report.swept_all:  # a second interrupt cut the sweep short: not said to have stopped all
            ui.warn(f"not checked for processes left running: run `{again(settings, 'stop', run_id)}`")
            interrupted(
                ui, "connections closed; the nodes' watchers stop what is left", stop=report.interrupted
            )
        interrupted(ui, stop=report.interrupted)
    code = exit_code_for(report.outcomes)
    tell(ui, run.ending())
    if settings.json_mode:
        top = {"run_id": run_id, "backend": run.plan.backend, "log_dir": str(run.log_dir)}
        return json_doc(ui, "launch", report.outcomes, code, result_fields, **top)
    tell(ui, run.summary(inventory, settings if own_session else None))
    return code
