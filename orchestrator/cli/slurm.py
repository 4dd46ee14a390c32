"""What `launch`, `logs`, `status` and `stop` print for a run on Slurm (orchestrator/slurm/ decides and
acts): the job's state while it waits, every rank's lines as `[node:rank]`, the failed node first."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli.common import Settings, interrupted, open_session
from orchestrator.errors import ExitCode
from orchestrator.inventory import Inventory
from orchestrator.logs import RunLog
from orchestrator.runs.next_command import again

if TYPE_CHECKING:
    from orchestrator.session import Session
    from orchestrator.slurm.run import JobEnd, NodeEnd, SlurmLogin, SlurmRun
    from orchestrator.transports.base import BlockHandler


@contextlib.contextmanager
def allocated(settings: Settings, inventory: Inventory, what: str) -> Iterator[tuple[Inventory, Session]]:
    """`check` and `validate` on Slurm: a job (``cb-<what>``) holds the request's nodes, given as an
    inventory and a session whose scripts run on them as job steps (orchestrator/slurm/relay.py).
    Refused under --dry-run (exit 2): a dry run allocates nothing, and the nodes are Slurm's choice."""
    from orchestrator.slurm.job import login_node, refuse_dry_run
    from orchestrator.slurm.relay import on_allocation

    refuse_dry_run(what, settings.dry_run)
    with open_session(settings, inventory, [login_node(inventory)]) as session:
        with on_allocation(session, inventory, settings.ui.note, what) as (nodes, on):
            yield nodes, on


def _outputs(settings: Settings, log: RunLog) -> Any:
    """The handlers of the allocated nodes: the controller's log and the terminal as `[node:rank]`."""
    from orchestrator.logs import RankedOutput

    def outputs_for(nodes: list[str], nproc: int) -> dict[str, BlockHandler]:
        printer = None if settings.json_mode else settings.ui.line_printer(nodes)
        return {
            name: RankedOutput(name, log, printer, first_rank=i * nproc, nproc=nproc)
            for i, name in enumerate(nodes)
        }

    return outputs_for


def launch_on_slurm(
    settings: Settings,
    inventory: Inventory,
    *,
    run_id: str | None,
    templates_dir: Path | None,
    detach: bool,
) -> ExitCode:
    """`launch` on an inventory with cluster.slurm: submit, then follow (or, --detach, only submit)."""
    from orchestrator.render import Renderer, require_secrets, templates_dir_for
    from orchestrator.runs.ids import new_run_id
    from orchestrator.runs.layout import train_record, write_record
    from orchestrator.slurm.job import login_node, slurm_settings
    from orchestrator.slurm.run import SlurmLogin

    ui = settings.ui
    slurm = slurm_settings(inventory)
    login = login_node(inventory)
    renderer = Renderer(templates_dir_for(inventory, templates_dir))
    require_secrets(inventory)
    run_id = new_run_id(inventory.cluster.name, chosen=run_id)
    directory = Path("runs") / run_id
    write_record(directory, run_id, [], detached=detach, train=train_record(inventory))
    with open_session(settings, inventory, [login]) as session:
        slurm_login = SlurmLogin(session, inventory)
        run = slurm_login.submit(run_id, renderer)
        ranks = f"{slurm.nodes} node(s) x {slurm.ranks_per_node} rank(s)"
        ui.info(f"run {run_id}: Slurm job {run.job_id} submitted through {login.name} ({ranks})")
        if detach:
            if settings.json_mode:
                ui.print_json({"command": "launch", "run_id": run_id, "job_id": run.job_id, "detached": True})
            else:
                ui.info(f"follow it: {again(settings, 'logs', run_id)} --follow")
            return ExitCode.OK
        log = RunLog(directory)
        try:
            end = slurm_login.follow(run, outputs_for=_outputs(settings, log), say=ui.note)
        except KeyboardInterrupt:
            log.close()
            try:
                state = slurm_login.stop(run)
                detail = f"Slurm job {run.job_id} cancelled ({state})"
            except KeyboardInterrupt:
                detail = f"Slurm job {run.job_id} may still run: `{again(settings, 'stop', run_id)}`"
            interrupted(ui, detail)
        finally:
            log.close()
    return _summary(settings, run, end, log.directory)


