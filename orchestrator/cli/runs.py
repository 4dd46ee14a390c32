"""`bootstrap logs / status / stop / fetch` and `launch --detach`: working with a run after it started.

Every command takes ``--run RUN`` (``latest``, the default except for `stop`, is the newest run under
./runs); the nodes come from the inventory (``--nodes`` narrows them). What each does and decides is
orchestrator/runs/commands.py; here: the options, and each report shown.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any, cast

import click
from rich.table import Table

from orchestrator.cli.common import (
    CommandExit,
    Settings,
    common_options,
    interrupted,
    load_selection,
    open_session,
    print_plans,
)
from orchestrator.cli.dashboard import dashboard_options, live_dashboard
from orchestrator.cli.report import json_doc, rich_table, tell
from orchestrator.cli.slurm import logs_on_slurm, status_on_slurm, stop_on_slurm
from orchestrator.dashboard.model import observe
from orchestrator.errors import ExitCode
from orchestrator.executor import exit_code_for
from orchestrator.logs import ranked_outputs
from orchestrator.render import secret_values
from orchestrator.runner import Reach
from orchestrator.runs import commands
from orchestrator.runs.commands import FetchReport, NodeScript, RecordedRun
from orchestrator.runs.ids import require_run, resolve_run
from orchestrator.runs.layout import RUNS_ROOT
from orchestrator.runs.next_command import again
from orchestrator.runs.start import DetachedStart

if TYPE_CHECKING:
    from orchestrator.dashboard.model import LiveRun
    from orchestrator.inventory import Inventory

_RUN_HELP = "Run id (default: latest, the newest run under ./runs)."
#: how a Slurm run answers a command instead (its login host: cli/slurm.py)
OnSlurm = Callable[[Settings, "Inventory", str], int]


def _run(
    ctx: click.Context, run_arg: str, on_slurm: OnSlurm, script: Callable[[RecordedRun], NodeScript]
) -> tuple[Settings, Inventory, RecordedRun]:
    """The command's settings, inventory and run (with the nodes and ranks its record gives). A Slurm
    run is answered by ``on_slurm``, and ``--dry-run`` shows ``script`` on each node: both end the
    command there."""
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    run_id = resolve_run(run_arg, on_note=settings.ui.note)
    if inventory.cluster.slurm is not None:  # a Slurm job: the login host answers for it
        raise CommandExit(ExitCode(on_slurm(settings, inventory, run_id)))
    run = commands.recorded_run(inventory, nodes, run_id, narrowed=bool(settings.nodes))
    if settings.dry_run:  # the script each node would get (runs.control's ``*_script``)
        on_node = script(run)
        print_plans(
            settings,
            inventory,
            run.nodes,
            lambda node, t: [on_node(node, t.platform)],
            command=ctx.info_name or "",
        )
        raise CommandExit(ExitCode.OK)
    return settings, inventory, run


def _reach(settings: Settings, inventory: Inventory) -> Reach:
    return Reach(lambda chosen: open_session(settings, inventory, chosen), settings.ui.progress)


def show_detached(settings: Settings, report: DetachedStart) -> ExitCode:
    """What `launch --detach` prints (or its --json document); its exit code."""
    ui, run_id, outcomes = settings.ui, report.run_id, report.outcomes
    if report.interrupted is not None:  # cut short while starting: stopped again, exit 130
        said = report.interrupted_detail(lambda command: again(settings, command, run_id))
        interrupted(ui, said, stop=report.interrupted)
    code = exit_code_for(outcomes)
    if settings.json_mode:
        fields, stopped_again = report.node_fields, report.stopped_again
        return json_doc(
            ui, "launch", outcomes, code, fields, run_id=run_id, detached=True, stopped_again=stopped_again
        )
    tell(ui, report.said(lambda command: again(settings, command, run_id)))
    return code if report.failed else ExitCode.OK


# -- logs ----------------------------------------------------------------------------------------------


@click.command()
@common_options
@click.option("--run", "run_arg", default="latest", show_default=True, help=_RUN_HELP)
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until every node's launcher has ended.")
@click.option(
    "--tail",
    "tail",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Only the last N lines of each node's log (0: only new ones); default: the whole log. "
    "Prints only: runs/<run-id>/<node>.log here is left as it is.",
)
@dashboard_options
@click.pass_context
def logs(ctx: click.Context, run_arg: str, follow: bool, tail: int | None) -> int:
    """Print every node's log of a run as `[node:rank] line`, keeping runs/<run-id>/<node>.log here.

    Each node's log is read from its start (into <node>.log.part here, which replaces the copy
    only once that node's read succeeded: a failed read keeps the previous copy as it was); with
    --follow it streams until every launcher has ended and its log is read to the end (exit code 1
    when a node's training did not exit 0). A dropped
    connection is reopened and reading resumes at the byte after the last complete line: no line is
    lost or printed twice.

    --tail N starts at each node's N-th last complete line (found on the node, which reads back
    from the end: the whole log never travels); with --follow, new lines follow. A last line
    without its newline counts once the launcher has ended. With --tail the copy here
    (runs/<run-id>/<node>.log) is neither truncated nor written: it keeps what the last full
    `logs` wrote.
    """
    on_slurm: OnSlurm = lambda s, i, r: logs_on_slurm(s, i, r, follow=follow)  # noqa: E731
    settings, inventory, run = _run(
        ctx, run_arg, on_slurm, lambda run: commands.logs_script(run, follow=follow, tail=tail)
    )
    try:
        with live_dashboard(ctx, settings, inventory, run.names, "logs") as live:
            if live is not None:
                live.set_run(run.run_id, run.labels, run.samples)
            if not follow or settings.json_mode or sys.stdin is None or not sys.stdin.isatty():
                return _logs(settings, inventory, run, follow=follow, tail=tail, live=live)
            from orchestrator.dashboard.terminal import KEY, table_key

            if live is None:  # the table reads what the page would
                live = _live(inventory, run)
            settings.ui.note(f"press {KEY}: the live table of `status --watch` ({KEY} again: the lines)")
            shown = RUNS_ROOT / run.run_id if tail is None else f"`{again(settings, 'logs', run.run_id)}`"
            with table_key(
                live, watch_table, sys.stdout, settings.ui.err, sys.stdin, where=f"{shown}"
            ) as lines:
                stream = cast(IO[str], lines)
                return _logs(settings, inventory, run, follow=follow, tail=tail, live=live, stream=stream)
    except KeyboardInterrupt:  # before the reading began (connecting, a prompt): it stopped nothing
        interrupted(settings.ui, f"the run goes on; stop it with: {again(settings, 'stop', run.run_id)}")


def _live(inventory: Inventory, run: RecordedRun, **more: Any) -> LiveRun:
    from orchestrator.dashboard.model import LiveRun

    secrets = secret_values(inventory)
    return LiveRun(
        run.names, run_id=run.run_id, labels=run.labels, secrets=secrets, sample_nonce=run.samples, **more
    )


def _logs(
    settings: Settings,
    inventory: Inventory,
    run: RecordedRun,
    *,
    follow: bool,
    tail: int | None,
    live: LiveRun | None,
    quiet: bool = False,
    stream: IO[str] | None = None,
) -> int:
    """`logs` once its run is known (and its dashboard serving, when asked for). ``quiet``: the lines
    go to ``live`` only (`status --watch`), not to the terminal; ``stream``: where they go instead of
    stdout (the key's switch to the table, dashboard/terminal.py)."""
    ui = settings.ui
    printer = None if settings.json_mode or quiet else ui.line_printer(run.names, stream)
    on_block = None if live is None else live.block  # the page reads the same blocks

    def on_failed(node: str, code: int) -> None:
        assert live is not None
        live.node_state(node, "train", "failed", f"training exited {code}")
        live.failure(node, f"training exited with code {code}")

    session = open_session(settings, inventory, run.nodes)
    observe(live, session.executor)
    report = commands.read_logs(
        session,
        run,
        lambda copies: ranked_outputs(run.node_labels, copies, printer, on_block, run.samples),
        follow=follow,
        tail=tail,
        on_note=lambda node, message: ui.note(f"{node}: {message}"),
        on_failed=None if live is None else on_failed,
    )
    if report.interrupted is not None:
        for note in report.copy_notes():
            ui.note(note)
        again_stop = again(settings, "stop", run.run_id)
        interrupted(ui, f"the run goes on; stop it with: {again_stop}", stop=report.interrupted)
    code = report.exit_code()
    if settings.json_mode:
        log_dir = None if report.log_dir is None else str(report.log_dir)  # --tail writes no copy here
        top = {"run_id": run.run_id, "follow": follow, "tail": tail, "log_dir": log_dir}
        return json_doc(ui, "logs", report.outcomes, code, report.node_fields, **top)
    tell(ui, report.said())
    return code


# -- status ------------------------------------------------------------------------------------------


@click.command()
@common_options
@click.option("--run", "run_arg", default="latest", show_default=True, help=_RUN_HELP)
@click.option(
    "--watch",
    is_flag=True,
    help="A live table in place (nodes, and each rank's step, loss and samples/s from the lines it "
    "prints from now on), until every launcher has ended or Ctrl-C.",
)
@click.pass_context
def status(ctx: click.Context, run_arg: str, watch: bool) -> int:
    """Per node: running / exited (code) / stopped / not started, runtime, last line, GPU use.

    One round trip per node. Runtime is measured on each node's own clock (from its launcher's start
    to its exit, or to now; stopped: to its last output). GPU utilisation shows where nvidia-smi
    exists. Exit code 1 when a node has no such run (state "no run", the node named) or the run failed
    there (a non-zero exit no stop there or of its peers caused, no exit code, a lost controller).
    """
    settings, inventory, run = _run(ctx, run_arg, status_on_slurm, commands.status_script_of)
    if watch:
        return _watch(settings, inventory, run)
    ui, run_id = settings.ui, run.run_id
    report = commands.status_all(_reach(settings, inventory), run)
    code = report.exit_code()
    if settings.json_mode:
        return json_doc(ui, "status", report.outcomes, code, run_id=run_id, train=report.train)
    tell(ui, report.said(run_id))
    return code


def _watch(settings: Settings, inventory: Inventory, run: RecordedRun) -> int:
    """`status --watch`: the run's new lines (as `logs --follow --tail 0` reads them) into the
    dashboard's model, shown as a table in place (rich Live) on stderr."""
    from rich.live import Live

    live = _live(inventory, run, command="status")
    with Live(
        watch_table(live),
        console=settings.ui.err,
        refresh_per_second=2,
        get_renderable=lambda: watch_table(live),
    ):
        code = _logs(settings, inventory, run, follow=True, tail=0, live=live, quiet=True)
    settings.ui.print_table(watch_table(live))  # the last state stays on the screen
    return code


def watch_table(live: LiveRun) -> Table:
    """The live view (``LiveRun.view``), drawn."""
    return rich_table(live.view())


# -- stop --------------------------------------------------------------------------------------------


@click.command()
@common_options
@click.option(
    "--run", "run_arg", default=None, help="Run id to stop (`latest`: the newest under ./runs); required."
)
@click.option(
    "--grace",
    type=click.FloatRange(min=0.1, max=60),
    default=5.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL (native Windows nodes terminate at once).",
)
@click.pass_context
def stop(ctx: click.Context, run_arg: str | None, grace: float) -> int:
    """Stop every process of a run on every node: SIGTERM, then SIGKILL after --grace seconds.

    The run's processes are those of its launcher's session (the launcher identified by its pid and
    start time) and any carrying the run's marker in their environment: never another run's, never
    one matched by name. On native Windows nodes: the launcher and its ranks (each identified by pid
    and creation time) with their process trees, terminated at once (Windows has no SIGTERM for
    them). Stopping a run that has ended says so and changes nothing.
    """
    script = lambda run: commands.stop_script_of(run, grace=grace)  # noqa: E731
    settings, inventory, run = _run(ctx, require_run(run_arg, "stop"), stop_on_slurm, script)
    report = commands.stop_all(_reach(settings, inventory), run, grace=grace)
    ui, code = settings.ui, report.exit_code()
    if settings.json_mode:
        return json_doc(ui, "stop", report.outcomes, code, run_id=run.run_id)
    tell(ui, report.said(run.run_id, again(settings, "stop", run.run_id)))
    return code


# -- fetch -------------------------------------------------------------------------------------------


@click.command()
@common_options
@click.option("--run", "run_arg", default="latest", show_default=True, help=_RUN_HELP)
@click.option(
    "--code",
    "from_code",
    is_flag=True,
    help="look for relative paths only in the code directory (shared by every run: what is there now)",
)
@click.argument("paths", nargs=-1, required=True)
@click.pass_context
def fetch(ctx: click.Context, run_arg: str, paths: tuple[str, ...], from_code: bool) -> int:
    """Copy files or directories a run wrote on the nodes into runs/<run-id>/<node>/ here.

    A relative PATH is looked for in the run's outputs ($CB_RUN_DIR: <workdir>/runs/<run-id>/<node>/out),
    then the run directory, then the code directory (where the training script runs; --code: only
    there); an absolute one is taken as is. Directories are copied with everything below them.
    """

    def on_slurm(settings: Settings, inventory: Inventory, run_id: str) -> int:
        reach = _reach(settings, inventory)  # --dry-run: listed through the login host, nothing copied
        found = commands.fetch_on_slurm(
            reach, inventory, run_id, paths, from_code=from_code, copy=not settings.dry_run
        )
        return _fetched(settings, run_id, found)

    script = lambda run: commands.fetch_script_of(run, paths, from_code=from_code)  # noqa: E731
    settings, inventory, run = _run(ctx, run_arg, on_slurm, script)
    report = commands.fetch_all(_reach(settings, inventory), run, paths, from_code=from_code)
    return _fetched(settings, run.run_id, report)


def _fetched(settings: Settings, run_id: str, report: FetchReport) -> int:
    """fetch's table (or --json) and exit code: 1 when a path was found on no node's side."""
    ui, code = settings.ui, report.exit_code()
    if report.listed_only:
        ui.note("--dry-run: nothing was copied; the table says what would be, and where")
    if settings.json_mode:
        return json_doc(ui, "fetch", report.outcomes, code, report.node_fields, run_id=run_id)
    tell(ui, report.said(run_id))
    return code
