"""`bootstrap bench`: each rank's measured training speed, the shares it implies, and (--scaling)
how the training script scales on 1, 2, ... N nodes with equal and measured shares."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from orchestrator.cli.common import (
    Settings,
    common_options,
    load_selection,
    templates_option,
)
from orchestrator.cli.front import reach_for
from orchestrator.cli.report import fail_lines, tell
from orchestrator.errors import ExitCode
from orchestrator.steps.preflight.checks import refuse_native_mix

if TYPE_CHECKING:
    from orchestrator.bench.engine import BenchOptions
    from orchestrator.inventory import Inventory


def _callable(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    module, colon, function = value.partition(":")
    parts = module.split(".")
    if not colon or not function.isidentifier() or not all(p.isidentifier() for p in parts):
        raise click.BadParameter(
            f"{value!r}: write MODULE:FUNCTION (e.g. mymodels.bench:make_step), the module importable "
            "from the code directory on the nodes"
        )
    return value


@click.command()
@common_options
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Samples per step of the probe's workload, on each rank.",
)
@click.option(
    "--repeats", type=click.IntRange(min=1), default=5, show_default=True, help="Timed repeats per rank."
)
@click.option(
    "--callable",
    "workload",
    metavar="MODULE:FUNCTION",
    callback=_callable,
    help="Your workload instead of the shipped MLP: FUNCTION(batch_size, device) returns a function "
    "that trains on one batch (docs/bench.md); MODULE is imported from the code directory.",
)
@click.option(
    "--scaling",
    is_flag=True,
    help="Then train (--steps steps) on 1, 2, ... N nodes with equal and measured shares: a table and "
    "runs/<id>/scaling.html.",
)
@click.option(
    "--steps",
    type=click.IntRange(min=5),
    default=50,
    show_default=True,
    help="--scaling: training steps per run (the script gets --max-steps).",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="--scaling: runs per node set and shares mode, alternating; the tables show the median.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds every rank has to join before the missing ones are named.",
)
@templates_option("whose ranks.sh.j2 replaces the shipped one")
@click.pass_context
def bench(
    ctx: click.Context,
    batch_size: int,
    repeats: int,
    workload: str | None,
    scaling: bool,
    steps: int,
    rounds: int,
    timeout: float,
    templates_dir: Path | None,
) -> ExitCode:
    """Measure every rank's training speed (samples/s) on its own device, with the launch's environment.

    A fixed forward/backward workload (a small MLP, or --callable) runs on every rank at once, timed
    over --repeats; the table shows each rank's median samples/s, its spread over the repeats, its
    device, and the share of a global batch `cluster.train.shares: measured` would give it. With
    --scaling the training script then runs on 1, 2, ... N nodes with equal and measured shares: a
    table (samples/s, speed-up, efficiency) and an HTML page with the curves. Exit 1 when a rank
    could not be measured or a run failed. --dry-run prints each node's probe script.
    """
    from orchestrator.bench.engine import BenchOptions

    settings = Settings.from_context(ctx)
    inventory, _ = load_selection(settings)
    options = BenchOptions(
        batch_size=batch_size,
        repeats=repeats,
        timeout=timeout,
        workload=workload,
        scaling=scaling,
        steps=steps,
        rounds=rounds,
    )
    return run_bench_command(settings, inventory, options, templates_dir=templates_dir)


def run_bench_command(
    settings: Settings, inventory: Inventory, options: BenchOptions, *, templates_dir: Path | None = None
) -> ExitCode:
    """`bootstrap bench` (``bench.engine.bench_phase``), shown; its exit code."""
    from orchestrator.bench.engine import BenchReport, bench_phase
    from orchestrator.cli.report import OFFLINE_NOTE, show_dry_run

    refuse_native_mix(inventory)
    ui = settings.ui
    if settings.nodes:
        ui.note("bench runs every node of the inventory: the probe uses the whole cluster's launch plan")
    report = bench_phase(
        reach_for(settings, inventory, lines="verbose"),
        inventory,
        options,
        templates_dir=templates_dir,
        dry_run=settings.ssh_options() if settings.dry_run else None,
    )
    if not isinstance(report, BenchReport):
        show_dry_run(ui, report, json_mode=settings.json_mode, note=OFFLINE_NOTE)
        if options.scaling:
            ui.note(
                f"--scaling would then run the training script for {options.steps} steps on 1 to "
                f"{len(inventory.nodes)} node(s), with equal and measured shares"
            )
        return ExitCode.OK
    probe = report.probe
    if probe is not None and any(not o.ok for o in probe.plan.inspected):
        fail_lines(ui, [o for o in probe.plan.inspected if not o.ok])
        return report.exit_code()
    code = report.exit_code()
    if settings.json_mode:
        ui.print_json({**report.public_dict(), "exit_code": int(code)})
        return code
    tell(ui, report.shown())
    return code
