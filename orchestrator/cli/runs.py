"""`bootstrap logs / status / stop / fetch` and `launch --detach`: working with a run after it started.

Every command takes ``--run RUN`` (``latest``, the default except for `stop`, is the newest run under
./runs); the nodes come from the inventory (``--nodes`` narrows them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, cast

import click
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import (
    Settings,
    common_options,
    fail_lines,
    interrupted,
    load_selection,
    open_session,
    print_plans,
)
from orchestrator.cli.dashboard import dashboard_options, live_dashboard, observe
from orchestrator.cli.report import json_doc
from orchestrator.cli.ui import UI
from orchestrator.errors import ExitCode
from orchestrator.executor import exit_code_for
from orchestrator.logs import RunLog, ranked_outputs
from orchestrator.neutralise import neutralise
from orchestrator.render import secret_values
from orchestrator.runs.commands import (
    FetchReport,
    fetch_all,
    fetch_on_slurm,
    read_logs,
    recorded_nodes,
    status_all,
    stop_all,
)
from orchestrator.runs.control import NodeStatus, fetch_script, status_script, stop_script, tail_script
from orchestrator.runs.ids import resolve_run
from orchestrator.runs.layout import RUNS_ROOT, sample_nonce
from orchestrator.runs.next_command import again
from orchestrator.runs.start import DetachedStart, Started
from orchestrator.runs.tail import FollowResult
from orchestrator.steps.node_facts import interpreter_for

if TYPE_CHECKING:
    from orchestrator.dashboard.model import LiveRun
    from orchestrator.inventory import Inventory, Node
    from orchestrator.platforms import Platform

_RUN_HELP = "Run id (default: latest, the newest run under ./runs)."


def _print_scripts(
    settings: Settings, inventory: Inventory, nodes: list[Node], script: Callable[[Node, Platform], str]
) -> None:
    """--dry-run: the script a run command sends to each node (runs.control's ``*_script``)."""
    command = click.get_current_context().info_name or ""
    print_plans(
        settings,
        inventory,
        nodes,
        lambda node, transport: [script(node, transport.platform)],
        command=command,
    )


# -- launch --detach ---------------------------------------------------------------------------------


def show_detached(settings: Settings, report: DetachedStart) -> ExitCode:
    """What `launch --detach` prints (or its --json document); its exit code."""
    ui, run_id, outcomes = settings.ui, report.run_id, report.outcomes
    code = exit_code_for(outcomes)
    if settings.json_mode:
        stopped_again = [o.node for o in report.undone if o.ok]
        return json_doc(
            ui,
            "launch",
            outcomes,
            code,
            report.node_fields,
            run_id=run_id,
            detached=True,
            stopped_again=stopped_again,
        )
    if report.failed:
        fail_lines(ui, report.failed)
        if report.undone:
            ui.error(
                "not started on every node: stopped it again on "
                + ", ".join(f"{o.node} ({o.value.describe() if o.value else o.error})" for o in report.undone)
            )
        return code
    for o in outcomes:
        if isinstance(o.value, Started):
            ui.note(f"{o.node}: launcher pid {o.value.pid}, log {o.value.node_log}")
    ui.info(f"run {run_id} started detached on {len(outcomes)} node(s); it keeps running without us")
    ui.info(f"  follow: {again(settings, 'logs', run_id)} --follow")
    ui.info(f"  status: {again(settings, 'status', run_id)}")
    ui.info(f"  stop:   {again(settings, 'stop', run_id)}")
    ui.print_text(run_id)
    return ExitCode.OK


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
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    run_id = resolve_run(run_arg)
    if inventory.cluster.slurm is not None:  # a Slurm job: the login host answers for it
        from orchestrator.cli.slurm import logs_on_slurm

        return logs_on_slurm(settings, inventory, run_id, follow=follow)
    nodes, labels = recorded_nodes(inventory, nodes, run_id, narrowed=bool(settings.nodes))
    if settings.dry_run:
        _print_scripts(
            settings,
            inventory,
            nodes,
            lambda node, platform: tail_script(
                platform, node, run_id, follow=follow, python=interpreter_for(node), lines=tail
            ),
        )
        return ExitCode.OK
    with live_dashboard(ctx, settings, inventory, [n.name for n in nodes], "logs") as live:
        samples = sample_nonce(RUNS_ROOT / run_id)  # a run launched from here: its nodes' GPU use
        if live is not None:
            live.set_run(run_id, labels, samples)
        if not follow or settings.json_mode or sys.stdin is None or not sys.stdin.isatty():
            return _logs(settings, inventory, nodes, labels, run_id, follow=follow, tail=tail, live=live)
        from orchestrator.dashboard.model import LiveRun
        from orchestrator.dashboard.terminal import KEY, table_key

        if live is None:  # the table reads what the page would
            live = LiveRun(
                [n.name for n in nodes],
                run_id=run_id,
                labels=labels,
                secrets=secret_values(inventory),
                sample_nonce=samples,
            )
        settings.ui.note(f"press {KEY}: the live table of `status --watch` ({KEY} again: the lines)")
        shown = RUNS_ROOT / run_id if tail is None else f"`{again(settings, 'logs', run_id)}`"
        with table_key(live, watch_table, sys.stdout, settings.ui.err, sys.stdin, where=f"{shown}") as lines:
            return _logs(
                settings,
                inventory,
                nodes,
                labels,
                run_id,
                follow=follow,
                tail=tail,
                live=live,
                stream=cast(IO[str], lines),
            )


def _logs(
    settings: Settings,
    inventory: Inventory,
    nodes: list[Node],
    labels: dict[str, tuple[int, int]],
    run_id: str,
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
    directory = RUNS_ROOT / run_id
    # each node's log is read from its start into <node>.log.part, which replaces the copy here only
    # once that node's read succeeded: a node that is gone never costs the only copy left
    run_log = RunLog(directory, staged=True)
    printer = ui.line_printer([n.name for n in nodes], stream)

    outputs = ranked_outputs(
        {n.name: labels[n.name] for n in nodes},
        run_log if tail is None else None,  # a tail is only printed: the copy here stays whole
        None if settings.json_mode or quiet else printer,
        None if live is None else live.block,  # the page reads the same blocks
        sample_nonce(RUNS_ROOT / run_id),
    )

    def on_note(node: str, message: str) -> None:
        ui.note(f"{node}: {message}")

    def on_read(node: str, result: FollowResult) -> None:
        if live is not None and result.exit_code not in (0, None):
            live.node_state(node, "train", "failed", f"training exited {result.exit_code}")
            live.failure(node, f"training exited with code {result.exit_code}")

    session = open_session(settings, inventory, nodes)
    observe(live, session.executor)
    report = read_logs(
        session,
        run_id,
        outputs,
        run_log if tail is None else None,
        follow=follow,
        tail=tail,
        on_note=on_note,
        on_read=on_read,
    )
    if report.interrupted is not None:
        _say_copies(ui, run_log, report.copies)
        interrupted(
            ui, f"the run goes on; stop it with: {again(settings, 'stop', run_id)}", stop=report.interrupted
        )
    outcomes, copies = report.outcomes, report.copies
    code = report.exit_code(follow=follow)
    if settings.json_mode:
        log_dir = str(directory) if tail is None else None  # --tail writes no copy here
        return json_doc(
            ui,
            "logs",
            outcomes,
            code,
            report.node_fields,
            run_id=run_id,
            follow=follow,
            tail=tail,
            log_dir=log_dir,
        )
    fail_lines(ui, outcomes)
    _say_copies(ui, run_log, copies)
    if follow:
        for o in outcomes:
            if isinstance(o.value, FollowResult):
                how = "was stopped" if o.value.exit_code is None else f"exited {o.value.exit_code}"
                ui.note(f"{o.node}: training {how}")
    if tail is None and any(isinstance(o.value, FollowResult) and o.value.lines for o in outcomes):
        ui.note(f"logs: {directory}/")
    return code


def _say_copies(ui: UI, run_log: RunLog, copies: dict[str, str]) -> None:
    for name, state in copies.items():
        path = run_log.path(name)
        if state == "kept":
            ui.note(f"{name}: the previous copy {path} was kept as it was")
        elif state == "none":
            ui.note(f"{name}: no copy written to {path} (the read failed)")
        elif state == "busy":
            ui.note(
                f"{name}: {path} left as it is: a running `bootstrap launch` (or another `logs`) writes it"
            )


# -- status ------------------------------------------------------------------------------------------


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def _gpu_text(status: NodeStatus) -> str:
    if not status.gpus:
        return "-"
    return " ".join(
        f"{g['index']}:{g['util_percent']:.0f}%" for g in status.gpus if g["util_percent"] is not None
    )


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

    One round trip per node. Runtime is measured on each node's own clock (from its launcher's
    start to its exit, or to now; stopped: to its last output). GPU utilisation shows where
    nvidia-smi exists. Exit code 1 when a node has no such run (state "no run", the node named).
    """
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    ui = settings.ui
    run_id = resolve_run(run_arg)
    if inventory.cluster.slurm is not None:  # a Slurm job: the login host answers for it
        from orchestrator.cli.slurm import status_on_slurm

        return status_on_slurm(settings, inventory, run_id)
    nodes, _labels = recorded_nodes(inventory, nodes, run_id, narrowed=bool(settings.nodes))
    if settings.dry_run:
        _print_scripts(
            settings, inventory, nodes, lambda node, platform: status_script(platform, node, run_id)
        )
        return ExitCode.OK
    if watch:
        return _watch(settings, inventory, nodes, _labels, run_id)
    session = open_session(settings, inventory, nodes)
    try:
        with ui.progress([n.name for n in nodes], "status") as on_event, session:
            session.executor.on_event = on_event
            report = status_all(session, run_id)
    except KeyboardInterrupt:
        interrupted(ui)
    from orchestrator.runs.layout import train_args_line

    outcomes, lost, train = report.outcomes, report.lost, report.train
    code = exit_code_for(outcomes)
    if settings.json_mode:
        return json_doc(ui, "status", outcomes, code, run_id=run_id, train=train)
    table = Table(title=Text(f"run {run_id}"), title_justify="left")
    for column in ("node", "state", "runtime", "gpu"):
        table.add_column(column, no_wrap=True)
    # the last line gives way, never the other columns (a 500-character line collapsed them all)
    table.add_column("last line", overflow="ellipsis", no_wrap=True, max_width=STATUS_LINE_WIDTH)
    styles = {"running": "cyan", "exited": "green", "stopped": "yellow"}
    for o in outcomes:
        value = o.value
        if value is None:
            table.add_row(Text(o.node), Text("unknown", style="red"), "-", "-", "")
            continue
        failed = o.error is not None or value.failed  # "no run" too
        label, style = value.label, "red" if failed else styles.get(value.state, "dim")
        table.add_row(
            Text(o.node),
            Text(label, style=style),
            _duration(value.runtime),
            _gpu_text(value),
            Text(neutralise(value.last_line)),  # node text: before rich measures it for the ellipsis
        )
    ui.print_table(table)
    args_line = train_args_line(train)
    if args_line:
        ui.info(args_line)
    if lost:
        ui.warn(
            f"run {run_id}: its controller ended without ending the run (killed, or its machine or "
            "connection lost): each node's watchdog stopped what was left; "
            f"`{again(settings, 'logs', run_id)}` shows what every rank printed last"
        )
    fail_lines(ui, outcomes)
    return code


def _watch(
    settings: Settings,
    inventory: Inventory,
    nodes: list[Node],
    labels: dict[str, tuple[int, int]],
    run_id: str,
) -> int:
    """`status --watch`: the run's new lines (as `logs --follow --tail 0` reads them) into the
    dashboard's model, shown as a table in place (rich Live) on stderr."""
    from rich.live import Live

    from orchestrator.dashboard.model import LiveRun

    live = LiveRun(
        [n.name for n in nodes],
        run_id=run_id,
        labels=labels,
        secrets=secret_values(inventory),
        command="status",
        sample_nonce=sample_nonce(RUNS_ROOT / run_id),
    )
    with Live(
        watch_table(live),
        console=settings.ui.err,
        refresh_per_second=2,
        get_renderable=lambda: watch_table(live),
    ):
        code = _logs(settings, inventory, nodes, labels, run_id, follow=True, tail=0, live=live, quiet=True)
    settings.ui.print_table(watch_table(live))  # the last state stays on the screen
    return code


def watch_table(live: LiveRun) -> Table:
    """The live view: per node its state, lines read and GPU use (else CPU load), per rank step, loss
    and samples/s (the slowest rank marked), the newest event. Node text neutralised."""
    from orchestrator.dashboard.model import use_text

    live.flush_pending()
    table = Table(title=Text(f"run {live.run_id}"), title_justify="left")
    for column in ("node", "state", "lines", "gpu / cpu", "rank", "step", "loss", "samples/s"):
        table.add_column(column, no_wrap=True)
    slowest = live.slowest()
    for name, doc in live.nodes.items():
        ranks = sorted((r for r in live.ranks.values() if r.node == name), key=lambda r: r.rank)
        head = (
            Text(name),
            Text(str(doc.get("state", ""))),
            str(doc.get("lines", 0)),
            Text(neutralise(use_text(doc))),
        )
        if not ranks:
            table.add_row(*head, "-", "-", "-", "-")
        for i, rank in enumerate(ranks):
            speed = "-" if rank.samples_per_s is None else f"{rank.samples_per_s:.1f}"
            table.add_row(
                *(head if i == 0 else ("", "", "", "")),
                str(rank.rank),
                "-" if rank.step is None else str(rank.step),
                "-" if rank.loss is None else f"{rank.loss:.4f}",
                Text(speed + " slowest", style="bold red") if rank.rank == slowest else speed,
            )
    if live.events:
        event = live.events[-1]
        table.caption = Text(neutralise(f"{event['kind']}: {event['node']} {event['message']}"))
    return table


#: characters of a rank's last line in the status table (the full line: `logs --tail 1`, `--json`)
STATUS_LINE_WIDTH = 60


# -- stop --------------------------------------------------------------------------------------------


@click.command()
@common_options
@click.option("--run", "run_arg", required=True, help="Run id to stop (`latest`: the newest under ./runs).")
@click.option(
    "--grace",
    type=click.FloatRange(min=0.1, max=60),
    default=5.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL (native Windows nodes terminate at once).",
)
@click.pass_context
def stop(ctx: click.Context, run_arg: str, grace: float) -> int:
    """Stop every process of a run on every node: SIGTERM, then SIGKILL after --grace seconds.

    The run's processes are those of its launcher's session (the launcher identified by its pid and
    start time) and any carrying the run's marker in their environment: never another run's, never
    one matched by name. On native Windows nodes: the launcher and its ranks (each identified by pid
    and creation time) with their process trees, terminated at once (Windows has no SIGTERM for
    them). Stopping a run that has ended says so and changes nothing.
    """
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    ui = settings.ui
    run_id = resolve_run(run_arg)
    if inventory.cluster.slurm is not None:  # a Slurm job: the login host answers for it
        from orchestrator.cli.slurm import stop_on_slurm

        return stop_on_slurm(settings, inventory, run_id)
    nodes, _labels = recorded_nodes(inventory, nodes, run_id, narrowed=bool(settings.nodes))
    if settings.dry_run:
        _print_scripts(
            settings, inventory, nodes, lambda node, platform: stop_script(platform, node, run_id, grace)
        )
        return ExitCode.OK
    session = open_session(settings, inventory, nodes)
    try:
        with ui.progress([n.name for n in nodes], "stop") as on_event, session:
            session.executor.on_event = on_event
            outcomes = stop_all(session, run_id, grace=grace)
    except KeyboardInterrupt:
        interrupted(ui)
    code = exit_code_for(outcomes)
    if settings.json_mode:
        return json_doc(ui, "stop", outcomes, code, run_id=run_id)
    table = Table(title=Text(f"stop {run_id}"), title_justify="left")
    for column in ("node", "result"):
        table.add_column(column)
    for o in outcomes:
        if o.value is None:
            table.add_row(Text(o.node), Text("failed", style="red"))
        else:
            style = "green" if o.value.state == "stopped" else "dim"
            table.add_row(Text(o.node), Text(o.value.describe(), style=style))
    ui.print_table(table)
    fail_lines(ui, outcomes)
    if code == ExitCode.OK and all(o.value is not None and o.value.state != "stopped" for o in outcomes):
        ui.note("nothing was running: nothing changed")
    return code


# -- fetch -------------------------------------------------------------------------------------------


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


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
    settings = Settings.from_context(ctx)
    inventory, nodes = load_selection(settings)
    ui = settings.ui
    run_id = resolve_run(run_arg)
    if inventory.cluster.slurm is not None:
        # a Slurm run: its nodes' directories are on the shared file system, read through the login host
        from orchestrator.slurm.job import login_node

        with open_session(settings, inventory, [login_node(inventory)]) as login:
            # --dry-run: listed through the login host, nothing copied
            report = fetch_on_slurm(
                login, inventory, run_id, paths, from_code=from_code, copy=not settings.dry_run
            )
        if settings.dry_run:
            settings.ui.note("--dry-run: nothing was copied; the table says what would be, and where")
        return _fetched(settings, run_id, report, from_code)
    nodes, _labels = recorded_nodes(inventory, nodes, run_id, narrowed=bool(settings.nodes))
    code_dir = inventory.cluster.train.code_dir
    if settings.dry_run:
        _print_scripts(
            settings,
            inventory,
            nodes,
            lambda node, platform: fetch_script(platform, node, run_id, paths, code_dir, from_code=from_code),
        )
        return ExitCode.OK
    session = open_session(settings, inventory, nodes)
    try:
        with ui.progress([n.name for n in nodes], "fetch") as on_event, session:
            session.executor.on_event = on_event
            report = fetch_all(session, run_id, paths, code_dir=code_dir, from_code=from_code)
    except KeyboardInterrupt:
        interrupted(ui)
    return _fetched(settings, run_id, report, from_code)


def _fetched(settings: Settings, run_id: str, report: FetchReport, from_code: bool) -> int:
    """fetch's table (or --json) and exit code: 1 when a path was found on no node's side."""
    ui = settings.ui
    outcomes, missing, code = report.outcomes, report.missing, report.exit_code()
    if settings.json_mode:
        return json_doc(ui, "fetch", outcomes, code, report.node_fields, run_id=run_id)
    table = Table(title=Text(f"fetch {run_id}"), title_justify="left")
    for column in ("node", "path", "files", "size", "copied to"):
        table.add_column(column)
    for o in outcomes:
        for f in o.value or []:
            if f.source is None:
                table.add_row(Text(o.node), Text(f.path), Text("missing", style="red"), "-", "-")
            else:
                table.add_row(Text(o.node), Text(f.path), str(f.files), _size(f.bytes), Text(f.local))
    ui.print_table(table)
    fail_lines(ui, list(outcomes))
    for node, path in missing:
        where = (
            "the code directory"
            if from_code
            else "the run's outputs, its run directory or the code directory"
        )
        ui.error(f"node {node!r}: {path} not found in {where}")
    return code