def _summary(settings: Settings, run: SlurmRun, end: JobEnd, log_dir: Path) -> ExitCode:
    ui = settings.ui
    code = ExitCode.OK if end.ok else ExitCode.NODES_FAILED
    if settings.json_mode:  # each node's entry: the common one (not timed here), its exit code
        from orchestrator.cli.report import json_doc
        from orchestrator.executor import Outcome

        nodes: list[Outcome[NodeEnd]] = [Outcome(n.node, n, n.error, 0.0) for n in end.nodes]
        return json_doc(
            ui,
            "launch",
            nodes,
            code,
            lambda o: {"exit_code": o.value.exit_code if o.value else None},
            lambda o: o.ok and o.value is not None and o.value.exit_code == 0,
            run_id=run.run_id,
            job_id=end.job_id,
            state=end.state,
            failed_first=end.failed_first,
            time_limit_reached=bool(end.time_limit),
            log_dir=str(log_dir),
        )
    failed = end.failed()
    if failed is not None:
        ui.error(f"{end.failed_first}: {failed[0]}")
        for line in failed[1]:
            ui.info(f"  {line}")
        if failed[2]:
            ui.note(failed[2])
    elif end.time_limit:
        ui.error(end.time_limit_reached())
        ui.note("a longer cluster.slurm.time, or a training script resuming from checkpoints in $CB_RUN_DIR")
    elif not end.ok:
        ui.error(f"job {end.job_id} ended {end.state}")
    else:
        ui.info(f"job {end.job_id} {end.state}: every node exited 0")
    ui.note(f"logs: {log_dir}/ (and {run.job_dir}/<node>/node.log on the shared file system)")
    return code


@contextlib.contextmanager
def _login(settings: Settings, inventory: Inventory) -> Iterator[SlurmLogin]:
    from orchestrator.slurm.job import login_node
    from orchestrator.slurm.run import SlurmLogin

    with open_session(settings, inventory, [login_node(inventory)]) as session:
        yield SlurmLogin(session, inventory)


def logs_on_slurm(settings: Settings, inventory: Inventory, run_id: str, *, follow: bool) -> ExitCode:
    """`logs --run ID [--follow]` of a Slurm run: every node's log from its start, as `[node:rank]`."""
    ui = settings.ui
    log = RunLog(Path("runs") / run_id, staged=True)
    with _login(settings, inventory) as login:
        run = login.find(run_id)
        try:
            end = login.logs(run, outputs_for=_outputs(settings, log), say=ui.note, follow=follow)
        except KeyboardInterrupt:
            log.close()
            interrupted(ui, "stopped following (the job goes on)")
        for node in end.nodes:
            log.commit(node.node)
        log.close()
    return ExitCode.OK if end.ok or not follow else ExitCode.NODES_FAILED


def status_on_slurm(settings: Settings, inventory: Inventory, run_id: str) -> ExitCode:
    """`status --run ID`: the job's id, state, nodes, runtime, and each node's last line."""
    from orchestrator.slurm.job import slurm_settings

    ui = settings.ui
    with _login(settings, inventory) as login:
        status = login.status(login.find(run_id))
    if settings.json_mode:
        ui.print_json({"command": "status", **status.__dict__})
        return ExitCode.OK
    why = f" ({status.reason})" if status.state == "PENDING" and status.reason else ""
    ui.print_text(f"run {status.run_id}: Slurm job {status.job_id} {status.state}{why}")
    if status.runtime:
        ui.print_text(f"runtime {status.runtime} on {', '.join(status.nodes) or 'no node yet'}")
    for line in status.labelled_last_lines(slurm_settings(inventory).ranks_per_node):
        ui.print_text(f"  {line}")
    return ExitCode.OK


def stop_on_slurm(settings: Settings, inventory: Inventory, run_id: str) -> ExitCode:
    """`stop --run ID`: scancel the job and await its end."""
    ui = settings.ui
    with _login(settings, inventory) as login:
        state = login.stop(run := login.find(run_id))
    ui.info(f"run {run_id}: Slurm job {run.job_id} cancelled ({state})")
    return ExitCode.OK
