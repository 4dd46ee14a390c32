"""`bootstrap render` and `bootstrap launch`: each node's launch script, and training on every node."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import (
    Settings,
    TrainArgsCommand,
    common_options,
    fail_lines,
    interrupted,
    load_selection,
    master_option,
    offline_plan,
    open_session,
    phase_session,
    show_offline_dry_run,
    templates_option,
    train_env_option,
)
from orchestrator.cli.dashboard import dashboard_options, live_dashboard, observe, show_facts
from orchestrator.cli.report import json_doc
from orchestrator.errors import (
    ExitCode,
    UsageError,
)
from orchestrator.executor import Outcome, exit_code_for
from orchestrator.inventory import Inventory
from orchestrator.logs import RunLog
from orchestrator.runs.layout import logs_where, train_args_line
from orchestrator.runs.next_command import again, train_without
from orchestrator.runs.run_inventory import for_run, run_nodes
from orchestrator.safefiles import write_inside
from orchestrator.session import Session
from orchestrator.steps.preflight.checks import refuse_native_mix
from orchestrator.steps.remote import result_fields

if TYPE_CHECKING:
    from orchestrator.cli.ui import UI
    from orchestrator.dashboard.model import LiveRun
    from orchestrator.render import LaunchSpec
    from orchestrator.steps.train import TrainReport

T = TypeVar("T")


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
@click.pass_context
def render(
    ctx: click.Context,
    out_dir: Path | None,
    templates_dir: Path | None,
    offline: bool,
    run_id: str | None,
    target: str,
) -> int:
    """Show each node's exact launch script (torchrun with its rendezvous, interface and environment).

    The interface and the address peers reach each node at come from the route to the master, found
    on the nodes (like `check`); --offline uses only the inventory. Printed scripts mask values of
    secret-looking variables; files written with --out are complete and run by hand on each node.
    """
    from orchestrator.bench.launch import planned_shares
    from orchestrator.render import Renderer, templates_dir_for
    from orchestrator.runs.ids import new_run_id
    from orchestrator.steps.launch import RANK_CAPTURE, launch_files, launch_scripts, plan

    settings = Settings.from_context(ctx)
    inventory, selected = load_selection(settings)
    ui = settings.ui
    run_id = new_run_id(inventory.cluster.name, chosen=run_id, reserve=False)
    renderer = Renderer(templates_dir_for(inventory, templates_dir))
    if target == "slurm":
        return _render_slurm(settings, inventory, renderer, run_id, out_dir)
    all_nodes = list(inventory.nodes)  # a job spans the whole cluster: every rank needs its place
    if offline or settings.dry_run:
        launch_plan = offline_plan(ui, inventory, run_id)
    else:
        session = open_session(settings, inventory, all_nodes)
        with ui.progress([n.name for n in all_nodes], "facts") as on_event, session:
            session.executor.on_event = on_event
            launch_plan = plan(session, inventory, run_id)
        failed = [o for o in launch_plan.inspected if not o.ok]
        if failed:
            fail_lines(ui, failed)
            return exit_code_for(launch_plan.inspected)
        for warning in launch_plan.warnings:
            ui.warn(warning)
        ui.note(f"backend: {launch_plan.backend_reason}")
    backend, specs = launch_plan.backend, launch_plan.specs
    specs, shares_note = planned_shares(inventory, specs)  # the variables and files a launch adds
    if shares_note and not settings.json_mode:
        ui.note(shares_note)
    shown = {n.name for n in selected}
    specs = [s for s in specs if s.node.name in shown]
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        for file_name, data in launch_files(renderer, specs).items():
            if file_name == RANK_CAPTURE:  # the POSIX scripts start every rank through it
                path = write_inside(out_dir, file_name, data, mode=0o600)
                ui.info(f"wrote {path} (copy it beside each .sh script on the node)")
                continue
            # may hold the run's environment: owner only; inside out_dir whatever the name, no link followed
            ui.info(f"wrote {write_inside(out_dir, file_name, data, mode=0o700)}")
        _write_shares(ui, out_dir, specs)
    scripts = launch_scripts(renderer, specs)
    if settings.json_mode:
        ui.print_json({"command": "render", "run_id": run_id, "backend": backend, "scripts": scripts})
        return ExitCode.OK
    if out_dir is None:
        for name, text in scripts.items():
            ui.print_text(f"# ---- {name} ----")
            ui.print_text(text)
    return ExitCode.OK


def _render_slurm(
    settings: Settings, inventory: Inventory, renderer: Any, run_id: str, out_dir: Path | None
) -> int:
    """render --for slurm: the batch script and the node part (connects to nothing: Slurm allocates
    the nodes when the job starts); --out writes them with the rank capture, to submit by hand."""
    from orchestrator.slurm.job import BATCH_FILE, NODE_FILE, render_job
    from orchestrator.steps.launch import RANK_CAPTURE, rank_capture_file

    ui = settings.ui
    if out_dir is not None:
        files = render_job(renderer, inventory, run_id, secrets="reference")
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, text in ((BATCH_FILE, files.batch), (NODE_FILE, files.node)):
            ui.info(f"wrote {write_inside(out_dir, name, text.encode(), mode=0o700)}")
        ui.info(f"wrote {write_inside(out_dir, RANK_CAPTURE, rank_capture_file().read_bytes(), mode=0o600)}")
        ui.info(
            f"submit: copy them to {files.job_dir}/ (shared file system), "
            f"then sbatch {files.job_dir}/{BATCH_FILE}"
        )
    shown = render_job(renderer, inventory, run_id, secrets="mask")
    if settings.json_mode:
        ui.print_json(
            {
                "command": "render",
                "for": "slurm",
                "run_id": run_id,
                "scripts": {BATCH_FILE: shown.batch, NODE_FILE: shown.node},
            }
        )
    elif out_dir is None:
        for name, text in ((BATCH_FILE, shown.batch), (NODE_FILE, shown.node)):
            ui.print_text(f"# ---- {name} ----")
            ui.print_text(text)
    return ExitCode.OK


def _write_shares(ui: Any, out_dir: Path, specs: list[LaunchSpec]) -> None:
    """render --out: the shares helper and file the scripts name (CB_SHARES_HELPER, CB_SHARES_FILE,
    in the run directory on each node, where a launch puts them)."""
    from orchestrator.bench.shares import SHARES_FILE, SHARES_HELPER, shares_helper_file
    from orchestrator.runs.layout import run_dir_for

    shared = [s for s in specs if s.shares_json]
    if not shared:
        return
    helper = write_inside(out_dir, SHARES_HELPER, shares_helper_file().read_bytes(), mode=0o600)
    doc = write_inside(out_dir, SHARES_FILE, shared[0].shares_json.encode(), mode=0o600)
    where = [f"{s.node.name}: {run_dir_for(s.node, s.run_id)}" for s in shared]
    ui.info(
        f"wrote {helper} and {doc} (copy both to the run directory on each node, where the scripts' "
        f"CB_SHARES_HELPER and CB_SHARES_FILE name them: {', '.join(where)})"
    )


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
    master: str | None,
    train_args: tuple[str, ...],
) -> int:
    """Start training on every node and stream every rank's output as `[node:rank] line`.

    Renders each node's torchrun script (see `render`), uploads it with the training script, runs all
    nodes at once. When one node fails, the others are stopped; the summary names it first with its
    exit code and last lines. Output is kept in runs/<run-id>/<node>.log here and beside the script
    on each node. Exit code 0 only when every node succeeded.

    `launch -- ARGS`: ARGS replace train.args for this run (the inventory is not changed);
    `-e NAME=VALUE` adds to train.env.
    """
    settings = Settings.from_context(ctx)
    inventory, _ = load_selection(settings)
    inventory = for_run(inventory, train_args or None, train_env)
    if inventory.cluster.slurm is not None:  # the nodes are Slurm's: a job, not a fan-out
        from orchestrator.cli.slurm import launch_on_slurm

        return launch_on_slurm(settings, inventory, run_id=run_id, templates_dir=templates_dir, detach=detach)
    refuse_native_mix(inventory)  # decided from the whole inventory, whatever --nodes says
    if not settings.dry_run:
        from orchestrator.render import require_secrets

        require_secrets(inventory)  # train.env from_env: exit 2 before connecting
    inventory = run_nodes(settings, inventory, master)  # --nodes: the job is sized to them
    from orchestrator.steps.script_check import check_script_compiles

    check_script_compiles(inventory)  # a syntax error: exit 2 before anything connects
    code = run_launch(ctx, settings, inventory, run_id=run_id, templates_dir=templates_dir, detach=detach)
    return code


def run_launch(
    ctx: click.Context,
    settings: Settings,
    inventory: Inventory,
    *,
    run_id: str | None,
    templates_dir: Path | None,
    detach: bool = False,
    session: Session | None = None,
) -> ExitCode:
    """The launch phase (also the main pipeline's last step); its exit code. ``session``: the
    pipeline's one session (facts the preflight gathered are reused), else one of its own."""
    from orchestrator.bench.launch import attach_shares
    from orchestrator.logs import ranked_outputs
    from orchestrator.render import Renderer, templates_dir_for
    from orchestrator.steps.launch import plan
    from orchestrator.steps.train import train_run

    ui = settings.ui
    from orchestrator.steps.launch import missing_script_warning

    missing = missing_script_warning(inventory)
    if missing:
        ui.warn(missing)
    nodes = list(inventory.nodes)
    renderer = Renderer(templates_dir_for(inventory, templates_dir))
    if settings.dry_run:
        from orchestrator.runs.ids import check_run_id

        shown_id = check_run_id(run_id) if run_id else f"{inventory.cluster.name}-<time>"  # as launch would
        _launch_dry_run(settings, inventory, shown_id, renderer, detach=detach)
        return ExitCode.OK
    if detach and ctx.meta.get("dashboard.options", {}).get("dashboard"):
        raise UsageError(
            "--dashboard watches a run in the foreground: with --detach, watch it with "
            "`bootstrap logs --run RUN --follow --dashboard`"
        )
    from orchestrator.runs.ids import new_run_id

    # a run id names one run: a new one unless the user named it (then refused when it exists)
    run_id = new_run_id(inventory.cluster.name, chosen=run_id)
    own_session = session is None
    with (
        phase_session(settings, inventory, nodes, session) as session,
        live_dashboard(ctx, settings, inventory, [n.name for n in nodes], "launch") as live,
    ):
        unobserve = observe(live, session.executor)  # every phase's node states, on the page
        with ui.progress([n.name for n in nodes], "plan") as on_event:
            session.executor.on_event = on_event
            launch_plan = plan(session, inventory, run_id)
            attach_shares(session, inventory, launch_plan, run_id)  # cluster.train.shares (docs/bench.md)
        session.executor.on_event = None
        show_facts(live, launch_plan.inspected)
        unreachable = [o for o in launch_plan.inspected if not o.ok]
        if unreachable:
            fail_lines(ui, unreachable)
            ui.error("not launching: every node must be reachable")
            hint = train_without(settings, inventory, session.unreachable(), "launch")
            if hint and own_session:  # the main pipeline says it once, at its end
                ui.info(hint)
            return exit_code_for(launch_plan.inspected)
        for warning in launch_plan.warnings:
            ui.warn(warning)
        backend = f"backend {launch_plan.backend} ({launch_plan.backend_reason})"
        ui.info(f"run {run_id}: {len(nodes)} node(s), {backend}")
        from orchestrator.runs.layout import train_record
        from orchestrator.runs.ranks import rank_labels

        record = train_record(inventory)  # the run record's train part: what the script got
        if args_line := train_args_line(record):
            ui.info(args_line)
        if detach:
            from orchestrator.cli.runs import show_detached
            from orchestrator.steps.launch import start_detached

            try:
                started_detached = start_detached(
                    session, launch_plan.specs, renderer=renderer, train_doc=record
                )
            except KeyboardInterrupt:
                interrupted(ui)
            return show_detached(settings, started_detached)
        log = RunLog(Path("runs") / run_id)
        printer = ui.line_printer([n.name for n in nodes])

        # every line: into runs/<run-id>/<node>.log as received, onto the terminal as [node:rank]
        labels = rank_labels(inventory)
        samples = launch_plan.specs[0].sample_nonce if launch_plan.specs else ""
        if live is not None:
            live.set_run(run_id, labels, samples)
        page = None if live is None else live.block  # the page reads the same blocks
        outputs = ranked_outputs(labels, log, None if settings.json_mode else printer, page, samples)
        if len(nodes) > 1:  # a single node's failure is the summary's to tell: nothing else to stop
            session.executor.on_cause = _announce_cause(ui)
        try:
            report = train_run(session, launch_plan.specs, renderer, outputs, log, train_doc=record)
        finally:
            session.executor.on_cause = None
            unobserve()
        if report.interrupted is not None:
            show_sweep(settings, run_id, report.swept)
            if not report.swept_all:
                ui.warn(f"not checked for processes left running: run `{again(settings, 'stop', run_id)}`")
            interrupted(ui, stop=report.interrupted)
        if live is not None:
            _tell_dashboard(live, report)
    outcomes, failed, stopped = report.outcomes, report.failed, report.stopped
    for name in sorted(report.lost):
        settings.ui.note(
            f"{name}: unreachable; it stops its part of the run by itself within 15 s of losing "
            f"this controller (`{again(settings, 'status', run_id)}` once it is back)"
        )
    show_sweep(settings, run_id, report.swept, ended=not stopped)
    code = exit_code_for(outcomes)
    if settings.json_mode:
        log_dir = str(log.directory)
        return json_doc(
            ui,
            "launch",
            outcomes,
            code,
            result_fields,
            run_id=run_id,
            backend=launch_plan.backend,
            log_dir=log_dir,
        )
    table = Table(title=Text(f"run {run_id}"), title_justify="left")
    for column in ("node", "result", "time"):
        table.add_column(column)
    ordered = failed + [o for o in outcomes if o not in failed]
    for o in ordered:
        word = report.status(o)
        style = "green" if word == "ok" else "red bold" if o in failed else "yellow"
        table.add_row(Text(o.node), Text(word, style=style), f"{o.duration:.1f}s")
    ui.err.print(table)
    for o in failed:
        ui.error(str(o.error))
        for line in report.tail(o, labels.get(o.node, (0, 0))[0]):
            ui.info(f"  {line}")
    if stopped and failed:
        ui.note(f"stopped because {failed[0].node} failed first: {', '.join(o.node for o in stopped)}")
    ui.note(f"logs: {log.directory}/ (and {logs_where(nodes, run_id)})")
    if stopped:  # what a stopped rank printed while it handled the stop may miss node.log
        ui.note("every line each rank wrote, also while it was being stopped: ranks/ beside node.log")
    return code


def _launch_dry_run(
    settings: Settings, inventory: Inventory, run_id: str, renderer: Any, *, detach: bool
) -> None:
    """Per node: what would be uploaded where, the launch script (secrets masked) and the exact text
    its shell would get. Connects to nothing: interfaces only as the inventory names them (`launch`
    finds them on the nodes, as `render` without --offline shows)."""
    from orchestrator.bench.launch import planned_shares
    from orchestrator.render import missing_secrets

    for issue in missing_secrets(inventory):  # masked here; a real launch stops on them (exit 2)
        settings.ui.warn(f"{issue} (a real launch stops here, exit 2)")

    def shared(specs: list[LaunchSpec]) -> list[LaunchSpec]:  # what attach_shares gives a launch
        specs, shares_note = planned_shares(inventory, specs)
        if shares_note and not settings.json_mode:
            settings.ui.note(shares_note)
        return specs

    # detached: the start script, which starts launch.sh in a session of its own and returns
    show_offline_dry_run(settings, "launch", inventory, run_id, renderer, shared, detach=detach)


def show_sweep(settings: Settings, run_id: str, swept: list[Outcome[Any]], *, ended: bool = False) -> None:
    """What the sweep after a cut-short run found: nodes it could not check, processes it stopped.
    ``ended``: the run ended by itself, and what is found are processes its ranks left behind."""
    stop = again(settings, "stop", run_id)
    for o in swept:
        if o.error is not None:
            settings.ui.warn(
                f"{o.node}: not checked for processes of the run left running ({o.error}): "
                f"run `{stop}` when it is reachable"
            )
        elif o.value is not None and o.value.state == "stopped" and ended:
            settings.ui.warn(
                f"{o.node}: the run ended, but processes its ranks started were still running (not "
                f"waited for by the training script): {o.value.describe()}"
            )
        elif o.value is not None and o.value.state == "stopped":
            settings.ui.note(f"{o.node}: processes of the run were still running: {o.value.describe()}")


def _tell_dashboard(live: LiveRun, report: TrainReport) -> None:
    """How the run ended, on the page: lost nodes, then the end (before the page goes away)."""
    for name in sorted(report.lost):
        live.lost(name, "unreachable: it stops its part of the run by itself within 15 s")
        live.node_state(name, "train", "lost")
    state = "failed" if report.failed else "stopped" if report.stopped else "ok"
    live.ended(state, f"run {report.run_id} {'ended' if state == 'ok' else state}")


def _announce_cause(ui: UI) -> Callable[[Outcome[Any]], None]:
    """The node whose failure ends a foreground run (a lost connection, a rank's exit), named as the
    fail fast stops the other nodes: the summary only comes after they are stopped and swept."""
    return lambda cause: ui.warn(f"{cause.error}; stopping the run on the other nodes")  # names the node
