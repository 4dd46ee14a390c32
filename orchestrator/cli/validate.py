"""`bootstrap validate`: join every rank, check all_reduce, time it (latency and bus bandwidth)."""

from __future__ import annotations

import time

import click
from rich.table import Table
from rich.text import Text

from orchestrator.cli.main import (
    Settings,
    _error_dict,
    _fail_lines,
    _interrupted,
    _load,
    _session,
    cli,
    common_options,
)
from orchestrator.errors import ExitCode
from orchestrator.executor import exit_code_for
from orchestrator.inventory import Inventory
from orchestrator.logs import RunLog


@cli.command()
@common_options
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds every rank has to join before the missing ones are named.",
)
@click.option(
    "--sizes",
    default="4K,256K,4M",
    show_default=True,
    help="all_reduce sizes to time (bytes; K, M, G = powers of 1024).",
)
@click.pass_context
def validate(ctx: click.Context, timeout: float, sizes: str) -> None:
    """Check that every rank can join and all_reduce correctly, and how fast.

    Runs a shipped script on every rank with the environment training gets (interface, backend,
    interpreter), joining through the master: ranks that never join are named after --timeout
    instead of hanging; then an all_reduce correctness check and timed all_reduce per size
    (latency, algorithm and bus bandwidth). Exit 1 when anything fails.
    """
    from orchestrator.steps.validate import parse_sizes

    settings = Settings.from_context(ctx)
    try:
        size_list = parse_sizes(sizes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--sizes") from None
    inventory, _ = _load(settings)
    ctx.exit(int(run_validate(settings, inventory, timeout=timeout, sizes=size_list)))


def run_validate(
    settings: Settings,
    inventory: Inventory,
    *,
    timeout: float = 60.0,
    sizes: tuple[int, ...] | None = None,
) -> ExitCode:
    """The validate phase (also a step of the main pipeline); returns its exit code."""
    from orchestrator.steps.validate import DEFAULT_SIZES, failure_summary, human_bytes, validate

    ui = settings.ui
    nodes = list(inventory.nodes)
    if settings.nodes:
        ui.note("validate runs every node of the inventory: a training job spans the whole cluster")
    run_id = f"validate-{inventory.cluster.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    session = _session(settings, inventory, nodes)
    if settings.dry_run:
        session.close()
        ui.note("--dry-run: validate runs ranks.sh (see `bootstrap render`) with the shipped worker")
        return ExitCode.OK
    log = RunLog(__import__("pathlib").Path("runs") / run_id)
    printer = ui.line_printer([n.name for n in nodes])

    def on_line(node: str, rank: int | None, text: str) -> None:
        log.write(node, text)
        if settings.verbose and not settings.json_mode:
            printer.write_rank(node, rank, text)

    with session:
        try:
            with ui.progress([n.name for n in nodes], "validate") as on_event:
                session.executor.on_event = on_event
                result = validate(
                    session,
                    inventory,
                    run_id,
                    timeout=timeout,
                    sizes=sizes or DEFAULT_SIZES,
                    on_line=on_line,
                )
        except KeyboardInterrupt:
            log.close()
            _interrupted(ui)
        finally:
            log.close()
    unreachable = [o for o in result.plan.inspected if not o.ok]
    if unreachable:
        _fail_lines(ui, unreachable)
        return exit_code_for(result.plan.inspected)
    report = result.report
    problems = failure_summary(result)
    code = ExitCode.OK if report.ok and not problems else ExitCode.NODES_FAILED
    if settings.json_mode:
        ui.print_json(
            {
                "command": "validate",
                "run_id": run_id,
                "backend": result.plan.backend,
                **report.public_dict(),
                "problems": problems,
                "nodes": [
                    {"name": o.node, "ok": o.ok, "error": _error_dict(o.error)} for o in result.outcomes
                ],
                "exit_code": int(code),
            }
        )
        return code
    if report.joined:
        slowest = max(report.joined.values())
        ui.info(
            f"{len(report.joined)} of {report.world_size} rank(s) joined "
            f"(backend {result.plan.backend}, slowest {slowest:.2f} s)"
            + ("; all_reduce result correct" if report.correct else "")
        )
    if report.results:
        table = Table(title=Text(f"all_reduce, {report.world_size} ranks"), title_justify="left")
        for column in ("size", "iterations", "latency", "algbw", "busbw"):
            table.add_column(column, justify="right")
        for r in report.results:
            table.add_row(
                human_bytes(r.bytes),
                str(r.iters),
                f"{r.latency_s * 1e3:.3f} ms",
                f"{human_bytes(r.algbw)}/s",
                f"{human_bytes(r.busbw)}/s",
            )
        ui.print_table(table)
    for problem in problems:
        ui.error(problem)
    if problems:
        ui.note(f"per-node output: {log.directory}/ (validation worker lines; -v shows them live)")
    return code
