"""`bootstrap validate`: join every rank, check all_reduce, time it (latency and bus bandwidth)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table
from rich.text import Text

from orchestrator.cli.common import (
    Settings,
    common_options,
    fail_lines,
    interrupted,
    load_selection,
    master_option,
    node_docs,
    phase_session,
    refuse_native_mix,
    run_nodes,
    templates_option,
)
from orchestrator.errors import ExitCode
from orchestrator.executor import exit_code_for
from orchestrator.inventory import Inventory
from orchestrator.logs import RunLog

if TYPE_CHECKING:
    from orchestrator.render import LaunchSpec, Renderer
    from orchestrator.session import Session


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
    from orchestrator.slurm.job import not_on_slurm_yet

    not_on_slurm_yet(inventory, "validate", "`check` runs the preflight inside an allocation (docs/slurm.md)")
    refuse_native_mix(inventory)  # decided from the whole inventory, whatever --nodes says
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
    unless_unchanged: bool = False,
) -> ExitCode:
    """The validate phase (also a step of the main pipeline); returns its exit code.

    ``templates_dir``: ``--templates``; else the inventory's ``cluster.train.templates``.
    ``unless_unchanged`` (the main pipeline without ``--validate``): one line instead of the run
    when nothing validation depends on changed since it last succeeded on these nodes
    (steps/validate_stamp.py); a success writes the stamp either way.
    """
    from orchestrator.render import Renderer, require_secrets, templates_dir_for
    from orchestrator.steps.preflight.checks import refuse_native_mix
    from orchestrator.steps.validate import DEFAULT_SIZES, failure_summary, human_bytes, validate

    refuse_native_mix(inventory)  # native Windows beside Linux/WSL nodes: exit 2, nothing started
    ui = settings.ui
    nodes = list(inventory.nodes)
    from orchestrator.runs.ids import new_run_id

    renderer = Renderer(templates_dir_for(inventory, templates_dir))
    run_id = new_run_id(inventory.cluster.name, kind="validate", reserve=not settings.dry_run)
    if settings.dry_run:
        _validate_dry_run(settings, inventory, renderer, run_id, timeout, sizes or DEFAULT_SIZES)
        return ExitCode.OK
    require_secrets(inventory)  # train.env's {from_env: NAME}: before connecting to anything
    log = RunLog(Path("runs") / run_id)
    printer = ui.line_printer([n.name for n in nodes])

    def on_line(node: str, rank: int | None, text: str) -> None:
        log.write(node, text)
        if settings.verbose and not settings.json_mode:
            printer.write_rank(node, rank, text)

    from orchestrator.steps.launch import plan
    from orchestrator.steps.validate_stamp import last_stamp, save_stamp, stamp_key

    with phase_session(settings, inventory, nodes, session) as on:
        try:
            with ui.progress([n.name for n in nodes], "validate") as on_event:
                on.executor.on_event = on_event
                launch_plan = plan(on, inventory, run_id)  # facts the preflight read: no round trip
                key = stamp_key(inventory, launch_plan) if all(o.ok for o in launch_plan.inspected) else None
                last = last_stamp(inventory) if unless_unchanged and key is not None else None
                if last is not None and last.key == key:
                    on.executor.on_event = None
                    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(last.when))
                    ui.info(
                        f"validate: skipped: nothing it checks changed since it passed on these "
                        f"{len(nodes)} node(s) at {when} (addresses, interpreters, torch, interfaces, "
                        "backend, firewall settings); --validate runs it anyway"
                    )
                    log.close()
                    return ExitCode.OK
                result = validate(
                    on,
                    inventory,
                    run_id,
                    timeout=timeout,
                    sizes=sizes or DEFAULT_SIZES,
                    renderer=renderer,
                    on_line=on_line,
                    launch_plan=launch_plan,
                )
        except KeyboardInterrupt:
            log.close()
            interrupted(ui)
        finally:
            log.close()
    unreachable = [o for o in result.plan.inspected if not o.ok]
    if unreachable:
        fail_lines(ui, unreachable)
        return exit_code_for(result.plan.inspected)
    report = result.report
    problems = failure_summary(result)
    code = ExitCode.OK if report.ok and not problems else ExitCode.NODES_FAILED
    if code == ExitCode.OK and key is not None:
        save_stamp(inventory, key)
    if settings.json_mode:
        ui.print_json(
            {
                "command": "validate",
                "run_id": run_id,
                "backend": result.plan.backend,
                **report.public_dict(),
                "problems": problems,
                "nodes": node_docs(result.outcomes, lambda o: {}),
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


# -- --dry-run: what would be sent to each node, connecting to nothing ----------------------------------


def validation_specs(specs: list[LaunchSpec], timeout: float, sizes: tuple[int, ...]) -> list[LaunchSpec]:
    """The launch specs as validation runs them (``steps.validate.validation_specs``; imported when
    used, so the CLI starts without loading the steps)."""
    from orchestrator.steps import validate as steps

    return steps.validation_specs(specs, timeout, sizes)


def dry_run_nodes(
    settings: Settings,
    inventory: Inventory,
    specs: list[LaunchSpec],
    renderer: Renderer,
    *,
    template: str | None = None,
    script_file: Path | None = None,
    detach: bool = False,
) -> list[dict[str, Any]]:
    """Per node, connecting to nothing: the node's plan (``steps.launch.node_plan``, the very object
    ``run_node`` applies), shown with its launch script's secrets masked: ``{"name", "via", "run_dir",
    "uploads", "script", "prepare", "commands", "plan"}``; ``prepare`` and ``commands`` are the exact
    texts the node's shell receives (``transport.plan``) before and for the launcher.

    ``template``: another template than the platform's launch template, for POSIX shells (native
    Windows keeps its own, as validation does). ``script_file``: a file of ours uploaded for
    ``spec.script`` (validation's worker). ``detach``: the launcher is `launch --detach`'s
    start script.
    """
    from orchestrator.inventory import PasswordResolver
    from orchestrator.plans import Put, Run, sent_text
    from orchestrator.platforms import PowerShell
    from orchestrator.runs.control import start_script
    from orchestrator.runs.layout import launcher_env, run_dir_for
    from orchestrator.session import Session
    from orchestrator.steps.launch import node_plan

    by_name = {s.node.name: s for s in specs}
    nodes = [n for n in inventory.nodes if n.name in by_name]
    session = Session(
        inventory, nodes, ssh=settings.ssh_options(), passwords=PasswordResolver(prompt=None), max_workers=1
    )
    planned = []
    with session:
        for node in nodes:
            spec = by_name[node.name]
            transport = session.transport(node)  # created, never connected
            platform = transport.platform
            native = isinstance(platform, PowerShell)
            plan = node_plan(
                node,
                platform,
                spec,
                renderer=renderer,
                template=None if native else template,
                script_file=script_file,
                secrets="mask",
            )
            run_dir = run_dir_for(node, spec.run_id)
            if detach:
                start = start_script(platform, node, spec.run_id)
                plan.actions[-1] = Run(
                    start, env=launcher_env(spec.sample_nonce), what="start the launcher detached"
                )
            runs = [a for a in plan.actions if isinstance(a, Run)]
            launch_put = next(a for a in plan.actions if isinstance(a, Put))
            planned.append(
                {
                    "name": node.name,
                    "via": transport.describe(),
                    "run_dir": run_dir,
                    "uploads": plan.uploads,
                    "script": launch_put.content().decode("utf-8-sig"),
                    "prepare": [sent_text(transport, r) for r in runs[:-1]],
                    "commands": [sent_text(transport, runs[-1])],
                    "plan": plan.public_dict(transport),
                }
            )
    return planned


def print_dry_run(
    settings: Settings,
    command: str,
    run_id: str,
    backend: str,
    planned: list[dict[str, Any]],
    *,
    how: str = "in the foreground",
) -> None:
    """``--dry-run`` output: one JSON document with --json; else per node the uploads, the script
    and the text that runs it (the layout of `launch --dry-run`)."""
    ui = settings.ui
    if settings.json_mode:
        ui.print_json(
            {"command": command, "dry_run": True, "run_id": run_id, "backend": backend, "nodes": planned}
        )
        return
    for entry in planned:
        ui.print_text(f"# ---- {entry['name']}: uploads {', '.join(entry['uploads'])} (secrets masked)")
        ui.print_text(entry["script"])
        ui.print_text(f"# ---- {entry['name']} ({entry['via']}): then runs, {how}:")
        for text in entry["commands"]:
            ui.print_text(text)
    ui.note(
        "--dry-run: nothing was uploaded or started; interfaces as the inventory names them "
        "(a real run finds them on the nodes, as `bootstrap render` shows)"
    )


def _validate_dry_run(
    settings: Settings,
    inventory: Inventory,
    renderer: Renderer,
    run_id: str,
    timeout: float,
    sizes: tuple[int, ...],
) -> None:
    from orchestrator.cli.common import offline_specs
    from orchestrator.resources import package_file
    from orchestrator.steps.validate import TEMPLATE, WORKER

    backend, specs = offline_specs(settings.ui, inventory, run_id)
    planned = dry_run_nodes(
        settings,
        inventory,
        validation_specs(specs, timeout, sizes),
        renderer,
        template=TEMPLATE,
        script_file=package_file("steps/probes/" + WORKER),
    )
    print_dry_run(settings, "validate", run_id, backend, planned)
