"""`bootstrap validate`: join every rank, check all_reduce, time it (latency and bus bandwidth)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.common import (
    Settings,
    common_options,
    load_selection,
    master_option,
    templates_option,
)
from orchestrator.cli.front import reach_for
from orchestrator.cli.report import fail_doc, json_doc, tell
from orchestrator.errors import ExitCode
from orchestrator.inventory import Inventory
from orchestrator.runs.run_inventory import run_nodes
from orchestrator.slurm.pipeline import allocation
from orchestrator.steps.preflight.checks import refuse_native_mix

if TYPE_CHECKING:
    from orchestrator.session import Session
    from orchestrator.steps.contract import Report
    from orchestrator.steps.validate import Skipped, Validation


@click.command()
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
@templates_option("whose ranks.sh.j2 replaces the shipped one")
@master_option
@click.pass_context
def validate(
    ctx: click.Context, timeout: float, sizes: str, templates_dir: Path | None, master: str | None
) -> int:
    """Check that every rank can join and all_reduce correctly, and how fast.

    Runs a shipped script on every rank with the environment training gets (interface, backend,
    interpreter), joining through the master: ranks that never join are named after --timeout
    instead of hanging; then an all_reduce correctness check and timed all_reduce per size
    (latency, algorithm and bus bandwidth). Exit 1 when anything fails. --dry-run connects to
    nothing and prints each node's rank script (secrets masked) and the command that runs it.
    """
    from orchestrator.steps.validate import parse_sizes

    settings = Settings.from_context(ctx)
    try:
        size_list = parse_sizes(sizes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--sizes") from None
    inventory, _ = load_selection(settings)
    if inventory.cluster.slurm is not None:  # the nodes are Slurm's: validated inside an allocation
        with allocation(reach_for(settings, inventory), inventory, "validate", dry_run=settings.dry_run) as (
            nodes,
            on,
        ):
            return run_validate(
                settings, nodes, timeout=timeout, sizes=size_list, templates_dir=templates_dir, session=on
            )
    refuse_native_mix(inventory)  # decided from the whole inventory, whatever --nodes says
    if not settings.dry_run:
        from orchestrator.render import require_secrets

        require_secrets(inventory)  # train.env's {from_env: NAME}: before connecting to anything
    inventory = run_nodes(settings, inventory, master)  # --nodes: the ranks of those nodes only
    code = run_validate(settings, inventory, timeout=timeout, sizes=size_list, templates_dir=templates_dir)
    return code


def run_validate(
    settings: Settings,
    inventory: Inventory,
    *,
    timeout: float = 60.0,
    sizes: tuple[int, ...] | None = None,
    templates_dir: Path | None = None,
    session: Session | None = None,
) -> ExitCode:
    """`bootstrap validate` (also the Slurm pipeline's, in its allocation): shown; its exit code.
    ``templates_dir``: ``--templates``; else the inventory's ``cluster.train.templates``."""
    from orchestrator.steps.validate import DEFAULT_SIZES, validation_phase

    result = validation_phase(
        reach_for(settings, inventory, session, lines="verbose"),
        inventory,
        timeout=timeout,
        sizes=sizes or DEFAULT_SIZES,
        templates_dir=templates_dir,
        dry_run=settings.ssh_options() if settings.dry_run else None,
    )
    return show_validation(settings, result)


def show_validation(settings: Settings, result: Validation | Skipped | Report[Any]) -> ExitCode:
    """Validation's report: who joined, the all_reduce table, what failed (or ``--json``; a dry
    run's plans; one line when it was skipped); its exit code."""
    from orchestrator.cli.report import OFFLINE_NOTE, show_dry_run
    from orchestrator.steps.validate import Skipped, Validation, failure_summary

    ui = settings.ui
    if not isinstance(result, (Validation, Skipped)):
        show_dry_run(ui, result, json_mode=settings.json_mode, note=OFFLINE_NOTE)
        return ExitCode.OK
    if isinstance(result, Skipped):
        tell(ui, [result.said()])
        return ExitCode.OK
    code = result.exit_code()
    if any(not o.ok for o in result.plan.inspected):
        return fail_doc(ui, "validate", result.plan.inspected, settings.json_mode)
    if settings.json_mode:
        top = {"run_id": result.run_id, "backend": result.plan.backend, **result.report.public_dict()}
        top["problems"] = failure_summary(result)
        return json_doc(ui, "validate", result.outcomes, code, Validation.node_fields, **top)
    tell(ui, result.shown())
    return code
